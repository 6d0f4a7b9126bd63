"""
The ``[pipeline]`` section of the gateway's TOML file: the pipeline's
options, so one file describes a gateway and what is computed from its
archive.  Command-line options win over it.  Pure Python: the gateway
checks this section at start-up without importing Spark.
"""

TABLES = (
    "topic_minute", "topic_hour", "client_hour", "json_minute", "last_value",
    "sparkplug_metrics", "sparkplug_minute", "sparkplug_sessions",
)

# key: (type, default, help)
KEYS = {
    "archive": (list, [], "archive directories (the gateway's [archive] directory when empty)"),
    "out": (str, "", "where the tables are written"),
    "json_fields": (list, [], "numeric JSON fields for json_minute (names or JSON paths)"),
    "tables": (list, list(TABLES), "the tables to compute"),
    "master": (str, "", "Spark master (spark-submit's wins; empty: local[*])"),
    "remote": (str, "", "Spark Connect server, sc://HOST:PORT ($SPARK_REMOTE wins)"),
    "conf": (dict, {}, "Spark settings, as spark-submit --conf takes them"),
    "class_cache": (bool, True, "keep Spark's classes in ~/.cache/mqttgw/spark: a driver started here starts faster"),
    "checkpoint": (str, "", "the stream's checkpoint directory"),
    "trigger": (str, "available-now", "'available-now' or an interval in seconds"),
    "publish": (str, "", "HOST:PORT to publish rollups to"),
    "prefix": (str, "$analytics", "topic prefix of what is published"),
    "tls": (bool, False, "publish over TLS"),
    "ca": (str, "", "authorities the gateway's certificate is checked against"),
    "username": (str, "mqttgw-pipeline", "user name for publishing"),
}

# More than a key's help says, for the example file and the manual
# (reStructuredText).
DOCS = {
    "archive": (
        "Several (one per gateway, or gathered copies) are combined by their"
        " ``gateway_id``."
    ),
    "out": "Needed by every run.",
    "json_fields": "A JSON path such as ``$.a.b`` names a nested field.",
    "tables": (
        "The ``sparkplug_`` tables only from archives that hold ``spBv1.0``"
        " topics."
    ),
    "master": (
        "The flags ``--master`` and ``--remote`` win over master and remote, and"
        " spark-submit's master or ``$SPARK_REMOTE`` over these keys."
    ),
    "class_cache": (
        "Only a driver started here, not spark-submit's nor Connect's; the flag"
        " ``--no-class-cache`` turns it off."
    ),
    "checkpoint": "For the stream command.",
    "trigger": "For the stream command.",
    "publish": (
        "The newest rollups, field statistics and last values, as retained"
        " messages under ``prefix``; the password is read from"
        " ``$MQTTGW_PASSWORD``."
    ),
}


class SettingsError(ValueError):
    pass


def check(table, where):
    """``{key: value}`` of a [pipeline] table, every key and value checked."""
    if not isinstance(table, dict):
        raise SettingsError(f"{where}: pipeline must be a table")
    values = {}
    for name, value in table.items():
        if name not in KEYS:
            raise SettingsError(f"{where}: unknown key pipeline.{name}")
        kind = KEYS[name][0]
        if kind is list and isinstance(value, str) and name == "archive":
            value = [value]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise SettingsError(f"{where}: pipeline.{name} must be a {kind.__name__}, not {value!r}")
        if kind is list and not all(isinstance(v, str) and v for v in value):
            raise SettingsError(f"{where}: pipeline.{name} must be a list of non-empty strings")
        if kind is dict and not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
            raise SettingsError(f"{where}: pipeline.conf values must be strings, numbers or booleans")
        values[name] = value
    check_values(values, where)
    return values


def check_values(values, where):
    unknown = [t for t in values.get("tables", ()) if t not in TABLES]
    if unknown:
        raise SettingsError(f"{where}: unknown table {unknown[0]!r} (tables: {', '.join(TABLES)})")
    for field in values.get("json_fields", ()):
        if any(c in field for c in "+#/\0"):
            raise SettingsError(f"{where}: JSON field {field!r} may not hold '+', '#', '/' or NUL")
    trigger = values.get("trigger", "available-now")
    if trigger != "available-now":
        try:
            if float(trigger) <= 0:
                raise ValueError
        except ValueError:
            raise SettingsError(f"{where}: trigger must be 'available-now' or seconds, not {trigger!r}") from None
    if values.get("master") and values.get("remote"):
        raise SettingsError(f"{where}: master and remote exclude each other")
    remote = values.get("remote") or ""
    if remote and not remote.startswith("sc://"):
        raise SettingsError(f"{where}: remote must be sc://HOST:PORT, not {remote!r}")
    publish = values.get("publish") or ""
    if publish and not publish.rpartition(":")[2].isdigit():
        raise SettingsError(f"{where}: publish must be HOST:PORT, not {publish!r}")

"""
Settings: the TOML configuration file and the command-line flags, checked
against one schema.  Every flag has a key; flags win over the file; an
unknown or ill-typed key is an error that names it.
"""

import tomllib

import attr

from mqttgw.archive.keys import ARCHIVE_KEYS
from mqttgw.bridges.keys import SIMPLE_BRIDGE_KEYS
from mqttgw.broker.keys import LIMITS_KEYS, MQTT_KEYS, PERSISTENCE_KEYS, SPARKPLUG_KEYS
from mqttgw.pipeline import settings as pipeline_settings
from mqttgw.schema import ConfigError, check_table, check_value, section_class
from mqttgw.security.keys import AUTH_KEYS
from mqttgw.service.keys import LOG_KEYS, OTEL_KEYS
from mqttgw.transports.keys import LISTENER_KEYS, LISTENERS_KEYS, TLS_KEYS, WEBSOCKET_KEYS
from mqttgw.transports.mqttsn.keys import MQTTSN_KEYS
from mqttgw.web.keys import HTTP_KEYS

# The main sections, each with its keys (schema rows) from the module beside
# the code it configures, in the order the example file (deploy/mqttgw.toml,
# written by mqttgw.service.example) and the manual list them.
SECTION_KEYS = {
    "listeners": LISTENERS_KEYS,
    "auth": AUTH_KEYS,
    "tls": TLS_KEYS,
    "websocket": WEBSOCKET_KEYS,
    "simple_bridge": SIMPLE_BRIDGE_KEYS,
    "persistence": PERSISTENCE_KEYS,
    "archive": ARCHIVE_KEYS,
    "otel": OTEL_KEYS,
    "sparkplug": SPARKPLUG_KEYS,
    "limits": LIMITS_KEYS,
    "mqtt": MQTT_KEYS,
    "log": LOG_KEYS,
    "http": HTTP_KEYS,
    "mqttsn": MQTTSN_KEYS,
}
KEYS = [key for keys in SECTION_KEYS.values() for key in keys]

KEYS_BY_PATH = {k.path: k for k in KEYS}
SECTIONS = sorted({k.section for k in KEYS})


def load_file(path):
    """``{key path: value}`` from a TOML file, every key checked."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    values = {}
    for section, table in document.items():
        if section == "listener":
            values["listener_tables"] = [check_listener(t, path) for t in _tables(table, path, "listener")]
            continue
        if section == "bridge":
            # [[bridge]] tables are checked by their bridge kind.
            if not isinstance(table, list) or not all(isinstance(t, dict) for t in table):
                raise ConfigError(f"{path}: bridge must be [[bridge]] tables")
            values["bridges"] = table
            continue
        if section == "pipeline":
            # The pipeline's options (python -m mqttgw.pipeline --config),
            # checked here too so a typo fails at the gateway's start.
            try:
                values["pipeline"] = pipeline_settings.check(table, path)
            except pipeline_settings.SettingsError as e:
                raise ConfigError(str(e)) from None
            continue
        if section not in SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section}]")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {section} must be a table")
        for name, value in table.items():
            key = KEYS_BY_PATH.get(f"{section}.{name}")
            if key is None:
                raise ConfigError(f"{path}: unknown key {section}.{name}")
            values[key.path] = check_value(key, value, path)
    return values


def _tables(value, path, name):
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(f"{path}: {name} must be [[{name}]] tables")
    return value



# The main sections a [[listener]] key of the same name falls back to.
INHERITED_FROM = ("auth", "tls", "websocket")


def inherited_key(name):
    """The main section's key a [[listener]] key ``name`` falls back to, or None."""
    for section in INHERITED_FROM:
        key = KEYS_BY_PATH.get(f"{section}.{name}")
        if key is not None:
            return key
    return None


def with_inherited(table, settings):
    """
    A [[listener]] table with each key it leaves out, or sets to "", taken
    from the main section's key of the same name; one worked out at
    start-up (auth.allow_anonymous unset) stays out.
    """
    table = dict(table)
    for key in LISTENER_KEYS:
        source = inherited_key(key.name)
        if source is not None and table.get(key.name, "") == "" and settings[source.path] is not None:
            table[key.name] = settings[source.path]
    return table


def check_listener(table, where):
    """A [[listener]] table with its keys checked; the message names the key."""
    values = check_table(LISTENER_KEYS, table, where)
    unknown = set(values["auth"]) - {"password", "token"}
    if unknown:
        raise ConfigError(f"{where}: listener.auth takes password and token, not {sorted(unknown)[0]!r}")
    if values["kind"] in ("tcp", "tls") and "allowed_origins" in table:
        raise ConfigError(f"{where}: listener.allowed_origins is for ws and wss listeners")
    if values["kind"] in ("tcp", "ws") and "use_identity_as_username" in table:
        raise ConfigError(f"{where}: listener.use_identity_as_username is for tls and wss listeners")
    # Only what the table sets: what it leaves out comes from the main sections.
    return dict(table, address=str(values["address"]))


@attr.s(frozen=True, slots=True)
class Listener:
    """
    One listener as declared: its [[listener]] table, and the
    ``[listeners]`` list it came from (None for a [[listener]] table).
    One from a list has only kind and address: it takes everything else
    from the main sections, and shares their connection factory, portal
    and TLS certificate with the others of its list.
    """

    table = attr.ib()
    declared_in = attr.ib(default=None)

    @property
    def where(self):
        """How an error names it: the list's key, or the table's kind and address."""
        return self.declared_in or f"listener {self.table['kind']} {self.table['address']}"


def declared_listeners(values):
    """
    Every listener, in the order they start: the ``[listeners]`` lists'
    tcp, tls, ws and wss entries, the [[listener]] tables, then MQTT-SN's.
    """
    listed = [
        Listener({"kind": kind, "address": str(address)}, f"listeners.{kind}")
        for kind in ("tcp", "tls", "ws", "wss")
        for address in values[f"listeners.{kind}"]
    ]
    tables = [Listener(table) for table in values["listener_tables"]]
    udp = [Listener({"kind": "mqttsn", "address": str(a)}, "listeners.mqttsn") for a in values["listeners.mqttsn"]]
    return tuple(listed + tables + udp)


# Each main section's class: its values as attributes (settings.tls.cert).
SECTION_CLASSES = {name: section_class(name, keys) for name, keys in SECTION_KEYS.items()}
# What the file holds beside the main sections: [[bridge]] and [[listener]] tables.
TABLES = ("bridges", "listener_tables")


@attr.s(frozen=True)
class Settings:
    """
    Every key's value after file and flags are merged: each main section
    an immutable object with its keys as attributes (``settings.tls.cert``),
    and ``settings["tls.cert"]`` for what goes through keys by their path
    (the flags, a reload's comparison).
    """

    values = attr.ib()
    # Every listener, as [[listener]] tables (declared_listeners).
    all_listeners = attr.ib(default=())
    sections = attr.ib(init=False)

    @sections.default
    def _sections(self):
        return {
            name: cls(**{k: self.values[f"{name}.{k}"] for k in attr.fields_dict(cls)})
            for name, cls in SECTION_CLASSES.items()
        }

    def __getattr__(self, name):
        # Only for a name that is not an attribute of the class.
        if name == "sections":
            raise AttributeError(name)
        if name in self.sections:
            return self.sections[name]
        if name in TABLES:
            return self.values[name]
        raise AttributeError(f"settings have no section {name!r}")

    def __getitem__(self, path):
        return self.values[path]


LISTENERS = [k.path for k in KEYS if k.section == "listeners"]
DEFAULT_LISTENER = ("listeners.tcp", ["1883"])


def build(file_values, flag_values):
    """Defaults, then the file, then the flags; with no listener, TCP 1883."""
    values = {k.path: k.default for k in KEYS}
    values["bridges"] = []
    values["listener_tables"] = []
    values.update(file_values)
    values.update(flag_values)
    if values["simple_bridge.addresses"]:
        values["bridges"] = values["bridges"] + [
            {
                "name": "default",
                "addresses": values["simple_bridge.addresses"],
                "rules": values["simple_bridge.rules"],
            }
        ]
    elif values["simple_bridge.rules"]:
        raise ConfigError("simple_bridge.rules (--bridge-topic) needs an address (--bridge)")
    unknown = set(values["archive.directions"]) - {"in", "out", "bridge_in", "bridge_out"}
    if unknown:
        raise ConfigError(f"archive.directions: unknown direction {sorted(unknown)[0]!r}")
    if not any(values[path] for path in LISTENERS) and not values["listener_tables"]:
        values[DEFAULT_LISTENER[0]] = DEFAULT_LISTENER[1]
    tls_listeners = values["listeners.tls"] or values["listeners.wss"]
    if tls_listeners and not (values["tls.cert"] and values["tls.key"]):
        raise ConfigError("TLS listeners need tls.cert and tls.key (--cert, --key)")
    tls_tables = any(t["kind"] in ("tls", "wss") for t in values["listener_tables"])
    for name in ("cert", "key", "ca"):
        if values[f"tls.{name}"] and not (tls_listeners or tls_tables):
            raise ConfigError(
                f"tls.{name} (--{name}) is set but there is no TLS listener (--tls, --wss)"
            )
    values["persistence.persistent_client_expiration"] = parse_duration(
        values["persistence.persistent_client_expiration"],
        "persistence.persistent_client_expiration",
    )
    values["websocket.trusted_proxies"] = parse_networks(
        values["websocket.trusted_proxies"], "websocket.trusted_proxies"
    )
    return Settings(values, declared_listeners(values))


# persistent_client_expiration units, as mosquitto's.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_duration(text, where):
    """
    Seconds from ``90``, ``12h``, ``2d``, ``1w``, ``1m`` or ``1y`` as
    mosquitto reads persistent_client_expiration (there ``m`` is a month);
    None for empty.
    """
    if isinstance(text, (int, float)) or text is None:
        return text
    text = text.strip()
    if not text:
        return None
    number, unit = text[:-1], text[-1]
    if unit.isdigit():
        number, unit = text, "s"
    # mosquitto's m is a month (30 days), not a minute.
    seconds = {"m": 30 * 86400}.get(unit, _UNITS.get(unit))
    if not number.isdigit() or seconds is None or int(number) <= 0:
        raise ConfigError(
            f"{where}: {text!r} is not a duration such as 3600, 12h, 2d, 1w, 1m or 1y"
        )
    return int(number) * seconds


def parse_networks(entries, where):
    """Addresses or networks (``10.0.0.0/8``) as ip_network objects."""
    import ipaddress

    networks = []
    for entry in entries:
        if not isinstance(entry, str):
            networks.append(entry)
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{where}: {entry!r} is not an address or network") from None
    return networks

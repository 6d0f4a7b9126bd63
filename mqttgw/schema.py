"""
The one schema every setting is checked against, wherever it is read
(the main sections, ``[[listener]]`` and ``[[bridge]]`` tables, flags): a
:class:`Key` per setting with its type, default, bounds and help, one
check of a value against its key, and the one error that names the key.
"""

import attr


class ConfigError(Exception):
    """Configuration that cannot be used; the message names the key."""


# A key that has no default: a table without it is refused.
REQUIRED = object()


@attr.s(frozen=True, slots=True)
class Key:
    section = attr.ib()
    name = attr.ib()
    type = attr.ib()
    default = attr.ib()
    help = attr.ib()
    minimum = attr.ib(default=None)
    maximum = attr.ib(default=None)
    choices = attr.ib(default=None)
    # The command-line flag, when not the key's name with dashes.  A flag
    # for a true/false key flips its default.
    flag_name = attr.ib(default=None)
    # What that flag does, when it flips a true/false key.
    flag_help = attr.ib(default=None)
    # More than help's one line, for the manual (docs/), where it is needed.
    doc = attr.ib(default=None)

    @property
    def path(self):
        return f"{self.section}.{self.name}"

    @property
    def flag(self):
        return self.flag_name or self.name.replace("_", "-")


def type_name(t):
    if isinstance(t, tuple):
        return " or ".join(type_name(one) for one in t)
    return {
        list: "a list of strings",
        float: "a number",
        int: "an integer",
        str: "a string",
        bool: "true or false",
    }[t]


def check_value(key, value, where):
    """``value`` converted to the key's type, or ConfigError naming it."""
    if key.type is bool:
        ok = isinstance(value, bool)
    elif key.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif key.type is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
    elif key.type is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif isinstance(key.type, tuple):
        ok = isinstance(value, key.type) and not isinstance(value, bool)
    else:
        ok = isinstance(value, key.type)
    if not ok:
        raise ConfigError(
            f"{where}: {key.path} must be {type_name(key.type)}, not {value!r}"
        )
    if key.minimum is not None and value < key.minimum:
        raise ConfigError(f"{where}: {key.path} must be at least {key.minimum}")
    if key.maximum is not None and value > key.maximum:
        raise ConfigError(f"{where}: {key.path} must be at most {key.maximum}")
    if key.choices is not None and value not in key.choices:
        raise ConfigError(f"{where}: {key.path} must be one of {', '.join(map(str, key.choices))}")
    return value


def check_table(keys, table, where):
    """
    A table of one section (a ``[[bridge]]``, say) checked against its
    ``keys``: ``{name: value}`` with the defaults of the keys it omits.
    """
    by_name = {k.name: k for k in keys}
    values = {}
    for name, value in table.items():
        key = by_name.get(name)
        if key is None:
            raise ConfigError(f"{where}: unknown key {keys[0].section}.{name}")
        values[name] = check_value(key, value, where)
    for key in keys:
        if key.name not in values:
            if key.default is REQUIRED:
                raise ConfigError(f"{where}: {key.path} is required")
            values[key.name] = key.default
    return values


def _by_path(keys):
    return {key.path: key for key in keys}


# The rows whose defaults a connection's bounds take
# (transports.protocol.ConnectionLimits); their sections' modules
# (broker.keys, service.keys) list them beside the others.
CONNECTION_KEYS = _by_path([
    Key(
        "limits",
        "max_packet_size",
        int,
        1024 * 1024,
        "largest packet accepted, in bytes",
        1,
        268_435_460,
        doc=(
            "The fixed header included.  A client sending a larger one is "
            "disconnected."
        ),
    ),
    Key(
        "limits",
        "max_connect_size",
        int,
        16 * 1024,
        "largest CONNECT accepted, in bytes (little is buffered before it)",
        16,
        268_435_460,
        doc=(
            "Until CONNECT has arrived no more than this is buffered for a "
            "connection, and a first packet that is not a CONNECT closes it "
            "at once."
        ),
    ),
    Key(
        "limits", "connect_timeout", float, 10.0, "seconds to wait for CONNECT", 0.001,
        doc=(
            "On WebSocket ports: to complete the upgrade, then to send "
            "CONNECT.  The connection is closed after it."
        ),
    ),
    Key(
        "mqtt",
        "max_topic_alias",
        int,
        10,
        "topic aliases a 5.0 client may set up (0: none)",
        0,
        65535,
        doc=(
            "Sent to 5.0 clients as Topic Alias Maximum in CONNACK.  It also"
            " bounds the aliases the gateway sets up toward a client (as many"
            " as the client's own maximum allows, no more than this), so each"
            " connection holds at most this many topic names each way.  A client"
            " setting up one past it is disconnected (DISCONNECT 0x94)."
        ),
    ),
    Key(
        "mqtt",
        "max_keepalive",
        int,
        65535,
        "longest keep alive (s) a 5.0 client may use; longer or none is answered with this",
        0,
        65535,
        doc=(
            "It is sent as Server Keep Alive.  65535: the client's own is "
            "always used."
        ),
    ),
    Key(
        "mqtt", "retain_available", bool, True, "accept retained messages (5.0 clients are told)",
        doc=(
            "When false, a retained PUBLISH from a 5.0 client is DISCONNECT "
            "0x9A."
        ),
    ),
    Key(
        "mqtt",
        "wildcard_subscription_available",
        bool,
        True,
        "accept wildcard topic filters from 5.0 clients",
        doc=(
            "3.1.1 clients may use them whatever this says, as with "
            "mosquitto."
        ),
    ),
    Key(
        "mqtt",
        "subscription_identifier_available",
        bool,
        True,
        "accept subscription identifiers from 5.0 clients",
    ),
    Key(
        "mqtt",
        "shared_subscription_available",
        bool,
        True,
        "accept shared subscriptions ($share/GROUP/FILTER) from 5.0 clients",
        doc=(
            "3.1.1 clients may use them whatever this says, as with "
            "mosquitto."
        ),
    ),
    Key(
        "mqtt",
        "response_information",
        str,
        "",
        "sent to a 5.0 client that asks for response information (%c: its client id); empty: none",
        doc="E.g. ``responses/%c``.",
    ),
    Key(
        "mqtt",
        "reject_control_characters",
        bool,
        True,
        "close MQTT 3.1.1 connections whose strings hold control characters or non-characters",
        flag_name="allow-control-characters",
        flag_help="accept control characters and non-characters in MQTT 3.1.1 strings",
        doc=(
            "Topic names, topic filters, client ids, user names or will "
            "topics holding control characters (U+0001-U+001F, U+007F-U+009F)"
            " or Unicode non-characters, as the specification allows and "
            "current mosquitto does.  false accepts them, for legacy fleets "
            "(U+0000 is refused either way)."
        ),
    ),
    Key(
        "log",
        "connection_messages",
        bool,
        True,
        "log each client's connect and disconnect (as mosquitto's connection_messages);"
        " past 50 a second, one line a second with their counts",
        flag_name="no-connection-messages",
        flag_help="do not log each client's connect and disconnect",
        doc=(
            "A storm of reconnecting devices is counted so until the burst is"
            " over."
        ),
    ),
    Key(
        "mqtt",
        "allow_long_client_ids",
        bool,
        False,
        "accept MQTT 3.1 client ids longer than 23 characters",
        doc=(
            "Many 3.1 client libraries generate longer ones, and mosquitto "
            "accepts them."
        ),
    ),
])


# The rows whose defaults the broker's bounds take (broker.session's
# SessionLimits, the router's); their sections' modules (broker.keys,
# security.keys) list them as well.
BROKER_KEYS = _by_path([
    Key(
        "auth",
        "session_owner_mismatch",
        str,
        "refuse",
        "a CONNECT with the client id of another identity's session: refuse it,"
        " or new_session (that session is discarded)",
        choices=("refuse", "new_session"),
        doc=(
            "An identity owns its session: a persistent session belongs to "
            "the user (password, token subject or certificate identity) that "
            "made it, or to anonymous.  A CONNECT by another identity with "
            "its client id is refused (MQTT 3.1/3.1.1 CONNACK 5, 5.0 reason "
            "0x87), and never takes over the owner's live connection; "
            "``new_session`` instead discards the unconnected session (its "
            "queue with it) and starts a new one.  What a session delivers is"
            " checked against its reader's current rights."
        ),
    ),
    Key(
        "limits",
        "max_inflight_messages",
        int,
        20,
        "unacknowledged QoS 1/2 messages per client",
        1,
        65535,
        doc="Further messages wait in the client's queue.",
    ),
    Key(
        "limits",
        "max_persistent_sessions",
        int,
        0,
        "persistent sessions kept at once; a client that would start one more"
        " gets CONNACK 3 (0: no limit)",
        0,
        doc=(
            "CONNACK 3 means server unavailable; sessions that exist may "
            "always come back."
        ),
    ),
    Key(
        "limits",
        "max_retained_messages",
        int,
        0,
        "retained messages kept at once; beyond it a new retained topic is"
        " delivered but not retained (0: no limit)",
        0,
        doc=(
            "``$SYS`` topics are not counted.  A retained publish beyond it "
            "is counted and logged (rate-limited)."
        ),
    ),
    Key(
        "limits",
        "max_shared_groups",
        int,
        10_000,
        "shared subscription groups ($share/GROUP/FILTER) at once; beyond it a"
        " new one is refused (SUBACK 0x97, or 0x80 for 3.1.1)",
        1,
    ),
    Key(
        "limits",
        "max_shared_group_members",
        int,
        1000,
        "members of one shared subscription group; beyond it one more is refused",
        1,
        doc="SUBACK 0x97 (quota exceeded) for 5.0 clients, 0x80 for 3.1.1.",
    ),
    Key(
        "limits",
        "max_queued_messages",
        int,
        1000,
        "messages queued per client beyond the in-flight window (every queue"
        " has a bound: mosquitto's 0 for unlimited is refused)",
        1,
        doc=(
            "While it is offline (persistent sessions) or while its socket is"
            " full.  Beyond this, new messages for that client are dropped, "
            "counted and logged."
        ),
    ),
    Key(
        "limits",
        "max_queued_bytes",
        int,
        16 * 1024 * 1024,
        "payload bytes queued per client (at least 1: no unlimited queue)",
        1,
        doc="The same rule as max_queued_messages.",
    ),
    Key(
        "limits",
        "max_subscriptions",
        int,
        10_000,
        "topic filters one client may hold; more are refused (SUBACK 0x80)",
        1,
        doc=(
            "A SUBSCRIBE over it, or over max_subscription_bytes, gets "
            "failure (0x80) for the filters beyond, one log line per packet, "
            "and counts them (``mqttgw_subscriptions_refused``); an MQTT 3.1 "
            "client, which has no failure code, is disconnected."
        ),
    ),
    Key(
        "limits",
        "max_subscription_bytes",
        int,
        1024 * 1024,
        "UTF-8 bytes of topic filters one client may hold; more are refused",
        1,
        doc="The same rule as max_subscriptions.",
    ),
    Key(
        "mqtt",
        "queue_qos0_messages",
        bool,
        False,
        "queue QoS 0 messages for offline persistent sessions",
        doc="As mosquitto's queue_qos0_messages.",
    ),
    Key(
        "mqtt",
        "max_qos",
        int,
        2,
        "highest QoS granted to subscriptions (and, to 5.0 clients, the maximum QoS they may publish)",
        0,
        2,
        doc=(
            "Requests above it are downgraded.  5.0 clients are told it in "
            "CONNACK (Maximum QoS); one publishing above it gets DISCONNECT "
            "0x9B."
        ),
    ),
    Key(
        "mqtt",
        "retry_interval",
        float,
        20.0,
        "seconds before an unacknowledged message is re-sent (0: only on reconnect)",
        0.0,
        doc=(
            "An outbound QoS 1/2 message (or PUBREL) is sent again with DUP "
            "set; the interval doubles on each retry, up to "
            "retry_max_interval."
        ),
    ),
    Key(
        "mqtt",
        "retry_max_interval",
        float,
        300.0,
        "longest interval between re-sends",
        0.001,
    ),
])


def default(path):
    """The default of the setting at ``path`` (``section.name``) among the rows here."""
    key = CONNECTION_KEYS.get(path) or BROKER_KEYS[path]
    return key.default


class Section:
    """
    One section's values, as attributes named by its keys
    (``settings.tls.cert``); made by :func:`section_class`, immutable.
    """

    __slots__ = ()
    # The section's name, for the error that names an unknown key.
    section_name = ""

    def __getattr__(self, name):
        # Only for a name that is no key of the section.
        raise AttributeError(f"[{self.section_name}] has no key {name!r}")


def section_class(name, keys):
    """The frozen class of section ``name``'s values: one attribute per key of ``keys``, in order."""
    title = "".join(part.title() for part in name.split("_"))
    cls = attr.make_class(
        f"{title}Section", [key.name for key in keys], bases=(Section,), frozen=True, slots=True
    )
    cls.section_name = name
    return cls

"""
A [[bridge]] table: its keys (the schema rows deploy/mqttgw.toml is
written from), its topic rules as mosquitto reads them, and the checked
settings a bridge runs from.
"""

import socket

import attr

from mqttgw.bridges.tls import client_tls_options
from mqttgw.broker.access import BRIDGE_STATE_PREFIX, notification_topic
from mqttgw.broker.topics import InvalidTopic, validate_topic_filter
from mqttgw.schema import REQUIRED, ConfigError, Key, check_table
from mqttgw.transports.tlsprofile import INTERMEDIATE_CIPHERS
from mqttgw.wire import packets as P

DIRECTIONS = ("in", "out", "both")

# The protocol key's values (mosquitto's names) and the levels they stand for.
PROTOCOLS = {"mqttv31": P.MQTT_31, "mqttv311": P.MQTT_311, "mqttv5": P.MQTT_5, "mqttv50": P.MQTT_5}
LEVEL_NAMES = {P.MQTT_31: "mqttv31", P.MQTT_311: "mqttv311", P.MQTT_5: "mqttv5"}


def default_client_id(name):
    """mosquitto's default, HOSTNAME.NAME: one config file on many sites
    still gives each site's bridge a session of its own upstream."""
    return f"{socket.gethostname()}.{name}"


@attr.s(frozen=True, slots=True)
class BridgeRule:
    """
    ``topic PATTERN [in|out|both [QOS [LOCAL_PREFIX REMOTE_PREFIX]]]``, as
    mosquitto reads it: locally the topic is LOCAL_PREFIX + PATTERN,
    upstream REMOTE_PREFIX + PATTERN.
    """

    pattern = attr.ib()
    direction = attr.ib(default="out")
    qos = attr.ib(default=0)
    local_prefix = attr.ib(default="")
    remote_prefix = attr.ib(default="")

    @classmethod
    def parse(cls, text):
        words = text.split()
        if words and words[0] == "topic":
            words = words[1:]
        if not 1 <= len(words) <= 5 or len(words) == 4:
            raise ValueError(
                f"rule {text!r}: expected PATTERN [in|out|both [QOS [LOCAL_PREFIX REMOTE_PREFIX]]]"
            )
        words = [w if w != '""' else "" for w in words]
        pattern, direction, qos, local, remote = words + [None] * (5 - len(words))
        if direction is not None and direction not in DIRECTIONS:
            raise ValueError(f"rule {text!r}: direction must be in, out or both")
        if qos is not None and qos not in ("0", "1", "2"):
            raise ValueError(f"rule {text!r}: QoS must be 0, 1 or 2")
        rule = cls(pattern, direction or "out", int(qos or 0), local or "", remote or "")
        for topic_filter in (rule.local_filter, rule.remote_filter):
            try:
                validate_topic_filter(topic_filter)
            except InvalidTopic as e:
                raise ValueError(f"rule {text!r}: {e}") from None
        return rule

    @property
    def local_filter(self):
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self):
        return self.remote_prefix + self.pattern

    @property
    def outgoing(self):
        return self.direction in ("out", "both")

    @property
    def incoming(self):
        return self.direction in ("in", "both")

    def to_remote(self, topic):
        return self.remote_prefix + topic[len(self.local_prefix):]

    def to_local(self, topic):
        return self.local_prefix + topic[len(self.remote_prefix):]


@attr.s(frozen=True)
class BridgeSettings:
    """A [[bridge]] table as check() makes it (BRIDGE_KEYS)."""

    name = attr.ib()
    addresses = attr.ib()
    rules = attr.ib()
    protocol_level = attr.ib()
    session_expiry_interval = attr.ib()
    client_id = attr.ib()
    username = attr.ib()
    password = attr.ib(repr=False)  # never in a log line
    clean_session = attr.ib()
    keepalive = attr.ib()
    try_private = attr.ib()
    tls = attr.ib()
    ca = attr.ib()
    cert = attr.ib()
    key = attr.ib()
    ciphers = attr.ib()
    qos0_policy = attr.ib()
    drop_policy = attr.ib()
    drain_messages_per_second = attr.ib()
    drain_bytes_per_second = attr.ib()
    max_queued_messages = attr.ib()
    max_queued_bytes = attr.ib()
    max_inflight_messages = attr.ib()
    state_topic = attr.ib()
    remote_state_topic = attr.ib()
    reconnect_initial = attr.ib()
    reconnect_max = attr.ib()
    max_sparkplug_wills = attr.ib(default=0)
    round_robin = attr.ib(default=False)
    session_fallback = attr.ib(default="clean")
    session_fallback_retry = attr.ib(default=300.0)


# [[bridge]] keys; deploy/mqttgw.toml shows each (mqttgw.service.example).
BRIDGE_KEYS = [
    Key(
        "bridge", "kind", str, "mqtt", "the bridge kind (a plugin's name)",
        doc="Found with Twisted's plugin system; ``mqtt`` is built in.",
    ),
    Key(
        "bridge", "name", str, REQUIRED, "the bridge's name",
        doc="Unique among the bridges.",
    ),
    Key(
        "bridge", "addresses", list, REQUIRED, "upstream HOST:PORT, tried in turn",
        doc=(
            "Failover, as mosquitto's bridges do it: after an address fails "
            "or its link is lost, the next one is tried first, each once a "
            "round, and the reconnect backs off only once all have failed.  "
            "An address that accepts CONNECT and closes the connection within"
            " 2 s has failed too (a cluster node that cannot serve the "
            "session).  See round_robin for going back to the first."
        ),
    ),
    Key(
        "bridge", "round_robin", bool, False, "addresses as equals: stay where the link works (mosquitto's round_robin)",
        doc=(
            "false: the first address is the main one; while on another, "
            "the bridge opens a TCP connection to the first every 5 s (less "
            "often after a return that did not last) and moves back once it "
            "is accepted.  true: it stays on whichever address works, as "
            "suits the nodes of one cluster."
        ),
    ),
    Key(
        "bridge", "rules", list, REQUIRED, "'PATTERN in|out|both QOS [LOCAL_PREFIX REMOTE_PREFIX]'",
        doc=(
            "Rules with mosquitto's meaning, ``PATTERN [in|out|both [QOS "
            "[LOCAL_PREFIX REMOTE_PREFIX]]]``.  out: local "
            "LOCAL_PREFIX+PATTERN goes upstream as REMOTE_PREFIX+PATTERN; in:"
            ' the reverse; both: either way.  Use ``""`` for an empty part.  '
            "A message brought in by a bridge is never sent back out by it."
        ),
    ),
    Key(
        "bridge", "protocol", str, "mqttv311", "MQTT version spoken upstream", choices=tuple(PROTOCOLS),
        doc=(
            "``mqttv311``, ``mqttv31`` or ``mqttv5`` (``mqttv50``, "
            "mosquitto's spelling, too).  Over 5.0 the bridge reads the "
            "upstream's limits from its CONNACK (receive maximum, maximum "
            "packet size, maximum QoS, retain available) and keeps to them, "
            "subscribes with no local instead of try_private, carries message"
            " properties both ways, and logs and counts the reason codes it "
            "is answered with."
        ),
    ),
    Key(
        "bridge", "protocol_version", int, 0, "MQTT protocol level upstream, 3, 4 or 5 (instead of protocol)", choices=(0, 3, 4, 5),
        doc="0: as protocol says.",
    ),
    Key(
        "bridge", "session_expiry_interval", int, 0xFFFFFFFF, "5.0: how long the upstream keeps the session after a link drop, s", 0, 0xFFFFFFFF,
        doc=(
            "Its subscriptions and what they queue; 4294967295 is for ever.  "
            "A clean_session bridge asks for none."
        ),
    ),
    Key(
        "bridge", "client_id", str, "", "client id upstream (default HOSTNAME.NAME, as mosquitto's)",
        doc=(
            "As with mosquitto, two bridges sharing one id take over each "
            "other's session upstream."
        ),
    ),
    Key("bridge", "username", str, "", "user name upstream"),
    Key("bridge", "password", str, "", "password upstream"),
    Key("bridge", "clean_session", bool, False, "a clean session upstream"),
    Key(
        "bridge", "session_fallback", str, "clean", "where no address resumes the persistent session: clean or wait", choices=("clean", "wait"),
        doc=(
            "An address resumes the persistent session (clean_session false)"
            " if it accepts CONNECT and keeps the link; where each address "
            "drops or refuses it (a cluster whose node holding the session "
            "is down), ``clean`` connects at once with a clean session under"
            " the client id CLIENT_ID/clean, subscribing the in rules again:"
            " the out rules keep flowing, and nothing the bridge holds for "
            "them is dropped; the in rules get what is published from then "
            "on, while what the upstream holds for the persistent session "
            "(left as it is) comes only once that is resumed, if the "
            "upstream kept it.  ``wait`` keeps trying the persistent session,"
            " and nothing flows meanwhile.  The persistent session is tried "
            "again at each reconnection and every session_fallback_retry "
            "seconds."
        ),
    ),
    Key(
        "bridge", "session_fallback_retry", float, 300.0, "seconds on a fallback clean session before the persistent one is tried again (0: at reconnections only)", 0.0,
        doc=(
            "The link is closed and the persistent session tried at the same"
            " address first; where it still cannot be resumed, the bridge "
            "is back on a clean session within the round."
        ),
    ),
    Key("bridge", "keepalive", int, 60, "keepalive upstream, seconds", 1, 65535),
    Key(
        "bridge", "try_private", bool, True, "announce itself as a bridge (mosquitto's try_private)",
        doc=(
            "So the upstream does not echo our own messages back (protocol "
            "level with 0x80 added).  An address that refuses it (CONNACK 1, "
            "as mosquitto) or closes the connection before CONNACK (as "
            "RabbitMQ) is asked again at once without it, and is not asked "
            "with it again while the gateway runs; the log says so once per "
            "address.  Not sent over 5.0 (no local does its work)."
        ),
    ),
    Key(
        "bridge", "tls", bool, False, "TLS to the upstream",
        doc=(
            "TLS 1.2 at least; the server's host name is checked too, and its"
            " certificate against ca."
        ),
    ),
    Key("bridge", "ca", str, "", "authorities the upstream's certificate is checked against"),
    Key(
        "bridge", "cert", str, "", "client certificate (PEM)",
        doc="Optional, with key.",
    ),
    Key("bridge", "key", str, "", "client key (PEM)"),
    Key(
        "bridge", "ciphers", str, INTERMEDIATE_CIPHERS, "TLS 1.2 cipher suites offered upstream (OpenSSL cipher string)",
        doc=(
            "The default is that of tls.ciphers, forward-secret AEAD suites "
            "only."
        ),
    ),
    Key(
        "bridge", "queue_qos0", bool, False, "queue QoS 0 messages while the upstream is away (qos0_policy memory)",
        doc='The same as ``qos0_policy = "memory"``.',
    ),
    Key(
        "bridge", "qos0_policy", str, "", "QoS 0 while the upstream is away: drop, memory or store", choices=("", "drop", "memory", "store"),
        doc=(
            "Dropped (``drop``), kept in ``memory`` (bounded by the queue "
            "bounds, lost at a restart, sent ahead of the QoS 1/2 backlog), "
            "or kept in the ``store`` with the QoS 1/2 ones (in order with "
            "them, kept across restarts, sent at QoS 0).  Empty: ``drop``, or"
            " ``memory`` with queue_qos0."
        ),
    ),
    Key(
        "bridge", "drop_policy", str, "oldest", "which message a full queue drops: oldest or newest", choices=("oldest", "newest"),
        doc=(
            "``oldest``: the newest readings get through; ``newest``: what "
            "waited longest gets through."
        ),
    ),
    Key(
        "bridge", "drain_messages_per_second", int, 0, "backlog drained at most this fast, live messages first (0: unpaced)", 0,
        doc=(
            "Drain pacing: once the upstream is back, what waited (the "
            "backlog) goes at most this many messages (and "
            "drain_bytes_per_second bytes) a second, and what arrives "
            "meanwhile goes first, so the newest readings are not behind the "
            "backlog.  Order then holds within the backlog and within the "
            "live messages, not between them.  0: unpaced, one order for "
            "everything."
        ),
    ),
    Key("bridge", "drain_bytes_per_second", int, 0, "backlog payload bytes drained a second at most (0: unpaced)", 0),
    Key(
        "bridge", "max_queued_messages", int, 100_000, "outage queue bound, messages", 1,
        doc=(
            "Beyond the outage queue's bounds the oldest messages are "
            "dropped, counted and logged (drop_policy)."
        ),
    ),
    Key("bridge", "max_queued_bytes", int, 256 * 1024 * 1024, "outage queue bound, bytes", 1),
    Key(
        "bridge", "max_inflight_messages", int, 20, "unacknowledged messages upstream", 1, 65535,
        doc=(
            "At most what the upstream takes from one client (mosquitto: its "
            "max_inflight_messages, 20 by default); MQTT 3.1.1 gives the "
            "bridge no way to ask, 5.0 does (the upstream's receive maximum, "
            "when lower, is used instead)."
        ),
    ),
    Key(
        "bridge", "state_topic", str, "", "local state topic (default mqttgw/bridge/NAME/state)",
        doc=(
            "Retained: ``1`` connected, ``0`` not.  Only the gateway writes "
            "under ``mqttgw/bridge/``."
        ),
    ),
    Key(
        "bridge", "remote_state_topic", str, "", "upstream state topic (default mosquitto's)",
        doc=(
            "The same upstream, there through the bridge's will.  Default, as"
            " mosquitto's notification topic: "
            "``$SYS/broker/connection/CLIENT_ID/state``, which an mqttgw "
            "upstream lets each client write for its own client id."
        ),
    ),
    Key(
        "bridge", "reconnect_initial", float, 1.0, "first reconnect delay, seconds", 0.001,
        doc=(
            "Reconnect with full jitter: after the n-th failed round, a wait "
            "drawn uniformly between reconnect_initial and min(reconnect_max,"
            " reconnect_initial * 2**n) seconds."
        ),
    ),
    Key("bridge", "reconnect_max", float, 60.0, "longest reconnect delay, seconds", 0.001),
    Key(
        "bridge", "max_sparkplug_wills", int, 100, "Sparkplug edge nodes whose NDEATH is held upstream as a will, one connection each (0: none)", 0, 65535,
        doc=(
            "For each node whose NBIRTH this bridge forwarded, one more "
            "connection upstream (client id CLIENT_ID/N) with that node's "
            "NDEATH as its will, so that the upstream's host applications see"
            " the node die if the uplink is lost for good."
        ),
    ),
]


def parse_address(address):
    """``host:port`` or ``[v6 host]:port``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


# Keys that BridgeSettings takes as the table gives them.
_AS_GIVEN = (
    "reconnect_initial", "reconnect_max", "max_sparkplug_wills", "round_robin", "session_fallback",
    "session_fallback_retry",
)


def check(table):
    """A [[bridge]] table checked into BridgeSettings; ConfigError names the key."""
    where = f"bridge {table.get('name', '?')!r}"
    values = check_table(BRIDGE_KEYS, table, where)
    for key in ("name", "addresses", "rules"):
        if not values[key]:
            raise ConfigError(f"{where}: bridge.{key} is required")
    try:
        rules = [BridgeRule.parse(r) for r in values["rules"]]
        for address in values["addresses"]:
            parse_address(address)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    name = values["name"]
    qos0_policy = values["qos0_policy"] or ("memory" if values["queue_qos0"] else "drop")
    if values["queue_qos0"] and qos0_policy != "memory":
        raise ConfigError(f"{where}: bridge.queue_qos0 and bridge.qos0_policy disagree")
    level = _protocol_level(values, table, where)
    client_id = values["client_id"] or default_client_id(name)
    if not values["client_id"] and level == P.MQTT_31:
        # 3.1 servers may refuse a client id over 23 characters.
        client_id = client_id[-23:]
    settings = BridgeSettings(
        name=name,
        addresses=list(values["addresses"]),
        rules=rules,
        protocol_level=level,
        # A clean session ends with its connection.
        session_expiry_interval=0 if values["clean_session"] else values["session_expiry_interval"],
        client_id=client_id,
        username=values["username"] or None,
        password=values["password"].encode() or None,
        clean_session=values["clean_session"],
        keepalive=values["keepalive"],
        try_private=values["try_private"],
        tls=values["tls"],
        ca=values["ca"] or None,
        cert=values["cert"] or None,
        key=values["key"] or None,
        ciphers=values["ciphers"],
        qos0_policy=qos0_policy,
        drop_policy=values["drop_policy"],
        drain_messages_per_second=values["drain_messages_per_second"],
        drain_bytes_per_second=values["drain_bytes_per_second"],
        max_queued_messages=values["max_queued_messages"],
        max_queued_bytes=values["max_queued_bytes"],
        max_inflight_messages=values["max_inflight_messages"],
        state_topic=values["state_topic"] or f"{BRIDGE_STATE_PREFIX}{name}/state",
        remote_state_topic=values["remote_state_topic"] or notification_topic(client_id),
        **{name: values[name] for name in _AS_GIVEN},
    )
    if settings.reconnect_max < settings.reconnect_initial:
        raise ConfigError(f"{where}: bridge.reconnect_max must not be below reconnect_initial")
    if settings.tls:
        client_tls_options(settings, "localhost")  # files checked at start-up
    return settings


def _protocol_level(values, table, where):
    """The level spoken upstream: protocol_version if given, else protocol."""
    level = PROTOCOLS[values["protocol"]]
    if values["protocol_version"]:
        if "protocol" in table and level != values["protocol_version"]:
            raise ConfigError(f"{where}: bridge.protocol and bridge.protocol_version disagree")
        level = values["protocol_version"]
    return level

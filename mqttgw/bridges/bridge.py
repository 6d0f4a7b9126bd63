"""
The MQTT bridge: forwards chosen local topics to an upstream broker and
brings chosen upstream topics down.  It is a client of the router with a
persistent session of its own, so what it cannot forward while the
upstream is away waits in the store, in order, and is removed only when
the upstream has acknowledged it.

Over 5.0 the upstream keeps the bridge's session for its session expiry
interval, tells it its limits in CONNACK (receive maximum, maximum packet
size, maximum QoS, retain available), which the bridge keeps to, and
sends back none of the bridge's own messages (no local); message
properties travel both ways, and the reason codes it answers with are
logged and counted.
"""

import random
import socket
from collections import Counter, deque

import attr
from twisted.application.internet import ClientService
from twisted.application.service import Service
from twisted.internet import ssl
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.bridges.client import ConnectRefused, MQTTClientFactory
from mqttgw.broker.access import BRIDGE_STATE_PREFIX, notification_topic
from mqttgw.broker.session import INTERNAL_PREFIX, Pacer, SessionLimits
from mqttgw.broker.store import OrderedAcks
from mqttgw.broker.topics import InvalidTopic, matches, validate_topic_filter
from mqttgw.schema import REQUIRED, ConfigError, Key, check_table
from mqttgw.transports.mqtt5 import Connection5
from mqttgw.transports.tls import INTERMEDIATE_CIPHERS, acceptable_ciphers, pem_certificates, read_file
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R

log = Logger()

DIRECTIONS = ("in", "out", "both")

# The protocol key's values (mosquitto's names) and the levels they stand for.
PROTOCOLS = {"mqttv31": P.MQTT_31, "mqttv311": P.MQTT_311, "mqttv5": P.MQTT_5, "mqttv50": P.MQTT_5}
LEVEL_NAMES = {P.MQTT_31: "mqttv31", P.MQTT_311: "mqttv311", P.MQTT_5: "mqttv5"}
# A link the upstream closes this soon after accepting it is counted as
# a likely takeover of its client id.
TAKEOVER_SECONDS = 2.0


def default_client_id(name):
    """mosquitto's default, HOSTNAME.NAME: one config file on many sites
    still gives each site's bridge a session of its own upstream."""
    return f"{socket.gethostname()}.{name}"

# 5.0: topic aliases the upstream may use toward the bridge.
UPSTREAM_TOPIC_ALIASES = 64

# 5.0 subscription options of the bridge's subscriptions upstream: no
# local (none of its own messages back, which 3.1.1 can only ask for with
# try_private) and retain as published (a retained message stays one here).
_NO_LOCAL = 0x04
_RETAIN_AS_PUBLISHED = 0x08


@attr.s(frozen=True, slots=True)
class Rule:
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
    """A [[bridge]] table as MQTTBridgeKind.check makes it (BRIDGE_KEYS)."""

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


# [[bridge]] keys; deploy/mqttgw.toml documents each.
BRIDGE_KEYS = [
    Key("bridge", "kind", str, "mqtt", "the bridge kind (a plugin's name)"),
    Key("bridge", "name", str, REQUIRED, "the bridge's name"),
    Key("bridge", "addresses", list, REQUIRED, "upstream HOST:PORT, tried in turn"),
    Key("bridge", "rules", list, REQUIRED, "'PATTERN in|out|both QOS [LOCAL_PREFIX REMOTE_PREFIX]'"),
    Key("bridge", "protocol", str, "mqttv311", "MQTT version spoken upstream", choices=tuple(PROTOCOLS)),
    Key("bridge", "protocol_version", int, 0, "MQTT protocol level upstream, 3, 4 or 5 (instead of protocol)", choices=(0, 3, 4, 5)),
    Key("bridge", "session_expiry_interval", int, 0xFFFFFFFF, "5.0: how long the upstream keeps the session after a link drop, s", 0, 0xFFFFFFFF),
    Key("bridge", "client_id", str, "", "client id upstream (default HOSTNAME.NAME, as mosquitto's)"),
    Key("bridge", "username", str, "", "user name upstream"),
    Key("bridge", "password", str, "", "password upstream"),
    Key("bridge", "clean_session", bool, False, "a clean session upstream"),
    Key("bridge", "keepalive", int, 60, "keepalive upstream, seconds", 1, 65535),
    Key("bridge", "try_private", bool, True, "announce itself as a bridge (mosquitto's try_private)"),
    Key("bridge", "tls", bool, False, "TLS to the upstream"),
    Key("bridge", "ca", str, "", "authorities the upstream's certificate is checked against"),
    Key("bridge", "cert", str, "", "client certificate (PEM)"),
    Key("bridge", "key", str, "", "client key (PEM)"),
    Key("bridge", "ciphers", str, INTERMEDIATE_CIPHERS, "TLS 1.2 cipher suites offered upstream (OpenSSL cipher string)"),
    Key("bridge", "queue_qos0", bool, False, "queue QoS 0 messages while the upstream is away (qos0_policy memory)"),
    Key("bridge", "qos0_policy", str, "", "QoS 0 while the upstream is away: drop, memory or store", choices=("", "drop", "memory", "store")),
    Key("bridge", "drop_policy", str, "oldest", "which message a full queue drops: oldest or newest", choices=("oldest", "newest")),
    Key("bridge", "drain_messages_per_second", int, 0, "backlog drained at most this fast, live messages first (0: unpaced)", 0),
    Key("bridge", "drain_bytes_per_second", int, 0, "backlog payload bytes drained a second at most (0: unpaced)", 0),
    Key("bridge", "max_queued_messages", int, 100_000, "outage queue bound, messages", 1),
    Key("bridge", "max_queued_bytes", int, 256 * 1024 * 1024, "outage queue bound, bytes", 1),
    Key("bridge", "max_inflight_messages", int, 20, "unacknowledged messages upstream", 1, 65535),
    Key("bridge", "state_topic", str, "", "local state topic (default mqttgw/bridge/NAME/state)"),
    Key("bridge", "remote_state_topic", str, "", "upstream state topic (default mosquitto's)"),
    Key("bridge", "reconnect_initial", float, 1.0, "first reconnect delay, seconds", 0.001),
    Key("bridge", "reconnect_max", float, 60.0, "longest reconnect delay, seconds", 0.001),
]


def full_jitter(initial, maximum):
    """
    Reconnect delays with full jitter: after the ``n``th failed round,
    anywhere between ``initial`` and ``min(maximum, initial * 2**n)``,
    uniformly, so gateways that lost the same upstream at once do not all
    come back at once (and none sooner than ``initial``).
    """

    def delay(failed_rounds):
        cap = min(maximum, initial * 2.0 ** min(failed_rounds, 64))
        return initial + random.random() * (cap - initial)

    return delay


def parse_address(address):
    """``host:port`` or ``[v6 host]:port``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class MQTTBridgeKind:
    name = "mqtt"

    @staticmethod
    def check(table):
        where = f"bridge {table.get('name', '?')!r}"
        values = check_table(BRIDGE_KEYS, table, where)
        for key in ("name", "addresses", "rules"):
            if not values[key]:
                raise ConfigError(f"{where}: bridge.{key} is required")
        try:
            rules = [Rule.parse(r) for r in values["rules"]]
            for address in values["addresses"]:
                parse_address(address)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        name = values["name"]
        qos0_policy = values["qos0_policy"] or ("memory" if values["queue_qos0"] else "drop")
        if values["queue_qos0"] and qos0_policy != "memory":
            raise ConfigError(f"{where}: bridge.queue_qos0 and bridge.qos0_policy disagree")
        level = PROTOCOLS[values["protocol"]]
        if values["protocol_version"]:
            if "protocol" in table and level != values["protocol_version"]:
                raise ConfigError(f"{where}: bridge.protocol and bridge.protocol_version disagree")
            level = values["protocol_version"]
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
            reconnect_initial=values["reconnect_initial"],
            reconnect_max=values["reconnect_max"],
        )
        if settings.reconnect_max < settings.reconnect_initial:
            raise ConfigError(f"{where}: bridge.reconnect_max must not be below reconnect_initial")
        if settings.tls:
            _tls_options(settings, "localhost")  # files checked at start-up
        return settings

    @staticmethod
    def make_service(router, settings, reactor):
        return MQTTBridge(router, settings, reactor)


def _tls_options(settings, hostname):
    where = f"bridge {settings.name!r}"
    trust = None
    if settings.ca:
        [authority, *_] = pem_certificates(read_file(settings.ca, f"{where} ca"), settings.ca, f"{where} ca")
        trust = ssl.Certificate(authority)
    client = None
    if settings.cert:
        try:
            client = ssl.PrivateCertificate.loadPEM(
                read_file(settings.cert, f"{where} cert") + b"\n" + read_file(settings.key or settings.cert, f"{where} key")
            )
        except Exception as e:
            raise ConfigError(f"{where}: client certificate {settings.cert}: {e}") from None
    # As the listeners': TLS 1.2 at least, forward-secret AEAD suites by default.
    return ssl.optionsForClientTLS(
        hostname,
        trustRoot=trust,
        clientCertificate=client,
        extraCertificateOptions={
            "raiseMinimumTo": ssl.TLSVersion.TLSv1_2,
            "acceptableCiphers": acceptable_ciphers(settings.ciphers, f"{where}: bridge.ciphers"),
        },
    )


@implementer(IStreamClientEndpoint)
class FailoverEndpoint:
    """
    Tries each upstream address in turn, the first one first.  A connection
    counts only once the upstream has accepted CONNECT, so a failed TLS
    handshake or a refusal moves on to the next address, and when all fail
    the reconnect backs off.
    """

    def __init__(self, reactor, settings, on_refused):
        self.reactor = reactor
        self.settings = settings
        self.on_refused = on_refused

    def __repr__(self):
        # ClientService names its endpoint when it logs a retry.
        return f"bridge {self.settings.name} upstream {', '.join(self.settings.addresses)}"

    def _endpoint(self, address):
        host, port = parse_address(address)
        endpoint = HostnameEndpoint(self.reactor, host, port, timeout=10)
        if self.settings.tls:
            endpoint = wrapClientTLS(_tls_options(self.settings, host), endpoint)
        return endpoint

    @inlineCallbacks
    def connect(self, factory):
        failure = None
        for address in self.settings.addresses:
            try:
                protocol = yield self._endpoint(address).connect(factory)
                try:
                    yield protocol.connack
                except Exception:
                    _forget_loss(protocol)
                    raise
                log.info(
                    "bridge {name}: connected to {address}",
                    name=self.settings.name,
                    address=address,
                )
                return protocol
            except Exception as e:
                failure = e
                log.warn(
                    "bridge {name}: upstream {address} unreachable: {error}",
                    name=self.settings.name,
                    address=address,
                    error=_describe(e),
                )
                if isinstance(e, ConnectRefused):
                    self.on_refused(e)
        raise failure


def _forget_loss(protocol):
    """
    A connection that failed before its CONNACK is an attempt that failed,
    which ClientService learns from connect() failing.  The wrapper it put
    around the protocol would also report the connection's loss, for
    which ClientService has no transition while connecting or waiting
    (automat's NoTransition, logged as a traceback); so that report is
    dropped.  The protocol itself still sees connectionLost.
    """
    if "_lostNotification" in vars(protocol):
        protocol._lostNotification = lambda reason: None


def _describe(error):
    """A one-line reason, TLS errors included."""
    text = str(error) or type(error).__name__
    reasons = getattr(error, "reason", None)
    if hasattr(reasons, "getErrorMessage"):
        text = reasons.getErrorMessage()
    return text.replace("\n", " ")


class _Relay:
    """
    The bridge session's connection: PUBLISH and PUBREL packets the session
    sends go upstream, topics rewritten by the out rules.

    The session writes whole frames, so only their headers are read here;
    a frame whose topic stays the same upstream goes on as it is.  A 5.0
    frame's topic is where a 3.1.1 frame's is, its properties after it.
    """

    # Topics whose route is remembered, at most (then it starts over).
    ROUTES = 10_000

    def __init__(self, bridge, upstream):
        self.bridge = bridge
        self.upstream = upstream
        # Whether the session's frames are 5.0's.
        self.frames5 = bridge.settings.protocol_level == P.MQTT_5
        # Local topic (wire bytes) -> remote topic (wire bytes), or None
        # when no out rule takes it.
        self._routes = {}

    def _route(self, topic_wire):
        topic = topic_wire[2:].decode("utf-8")
        rule = self.bridge.out_rule(topic)
        route = None if rule is None else P.encode_string(rule.to_remote(topic))
        if len(self._routes) >= self.ROUTES:
            self._routes.clear()
        self._routes[topic_wire] = route
        return route

    def write(self, data):
        out = []
        o, end = 0, len(data)
        while o < end:
            first = data[o]
            body, length = P.decode_remaining_length(data, o + 1)
            stop = body + length
            if first >> 4 != P.PUBLISH:
                out.append(data[o:stop])
                o = stop
                continue
            topic_end = body + 2 + ((data[body] << 8) | data[body + 1])
            topic_wire = data[body:topic_end]
            routes = self._routes
            remote = routes[topic_wire] if topic_wire in routes else self._route(topic_wire)
            if remote is None:
                o = stop
                continue
            if remote == topic_wire:
                frame = data[o:stop]
            else:
                rest = data[topic_end:stop]
                frame = b"".join((
                    bytes((first,)), P.encode_remaining_length(len(remote) + len(rest)), remote, rest,
                ))
            out.append(frame)
            o = stop
            if not first & 0x08:  # not a DUP: a first send
                self.bridge.sent += 1
                recorder = self.bridge.router.recorder
                if recorder is not None:
                    message = _message(first, remote, data[topic_end:stop], self.frames5)
                    recorder.record("bridge_out", self.bridge.settings.name, message)
        if out:
            self.upstream.write(b"".join(out) if len(out) != 1 else out[0])


def _message(first, remote, rest, v5=False):
    """What the archive records of a frame sent upstream: its message as sent."""
    qos = (first >> 1) & 3
    start = 2 if qos else 0
    if v5:
        start, length = P.decode_remaining_length(rest, start)
        start += length
    return P.Publish(remote[2:].decode("utf-8"), rest[start:], qos, bool(first & 1))


class _Upstream5(Connection5):
    """
    The 5.0 framing of what the bridge sends upstream, within the limits
    the upstream's CONNACK gave: its maximum packet size (less what the out
    rules' prefixes may add), and no RETAIN flag if it has no retained
    messages.  No topic aliases: the frames' topics are rewritten after.
    """

    __slots__ = ("retain_available",)

    def __init__(self, clock, server, growth):
        limit = server.get("maximum_packet_size")
        if limit is not None:
            # The topic rewritten may also lengthen Remaining Length, by
            # at most 3 bytes.
            limit = max(limit - growth - 3, 0)
        super().__init__(
            clock,
            {"maximum_packet_size": limit},
            UPSTREAM_TOPIC_ALIASES,
            65535,
        )
        self.retain_available = server.get("retain_available", 1) == 1

    def frame(self, message, qos, mid, retain, dup, subscription_ids):
        # Subscription identifiers are this broker's, nothing upstream's.
        return super().frame(message, qos, mid, retain and self.retain_available, dup, None)


class MQTTBridge(Service):
    def __init__(self, router, settings, reactor):
        self.router = router
        # Only the bridge itself says whether it is connected.
        router.access.reserved_topics.add(settings.state_topic)
        self.settings = settings
        self.reactor = reactor
        self.name = f"bridge {settings.name}"
        self.session_id = f"{INTERNAL_PREFIX}bridge/{settings.name}"
        self.session = None
        self.upstream = None
        self._acks = None
        self._try_private = settings.try_private
        # 5.0: the will as the upstream takes it (see connect_failed).
        self._will_retain = True
        self._will_qos = 1
        self._service = None
        # Messages forwarded upstream (first sends) and brought in.
        self.sent = 0
        self.received = 0
        self.connected_since = None
        self.v5 = settings.protocol_level == P.MQTT_5
        # 5.0: the upstream connection's framing and limits (_Upstream5).
        self._upstream5 = None
        # 5.0 reason codes the upstream answered with, other than success,
        # by "PACKET reason name"; and how many said a message was refused.
        self.reason_codes = Counter()
        self.refused = 0
        # Times the link came up or went down; links lost in a row soon
        # after they were accepted.
        self.link_changes = 0
        self.short_links = 0
        # (clock time, sent) samples of the last minute, for the drain rate.
        self._sent_samples = deque(maxlen=64)

    def status(self):
        """What operators see: $SYS, /metrics and the admin API."""
        session = self.session
        upstream = self.upstream
        now = self.reactor.seconds()
        oldest = session.oldest_waiting() if session is not None else None
        dropped = session.dropped if session is not None else 0
        too_large = session.dropped_too_large if session is not None else 0
        return {
            "name": self.settings.name,
            "kind": "mqtt",
            "protocol": LEVEL_NAMES[self.settings.protocol_level],
            "addresses": list(self.settings.addresses),
            "connected": upstream is not None,
            "connected_since": self.connected_since,
            "queued": session.queued if session is not None else 0,
            "inflight": len(session.inflight) if session is not None else 0,
            "window": session.window if session is not None else 0,
            "dropped": dropped,
            "queued_bytes": session.queued_bytes if session is not None else 0,
            # Seconds the oldest message waiting for the upstream has waited.
            "oldest_queued_s": None if oldest is None else round(now - oldest, 3),
            "drain_rate": self.drain_rate(now),
            "drops": {
                "queue_full": dropped - too_large,
                "too_large": too_large,
                "expired": session.dropped_expired if session is not None else 0,
                "refused": self.refused,
            },
            "link_changes": self.link_changes,
            "sent": self.sent,
            "received": self.received,
            "refused": self.refused,
            "reason_codes": dict(self.reason_codes),
            # 5.0: the limits the upstream's CONNACK gave.
            "upstream_limits": dict(upstream.server_properties) if upstream is not None else {},
        }

    def drain_rate(self, now):
        """Messages sent upstream a second, over up to the last minute."""
        samples = self._sent_samples
        if not samples or now - samples[-1][0] >= 1.0:
            samples.append((now, self.sent))
        while len(samples) > 2 and now - samples[1][0] >= 60.0:
            samples.popleft()
        first_at, first_sent = samples[0]
        if now - first_at <= 0:
            return 0.0
        return round((self.sent - first_sent) / (now - first_at), 3)

    # Rules

    def out_rule(self, topic):
        for rule in self.settings.rules:
            if rule.outgoing and matches(rule.local_filter, topic):
                return rule
        return None

    def in_rule(self, topic):
        for rule in self.settings.rules:
            if rule.incoming and matches(rule.remote_filter, topic):
                return rule
        return None

    # Service

    def startService(self):
        super().startService()
        s = self.settings
        session, _ = self.router.connect(self.session_id, clean_session=False)
        session.no_local = True
        session.retain_as_published = True
        session.limits = SessionLimits(
            max_inflight_messages=s.max_inflight_messages,
            max_queued_messages=s.max_queued_messages,
            max_queued_bytes=s.max_queued_bytes,
            queue_qos0_messages=s.qos0_policy == "memory",
            store_qos0_messages=s.qos0_policy == "store",
            drop_oldest=s.drop_policy == "oldest",
            retry_interval=0,
        )
        self.session = session
        session.pacer = None
        if s.drain_messages_per_second or s.drain_bytes_per_second:
            session.pacer = Pacer(s.drain_messages_per_second, s.drain_bytes_per_second)
        self._subscribe_locally()
        self._publish_local_state(b"0")
        self._factory = MQTTClientFactory(self._connect_packet(), self, self.reactor)
        self._service = ClientService(
            FailoverEndpoint(self.reactor, s, self.connect_failed),
            self._factory,
            retryPolicy=full_jitter(s.reconnect_initial, s.reconnect_max),
            clock=self.reactor,
        )
        self._service.startService()

    def _subscribe_locally(self):
        """The bridge session's subscriptions: the out rules' local filters, at their QoS."""
        session = self.session
        wanted = {r.local_filter: r.qos for r in self.settings.rules if r.outgoing}
        for topic_filter in list(session.subscriptions):
            if topic_filter not in wanted:
                self.router.unsubscribe(session, [topic_filter])
        self.router.subscribe(
            session,
            [(f, q) for f, q in wanted.items() if session.subscriptions.get(f) != q],
        )

    def _connect_packet(self):
        s = self.settings
        properties = will_properties = None
        if self.v5:
            # No try_private: no local does its work.
            level = s.protocol_level
            properties = {"topic_alias_maximum": UPSTREAM_TOPIC_ALIASES}
            if s.session_expiry_interval:
                properties["session_expiry_interval"] = s.session_expiry_interval
            will_properties = {}
        else:
            level = s.protocol_level | (0x80 if self._try_private else 0)
        return P.Connect(
            client_id=s.client_id,
            protocol_level=level,
            protocol_name=P.PROTOCOL_NAMES[s.protocol_level],
            clean_session=s.clean_session,
            keepalive=s.keepalive,
            will_topic=s.remote_state_topic,
            will_message=b"0",
            will_qos=self._will_qos,
            will_retain=self._will_retain,
            username=s.username,
            password=s.password,
            properties=properties,
            will_properties=will_properties,
        )

    def stopService(self):
        super().stopService()
        d = self._service.stopService() if self._service else None
        if self.session is not None and self.session.connection is not None:
            self.router.disconnect(self.session, publish_will=False)
        self._publish_local_state(b"0")
        # Reserved again by whichever bridge takes it next.
        self.router.access.reserved_topics.discard(self.settings.state_topic)
        return d

    def _publish_local_state(self, value):
        self.router.publish(P.Publish(self.settings.state_topic, value, 1, True))

    # The upstream connection (the MQTTClientProtocol handler)

    def connected(self, upstream):
        s = self.settings
        log.info("bridge {name}: upstream accepted CONNECT", name=s.name)
        self.upstream = upstream
        self.link_changes += 1
        self.connected_since = self.reactor.seconds()
        self._acks = OrderedAcks(self.router.store, self._write_upstream(upstream))
        store = self.router.store
        if store is not None:
            # A disk behind the traffic holds the upstream back, as it does
            # local clients (see Store.congestion_listeners).
            if self._store_congestion not in store.congestion_listeners:
                store.congestion_listeners.append(self._store_congestion)
            if store.congested:
                upstream.transport.pauseProducing()
        # The store could not commit what came in: the upstream sends it
        # again after we reconnect.
        self._acks.on_failure = lambda _: upstream.transport.abortConnection()
        incoming = [(r.remote_filter, r.qos) for r in s.rules if r.incoming]
        encoder = receive_maximum = None
        retain = True
        session = self.session
        if not upstream.session_present:
            # A new session upstream: the ids of QoS 2 messages it had not
            # released are free again there, and must be here too.
            session.forget_inbound_qos2()
        session.max_qos = 2
        if self.v5:
            server = upstream.server_properties
            log.info(
                "bridge {name}: upstream limits: receive maximum {receive}, maximum packet"
                " size {size}, maximum QoS {qos}, retain {retain}",
                name=s.name,
                receive=server.get("receive_maximum", 65535),
                size=server.get("maximum_packet_size", "unlimited"),
                qos=server.get("maximum_qos", 2),
                retain="available" if server.get("retain_available", 1) else "not available",
            )
            growth = max(
                (len(r.remote_prefix.encode()) - len(r.local_prefix.encode()) for r in s.rules),
                default=0,
            )
            encoder = self._upstream5 = _Upstream5(self.reactor, server, max(growth, 0))
            retain = encoder.retain_available
            # The upstream's receive maximum bounds the in-flight window.
            receive_maximum = server.get("receive_maximum", 65535)
            # Nothing above its maximum QoS, queued and in flight included
            # ([MQTT-3.2.2-11]): the session sends at most that.
            session.max_qos = server.get("maximum_qos", 2)
            options = _NO_LOCAL | _RETAIN_AS_PUBLISHED
            incoming = [(f, q | options) for f, q in incoming]
            subscribe = P.Subscribe(1, incoming, {})
        else:
            subscribe = P.Subscribe(1, incoming)
        if incoming:
            upstream.write(subscribe.encode())
        state = P.Publish(s.remote_state_topic, b"1", 0, retain, properties={} if self.v5 else None)
        upstream.write(state.encode())
        self._publish_local_state(b"1")
        # What waited while the upstream was away drains now, in order.
        self.session.attach(_Relay(self, upstream), encoder, receive_maximum)

    def _store_congestion(self, congested):
        upstream = self.upstream
        if upstream is not None:
            if congested:
                upstream.transport.pauseProducing()
            else:
                upstream.transport.resumeProducing()

    def _write_upstream(self, upstream):
        def write(data):
            if self.upstream is upstream:
                upstream.write(data)

        return write

    def disconnected(self, upstream, reason):
        log.info(
            "bridge {name}: upstream connection lost: {reason}",
            name=self.settings.name,
            reason=reason.getErrorMessage(),
        )
        since = self.connected_since
        if self.upstream is upstream and since is not None:
            if self.reactor.seconds() - since >= TAKEOVER_SECONDS:
                self.short_links = 0
            else:
                # An upstream closes a session's older connection when
                # another client connects with its client id: two bridges
                # sharing one id take each other's messages and packet ids.
                self.short_links += 1
            if self.short_links in (3, 30, 300):
                log.warn(
                    "bridge {name}: {count} connections in a row were lost within {seconds:g} s"
                    " of the upstream accepting them: is another client connecting as"
                    " {client_id!r}? Each site's bridge needs its own client_id",
                    name=self.settings.name, count=self.short_links, seconds=TAKEOVER_SECONDS,
                    client_id=self.settings.client_id,
                )
        if self.upstream is upstream:
            self.upstream = None
            store = self.router.store
            if store is not None and self._store_congestion in store.congestion_listeners:
                store.congestion_listeners.remove(self._store_congestion)
            self.link_changes += 1
            self.connected_since = None
            if self.session.connection is not None:
                self.router.disconnect(self.session, publish_will=False)
            self._publish_local_state(b"0")

    def packet(self, upstream, packet):
        session = self.session
        kind = type(packet)
        if kind is P.Publish:
            self._incoming(packet)
        elif kind is P.Puback:
            if packet.reason_code:
                self._reason("PUBACK", packet.reason_code, packet)
            session.puback(packet.message_id)
        elif kind is P.Pubrec:
            failed = packet.reason_code >= 0x80
            if packet.reason_code:
                self._reason("PUBREC", packet.reason_code, packet)
            session.pubrec(packet.message_id, failed)
        elif kind is P.Pubcomp:
            if packet.reason_code:
                self._reason("PUBCOMP", packet.reason_code, packet)
            session.pubcomp(packet.message_id)
        elif kind is P.Pubrel:
            mid = packet.message_id
            if packet.reason_code:
                self._reason("PUBREL", packet.reason_code, packet)
            self._acks.send(P.pubcomp_bytes(mid), session.qos2_released(mid))
        elif kind is P.Suback:
            refused = [code for code in packet.granted_qos if code >= 0x80]
            if self.v5:
                for code in refused:
                    self._reason("SUBACK", code, packet)
            elif refused:
                log.warn(
                    "bridge {name}: upstream refused a subscription: {granted}",
                    name=self.settings.name,
                    granted=packet.granted_qos,
                )
        elif kind is P.Disconnect:
            if packet.reason_code:
                self._reason("DISCONNECT", packet.reason_code, packet)
            else:
                log.info("bridge {name}: upstream disconnected normally", name=self.settings.name)

    def _reason(self, packet_name, code, packet):
        """
        A 5.0 reason code other than success from the upstream: counted by
        packet and name, and a failure (0x80 and above) logged, at most a
        few times a second, with the upstream's reason string if it gave one.
        """
        self.reason_codes[f"{packet_name} {R.name(code)}"] += 1
        if code < 0x80 and packet_name != "DISCONNECT":
            return
        if packet_name in ("PUBACK", "PUBREC"):
            # The upstream will not take the message: it is not sent again.
            self.refused += 1
        why = (packet.properties or {}).get("reason_string")
        self.router.limited(f"bridge {self.settings.name} reasons", log).warn(
            "bridge {name}: upstream answered {packet} with {code:#04x} ({reason}){why}",
            name=self.settings.name,
            packet=packet_name,
            code=code,
            reason=R.name(code),
            why=f": {why}" if why else "",
        )

    def _incoming(self, packet):
        session = self.session
        self.received += 1
        if self.v5:
            # Its topic alias resolved; its message properties kept.
            self._upstream5.inbound_topic(packet)
        rule = self.in_rule(packet.topic)
        message = None
        if rule is not None:
            message = P.Publish(
                rule.to_local(packet.topic), packet.payload, packet.qos, packet.retain,
                properties=packet.properties,
            )
            message.expiry = packet.expiry
        if packet.qos == 0:
            if message is not None:
                self.router.publish(message, sender=session)
        elif packet.qos == 1:
            held = None if message is None else self.router.publish_held(message, session)
            self._acks.send(P.puback_bytes(packet.message_id), held is not None, held)
        else:
            mid = packet.message_id
            durable = False
            if session.qos2_received(mid):
                routed = message is not None and self.router.publish(message, sender=session)
                durable = routed or session.store is not None
            self._acks.send(P.pubrec_bytes(mid), durable)

    def connect_failed(self, error):
        if error.v5 and error.code in (R.RETAIN_NOT_SUPPORTED, R.QOS_NOT_SUPPORTED):
            # An upstream without retained messages, or with a maximum QoS
            # of 0, refuses the will as it was ([MQTT-3.2.2-13], [MQTT-3.2.2-12]).
            if error.code == R.RETAIN_NOT_SUPPORTED and self._will_retain:
                self._will_retain = False
            elif error.code == R.QOS_NOT_SUPPORTED and self._will_qos:
                self._will_qos = 0
            else:
                return
            log.info(
                "bridge {name}: upstream refused the will ({reason}); asking again with"
                " will QoS {qos}, {retain}",
                name=self.settings.name,
                reason=R.name(error.code),
                qos=self._will_qos,
                retain="retained" if self._will_retain else "not retained",
            )
            self._factory.connect_packet = self._connect_packet()
            return
        if error.code == 1 and self._try_private:
            log.info(
                "bridge {name}: upstream does not take bridge CONNECTs; trying plain",
                name=self.settings.name,
            )
            self._try_private = False
            self._factory.connect_packet = self._connect_packet()

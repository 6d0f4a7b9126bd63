"""
What differs between the MQTT versions a bridge speaks upstream, in one
object per version chosen from the settings: the CONNECT it sends, the
terms of a link once accepted (the frames its session writes), its
SUBSCRIBE and state PUBLISH, what a refused subscription or will means,
how a frame it sent is read back, and for the link's client side
(bridges.client) how the upstream's packets are read, what a refused
CONNECT means and what goes out before a close.

Over 5.0 the upstream keeps the bridge's session for its session expiry
interval, tells it its limits in CONNACK (receive maximum, maximum packet
size, maximum QoS, retain available), which the bridge keeps to, and
sends back none of the bridge's own messages (no local).
"""

from twisted.logger import Logger

from mqttgw.broker.deliveryframes import PLAIN, EncodedFrames
from mqttgw.transports.mqtt5 import Connection5
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import Framer

log = Logger()

# What a 3.1/3.1.1 CONNACK's refusal says.
RETURN_CODES = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}

# 5.0: topic aliases the upstream may use toward the bridge.
UPSTREAM_TOPIC_ALIASES = 64

# 5.0 subscription options of the bridge's subscriptions upstream: no
# local (none of its own messages back, which 3.1.1 can only ask for with
# try_private) and retain as published (a retained message stays one here).
_NO_LOCAL = 0x04
_RETAIN_AS_PUBLISHED = 0x08


def upstream_version(settings):
    """The version object for a bridge's settings."""
    if settings.protocol_level == P.MQTT_5:
        return Upstream5(settings)
    return Upstream3(settings)


def upstream_versions(settings):
    """
    The version objects a bridge may speak, by protocol level: its own,
    and for a 5.0 bridge 3.1.1's, which an upstream that refuses 5.0 gets
    instead (bridges.upstreams).
    """
    versions = {settings.protocol_level: upstream_version(settings)}
    if settings.protocol_level == P.MQTT_5:
        versions[P.MQTT_311] = Upstream3(settings, P.MQTT_311)
    return versions


class Upstream3:
    """MQTT 3.1 and 3.1.1 upstream: no properties, return codes only."""

    # The will as the upstream takes it: 3.1/3.1.1 never refuses it for these.
    will_qos = 1
    will_retain = True

    def __init__(self, settings, level=None):
        self.settings = settings
        # The level spoken: the settings', or 3.1.1 where 5.0 was refused.
        self.level = level or (settings.protocol_level if settings is not None else P.MQTT_311)

    def connect(self, try_private, clean_fallback=False, remote_state=True):
        """
        The CONNECT sent upstream; try_private marks it a bridge's;
        clean_fallback makes it the clean session that stands in for the
        persistent one (see fallback_client_id); remote_state gives it
        the state topic's will.
        """
        level = self.level | (0x80 if try_private else 0)
        return _connect(self.settings, level, clean_fallback, remote_state and self, None, None)

    def carrier_connect(self, client_id, will_topic, will_message, will_qos):
        """The CONNECT of a link that holds an edge node's NDEATH upstream
        as its will (bridges.deaths)."""
        return _carrier_connect(self.settings, self.level, client_id, will_topic, will_message, will_qos, None)

    def protocol_refused(self, code):
        """Whether a CONNACK with ``code`` refuses the protocol level."""
        return code == P.CONNACK_UNACCEPTABLE_PROTOCOL

    def will_topic_refused(self, code):
        """
        Whether a CONNACK with ``code`` may refuse the will's topic: 3.1.1
        has no code for it, and an upstream that forbids ``$`` topics
        (ejabberd) answers one beyond those 3.1.1 defines.
        """
        return code > P.CONNACK_NOT_AUTHORIZED

    def attach(self, upstream, clock, session):
        """
        A link accepted: (the frames ``session`` writes upstream, see
        broker.deliveryframes; the upstream's receive maximum; its maximum QoS).
        """
        return PLAIN, None, 2

    def subscribe(self, incoming):
        return P.Subscribe(1, incoming)

    def state(self, topic, value):
        """The link's state message upstream."""
        return P.Publish(topic, value, 0, True)

    def suback(self, bridge, packet):
        refused = [code for code in packet.granted_qos if code >= 0x80]
        if refused:
            log.warn(
                "bridge {name}: upstream refused a subscription: {granted}",
                name=self.settings.name,
                granted=packet.granted_qos,
            )

    def inbound(self, packet):
        """A PUBLISH from upstream, as it came."""

    def sent(self, first, remote, rest):
        """What the archive records of a frame sent upstream: its message as sent."""
        qos = (first >> 1) & 3
        start = 2 if qos else 0
        return P.Publish(remote[2:].decode("utf-8"), rest[start:], qos, bool(first & 1))

    def will_refused(self, error):
        """Whether the will changed so that CONNECT may be asked again."""
        return False

    # The link's own side (bridges.client): what it reads and says

    def framer(self, connect, max_packet_size):
        """What reads the upstream's packets after ``connect``."""
        return Framer(max_packet_size, strict=connect.protocol_level in (P.MQTT_311, P.MQTT_5))

    def refused(self, code):
        """What a CONNACK refusing with ``code`` means."""
        return f"CONNACK {code}: {RETURN_CODES.get(code, 'unknown code')}"

    def accepted(self, connack):
        """The upstream's CONNACK properties: none in 3.x."""
        return {}

    def closing(self, reason_code):
        """What goes out before the link closes on a malformed packet:
        nothing in 3.x, the connection is just dropped."""
        return None


class Upstream5(Upstream3):
    """MQTT 5.0 upstream: properties, reason codes, the upstream's limits."""

    def __init__(self, settings):
        super().__init__(settings)
        # The will as the upstream takes it (see will_refused).
        self.will_qos = 1
        self.will_retain = True
        # The current link's framing and limits (Framing5).
        self.framing = None

    def connect(self, try_private, clean_fallback=False, remote_state=True):
        # No try_private: no local does its work.
        s = self.settings
        properties = {"topic_alias_maximum": UPSTREAM_TOPIC_ALIASES}
        if s.session_expiry_interval and not clean_fallback:
            properties["session_expiry_interval"] = s.session_expiry_interval
        return _connect(s, self.level, clean_fallback, remote_state and self, properties, {})

    def carrier_connect(self, client_id, will_topic, will_message, will_qos):
        return _carrier_connect(self.settings, self.level, client_id, will_topic, will_message, will_qos, {})

    def protocol_refused(self, code):
        # A 3.x CONNACK 1 is read as this too (wire.reasons.CONNACK_FROM_V3).
        return code == R.UNSUPPORTED_PROTOCOL_VERSION

    def will_topic_refused(self, code):
        # The only topic a CONNECT names is its will's.
        return code == R.TOPIC_NAME_INVALID

    def attach(self, upstream, clock, session):
        s = self.settings
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
        self.framing = Framing5(clock, server, max(growth, 0))
        # The upstream's receive maximum bounds the in-flight window.
        # Nothing above its maximum QoS, queued and in flight included
        # ([MQTT-3.2.2-11]): the session sends at most that.
        frames = EncodedFrames(self.framing, session)
        return frames, server.get("receive_maximum", 65535), server.get("maximum_qos", 2)

    def subscribe(self, incoming):
        options = _NO_LOCAL | _RETAIN_AS_PUBLISHED
        return P.Subscribe(1, [(f, q | options) for f, q in incoming], {})

    def state(self, topic, value):
        return P.Publish(topic, value, 0, self.framing.retain_available, properties={})

    def suback(self, bridge, packet):
        for code in packet.granted_qos:
            if code >= 0x80:
                bridge.reason("SUBACK", code, packet)

    def inbound(self, packet):
        # Its topic alias resolved; its message properties kept.
        self.framing.inbound_topic(packet)

    def sent(self, first, remote, rest):
        qos = (first >> 1) & 3
        start, length = P.decode_remaining_length(rest, 2 if qos else 0)
        return P.Publish(remote[2:].decode("utf-8"), rest[start + length:], qos, bool(first & 1))

    def framer(self, connect, max_packet_size):
        framer = super().framer(connect, max_packet_size)
        framer.v5 = True
        framer.from_client = False
        return framer

    def refused(self, code):
        return f"CONNACK {code:#04x}: {R.name(code)}"

    def accepted(self, connack):
        # The upstream's limits among them.
        return connack.properties or {}

    def closing(self, reason_code):
        # 5.0 says why before closing ([MQTT-4.13.1-1]).
        return P.Disconnect(reason_code or R.PROTOCOL_ERROR).encode()

    def will_refused(self, error):
        # An upstream without retained messages, or with a maximum QoS
        # of 0, refuses the will as it was ([MQTT-3.2.2-13], [MQTT-3.2.2-12]).
        if error.code == R.RETAIN_NOT_SUPPORTED and self.will_retain:
            self.will_retain = False
            return True
        if error.code == R.QOS_NOT_SUPPORTED and self.will_qos:
            self.will_qos = 0
            return True
        return False


def fallback_client_id(settings):
    """
    The client id of the clean session that stands in for the persistent
    one: another id, so that the upstream keeps the persistent session as
    it is, to be resumed later, and nothing of it (RabbitMQ's queue named
    after the client id, on a node that is down) is in the way.
    """
    return f"{settings.client_id}/clean"


def _connect(s, level, clean_fallback, will, properties, will_properties):
    """``will``: the version whose will QoS and retain are taken, or None for no will."""
    return P.Connect(
        client_id=fallback_client_id(s) if clean_fallback else s.client_id,
        protocol_level=level,
        protocol_name=P.PROTOCOL_NAMES[level & 0x7F],
        clean_session=s.clean_session or clean_fallback,
        keepalive=s.keepalive,
        will_topic=s.remote_state_topic if will else None,
        will_message=b"0" if will else None,
        will_qos=will.will_qos if will else 0,
        will_retain=will.will_retain if will else False,
        username=s.username,
        password=s.password,
        properties=properties,
        will_properties=will_properties if will else None,
    )


def _carrier_connect(s, level, client_id, will_topic, will_message, will_qos, properties):
    """``properties``: the empty properties of a 5.0 CONNECT and its will, or None."""
    return P.Connect(
        client_id=client_id,
        protocol_level=level,
        clean_session=True,
        keepalive=s.keepalive,
        will_topic=will_topic,
        will_message=will_message,
        will_qos=will_qos,
        will_retain=False,
        username=s.username,
        password=s.password,
        properties=properties,
        will_properties=properties,
    )


class Framing5(Connection5):
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

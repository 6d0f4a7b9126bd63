"""
What differs between MQTT 3.1, 3.1.1 and 5.0 on the server side, one
dialect per version (:class:`V31`, :class:`V311`, :class:`V5`), chosen once
at CONNECT (:func:`dialect_for`): client identifier rules, CONNACK and its
refusals, acknowledgements with or without reason codes, SUBACK and
UNSUBACK, subscription options, the DISCONNECT before a close, the checks
a PUBLISH passes first, and the frame a session writes to its client.  The
protocol calls its dialect without asking which version it speaks, as the
wire layer keeps one decoder table per version.
"""

from mqttgw.broker.deliveryframes import PLAIN, EncodedFrames
from mqttgw.broker.session import NEVER_EXPIRES
from mqttgw.broker.subscriptions import SEND_RETAINED_IF_NEW, SubscriptionOptions, is_shared, shared_filter
from mqttgw.broker.topics import is_wildcard
from mqttgw.transports.mqtt5 import Connection5
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import LAX, ProtocolViolation

_puback_bytes = P.puback_bytes
_pubrec_bytes = P.pubrec_bytes


class V3:
    """
    MQTT 3.x: return codes without reasons, no properties, no DISCONNECT
    from the server.  Until a CONNECT names its version a connection
    refuses as 3.x does: a client of an unknown version reads that best.
    """

    __slots__ = ()
    level = None
    # The stats counter of connected clients of this version.
    counter = None
    # A session outlives its connection by Clean Session alone.
    session_expiry = 0
    # Handlers of this version's own (packet type: handler name), before
    # the shared ones.
    HANDLERS = {}
    # The refusal when max_persistent_sessions is reached.
    QUOTA_REFUSAL = R.SERVER_UNAVAILABLE
    # Whether a SUBACK can refuse one filter.
    may_refuse_filters = True
    # Whether CONNACK says a session was present (3.1's does not).
    session_present = False

    def configure(self, framer):
        """The framer reads this version's packets from now on."""
        framer.strict = framer.strict_for_311

    # CONNECT and CONNACK

    def client_id_refusal(self, client_id, clean_session, limits):
        """Why ``client_id`` may not connect, or None."""
        if not client_id and not clean_session:
            return "empty client id needs clean session"
        return None

    def bad_will(self, login, why):
        """The will topic of CONNECT is not a topic name (``login``: the connection's Login)."""
        login.connection.protocol_error(why)

    def will_refusal(self, packet, max_qos, limits):
        """(reason code, why) when the will cannot be held, or None."""
        return None

    def refusal(self, reason_code, reason):
        """The CONNACK refusing with ``reason_code`` (5.0's terms), or None."""
        return P.Connack(R.CONNACK_V3.get(reason_code, P.CONNACK_NOT_AUTHORIZED)).encode()

    def persistent(self, packet):
        """Whether the session outlives this connection."""
        return not packet.clean_session

    def accept(self, packet, client_id, limits, max_qos, auth_properties):
        """
        The CONNACK's properties and the keep alive the server takes; None
        when no CONNACK fits the client (then none is sent).
        """
        return None, packet.keepalive

    def connect(self, router, client_id, packet, will, owner):
        """The client's session from the router, and whether it was present."""
        # Clean Session is a clean start, and a session that ends with
        # the connection; without it the session never expires.
        expiry = 0 if packet.clean_session else NEVER_EXPIRES
        return router.connect(client_id, packet.clean_session, will, expiry, owner=owner)

    def connack(self, present, properties):
        return P.Connack(P.CONNACK_ACCEPTED, present and self.session_present).encode()

    def attach(self, session, connection, packet):
        """The session takes the connection, and with it our outbound frame."""
        session.attach(connection, self.frames(session))

    # The outbound PUBLISH

    # The message's own frame, encoded once per QoS however many receive
    # it, the message id spliced in; 3.x has no subscription identifiers.
    frame = staticmethod(P.Publish.frame)

    def frames(self, session):
        """What frames ``session``'s PUBLISH to us (see broker.deliveryframes)."""
        # PLAIN.publish is our frame itself: no call between, for every copy.
        return PLAIN

    def session_line(self, packet):
        """What a log line says of the session CONNECT asked for."""
        return f"clean session {packet.clean_session}"

    def disconnect(self, reason_code, reason=None):
        """The DISCONNECT sent before the server closes, or None."""
        return None

    def disconnecting(self, packet, router, session):
        """The client's DISCONNECT: whether its will is published all the same."""
        return False

    # Acknowledgements

    def denied_ack(self, session, packet):
        """What acknowledges a PUBLISH the client may not make, or None."""
        if packet.qos == 1:
            return _puback_bytes(packet.message_id)
        if packet.qos == 2:
            session.qos2_received(packet.message_id)
            return _pubrec_bytes(packet.message_id)
        return None

    # SUBSCRIBE and UNSUBSCRIBE

    def subscription_identifier(self, packet, limits):
        return None

    def shared_refusal(self, requested, limits):
        """(reason code, why) refusing a shared subscription, or None."""
        return None

    def wildcard_refusal(self, topic_filter, limits):
        return None

    def refused_filter(self, reason_code, why):
        """The SUBACK code for a filter refused with ``reason_code``."""
        return P.SUBACK_FAILURE

    def subscription(self, topic_filter, requested, session, identifier):
        """The router's entry for a granted filter, and whether its retained messages are sent."""
        return (topic_filter, requested), True

    def suback(self, message_id, codes, reason):
        return P.Suback(message_id, codes).encode()

    def unsubscribed(self, held, step, codes):
        """The reason codes of a step of UNSUBSCRIBE, added to ``codes``."""

    def unsuback(self, message_id, codes):
        return P.Unsuback(message_id).encode()


class V31(V3):
    """MQTT 3.1 (``MQIsdp``, level 3)."""

    __slots__ = ()
    level = P.MQTT_31
    counter = "clients_v31"
    # No failure code: a filter that can match nothing readable is granted.
    may_refuse_filters = False

    def configure(self, framer):
        framer.strict = LAX

    def client_id_refusal(self, client_id, clean_session, limits):
        if not client_id or (len(client_id) > 23 and not limits.allow_long_client_ids):
            return "MQTT 3.1 client id must be 1 to 23 characters"
        return None

    def refused_filter(self, reason_code, why):
        # No failure code to refuse one filter with.
        raise ProtocolViolation(f"SUBSCRIBE: {why}", R.PROTOCOL_ERROR)


class V311(V3):
    """MQTT 3.1.1 (``MQTT``, level 4)."""

    __slots__ = ()
    level = P.MQTT_311
    counter = "clients_v311"
    session_present = True


class V5(V3):
    """
    MQTT 5.0 (``MQTT``, level 5): reason codes and properties; the
    client's limits and topic aliases in its :class:`Connection5`, whose
    ``frame`` the session calls for each PUBLISH to the client.
    """

    __slots__ = ("session_expiry", "connection5")
    level = P.MQTT_5
    counter = "clients_v5"
    HANDLERS = {P.PUBLISH: "handle_PUBLISH5", P.PUBREL: "handle_PUBREL5"}
    QUOTA_REFUSAL = R.QUOTA_EXCEEDED

    def __init__(self, clock, connect_properties, alias_maximum_in, receive_maximum):
        self.connection5 = Connection5(clock, connect_properties, alias_maximum_in, receive_maximum)
        self.session_expiry = (connect_properties or {}).get("session_expiry_interval", 0)

    def configure(self, framer):
        framer.strict = framer.strict_for_311
        framer.v5 = True

    # CONNECT and CONNACK

    def client_id_refusal(self, client_id, clean_session, limits):
        # One is assigned whatever Clean Start says ([MQTT-3.1.3-6]).
        return None

    def bad_will(self, login, why):
        login.refuse(R.TOPIC_NAME_INVALID, why)

    def will_refusal(self, packet, max_qos, limits):
        if packet.will_qos > max_qos:
            return R.QOS_NOT_SUPPORTED, f"will QoS {packet.will_qos} exceeds max_qos"
        if packet.will_retain and not limits.retain_available:
            return R.RETAIN_NOT_SUPPORTED, "retained will: retain_available is off"
        return None

    def refusal(self, reason_code, reason):
        props = self.connection5.fit_connack(reason_code, {"reason_string": reason[:200]})
        return None if props is None else P.Connack(reason_code, False, props).encode()

    def persistent(self, packet):
        return self.session_expiry != 0

    def accept(self, packet, client_id, limits, max_qos, auth_properties):
        props, keepalive = connack_properties(packet, client_id, limits, max_qos, self)
        if auth_properties:
            props.update(auth_properties)
        props = self.connection5.fit_connack(R.SUCCESS, props)
        return None if props is None else (props, keepalive)

    def connect(self, router, client_id, packet, will, owner):
        will_props = packet.will_properties or {}
        return router.connect(
            client_id,
            packet.clean_session,
            will,
            self.session_expiry,
            will_props.get("will_delay_interval", 0),
            owner,
        )

    def connack(self, present, properties):
        return P.Connack(R.SUCCESS, present, properties).encode()

    def attach(self, session, connection, packet):
        if session.store is not None:
            # Frames behind a store commit: aliases only on QoS 0 ones.
            self.connection5.assign_aliases_at = 1
        session.attach(connection, self.frames(session), (packet.properties or {}).get("receive_maximum"))

    @property
    def max_packet_size(self):
        """The client's Maximum Packet Size, or None."""
        return self.connection5.max_packet_size

    @property
    def receive_maximum(self):
        """QoS 1/2 publishes of the client not yet completed may number at most this."""
        return self.connection5.receive_maximum

    def frame(self, message, qos, mid, retain, dup, subscription_ids):
        # Connection5's, not 3.x's: properties, topic aliases, the client's
        # maximum packet size.
        return self.connection5.frame(message, qos, mid, retain, dup, subscription_ids)

    def frames(self, session):
        # Our Connection5's frame, with no call between, given the
        # session's subscription identifiers.
        return EncodedFrames(self.connection5, session)

    def fit(self, packet_class, *args, properties=None, exempt=False):
        """See :meth:`Connection5.fit`."""
        return self.connection5.fit(packet_class, *args, properties=properties, exempt=exempt)

    def session_line(self, packet):
        # Clean Start says whether a session resumes, the expiry how long
        # it outlives the connection.
        return f"clean start {packet.clean_session}, session expiry {self.session_expiry}s"

    def disconnect(self, reason_code, reason=None):
        props = {"reason_string": reason[:200]} if reason else None
        return self.connection5.fit(P.Disconnect, reason_code, properties=props, exempt=True)

    def disconnecting(self, packet, router, session):
        expiry = (packet.properties or {}).get("session_expiry_interval")
        if expiry is not None and expiry != self.session_expiry:
            if self.session_expiry == 0:
                # 3.14.2.2.2: a Protocol Error; the session ends as CONNECT said.
                raise ProtocolViolation(
                    "DISCONNECT sets a session expiry where CONNECT set none", R.PROTOCOL_ERROR
                )
            self.session_expiry = expiry
            router.set_session_expiry(session, expiry)
        # 0x04: the client asks for its will all the same.
        return packet.reason_code == R.DISCONNECT_WITH_WILL_MESSAGE

    # PUBLISH and acknowledgements

    def check_publish(self, packet, publishing):
        """
        What a PUBLISH must pass first (``publishing``: the client's
        Publishing): its topic alias, the server's maximum QoS, retain
        available and receive maximum.  Raises ProtocolViolation with the
        reason code the DISCONNECT gives.
        """
        connection5 = self.connection5
        connection5.inbound_topic(packet)
        qos = packet.qos
        if qos > publishing.router.max_qos:
            raise ProtocolViolation(f"PUBLISH at QoS {qos} exceeds max_qos", R.QOS_NOT_SUPPORTED)
        if packet.retain and not publishing.limits.retain_available:
            raise ProtocolViolation("retained PUBLISH: retain_available is off", R.RETAIN_NOT_SUPPORTED)
        if qos:
            # The client's QoS 1/2 publishes not yet completed.
            session = publishing.session
            acks = publishing.ordered_acks
            waiting = len(session.awaiting_pubrel) + (acks.waiting if acks else 0)
            receive_maximum = connection5.receive_maximum
            if waiting >= receive_maximum and packet.message_id not in session.awaiting_pubrel:
                # [MQTT-3.3.4-9]
                raise ProtocolViolation(
                    f"more than {receive_maximum} QoS 1/2 publishes unacknowledged",
                    R.RECEIVE_MAXIMUM_EXCEEDED,
                )

    def ack(self, packet_class, mid, reason_code, reason=None):
        """An acknowledgement with a reason code (and why, if asked)."""
        props = {"reason_string": reason} if reason else None
        return self.connection5.fit(packet_class, mid, reason_code, properties=props)

    def denied_ack(self, session, packet):
        # 5.0 says why; a refused QoS 2 flow ends at its PUBREC.
        if packet.qos:
            cls = P.Puback if packet.qos == 1 else P.Pubrec
            return self.ack(cls, packet.message_id, R.NOT_AUTHORIZED, "not authorized")
        return None

    # SUBSCRIBE and UNSUBSCRIBE

    def subscription_identifier(self, packet, limits):
        identifier = packet.properties.get("subscription_identifier")
        if identifier is not None and not limits.subscription_identifier_available:
            raise ProtocolViolation(
                "SUBSCRIBE with a subscription identifier: not available",
                R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
            )
        return identifier

    def shared_refusal(self, requested, limits):
        if requested & 4:
            raise ProtocolViolation("SUBSCRIBE: no local on a shared subscription", R.PROTOCOL_ERROR)
        if not limits.shared_subscription_available:
            return R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, "shared subscriptions are off"
        return None

    def wildcard_refusal(self, topic_filter, limits):
        if not limits.wildcard_subscription_available and is_wildcard(topic_filter):
            return R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, "wildcard subscriptions are off"
        return None

    def refused_filter(self, reason_code, why):
        return reason_code

    def subscription(self, topic_filter, requested, session, identifier):
        handling = (requested >> 4) & 3
        shared = is_shared(topic_filter)
        retained = not shared and (
            handling == 0 or handling == SEND_RETAINED_IF_NEW and topic_filter not in session.subscriptions
        )
        options = SubscriptionOptions(
            shared_filter(topic_filter)[1] if shared else topic_filter,
            bool(requested & 4),
            bool(requested & 8),
            handling,
            identifier,
        )
        return (topic_filter, requested & 3, options), retained

    def suback(self, message_id, codes, reason):
        props = {"reason_string": reason[:200]} if reason is not None else None
        return self.connection5.fit(P.Suback, message_id, codes, properties=props)

    def unsubscribed(self, held, step, codes):
        # As a sequence of single UNSUBSCRIBEs ([MQTT-3.10.4-6]).
        gone = set()
        for f in step:
            codes.append(R.SUCCESS if f in held and f not in gone else R.NO_SUBSCRIPTION_EXISTED)
            gone.add(f)

    def unsuback(self, message_id, codes):
        return self.connection5.fit(P.Unsuback, message_id, codes)


def connack_properties(packet, client_id, limits, max_qos, dialect):
    """A 5.0 CONNACK's properties, and the keep alive the server takes."""
    props = {}
    if dialect.session_expiry and packet.properties.get("session_expiry_interval") is None:
        props["session_expiry_interval"] = dialect.session_expiry
    if not packet.client_id:
        props["assigned_client_identifier"] = client_id
    if dialect.receive_maximum < 65535:
        props["receive_maximum"] = dialect.receive_maximum
    if max_qos < 2:
        props["maximum_qos"] = max_qos
    if not limits.retain_available:
        props["retain_available"] = 0
    props["maximum_packet_size"] = limits.max_packet_size
    if limits.max_topic_alias:
        props["topic_alias_maximum"] = limits.max_topic_alias
    for name in ("wildcard_subscription_available", "subscription_identifier_available",
                 "shared_subscription_available"):
        if not getattr(limits, name):
            props[name] = 0
    keepalive = packet.keepalive
    if limits.max_keepalive < 65535 and (keepalive == 0 or keepalive > limits.max_keepalive):
        # [MQTT-3.2.2-21]: the client uses the server's value.
        keepalive = props["server_keep_alive"] = limits.max_keepalive
    if packet.properties.get("request_response_information") and limits.response_information:
        props["response_information"] = limits.response_information.replace("%c", client_id)
    return props, keepalive


# Until CONNECT names a version.
UNKNOWN = V3()
_V31 = V31()
_V311 = V311()
_NAMES = {("MQIsdp", P.MQTT_31): _V31, ("MQTT", P.MQTT_311): _V311, ("MQTT", P.MQTT_5): None}


def dialect_for(packet, clock, limits, receive_maximum):
    """
    The dialect of a CONNECT's protocol name and level, or None for one
    not spoken here.  3.x dialects are shared; a 5.0 one holds the
    connection's own state.
    """
    key = (packet.protocol_name, packet.protocol_level)
    if key not in _NAMES:
        return None
    dialect = _NAMES[key]
    if dialect is None:
        dialect = V5(clock, packet.properties, limits.max_topic_alias, receive_maximum)
    return dialect


def unsupported(packet):
    """Why a CONNECT that no dialect speaks is refused."""
    return f"unsupported protocol {packet.protocol_name!r} level {packet.protocol_level}"

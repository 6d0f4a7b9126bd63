"""
MQTT 3.1, 3.1.1 and 5.0 control packets: one class per packet type, each
able to encode itself to wire bytes.  A packet whose ``properties`` is a
dict (even an empty one) is in its 5.0 form; None, in its 3.1.1 form.
Decoding lives in :mod:`mqttgw.wire.framing`.
"""

import struct

import attr

from mqttgw.wire.properties import encode_properties

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

PACKET_NAMES = {
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}

# Protocol (name, level) pairs this broker speaks.
MQTT_31 = 3  # "MQIsdp"
MQTT_311 = 4  # "MQTT"
MQTT_5 = 5  # "MQTT"
PROTOCOL_NAMES = {MQTT_31: "MQIsdp", MQTT_311: "MQTT", MQTT_5: "MQTT"}
VERSION_NAMES = {MQTT_31: "3.1", MQTT_311: "3.1.1", MQTT_5: "5.0"}

# CONNACK return codes (the same numbers in 3.1 and 3.1.1).
CONNACK_ACCEPTED = 0
CONNACK_UNACCEPTABLE_PROTOCOL = 1
CONNACK_IDENTIFIER_REJECTED = 2
CONNACK_SERVER_UNAVAILABLE = 3
CONNACK_BAD_CREDENTIALS = 4
CONNACK_NOT_AUTHORIZED = 5

SUBACK_FAILURE = 0x80

MAX_REMAINING_LENGTH = 268_435_455

_pack_u16 = struct.Struct(">H").pack

_SMALL_LENGTHS = [bytes((n,)) for n in range(128)]


def encode_remaining_length(n):
    """Encode a Remaining Length: 7 bits per byte, least significant first."""
    if n < 128:
        return _SMALL_LENGTHS[n]
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} exceeds {MAX_REMAINING_LENGTH}")
    out = bytearray()
    while n:
        digit = n & 0x7F
        n >>= 7
        out.append(digit | 0x80 if n else digit)
    return bytes(out)


def decode_remaining_length(data, offset):
    """
    The Remaining Length at ``offset`` of a whole frame this process
    encoded: (where the body starts, its length).  Untrusted bytes go
    through :class:`mqttgw.wire.framing.Framer`, which checks everything.
    """
    length = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return offset, length
        shift += 7


def encode_string(s):
    """A UTF-8 string (or raw bytes) with its 16-bit big-endian length."""
    if isinstance(s, str):
        s = s.encode("utf-8")
    if len(s) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _pack_u16(len(s)) + s


def _frame(first_byte, body):
    return bytes((first_byte,)) + encode_remaining_length(len(body)) + body


def _props(properties):
    """The encoded properties of a 5.0 packet, or nothing for 3.1.1."""
    return b"" if properties is None else encode_properties(properties)


@attr.s(slots=True)
class Connect:
    client_id = attr.ib(default="")
    protocol_level = attr.ib(default=MQTT_311)
    protocol_name = attr.ib(default=None)
    # 3.1.1's Clean Session; 5.0's Clean Start.
    clean_session = attr.ib(default=True)
    keepalive = attr.ib(default=60)
    will_topic = attr.ib(default=None)
    will_message = attr.ib(default=None)
    will_qos = attr.ib(default=0)
    will_retain = attr.ib(default=False)
    username = attr.ib(default=None)
    password = attr.ib(default=None, repr=False)  # never in a log line
    # The raw flags byte, kept for the 3.1.1 reserved-bit check.
    flags = attr.ib(default=None, eq=False, repr=False)
    # 5.0: the CONNECT's properties and the will's.
    properties = attr.ib(default=None)
    will_properties = attr.ib(default=None)

    packet_type = CONNECT

    def encode(self):
        name = self.protocol_name or PROTOCOL_NAMES[self.protocol_level]
        v5 = self.protocol_level == MQTT_5
        flags = 0
        payload = [encode_string(self.client_id)]
        if self.clean_session:
            flags |= 0x02
        if self.will_topic is not None:
            flags |= 0x04 | (self.will_qos << 3) | (0x20 if self.will_retain else 0)
            if v5:
                payload.append(encode_properties(self.will_properties))
            payload.append(encode_string(self.will_topic))
            payload.append(encode_string(self.will_message or b""))
        if self.username is not None:
            flags |= 0x80
            payload.append(encode_string(self.username))
        if self.password is not None:
            flags |= 0x40
            payload.append(encode_string(self.password))
        body = (
            encode_string(name)
            + bytes((self.protocol_level, flags))
            + _pack_u16(self.keepalive)
            + (encode_properties(self.properties) if v5 else b"")
            + b"".join(payload)
        )
        return _frame(0x10, body)


@attr.s(slots=True)
class Connack:
    # 3.1.1's return code; 5.0's reason code.
    return_code = attr.ib(default=CONNACK_ACCEPTED)
    session_present = attr.ib(default=False)
    properties = attr.ib(default=None)

    packet_type = CONNACK

    def encode(self):
        if self.properties is None:
            return bytes((0x20, 2, 1 if self.session_present else 0, self.return_code))
        body = bytes((1 if self.session_present else 0, self.return_code))
        return _frame(0x20, body + encode_properties(self.properties))


@attr.s(slots=True)
class Publish:
    """
    A PUBLISH packet, which is also the application message the router
    carries: ``topic`` (str), ``payload`` (bytes), ``qos``, ``retain``;
    for a 5.0 publisher its ``properties`` that travel with it, and
    ``expiry``, the clock time its message expiry interval ends.
    """

    topic = attr.ib()
    payload = attr.ib(default=b"")
    qos = attr.ib(default=0)
    retain = attr.ib(default=False)
    dup = attr.ib(default=False)
    message_id = attr.ib(default=None)
    properties = attr.ib(default=None)
    expiry = attr.ib(default=None, eq=False)
    # Encoded topic string, and the whole QoS 0 delivery, cached so a
    # fan-out encodes them once; the same for 5.0 subscribers.
    _topic_wire = attr.ib(default=None, eq=False, repr=False)
    _frame0 = attr.ib(default=None, eq=False, repr=False)
    _props5 = attr.ib(default=None, eq=False, repr=False)

    packet_type = PUBLISH

    def frame(self, qos, message_id=None, retain=False, dup=False):
        """
        Wire bytes of this message delivered at ``qos`` over 3.1/3.1.1.
        The topic is encoded once per message and a QoS 0 delivery once in
        all, however many subscribers it goes to; only the message id
        differs between QoS 1/2 deliveries.
        """
        if not qos and not retain and not dup:
            frame = self._frame0
            if frame is None:
                frame = self._frame0 = self._encode(0, None, False, False)
            return frame
        return self._encode(qos, message_id, retain, dup)

    def _encode(self, qos, message_id, retain, dup):
        topic_wire = self._topic_wire
        if topic_wire is None:
            topic_wire = self._topic_wire = encode_string(self.topic)
        first = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
        payload = self.payload
        if qos:
            length = len(topic_wire) + 2 + len(payload)
            return b"".join(
                (
                    bytes((first,)),
                    encode_remaining_length(length),
                    topic_wire,
                    _pack_u16(message_id),
                    payload,
                )
            )
        length = len(topic_wire) + len(payload)
        return b"".join(
            (bytes((first,)), encode_remaining_length(length), topic_wire, payload)
        )

    def _encode5(self, qos, message_id, retain, dup, props, topic_wire=None):
        if topic_wire is None:
            topic_wire = self._topic_wire
            if topic_wire is None:
                topic_wire = self._topic_wire = encode_string(self.topic)
        first = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
        payload = self.payload
        mid = _pack_u16(message_id) if qos else b""
        length = len(topic_wire) + len(mid) + len(props) + len(payload)
        return b"".join(
            (bytes((first,)), encode_remaining_length(length), topic_wire, mid, props, payload)
        )

    def frame5(self, qos, message_id=None, retain=False, dup=False, now=None,
               subscription_ids=None, alias=None):
        """
        Wire bytes of this message delivered over 5.0: its properties (the
        expiry interval as much as is left of it at ``now``), with the
        subscription identifiers and topic alias of this delivery.  With
        ``alias`` as ``(number, False)`` the topic is left out.
        """
        if self.expiry is None and not subscription_ids and alias is None:
            props = self._props5
            if props is None:
                props = self._props5 = encode_properties(self.properties)
        else:
            props = dict(self.properties) if self.properties else {}
            if self.expiry is not None:
                props["message_expiry_interval"] = max(0, int(self.expiry - now + 0.999))
            if subscription_ids:
                props["subscription_identifier"] = subscription_ids
            topic_wire = None
            if alias is not None:
                number, send_topic = alias
                props["topic_alias"] = number
                if not send_topic:
                    topic_wire = b"\x00\x00"
            return self._encode5(qos, message_id, retain, dup, encode_properties(props), topic_wire)
        return self._encode5(qos, message_id, retain, dup, props)

    def encode(self):
        if self.properties is not None:
            return self._encode5(
                self.qos, self.message_id, self.retain, self.dup, encode_properties(self.properties)
            )
        return self.frame(self.qos, self.message_id, self.retain, self.dup)


def _id_only(name, type_, first_byte):
    """
    A packet whose body is a message id, and in 5.0 perhaps a reason code
    and properties (PUBACK, PUBREC, PUBREL, PUBCOMP).
    """

    def encode(self):
        if not self.reason_code and not self.properties:
            return bytes((first_byte, 2)) + _pack_u16(self.message_id)
        if not self.properties:
            return bytes((first_byte, 3)) + _pack_u16(self.message_id) + bytes((self.reason_code,))
        body = _pack_u16(self.message_id) + bytes((self.reason_code,))
        return _frame(first_byte, body + encode_properties(self.properties))

    cls = type(
        name,
        (),
        {
            "message_id": attr.ib(),
            "reason_code": attr.ib(default=0),
            "properties": attr.ib(default=None),
            "packet_type": type_,
            "encode": encode,
            "__doc__": f"{name}: acknowledges or releases one message id.",
        },
    )
    return attr.s(slots=True)(cls)


Puback = _id_only("Puback", PUBACK, 0x40)
Pubrec = _id_only("Pubrec", PUBREC, 0x50)
# PUBREL, SUBSCRIBE and UNSUBSCRIBE carry QoS 1 in their fixed header.
Pubrel = _id_only("Pubrel", PUBREL, 0x62)
Pubcomp = _id_only("Pubcomp", PUBCOMP, 0x70)


@attr.s(slots=True)
class Subscribe:
    message_id = attr.ib()
    # [(topic_filter, requested_qos), ...]; in 5.0 the whole options byte
    # (QoS, no local, retain as published, retain handling).
    topics = attr.ib(factory=list)
    properties = attr.ib(default=None)

    packet_type = SUBSCRIBE

    def encode(self):
        body = (
            _pack_u16(self.message_id)
            + _props(self.properties)
            + b"".join(encode_string(f) + bytes((q,)) for f, q in self.topics)
        )
        return _frame(0x82, body)


@attr.s(slots=True)
class Suback:
    message_id = attr.ib()
    # Granted QoS per requested filter, or a failure (SUBACK_FAILURE; in
    # 5.0 any reason code).
    granted_qos = attr.ib(factory=list)
    properties = attr.ib(default=None)

    packet_type = SUBACK

    def encode(self):
        return _frame(
            0x90, _pack_u16(self.message_id) + _props(self.properties) + bytes(self.granted_qos)
        )


@attr.s(slots=True)
class Unsubscribe:
    message_id = attr.ib()
    topics = attr.ib(factory=list)
    properties = attr.ib(default=None)

    packet_type = UNSUBSCRIBE

    def encode(self):
        body = _pack_u16(self.message_id) + _props(self.properties) + b"".join(
            encode_string(f) for f in self.topics
        )
        return _frame(0xA2, body)


@attr.s(slots=True)
class Unsuback:
    message_id = attr.ib()
    # 5.0: a reason code per filter, and properties.
    reason_codes = attr.ib(default=None)
    properties = attr.ib(default=None)

    packet_type = UNSUBACK

    def encode(self):
        if self.properties is None:
            return bytes((0xB0, 2)) + _pack_u16(self.message_id)
        return _frame(
            0xB0,
            _pack_u16(self.message_id)
            + encode_properties(self.properties)
            + bytes(self.reason_codes or ()),
        )


def _empty(name, type_, first_byte):
    """A packet with no variable header or payload (PINGREQ, ...)."""
    wire = bytes((first_byte, 0))
    cls = type(
        name,
        (),
        {"packet_type": type_, "encode": lambda self: wire, "__doc__": f"{name}."},
    )
    return attr.s(slots=True)(cls)


Pingreq = _empty("Pingreq", PINGREQ, 0xC0)
Pingresp = _empty("Pingresp", PINGRESP, 0xD0)


def _reason_only(name, type_, first_byte):
    """
    DISCONNECT and AUTH: empty in 3.1.1; in 5.0 a reason code and
    properties, either left out when they are 0 and none.
    """

    def encode(self):
        if not self.properties:
            if not self.reason_code:
                return bytes((first_byte, 0))
            return bytes((first_byte, 1, self.reason_code))
        return _frame(first_byte, bytes((self.reason_code,)) + encode_properties(self.properties))

    cls = type(
        name,
        (),
        {
            "reason_code": attr.ib(default=0),
            "properties": attr.ib(default=None),
            "packet_type": type_,
            "encode": encode,
            "__doc__": f"{name}.",
        },
    )
    return attr.s(slots=True)(cls)


Disconnect = _reason_only("Disconnect", DISCONNECT, 0xE0)
Auth = _reason_only("Auth", AUTH, 0xF0)

PINGRESP_WIRE = Pingresp().encode()

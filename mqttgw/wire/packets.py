"""
MQTT 3.1, 3.1.1 and 5.0 control packets: one class per packet type, each
able to encode itself to wire bytes.  A packet whose ``properties`` is a
dict (even an empty one) is in its 5.0 form; None, in its 3.1.1 form.
Decoding lives in :mod:`mqttgw.wire.framing`.
"""

import struct

import attr

from mqttgw.wire.encoding import MAX_VARINT, encode_string, encode_varint
from mqttgw.wire.properties import IDENTIFIERS, encode_properties, encode_property_list

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

MAX_REMAINING_LENGTH = MAX_VARINT

_pack_u16 = struct.Struct(">H").pack
_pack_u32 = struct.Struct(">I").pack

# Identifiers of the properties a delivery adds to a message's own.
_EXPIRY, _SUBSCRIPTION_ID, _TOPIC_ALIAS = (
    bytes((IDENTIFIERS[name][0],))
    for name in ("message_expiry_interval", "subscription_identifier", "topic_alias")
)

# The Remaining Length is a variable byte integer.
encode_remaining_length = encode_varint
# A PUBLISH's first byte by its flags, and a Remaining Length of one byte.
_FIRST_BYTES = [bytes((0x30 | flags,)) for flags in range(16)]
_SMALL_VARINTS = [encode_varint(n) for n in range(128)]


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
    # The wire bytes of its topic string, and of its whole QoS 0 delivery
    # over 3.1/3.1.1, cached so a fan-out encodes them once: a decoder
    # that read the packet sets them from the bytes it came in (see
    # wire.framing).  The same for 5.0 subscribers (their properties, and
    # the delivery when it has none).
    topic_wire = attr.ib(default=None, eq=False, repr=False)
    frame0 = attr.ib(default=None, eq=False, repr=False)
    _props5 = attr.ib(default=None, eq=False, repr=False)
    _frame50 = attr.ib(default=None, eq=False, repr=False)

    packet_type = PUBLISH

    def frame(self, qos, message_id=None, retain=False, dup=False, via=None):
        """
        Wire bytes of this message delivered at ``qos`` over 3.1/3.1.1.
        The topic is encoded once per message and a QoS 0 delivery once in
        all, however many subscribers it goes to; only the message id
        differs between QoS 1/2 deliveries.  ``via`` (the subscription the
        copy was routed by) matters to 5.0's framing only: taken so that a
        session calls either version's framing alike.
        """
        if not qos and not retain and not dup:
            frame = self.frame0
            if frame is None:
                frame = self.frame0 = self._encode(0, None, False, False)
            return frame
        topic_wire = self.topic_wire
        if not qos or topic_wire is None:
            return self._encode(qos, message_id, retain, dup)
        # A QoS 1 or 2 copy of a message that came in over the wire: one a
        # subscriber, so built here rather than through _encode.
        payload = self.payload
        length = len(topic_wire) + 2 + len(payload)
        return b"".join((
            _FIRST_BYTES[(qos << 1) | (1 if retain else 0) | (8 if dup else 0)],
            _SMALL_VARINTS[length] if length < 128 else encode_remaining_length(length),
            topic_wire, _pack_u16(message_id), payload,
        ))

    def _encode(self, qos, message_id, retain, dup):
        topic_wire = self.topic_wire
        if topic_wire is None:
            topic_wire = self.topic_wire = encode_string(self.topic)
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
            topic_wire = self.topic_wire
            if topic_wire is None:
                topic_wire = self.topic_wire = encode_string(self.topic)
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
        # The message's own properties are encoded once, whatever each
        # delivery adds to them.
        body = self._props5
        if body is None:
            props = self.properties
            if props and "message_expiry_interval" in props:
                props = {k: v for k, v in props.items() if k != "message_expiry_interval"}
            body = self._props5 = encode_property_list(props)
        topic_wire = None
        if self.expiry is None and not subscription_ids and alias is None:
            if not body:
                # No property at all, the usual message.
                if not qos and not retain and not dup:
                    frame = self._frame50
                    if frame is None:
                        frame = self._frame50 = self._encode5(0, None, False, False, b"\x00")
                    return frame
                return self._encode5(qos, message_id, retain, dup, b"\x00")
        else:
            extra = [body]
            if self.expiry is not None:
                left = max(0, int(self.expiry - now + 0.999))
                extra.append(_EXPIRY + _pack_u32(left))
            for identifier in subscription_ids or ():
                extra.append(_SUBSCRIPTION_ID + encode_varint(identifier))
            if alias is not None:
                number, send_topic = alias
                extra.append(_TOPIC_ALIAS + _pack_u16(number))
                if not send_topic:
                    topic_wire = b"\x00\x00"
            body = b"".join(extra)
        props = encode_varint(len(body)) + body
        return self._encode5(qos, message_id, retain, dup, props, topic_wire)

    def encode(self):
        if self.properties is not None:
            return self._encode5(
                self.qos, self.message_id, self.retain, self.dup, encode_properties(self.properties)
            )
        return self.frame(self.qos, self.message_id, self.retain, self.dup)


class WatchedPublish(Publish):
    """
    A Publish whose every 3.1/3.1.1 copy is encoded anew, ``copied()``
    called as each is (set it before the message is routed): no QoS 0
    frame is cached for it, so a sampled message's deliveries can be
    timed one by one.  Sessions call ``Publish.frame`` itself (see
    broker.deliveryframes), which reads the cache through ``frame0``.
    """

    __slots__ = ("copied",)

    frame0 = property(lambda self: None, lambda self, frame: None)
    # Nor its topic's bytes: Publish.frame builds a copy without _encode
    # only from those.
    topic_wire = property(lambda self: None, lambda self, wire: None)

    def _encode(self, qos, message_id, retain, dup):
        self.copied()
        return Publish._encode(self, qos, message_id, retain, dup)


def _with_reason(name, type_, first_byte, with_id):
    """
    A packet that in 5.0 has a reason code and properties, each left out
    when 0 and none: after a message id (``with_id``: PUBACK, PUBREC,
    PUBREL, PUBCOMP, whose 3.1.1 body is that id alone), or alone
    (DISCONNECT and AUTH, empty in 3.1.1).
    """

    def encode(self):
        head = _pack_u16(self.message_id) if with_id else b""
        if not self.properties:
            if not self.reason_code:
                return bytes((first_byte, len(head))) + head
            return bytes((first_byte, len(head) + 1)) + head + bytes((self.reason_code,))
        body = head + bytes((self.reason_code,)) + encode_properties(self.properties)
        return _frame(first_byte, body)

    fields = {"message_id": attr.ib()} if with_id else {}
    cls = type(
        name,
        (),
        {
            **fields,
            "reason_code": attr.ib(default=0),
            "properties": attr.ib(default=None),
            "packet_type": type_,
            "encode": encode,
            "__doc__": f"{name}: acknowledges or releases one message id."
            if with_id
            else f"{name}.",
        },
    )
    return attr.s(slots=True)(cls)


Puback = _with_reason("Puback", PUBACK, 0x40, True)
Pubrec = _with_reason("Pubrec", PUBREC, 0x50, True)
# PUBREL, SUBSCRIBE and UNSUBSCRIBE carry QoS 1 in their fixed header.
Pubrel = _with_reason("Pubrel", PUBREL, 0x62, True)
Pubcomp = _with_reason("Pubcomp", PUBCOMP, 0x70, True)


# The acknowledgements of every QoS 1/2 message: a success without
# properties is the same four bytes in 3.1.1 and 5.0 [MQTT-3.4.2.1], so
# they are made without a packet object.


def puback_bytes(message_id):
    return b"\x40\x02" + _pack_u16(message_id)


def pubrec_bytes(message_id):
    return b"\x50\x02" + _pack_u16(message_id)


def pubrel_bytes(message_id):
    return b"\x62\x02" + _pack_u16(message_id)


def pubcomp_bytes(message_id):
    return b"\x70\x02" + _pack_u16(message_id)


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


Disconnect = _with_reason("Disconnect", DISCONNECT, 0xE0, False)
Auth = _with_reason("Auth", AUTH, 0xF0, False)

PINGRESP_WIRE = Pingresp().encode()

"""
MQTT-SN 1.2 messages, one frozen class per message type: ``encode()``
makes the whole datagram, and the class method ``decode_body`` reads what
follows the Length and MsgType fields, raising MalformedDatagram for bytes
that are not that message.  :func:`mqttgw.wire.mqttsn.codec.decode` reads
whole datagrams.
"""

import struct

import attr

from mqttgw.wire.mqttsn import constants as C

_U16 = struct.Struct(">H")
_pack_u16 = _U16.pack
_unpack_u16 = _U16.unpack_from

# The longest Wireless Node Id: the forwarder's Length field is one byte
# and counts itself, MsgType and Ctrl.
MAX_WIRELESS_NODE_ID = C.MAX_SHORT_LENGTH - 3


class MalformedDatagram(Exception):
    """A datagram that is not an MQTT-SN 1.2 message; the text says why."""


def frame(message_type, body):
    """A whole message: Length (one byte, or 0x01 and two), MsgType, body."""
    length = len(body) + 2
    if length <= C.MAX_SHORT_LENGTH:
        return bytes((length, message_type)) + body
    length += 2
    if length > C.MAX_LENGTH:
        raise ValueError(
            f"{C.message_name(message_type)} of {length} bytes is longer than {C.MAX_LENGTH}"
        )
    return bytes((C.LONG_LENGTH_MARK, length >> 8, length & 0xFF, message_type)) + body


def short_topic_id(name):
    """The TopicId field of a two-octet short topic name (``"ab"``)."""
    raw = name.encode("utf-8")
    if len(raw) != 2:
        raise ValueError(f"short topic name {name!r} is not two octets")
    return _unpack_u16(raw)[0]


def short_topic_name(topic_id):
    """The short topic name a PUBLISH's TopicId field holds."""
    return _utf8(_pack_u16(topic_id), "short topic name")


# Validators of the fields, for messages this process makes.


def _integer(low, high):
    def check(instance, attribute, value):
        if not isinstance(value, int):
            raise TypeError(f"{attribute.name} must be an integer, not {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{attribute.name} must be from {low} to {high}, not {value}")

    return check


_u8 = _integer(0, 0xFF)
_u16 = _integer(0, 0xFFFF)
_qos = attr.validators.in_(C.QOS_LEVELS)
_topic_id_type = attr.validators.in_(C.TOPIC_ID_TYPES)
_flag = attr.validators.instance_of(bool)
_text = attr.validators.instance_of(str)
_optional_text = attr.validators.optional(_text)
_octets = attr.validators.instance_of(bytes)


# Readers of the fields, for bytes from the network.


def octets(count):
    """``count`` with its noun, for error texts: "1 byte", "7 bytes"."""
    return "1 byte" if count == 1 else f"{count} bytes"


def _expect(body, size, message_type):
    if len(body) != size:
        raise MalformedDatagram(
            f"{C.message_name(message_type)}: {octets(len(body))} after the header, {size} expected"
        )


def _at_least(body, size, message_type):
    if len(body) < size:
        raise MalformedDatagram(
            f"{C.message_name(message_type)}: {octets(len(body))} after the header, "
            f"at least {size} expected"
        )


def _utf8(raw, what):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedDatagram(f"{what} is not UTF-8") from None


def _read_qos(flags):
    return C.FLAGS_TO_QOS[flags & C.QOS_BITS]


def _read_topic_id_type(flags, message_type):
    kind = flags & C.TOPIC_ID_TYPE_BITS
    if kind not in C.TOPIC_ID_TYPES:
        raise MalformedDatagram(f"{C.message_name(message_type)}: TopicIdType 0b11 is reserved")
    return kind


@attr.s(frozen=True, slots=True)
class Advertise:
    """ADVERTISE: a gateway's id and the seconds until its next ADVERTISE."""

    gateway_id = attr.ib(validator=_u8)
    duration = attr.ib(validator=_u16)

    message_type = C.ADVERTISE

    def encode(self):
        return frame(C.ADVERTISE, bytes((self.gateway_id,)) + _pack_u16(self.duration))

    @classmethod
    def decode_body(cls, body):
        _expect(body, 3, C.ADVERTISE)
        return cls(body[0], _unpack_u16(body, 1)[0])


@attr.s(frozen=True, slots=True)
class SearchGw:
    """SEARCHGW: a client looking for a gateway, over ``radius`` hops."""

    radius = attr.ib(default=0, validator=_u8)

    message_type = C.SEARCHGW

    def encode(self):
        return frame(C.SEARCHGW, bytes((self.radius,)))

    @classmethod
    def decode_body(cls, body):
        _expect(body, 1, C.SEARCHGW)
        return cls(body[0])


@attr.s(frozen=True, slots=True)
class GwInfo:
    """
    GWINFO: a gateway's id, and its address (network-specific bytes) when
    a client answers a SEARCHGW for it; empty from the gateway itself.
    """

    gateway_id = attr.ib(validator=_u8)
    gateway_address = attr.ib(default=b"", validator=_octets)

    message_type = C.GWINFO

    def encode(self):
        return frame(C.GWINFO, bytes((self.gateway_id,)) + self.gateway_address)

    @classmethod
    def decode_body(cls, body):
        _at_least(body, 1, C.GWINFO)
        return cls(body[0], body[1:])


@attr.s(frozen=True, slots=True)
class Connect:
    """
    CONNECT: ``duration`` is the keep-alive period in seconds; ``will``
    asks the gateway to prompt for a will (WILLTOPICREQ, WILLMSGREQ).
    ``protocol_id`` is 0x01 in MQTT-SN 1.2: kept, so that the gateway can
    answer another with a refusal.
    """

    client_id = attr.ib(validator=_text)
    duration = attr.ib(validator=_u16)
    clean_session = attr.ib(default=True, validator=_flag)
    will = attr.ib(default=False, validator=_flag)
    protocol_id = attr.ib(default=C.PROTOCOL_ID, validator=_u8)

    message_type = C.CONNECT

    def encode(self):
        flags = (C.WILL if self.will else 0) | (C.CLEAN_SESSION if self.clean_session else 0)
        return frame(
            C.CONNECT,
            bytes((flags, self.protocol_id))
            + _pack_u16(self.duration)
            + self.client_id.encode("utf-8"),
        )

    @classmethod
    def decode_body(cls, body):
        _at_least(body, 4, C.CONNECT)
        flags = body[0]
        return cls(
            client_id=_utf8(body[4:], "CONNECT ClientId"),
            duration=_unpack_u16(body, 2)[0],
            clean_session=bool(flags & C.CLEAN_SESSION),
            will=bool(flags & C.WILL),
            protocol_id=body[1],
        )


@attr.s(frozen=True, slots=True)
class _Empty:
    """A message of a header alone."""

    def encode(self):
        return bytes((2, self.message_type))

    @classmethod
    def decode_body(cls, body):
        _expect(body, 0, cls.message_type)
        return cls()


@attr.s(frozen=True, slots=True)
class WillTopicReq(_Empty):
    """WILLTOPICREQ: the gateway asks a connecting client for its will topic."""

    message_type = C.WILLTOPICREQ


@attr.s(frozen=True, slots=True)
class WillMsgReq(_Empty):
    """WILLMSGREQ: the gateway asks a connecting client for its will message."""

    message_type = C.WILLMSGREQ


@attr.s(frozen=True, slots=True)
class Pingresp(_Empty):
    """PINGRESP: the answer to a PINGREQ, and the end of a sleeper's wake."""

    message_type = C.PINGRESP


@attr.s(frozen=True, slots=True)
class _ReturnCodeOnly:
    """A message of a ReturnCode alone."""

    return_code = attr.ib(default=C.ACCEPTED, validator=_u8)

    def encode(self):
        return bytes((3, self.message_type, self.return_code))

    @classmethod
    def decode_body(cls, body):
        _expect(body, 1, cls.message_type)
        return cls(body[0])


@attr.s(frozen=True, slots=True)
class Connack(_ReturnCodeOnly):
    """CONNACK: the gateway's answer to a CONNECT."""

    message_type = C.CONNACK


@attr.s(frozen=True, slots=True)
class WillTopicResp(_ReturnCodeOnly):
    """WILLTOPICRESP: the gateway's answer to a WILLTOPICUPD."""

    message_type = C.WILLTOPICRESP


@attr.s(frozen=True, slots=True)
class WillMsgResp(_ReturnCodeOnly):
    """WILLMSGRESP: the gateway's answer to a WILLMSGUPD."""

    message_type = C.WILLMSGRESP


@attr.s(frozen=True, slots=True)
class _WillTopicField:
    """
    A will's topic with its QoS and Retain flags; without a topic
    (``will_topic`` None) the message is its header alone, which deletes
    the will topic and message.
    """

    will_topic = attr.ib(default=None, validator=_optional_text)
    qos = attr.ib(default=0, validator=_qos)
    retain = attr.ib(default=False, validator=_flag)

    def __attrs_post_init__(self):
        if self.will_topic is None and (self.qos or self.retain):
            raise ValueError("an empty will topic message has no QoS or Retain flag")

    def encode(self):
        if self.will_topic is None:
            return bytes((2, self.message_type))
        flags = C.QOS_TO_FLAGS[self.qos] | (C.RETAIN if self.retain else 0)
        return frame(self.message_type, bytes((flags,)) + self.will_topic.encode("utf-8"))

    @classmethod
    def decode_body(cls, body):
        if not body:
            return cls()
        name = C.message_name(cls.message_type)
        flags = body[0]
        return cls(_utf8(body[1:], f"{name} WillTopic"), _read_qos(flags), bool(flags & C.RETAIN))


@attr.s(frozen=True, slots=True)
class WillTopic(_WillTopicField):
    """WILLTOPIC: a connecting client's will topic."""

    message_type = C.WILLTOPIC


@attr.s(frozen=True, slots=True)
class WillTopicUpd(_WillTopicField):
    """WILLTOPICUPD: a connected client changes its will topic."""

    message_type = C.WILLTOPICUPD


@attr.s(frozen=True, slots=True)
class _WillMessageField:
    """A will's message, bytes."""

    will_message = attr.ib(default=b"", validator=_octets)

    def encode(self):
        return frame(self.message_type, self.will_message)

    @classmethod
    def decode_body(cls, body):
        return cls(body)


@attr.s(frozen=True, slots=True)
class WillMsg(_WillMessageField):
    """WILLMSG: a connecting client's will message."""

    message_type = C.WILLMSG


@attr.s(frozen=True, slots=True)
class WillMsgUpd(_WillMessageField):
    """WILLMSGUPD: a connected client changes its will message."""

    message_type = C.WILLMSGUPD


@attr.s(frozen=True, slots=True)
class Register:
    """
    REGISTER: a topic name and the id it is to go by; from a client the
    TopicId is 0x0000 and the gateway's REGACK gives it.
    """

    topic_id = attr.ib(validator=_u16)
    message_id = attr.ib(validator=_u16)
    topic_name = attr.ib(validator=_text)

    message_type = C.REGISTER

    def encode(self):
        return frame(
            C.REGISTER,
            _pack_u16(self.topic_id) + _pack_u16(self.message_id) + self.topic_name.encode("utf-8"),
        )

    @classmethod
    def decode_body(cls, body):
        _at_least(body, 4, C.REGISTER)
        return cls(
            _unpack_u16(body, 0)[0], _unpack_u16(body, 2)[0], _utf8(body[4:], "REGISTER TopicName")
        )


@attr.s(frozen=True, slots=True)
class _TopicAck:
    """An acknowledgement of a topic id and a message id, with a ReturnCode."""

    topic_id = attr.ib(validator=_u16)
    message_id = attr.ib(validator=_u16)
    return_code = attr.ib(default=C.ACCEPTED, validator=_u8)

    def encode(self):
        return (
            bytes((7, self.message_type))
            + _pack_u16(self.topic_id)
            + _pack_u16(self.message_id)
            + bytes((self.return_code,))
        )

    @classmethod
    def decode_body(cls, body):
        _expect(body, 5, cls.message_type)
        return cls(_unpack_u16(body, 0)[0], _unpack_u16(body, 2)[0], body[4])


@attr.s(frozen=True, slots=True)
class Regack(_TopicAck):
    """REGACK: the answer to a REGISTER."""

    message_type = C.REGACK


@attr.s(frozen=True, slots=True)
class Puback(_TopicAck):
    """PUBACK: a QoS 1 PUBLISH received, or one refused (any QoS)."""

    message_type = C.PUBACK


@attr.s(frozen=True, slots=True)
class Publish:
    """
    PUBLISH: ``topic_id`` is read by ``topic_id_type``: a registered
    (normal) topic id, a pre-defined one, or a short topic name's two
    octets (:func:`short_topic_name`).  QoS -1 is ``qos=-1``.  The
    message id is 0x0000 at QoS 0 and -1.
    """

    topic_id = attr.ib(validator=_u16)
    data = attr.ib(default=b"", validator=_octets)
    qos = attr.ib(default=0, validator=_qos)
    retain = attr.ib(default=False, validator=_flag)
    dup = attr.ib(default=False, validator=_flag)
    message_id = attr.ib(default=0, validator=_u16)
    topic_id_type = attr.ib(default=C.NORMAL_TOPIC_ID, validator=_topic_id_type)

    message_type = C.PUBLISH

    def encode(self):
        flags = (
            (C.DUP if self.dup else 0)
            | C.QOS_TO_FLAGS[self.qos]
            | (C.RETAIN if self.retain else 0)
            | self.topic_id_type
        )
        return frame(
            C.PUBLISH,
            bytes((flags,)) + _pack_u16(self.topic_id) + _pack_u16(self.message_id) + self.data,
        )

    @classmethod
    def decode_body(cls, body):
        _at_least(body, 5, C.PUBLISH)
        flags = body[0]
        return cls(
            topic_id=_unpack_u16(body, 1)[0],
            data=body[5:],
            qos=_read_qos(flags),
            retain=bool(flags & C.RETAIN),
            dup=bool(flags & C.DUP),
            message_id=_unpack_u16(body, 3)[0],
            topic_id_type=_read_topic_id_type(flags, C.PUBLISH),
        )


@attr.s(frozen=True, slots=True)
class _MessageIdOnly:
    """A message of a message id alone."""

    message_id = attr.ib(validator=_u16)

    def encode(self):
        return bytes((4, self.message_type)) + _pack_u16(self.message_id)

    @classmethod
    def decode_body(cls, body):
        _expect(body, 2, cls.message_type)
        return cls(_unpack_u16(body, 0)[0])


@attr.s(frozen=True, slots=True)
class Pubcomp(_MessageIdOnly):
    """PUBCOMP: the end of a QoS 2 exchange."""

    message_type = C.PUBCOMP


@attr.s(frozen=True, slots=True)
class Pubrec(_MessageIdOnly):
    """PUBREC: a QoS 2 PUBLISH received."""

    message_type = C.PUBREC


@attr.s(frozen=True, slots=True)
class Pubrel(_MessageIdOnly):
    """PUBREL: a QoS 2 PUBLISH released."""

    message_type = C.PUBREL


@attr.s(frozen=True, slots=True)
class Unsuback(_MessageIdOnly):
    """UNSUBACK: the answer to an UNSUBSCRIBE."""

    message_type = C.UNSUBACK


@attr.s(frozen=True, slots=True)
class _TopicChoice:
    """
    The end of a SUBSCRIBE or UNSUBSCRIBE, read by its TopicIdType: a
    topic name (which may hold wildcards) or a short topic name in
    ``topic_name``, or a pre-defined topic id in ``topic_id``.
    """

    message_id = attr.ib(validator=_u16)
    topic_name = attr.ib(default=None, validator=_optional_text)
    topic_id = attr.ib(default=None, validator=attr.validators.optional(_u16))
    topic_id_type = attr.ib(default=C.NORMAL_TOPIC_ID, validator=_topic_id_type)

    def __attrs_post_init__(self):
        if self.topic_id_type == C.PREDEFINED_TOPIC_ID:
            if self.topic_id is None or self.topic_name is not None:
                raise ValueError("a pre-defined topic id is a topic_id, without a topic_name")
            return
        if self.topic_name is None or self.topic_id is not None:
            raise ValueError("a topic name or short topic name is a topic_name, without a topic_id")
        if self.topic_id_type == C.SHORT_TOPIC_NAME:
            short_topic_id(self.topic_name)

    def _encode_topic(self):
        if self.topic_id_type == C.PREDEFINED_TOPIC_ID:
            return _pack_u16(self.topic_id)
        return self.topic_name.encode("utf-8")

    @staticmethod
    def _decode_topic(raw, kind, message_type):
        """(topic_name, topic_id) from the bytes after the message id."""
        name = C.message_name(message_type)
        if kind != C.NORMAL_TOPIC_ID and len(raw) != 2:
            raise MalformedDatagram(
                f"{name}: a {C.TOPIC_ID_TYPE_NAMES[kind]} of {octets(len(raw))}, 2 expected"
            )
        if kind == C.PREDEFINED_TOPIC_ID:
            return None, _unpack_u16(raw)[0]
        return _utf8(raw, f"{name} TopicName"), None


@attr.s(frozen=True, slots=True)
class Subscribe(_TopicChoice):
    """SUBSCRIBE: a topic filter, short topic name or pre-defined id, at ``qos``."""

    qos = attr.ib(default=0, validator=_qos)
    dup = attr.ib(default=False, validator=_flag)

    message_type = C.SUBSCRIBE

    def encode(self):
        flags = (C.DUP if self.dup else 0) | C.QOS_TO_FLAGS[self.qos] | self.topic_id_type
        return frame(
            C.SUBSCRIBE, bytes((flags,)) + _pack_u16(self.message_id) + self._encode_topic()
        )

    @classmethod
    def decode_body(cls, body):
        _at_least(body, 3, C.SUBSCRIBE)
        flags = body[0]
        kind = _read_topic_id_type(flags, C.SUBSCRIBE)
        topic_name, topic_id = cls._decode_topic(body[3:], kind, C.SUBSCRIBE)
        return cls(
            message_id=_unpack_u16(body, 1)[0],
            topic_name=topic_name,
            topic_id=topic_id,
            topic_id_type=kind,
            qos=_read_qos(flags),
            dup=bool(flags & C.DUP),
        )


@attr.s(frozen=True, slots=True)
class Unsubscribe(_TopicChoice):
    """UNSUBSCRIBE: a topic filter, short topic name or pre-defined id."""

    message_type = C.UNSUBSCRIBE

    def encode(self):
        return frame(
            C.UNSUBSCRIBE,
            bytes((self.topic_id_type,)) + _pack_u16(self.message_id) + self._encode_topic(),
        )

    @classmethod
    def decode_body(cls, body):
        _at_least(body, 3, C.UNSUBSCRIBE)
        kind = _read_topic_id_type(body[0], C.UNSUBSCRIBE)
        topic_name, topic_id = cls._decode_topic(body[3:], kind, C.UNSUBSCRIBE)
        return cls(_unpack_u16(body, 1)[0], topic_name, topic_id, kind)


@attr.s(frozen=True, slots=True)
class Suback:
    """
    SUBACK: the granted QoS, and the topic id the gateway will publish
    with (0x0000 for a wildcard filter or a short topic name).
    """

    topic_id = attr.ib(validator=_u16)
    message_id = attr.ib(validator=_u16)
    return_code = attr.ib(default=C.ACCEPTED, validator=_u8)
    qos = attr.ib(default=0, validator=_qos)

    message_type = C.SUBACK

    def encode(self):
        return (
            bytes((8, C.SUBACK, C.QOS_TO_FLAGS[self.qos]))
            + _pack_u16(self.topic_id)
            + _pack_u16(self.message_id)
            + bytes((self.return_code,))
        )

    @classmethod
    def decode_body(cls, body):
        _expect(body, 6, C.SUBACK)
        return cls(
            _unpack_u16(body, 1)[0], _unpack_u16(body, 3)[0], body[5], _read_qos(body[0])
        )


@attr.s(frozen=True, slots=True)
class Pingreq:
    """
    PINGREQ: a keep-alive, or with ``client_id`` a sleeping client awake
    to collect what the gateway held for it.
    """

    client_id = attr.ib(default=None, validator=_optional_text)

    message_type = C.PINGREQ

    def encode(self):
        if self.client_id is None:
            return bytes((2, C.PINGREQ))
        return frame(C.PINGREQ, self.client_id.encode("utf-8"))

    @classmethod
    def decode_body(cls, body):
        return cls(_utf8(body, "PINGREQ ClientId") if body else None)


@attr.s(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: with a ``duration`` (seconds), the client goes to sleep."""

    duration = attr.ib(default=None, validator=attr.validators.optional(_u16))

    message_type = C.DISCONNECT

    def encode(self):
        if self.duration is None:
            return bytes((2, C.DISCONNECT))
        return bytes((4, C.DISCONNECT)) + _pack_u16(self.duration)

    @classmethod
    def decode_body(cls, body):
        if not body:
            return cls()
        _expect(body, 2, C.DISCONNECT)
        return cls(_unpack_u16(body)[0])


def _inner_message(instance, attribute, value):
    if isinstance(value, Encapsulated) or not hasattr(value, "decode_body"):
        raise TypeError(f"{attribute.name} must be an MQTT-SN message, not {value!r}")


def _node_id(instance, attribute, value):
    _octets(instance, attribute, value)
    if len(value) > MAX_WIRELESS_NODE_ID:
        raise ValueError(
            f"a Wireless Node Id of {octets(len(value))}, at most {MAX_WIRELESS_NODE_ID}"
        )


@attr.s(frozen=True, slots=True)
class Encapsulated:
    """
    An MQTT-SN message a forwarder relays, with the Wireless Node Id of
    the node it came from or goes to, and the broadcast ``radius`` (Ctrl
    bits 0 and 1; relevant from the gateway to the forwarder).
    """

    message = attr.ib(validator=_inner_message)
    wireless_node_id = attr.ib(default=b"", validator=_node_id)
    radius = attr.ib(default=0, validator=_integer(0, 3))

    message_type = C.ENCAPSULATED_MESSAGE

    def encode(self):
        node = self.wireless_node_id
        header = bytes((3 + len(node), C.ENCAPSULATED_MESSAGE, self.radius)) + node
        return header + self.message.encode()

"""
MQTT-SN 1.2 datagrams to message objects: one datagram is one message,
or one forwarder's Encapsulated message around one.  Pure: no I/O, no
clock.  Anything else raises :class:`MalformedDatagram`, and nothing else.
"""

from mqttgw.wire.mqttsn import constants as C
from mqttgw.wire.mqttsn import packets as P
from mqttgw.wire.mqttsn.packets import MalformedDatagram, octets

MESSAGE_CLASSES = {
    cls.message_type: cls
    for cls in (
        P.Advertise, P.SearchGw, P.GwInfo, P.Connect, P.Connack,
        P.WillTopicReq, P.WillTopic, P.WillMsgReq, P.WillMsg,
        P.Register, P.Regack, P.Publish, P.Puback, P.Pubcomp, P.Pubrec, P.Pubrel,
        P.Subscribe, P.Suback, P.Unsubscribe, P.Unsuback,
        P.Pingreq, P.Pingresp, P.Disconnect,
        P.WillTopicUpd, P.WillTopicResp, P.WillMsgUpd, P.WillMsgResp,
    )
}


def decode(datagram, max_length=C.MAX_LENGTH):
    """
    The message a datagram holds (an :class:`~packets.Encapsulated` for a
    forwarder's), or MalformedDatagram naming what is wrong: longer than
    ``max_length`` bytes, truncated, a Length field other than the
    datagram's size, an unknown or reserved MsgType, fields that do not
    fit the message.
    """
    data = bytes(datagram)
    if len(data) > max_length:
        raise MalformedDatagram(f"datagram of {octets(len(data))}, more than {max_length}")
    # An Encapsulated message's Length is one byte and counts only its
    # own header; the relayed message follows it.
    if len(data) >= 2 and data[1] == C.ENCAPSULATED_MESSAGE and data[0] != C.LONG_LENGTH_MARK:
        return _decode_encapsulated(data)
    return _decode_message(data)


# publish_fields reads these on every datagram.
_PUBLISH = C.PUBLISH
_TOPIC_ID_TYPE_BITS = C.TOPIC_ID_TYPE_BITS
_RESERVED_TOPIC_ID_TYPE = 0x03
_QOS_BITS = C.QOS_BITS
_FLAGS_TO_QOS = C.FLAGS_TO_QOS
_RETAIN = C.RETAIN


def publish_fields(data):
    """
    A PUBLISH with a one-byte Length as ``(qos, retain, topic_id_type,
    topic_id, message_id, payload)``, without a message object: the common
    datagram, read in one step.  None for anything else, which
    :func:`decode` reads and checks.
    """
    size = len(data)
    if size < 7 or data[1] != _PUBLISH or data[0] != size:
        return None
    flags = data[2]
    topic_id_type = flags & _TOPIC_ID_TYPE_BITS
    if topic_id_type == _RESERVED_TOPIC_ID_TYPE:
        return None
    return (
        _FLAGS_TO_QOS[flags & _QOS_BITS],
        bool(flags & _RETAIN),
        topic_id_type,
        (data[3] << 8) | data[4],
        (data[5] << 8) | data[6],
        data[7:],
    )


def _decode_message(data):
    size = len(data)
    if size < 2:
        raise MalformedDatagram(f"datagram of {octets(size)}, shorter than any MQTT-SN message")
    if data[0] == C.LONG_LENGTH_MARK:
        if size < 4:
            raise MalformedDatagram(
                f"three-byte Length field truncated: datagram of {octets(size)}"
            )
        length = (data[1] << 8) | data[2]
        header = 4
    else:
        length = data[0]
        header = 2
    if length < header:
        raise MalformedDatagram(f"Length field says {length}, shorter than its own header")
    if length != size:
        raise MalformedDatagram(f"Length field says {octets(length)}, the datagram has {size}")
    message_type = data[header - 1]
    cls = MESSAGE_CLASSES.get(message_type)
    if cls is None:
        if message_type == C.ENCAPSULATED_MESSAGE:
            raise MalformedDatagram(
                "Encapsulated message with a three-byte Length or inside another"
            )
        raise MalformedDatagram(f"unknown MsgType {message_type:#04x}")
    return cls.decode_body(data[header:])


def _decode_encapsulated(data):
    length = data[0]
    if length < 3:
        raise MalformedDatagram(f"Encapsulated message: Length {length}, at least 3 expected")
    if length >= len(data):
        raise MalformedDatagram(
            f"Encapsulated message: Length {length} leaves no message "
            f"in a datagram of {octets(len(data))}"
        )
    return P.Encapsulated(
        message=_decode_message(data[length:]),
        wireless_node_id=data[3:length],
        radius=data[2] & 0x03,
    )

"""
The numbers of MQTT-SN 1.2 by their names in the specification: message
types (section 5.2.2), the Flags field (5.3.4), the ReturnCode field
(5.3.10) and the protocol id (5.3.6).
"""

ADVERTISE = 0x00
SEARCHGW = 0x01
GWINFO = 0x02
CONNECT = 0x04
CONNACK = 0x05
WILLTOPICREQ = 0x06
WILLTOPIC = 0x07
WILLMSGREQ = 0x08
WILLMSG = 0x09
REGISTER = 0x0A
REGACK = 0x0B
PUBLISH = 0x0C
PUBACK = 0x0D
PUBCOMP = 0x0E
PUBREC = 0x0F
PUBREL = 0x10
SUBSCRIBE = 0x12
SUBACK = 0x13
UNSUBSCRIBE = 0x14
UNSUBACK = 0x15
PINGREQ = 0x16
PINGRESP = 0x17
DISCONNECT = 0x18
WILLTOPICUPD = 0x1A
WILLTOPICRESP = 0x1B
WILLMSGUPD = 0x1C
WILLMSGRESP = 0x1D
# A message relayed by a forwarder, with the wireless node it came from
# or goes to (section 5.5).
ENCAPSULATED_MESSAGE = 0xFE

MESSAGE_NAMES = {
    ADVERTISE: "ADVERTISE",
    SEARCHGW: "SEARCHGW",
    GWINFO: "GWINFO",
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    WILLTOPICREQ: "WILLTOPICREQ",
    WILLTOPIC: "WILLTOPIC",
    WILLMSGREQ: "WILLMSGREQ",
    WILLMSG: "WILLMSG",
    REGISTER: "REGISTER",
    REGACK: "REGACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBCOMP: "PUBCOMP",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    WILLTOPICUPD: "WILLTOPICUPD",
    WILLTOPICRESP: "WILLTOPICRESP",
    WILLMSGUPD: "WILLMSGUPD",
    WILLMSGRESP: "WILLMSGRESP",
    ENCAPSULATED_MESSAGE: "Encapsulated message",
}

# The Flags field, one byte: DUP, QoS (two bits), Retain, Will,
# CleanSession, TopicIdType (two bits).
DUP = 0x80
QOS_BITS = 0x60
RETAIN = 0x10
WILL = 0x08
CLEAN_SESSION = 0x04
TOPIC_ID_TYPE_BITS = 0x03

# QoS -1, "publish without connecting", is coded 0b11.
QOS_MINUS_ONE = -1
QOS_LEVELS = (QOS_MINUS_ONE, 0, 1, 2)
QOS_TO_FLAGS = {0: 0x00, 1: 0x20, 2: 0x40, QOS_MINUS_ONE: 0x60}
FLAGS_TO_QOS = {bits: qos for qos, bits in QOS_TO_FLAGS.items()}

# TopicIdType: what the TopicId (or TopicName) field holds.  0b11 is
# reserved.
NORMAL_TOPIC_ID = 0b00
PREDEFINED_TOPIC_ID = 0b01
SHORT_TOPIC_NAME = 0b10
TOPIC_ID_TYPES = (NORMAL_TOPIC_ID, PREDEFINED_TOPIC_ID, SHORT_TOPIC_NAME)
TOPIC_ID_TYPE_NAMES = {
    NORMAL_TOPIC_ID: "normal topic id",
    PREDEFINED_TOPIC_ID: "pre-defined topic id",
    SHORT_TOPIC_NAME: "short topic name",
}

# ReturnCode; 0x04 to 0xFF are reserved.
ACCEPTED = 0x00
REJECTED_CONGESTION = 0x01
REJECTED_INVALID_TOPIC_ID = 0x02
REJECTED_NOT_SUPPORTED = 0x03
RETURN_CODE_NAMES = {
    ACCEPTED: "Accepted",
    REJECTED_CONGESTION: "Rejected: congestion",
    REJECTED_INVALID_TOPIC_ID: "Rejected: invalid topic ID",
    REJECTED_NOT_SUPPORTED: "Rejected: not supported",
}

# The one ProtocolId of MQTT-SN 1.2 (MQTT's protocol name and version).
PROTOCOL_ID = 0x01

# The Length field counts the whole message, itself included: one byte
# up to 255, else 0x01 and two bytes up to 65535.
MAX_SHORT_LENGTH = 0xFF
MAX_LENGTH = 0xFFFF
LONG_LENGTH_MARK = 0x01


def return_code_name(code):
    """A ReturnCode's name, for log lines."""
    return RETURN_CODE_NAMES.get(code, f"reserved return code {code:#04x}")


def message_name(message_type):
    """A MsgType's name, for log lines."""
    return MESSAGE_NAMES.get(message_type, f"reserved message type {message_type:#04x}")

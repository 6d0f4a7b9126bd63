"""
MQTT-SN 1.2 (OASIS MQTT For Sensor Networks) on the wire: its numbers
(``constants``), one class per message that encodes itself (``packets``),
and ``decode`` from a datagram (``codec``).  Pure: no I/O, no clock.
"""

from mqttgw.wire.mqttsn.codec import MESSAGE_CLASSES, decode, publish_fields
from mqttgw.wire.mqttsn.packets import (
    Advertise,
    Connack,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    MalformedDatagram,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Regack,
    Register,
    SearchGw,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
    short_topic_id,
    short_topic_name,
)

__all__ = [
    "MESSAGE_CLASSES", "decode", "publish_fields", "MalformedDatagram", "short_topic_id", "short_topic_name",
    "Advertise", "SearchGw", "GwInfo", "Connect", "Connack",
    "WillTopicReq", "WillTopic", "WillMsgReq", "WillMsg",
    "Register", "Regack", "Publish", "Puback", "Pubcomp", "Pubrec", "Pubrel",
    "Subscribe", "Suback", "Unsubscribe", "Unsuback",
    "Pingreq", "Pingresp", "Disconnect",
    "WillTopicUpd", "WillTopicResp", "WillMsgUpd", "WillMsgResp", "Encapsulated",
]

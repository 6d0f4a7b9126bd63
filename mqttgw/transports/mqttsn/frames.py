"""
The outbound PUBLISH of an MQTT-SN client, as its session asks for it
(:class:`~mqttgw.broker.interfaces.IFrames`): the topic by the id the
client knows it by, and where it knows none yet (a wildcard
subscription's match), a REGISTER sent first and the PUBLISH held by the
client until its REGACK.
"""

from zope.interface import implementer

from mqttgw.broker.deliveryframes import TooLarge
from mqttgw.broker.interfaces import IFrames
from mqttgw.wire.mqttsn import Publish
from mqttgw.wire.mqttsn import constants as C


@implementer(IFrames)
class SnFrames:
    """
    PUBLISH frames for one client (an object with ``topics``, its
    TopicRegistry, and ``register_topic(name)``), at most ``max_size``
    bytes each.
    """

    __slots__ = ("client", "max_size")
    # 1.2 clients are re-sent what they have not acknowledged, as 3.1.1's.
    retries = True
    expires = False

    def __init__(self, client, max_size=C.MAX_LENGTH):
        self.client = client
        self.max_size = max_size

    def publish(self, message, qos, mid, retain, dup, group):
        client = self.client
        where = client.topics.outbound(message.topic)
        if where is None:
            topic_id = client.register_topic(message.topic)
            if topic_id is None:
                # The client's registrations are at their bound: not delivered, counted.
                raise TooLarge()
            where = (C.NORMAL_TOPIC_ID, topic_id)
        kind, topic_id = where
        payload = message.payload
        if len(payload) + 9 > self.max_size:
            raise TooLarge()
        return Publish(
            topic_id, payload, qos, retain, dup and qos > 0, mid or 0, kind
        ).encode()


def publish_topic_id(frame):
    """The (TopicIdType, TopicId) of an encoded PUBLISH, or None for any other message."""
    header = 4 if frame[0] == C.LONG_LENGTH_MARK else 2
    if len(frame) < header + 3 or frame[header - 1] != C.PUBLISH:
        return None
    return frame[header] & C.TOPIC_ID_TYPE_BITS, (frame[header + 1] << 8) | frame[header + 2]

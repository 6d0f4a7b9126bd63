"""
QoS -1: a PUBLISH from an address that never connected, on a pre-defined
topic id or a short topic name, routed when ``mqttsn.qos_minus_one`` is
on and the ACL lets the anonymous identity (or the client id the clients
file gives that address, with its ``QoS-1`` flag) write the topic.
"""

from twisted.logger import Logger

from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import MalformedDatagram, short_topic_name
from mqttgw.wire.mqttsn import constants as C

log = Logger()


class QosMinusOne:
    """The QoS -1 publishing of a listener (an ISnListener with ``drop``)."""

    __slots__ = ("listener",)

    def __init__(self, listener):
        self.listener = listener

    def handle_PUBLISH(self, route, message):
        listener = self.listener
        options = listener.options
        if message.qos != C.QOS_MINUS_ONE:
            return listener.drop(route, "PUBLISH from an address not connected")
        if not options.qos_minus_one:
            return listener.drop(route, "QoS -1 PUBLISH while mqttsn.qos_minus_one is off")
        client_id, username = "", None
        if options.clients is not None:
            entry = options.clients.at(route.host, route.port)
            if entry is None or not entry.qos_minus_one:
                return listener.drop(route, "QoS -1 PUBLISH from an address the clients file gives no QoS-1")
            client_id = username = entry.client_id
        topic = self._topic(options, client_id, message)
        if topic is None or not topic or "+" in topic or "#" in topic or "\x00" in topic:
            return listener.drop(route, "QoS -1 PUBLISH on an unknown topic id")
        router = listener.router
        stats = router.stats
        if not router.access.may_publish(username, client_id, topic):
            stats.messages_denied += 1
            return listener.drop(route, f"QoS -1 PUBLISH on {topic!r}: not allowed by the ACL")
        stats.messages_received += 1
        stats.publish_bytes_received += len(message.data)
        router.publish(P.Publish(topic, message.data, 0, message.retain), None)
        return None

    @staticmethod
    def _topic(options, client_id, message):
        kind = message.topic_id_type
        if kind == C.PREDEFINED_TOPIC_ID:
            if options.predefined is None:
                return None
            return options.predefined.topic_name(client_id, message.topic_id)
        if kind == C.SHORT_TOPIC_NAME:
            try:
                return short_topic_name(message.topic_id)
            except MalformedDatagram:
                return None
        return None

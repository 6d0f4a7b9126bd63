"""
An MQTT-SN client's REGISTER and PUBLISH, and the acknowledgements of
both directions: topic ids to names, the ACL at the door, the router,
and PUBACK/PUBREC/PUBCOMP in order, after the store's commit where the
message must outlive a crash (as MQTT's publishing has them).  A part of
:class:`~mqttgw.transports.mqttsn.client.SnClient`.
"""

from twisted.logger import Logger
from zope.interface import Interface, implementer

from mqttgw.broker.acks import OrderedAcks
from mqttgw.broker.topics import InvalidTopic, validate_topic_name
from mqttgw.transports.publishing import write_allowed
from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import Puback, Pubcomp, Pubrec, Regack
from mqttgw.wire.mqttsn import constants as C
from mqttgw.wire.printable import printable

log = Logger()


class ISnPublishing(Interface):
    """What a connected MQTT-SN client's messages about publishing go to."""

    def handle_REGISTER(message):
        """The client names a topic: its id in a REGACK."""

    def handle_REGACK(message):
        """The client's answer to the gateway's REGISTER."""

    def handle_PUBLISH(message):
        """A message from the client, routed and acknowledged."""

    def publish(qos, retain, topic_id_type, topic_id, mid, data):
        """A PUBLISH's fields, as ``publish_fields`` reads them: routed and acknowledged."""

    def handle_PUBACK(message):
        """The client acknowledges a QoS 1 delivery."""

    def handle_PUBREC(message):
        """The client received a QoS 2 delivery."""

    def handle_PUBREL(message):
        """The client releases its QoS 2 message."""

    def handle_PUBCOMP(message):
        """The client completes a QoS 2 delivery."""


def topic_of(topics, topic_id_type, topic_id):
    """The topic name a PUBLISH goes to, or None: an id the client has not registered."""
    topic = topics.topic_name(topic_id_type, topic_id)
    if topic is None or not topic or "+" in topic or "#" in topic or "\x00" in topic:
        return None
    return topic


@implementer(ISnPublishing)
class SnPublishing:
    """The publishing of one client (an ISnClient) and its session."""

    __slots__ = ("client", "router", "stats", "session", "may_write", "acks", "_denied")

    def __init__(self, client, router, session, may_write):
        self.client = client
        self.router = router
        self.stats = router.stats
        self.session = session
        # A cached ACL check of what the client may publish, or None: the
        # reserved topics' rule alone.
        self.may_write = may_write
        self.acks = None
        self._denied = None

    def handle_REGISTER(self, message):
        client = self.client
        name = message.topic_name
        try:
            validate_topic_name(name)
        except InvalidTopic:
            client.send(Regack(0, message.message_id, C.REJECTED_INVALID_TOPIC_ID).encode())
            return
        topic_id = client.register_own(name)
        if topic_id is None:
            client.send(Regack(0, message.message_id, C.REJECTED_CONGESTION).encode())
            return
        client.send(Regack(topic_id, message.message_id, C.ACCEPTED).encode())

    def handle_REGACK(self, message):
        client = self.client
        client.registered(message.topic_id, message.return_code)
        # An awake sleeper whose last held message this released may sleep again.
        client.acknowledged()

    def handle_PUBLISH(self, message):
        self.publish(message.qos, message.retain, message.topic_id_type, message.topic_id,
                     message.message_id, message.data)

    def publish(self, qos, retain, topic_id_type, topic_id, mid, data):
        """A PUBLISH's fields (as ``publish_fields`` reads them): routed and acknowledged."""
        client = self.client
        topic = topic_of(client.topics, topic_id_type, topic_id)
        if topic is None:
            # The spec's answer whatever the QoS: the client registers again.
            client.send(Puback(topic_id, mid, C.REJECTED_INVALID_TOPIC_ID).encode())
            return
        if qos < 0:
            # QoS -1 from a connected client is QoS 0.
            qos = 0
        stats = self.stats
        stats.messages_received += 1
        stats.publish_bytes_received += len(data)
        packet = P.Publish(topic, data, qos, retain)
        router = self.router
        if not write_allowed(self.may_write, router.access, client.username, client.client_id, topic):
            return self._denied_publish(topic_id, mid, topic, qos)
        if qos == 0:
            router.publish(packet, self.session)
            return
        if qos == 1:
            ack = Puback(topic_id, mid, C.ACCEPTED).encode()
            if router.may_be_durable(packet):
                if router.store.failed is not None:
                    return self._store_failed()
                held = router.publish_held(packet, self.session)
                self._acknowledge(ack, held is not None, held)
            else:
                self._acknowledge(ack, False)
                router.publish(packet, self.session)
            return
        self._publish_qos2(packet, mid)

    def _publish_qos2(self, packet, mid):
        router, session = self.router, self.session
        ack = Pubrec(mid).encode()
        # Exactly once: a re-sent PUBLISH before PUBREL is not routed again.
        if not session.qos2_received(mid):
            self._acknowledge(ack, False)
        elif session.store is None and not router.may_be_durable(packet):
            self._acknowledge(ack, False)
            router.publish(packet, session)
        elif router.store.failed is not None:
            session.qos2_released(mid)
            self._store_failed()
        elif session.store is not None:
            router.publish(packet, session)
            self._acknowledge(ack, True)
        else:
            held = router.publish_held(packet, session)
            self._acknowledge(ack, held is not None, held)

    def _denied_publish(self, topic_id, mid, topic, qos):
        """Not routed, but acknowledged, so that the client does not send it again."""
        self.stats.messages_denied += 1
        denied = self._denied
        if denied is None:
            denied = self._denied = set()
        if topic not in denied and len(denied) < 100:
            denied.add(topic)
            log.warn(
                "MQTT-SN client {client_id} may not publish on {topic}",
                client_id=self.client.log_id,
                topic=printable(topic),
            )
        if qos == 1:
            self._acknowledge(Puback(topic_id, mid, C.ACCEPTED).encode(), False)
        elif qos == 2:
            self.session.qos2_received(mid)
            self._acknowledge(Pubrec(mid).encode(), False)

    def _store_failed(self):
        """A QoS 1/2 publish needs the store, which cannot commit: the client goes, its will published."""
        client = self.client
        self.stats.store_refused += 1
        self.router.limited("store refusals", log).warn(
            "dropping MQTT-SN client {client_id}: its QoS 1/2 publish needs the store, which cannot be written",
            client_id=client.log_id,
        )
        client.close(publish_will=True, reason="store failed")

    def _acknowledge(self, ack, durable, held=None):
        acks = self.acks
        if not durable and (acks is None or not acks.queue):
            self.client.send(ack)
            return
        if acks is None:
            acks = self.acks = OrderedAcks(self.router.store, self.client.write_if_connected)
            acks.on_failure = lambda error: self._store_failed()
        acks.send(ack, durable, held)

    def handle_PUBREL(self, message):
        mid = message.message_id
        self._acknowledge(Pubcomp(mid).encode(), self.session.qos2_released(mid))

    def handle_PUBACK(self, message):
        if message.return_code == C.REJECTED_INVALID_TOPIC_ID:
            # The client lost the id: it is registered again for the next delivery.
            self.client.unknown_topic(message.topic_id)
        self.session.window.puback(message.message_id)
        self.client.acknowledged()

    def handle_PUBREC(self, message):
        self.session.window.pubrec(message.message_id)

    def handle_PUBCOMP(self, message):
        self.session.window.pubcomp(message.message_id)
        self.client.acknowledged()

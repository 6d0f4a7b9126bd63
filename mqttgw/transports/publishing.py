"""
A client's PUBLISH and the acknowledgements of both directions: the ACL
at the door, the router, and PUBACK/PUBREC/PUBCOMP written in order, after
the store's commit where the message must outlive a crash.  The hot path:
its cost per message is measured by ``bench.hotpath``.  A part of
:class:`~mqttgw.transports.protocol.MQTTServerProtocol`.
"""

from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.access import BRIDGE_STATE_PREFIX
from mqttgw.broker.acks import OrderedAcks
from mqttgw.transports.handshake import CONNECTED
from mqttgw.transports.interfaces import IPublishing
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.printable import printable

log = Logger()

# What every topic only the gateway writes starts with (those outside it
# are in Access.reserved_topics).
_RESERVED_STARTS = ("$", BRIDGE_STATE_PREFIX)
_puback_bytes = P.puback_bytes
_pubrec_bytes = P.pubrec_bytes
_pubcomp_bytes = P.pubcomp_bytes


def write_allowed(may_write, access, username, client_id, topic):
    """
    Whether a client may publish on ``topic``: its cached ACL check
    ``may_write``, or without one the reserved topics' rule.
    """
    if may_write is not None:
        return may_write(topic)
    return access.may_publish(username, client_id, topic)


@implementer(IPublishing)
class Publishing:
    """
    A connected client's PUBLISH and acknowledgements, for its connection
    (an :class:`~mqttgw.transports.interfaces.IConnection`) and session.
    """

    __slots__ = (
        "connection", "router", "stats", "session", "dialect", "limits",
        "_may_write", "_reserved", "_denied_topics",
        # Acks waiting, in order, behind a store commit (OrderedAcks), once
        # some have.
        "ordered_acks",
    )

    def __init__(self, connection, router, session, dialect, limits, may_write, reserved):
        self.connection = connection
        self.router = router
        self.stats = router.stats
        self.session = session
        self.dialect = dialect
        self.limits = limits
        # A cached ACL check of what the client may publish, or None: then
        # only the reserved topics are checked (see write_allowed).
        self._may_write = may_write
        self._reserved = reserved
        self._denied_topics = None
        self.ordered_acks = None

    def handle_PUBLISH5(self, packet):
        """A 5.0 PUBLISH: the dialect's checks first (alias, maximum QoS, receive maximum)."""
        self.dialect.check_publish(packet, self)
        return self.handle_PUBLISH(packet)

    def handle_PUBLISH(self, packet):
        topic = packet.topic
        if not topic or "+" in topic or "#" in topic or "\x00" in topic:
            return self.connection.protocol_error(
                f"invalid topic name {topic!r} in PUBLISH", R.TOPIC_NAME_INVALID
            )
        qos = packet.qos
        router = self.router
        stats = self.stats
        stats.messages_received += 1
        stats.publish_bytes_received += len(packet.payload)
        session = self.session
        may_write = self._may_write
        if may_write is not None:
            if not may_write(topic):
                return self._denied(packet)
        elif topic.startswith(_RESERVED_STARTS) or topic in self._reserved:
            # Reserved topics start with "$" or are bridge state topics.
            if not self._write_allowed(topic):
                return self._denied(packet)
        if qos == 0:
            router.publish(packet, session)
            return
        # The acknowledgement goes out before the routed copies (the
        # publisher may be a subscriber too), unless it must wait for the
        # store to commit the message.
        if qos == 1:
            ack = _puback_bytes(packet.message_id)
            if router.may_be_durable(packet):
                if router.store.failed is not None:
                    return self._store_failed(packet)
                held = router.publish_held(packet, session)
                self._acknowledge(ack, held is not None, held)
            else:
                self._acknowledge(ack, False)
                router.publish(packet, session)
            return
        mid = packet.message_id
        ack = _pubrec_bytes(mid)
        # Exactly once: a re-sent PUBLISH before PUBREL is not routed again.
        if not session.qos2_received(mid):
            self._acknowledge(ack, False)
        elif session.store is None and not router.may_be_durable(packet):
            self._acknowledge(ack, False)
            router.publish(packet, session)
        elif router.store.failed is not None:
            session.qos2_released(mid)
            return self._store_failed(packet)
        elif session.store is not None:
            # Its id is recorded as received: the ack waits for that commit.
            router.publish(packet, session)
            self._acknowledge(ack, True)
        else:
            held = router.publish_held(packet, session)
            self._acknowledge(ack, held is not None, held)

    def _store_failed(self, reason=None):
        """
        A QoS 1/2 publish needs the store and the store cannot commit:
        rather than leave the client waiting for an ack that cannot come,
        the connection is closed; the client sends the message again when
        it reconnects (and CONNACK tells it when the gateway cannot hold
        persistent sessions).
        """
        connection = self.connection
        self.stats.store_refused += 1
        self.router.limited("store refusals", log).warn(
            "closing connection of client {client_id}: its QoS 1/2 publish needs"
            " the store, which cannot be written",
            client_id=connection.log_id,
        )
        connection.disconnect_first(R.UNSPECIFIED_ERROR, "the store cannot be written")
        connection.close(publish_will=True, graceful=True)

    def _write_allowed(self, topic):
        connection = self.connection
        return write_allowed(self._may_write, self.router.access, connection.username, connection.client_id, topic)

    def _denied(self, packet):
        """
        A PUBLISH the client may not make: not routed, but acknowledged as
        the protocol requires, so the client does not send it again.
        """
        self.router.stats.messages_denied += 1
        denied = self._denied_topics
        if denied is None:
            denied = self._denied_topics = set()
        if packet.topic not in denied and len(denied) < 100:
            # Once per topic and connection, not once per message.
            denied.add(packet.topic)
            log.warn(
                "client {client_id} (user {username}) may not publish on {topic}",
                client_id=self.connection.log_id,
                username=printable(self.connection.username),
                topic=printable(packet.topic),
            )
        ack = self.dialect.denied_ack(self.session, packet)
        if ack is not None:
            self._acknowledge(ack, False)

    def _acknowledge(self, ack, durable, held=None):
        acks = self.ordered_acks
        if not durable and (acks is None or not acks.queue):
            # Nothing to wait for, and nothing waiting before it: written
            # now, without the queue's calls (most acks, on the hot path).
            connection = self.connection
            if connection.state is CONNECTED:
                connection.write(ack)
            return
        if acks is None:
            acks = self.ordered_acks = OrderedAcks(self.router.store, self._write_if_connected)
            acks.on_failure = self._store_failed
        acks.send(ack, durable, held)

    def _write_if_connected(self, data):
        connection = self.connection
        if connection.state is CONNECTED:
            connection.write(data)

    def handle_PUBACK(self, packet):
        self.session.window.puback(packet.message_id)

    def handle_PUBREC(self, packet):
        self.session.window.pubrec(packet.message_id, packet.reason_code >= 0x80)

    def handle_PUBREL5(self, packet):
        """A 5.0 PUBREL of an id not awaiting one is answered with a reason code."""
        mid = packet.message_id
        if mid not in self.session.awaiting_pubrel:
            self._acknowledge(self.dialect.ack(P.Pubcomp, mid, R.PACKET_IDENTIFIER_NOT_FOUND), False)
            return
        self._acknowledge(_pubcomp_bytes(mid), self.session.qos2_released(mid))

    def handle_PUBREL(self, packet):
        mid = packet.message_id
        self._acknowledge(_pubcomp_bytes(mid), self.session.qos2_released(mid))

    def handle_PUBCOMP(self, packet):
        self.session.window.pubcomp(packet.message_id)

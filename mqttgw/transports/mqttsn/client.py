"""
One MQTT-SN client as the broker sees it: a carrier of its session
(:class:`~mqttgw.broker.interfaces.IClientConnection`) in one of the
states of MQTT-SN 1.2 (active, asleep, awake, lost), with its keep alive
or sleep timer at 1.5 times what it asked for, its will, and the messages
it receives dispatched to its parts (publishing, subscribing).
"""

from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.interfaces import IClientConnection
from mqttgw.broker.topics import InvalidTopic, validate_topic_name
from mqttgw.transports.mqttsn.frames import SnFrames, publish_topic_id
from mqttgw.transports.mqttsn.interfaces import ISnClient
from mqttgw.transports.mqttsn.publishing import SnPublishing
from mqttgw.transports.mqttsn.subscribing import SnSubscribing
from mqttgw.transports.publishing import write_allowed
from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import (
    Disconnect,
    Pingresp,
    Pubrel,
    Register,
    WillMsgResp,
    WillTopicResp,
)
from mqttgw.wire.mqttsn import constants as C
from mqttgw.wire.printable import printable

log = Logger()

ACTIVE, ASLEEP, AWAKE, LOST = "active", "asleep", "awake", "lost"

# What the broker's window writes for a PUBLISH's second step (MQTT's
# PUBREL, 0x62 0x02 and the message id), made MQTT-SN's here.
_MQTT_PUBREL = 0x62
# Deliveries held per client while their topic's REGISTER waits for a REGACK.
MAX_HELD = 64
# Seconds before the gateway's REGISTER of a topic is sent again.
REGISTER_RETRY = 5.0
# Seconds an awake client is given to acknowledge what it was sent before
# it is told (PINGRESP) it may sleep again.
AWAKE_LIMIT = 10.0


class SnDialect:
    """What the admin API, ``$SYS`` and log lines read of an MQTT-SN client's protocol."""

    __slots__ = ()
    level = None
    name = "MQTT-SN 1.2"
    counter = "clients_mqttsn"


MQTTSN = SnDialect()

# Messages a client may send in each state, by class name: the handler's
# receiver (None: the client itself) and method.
_ACKS = {
    "Puback": ("publishing", "handle_PUBACK"),
    "Pubrec": ("publishing", "handle_PUBREC"),
    "Pubcomp": ("publishing", "handle_PUBCOMP"),
    "Pubrel": ("publishing", "handle_PUBREL"),
    "Regack": ("publishing", "handle_REGACK"),
    "Pingreq": (None, "handle_PINGREQ"),
    "Disconnect": (None, "handle_DISCONNECT"),
}
HANDLERS = {
    ACTIVE: dict(
        _ACKS,
        Publish=("publishing", "handle_PUBLISH"),
        Register=("publishing", "handle_REGISTER"),
        Subscribe=("subscribing", "handle_SUBSCRIBE"),
        Unsubscribe=("subscribing", "handle_UNSUBSCRIBE"),
        WillTopicUpd=(None, "handle_WILLTOPICUPD"),
        WillMsgUpd=(None, "handle_WILLMSGUPD"),
    ),
    ASLEEP: _ACKS,
    AWAKE: _ACKS,
}


@implementer(IClientConnection, ISnClient)
class SnClient:
    """
    A connected MQTT-SN client at ``route``, held by its ``listener`` (an
    ISnListener); its ``topics`` (a TopicRegistry) may be its persistent
    session's from an earlier connection.
    """

    __slots__ = (
        "listener", "router", "clock", "route", "client_id", "log_id", "username", "keepalive",
        "session", "topics", "frames", "state", "_publishing", "_subscribing", "may_write",
        "held", "next_mid", "deadline", "period", "watched", "_awake_call",
    )
    listener_kind = "mqttsn"
    dialect = MQTTSN

    def __init__(self, listener, route, client_id, username, keepalive, topics):
        self.listener = listener
        self.router = listener.router
        self.clock = listener.clock
        self.route = route
        self.client_id = client_id
        self.log_id = printable(client_id)
        self.username = username
        self.keepalive = keepalive
        self.session = None
        self.topics = topics
        self.frames = SnFrames(self, listener.options.max_datagram_size)
        self.state = ACTIVE
        # Its parts, made as it first needs them (an idle client costs fewer).
        self._publishing = self._subscribing = None
        self.may_write = None
        # PUBLISH frames waiting for a REGACK: topic id -> [frame], once some do.
        self.held = None
        # The gateway's own message ids (REGISTER), below 0x8000 (see topics).
        self.next_mid = 1
        self.deadline = self.period = None
        # The listener's watchdog bucket it waits in (a whole second), or None.
        self.watched = None
        self._awake_call = None

    def __repr__(self):
        return f"<SnClient {self.log_id} at {self.route} {self.state}>"

    @property
    def peer(self):
        """The client's address (a forwarder's, and its node) for log lines and the admin API."""
        return str(self.route)

    # Connection life

    def attach(self, session, may_write):
        """The session is ours: deliveries go out (after the CONNACK sent before)."""
        router = self.router
        self.session = session
        self.may_write = may_write
        router.stats.clients_mqttsn += 1
        session.attach(self, self.frames)
        self.watch(self.keepalive)

    @property
    def publishing(self):
        """Its SnPublishing part."""
        part = self._publishing
        if part is None:
            part = self._publishing = SnPublishing(self, self.router, self.session, self.may_write)
        return part

    @property
    def subscribing(self):
        """Its SnSubscribing part."""
        part = self._subscribing
        if part is None:
            part = self._subscribing = SnSubscribing(self, self.router, self.session)
        return part

    def received(self, message):
        """A message from the client; False when its state takes no such message."""
        handler = HANDLERS.get(self.state, {}).get(type(message).__name__)
        if handler is None:
            return False
        if self.period is not None:
            self.deadline = self.clock.seconds() + self.period
        part, method = handler
        receiver = self if part is None else getattr(self, part)
        getattr(receiver, method)(message)
        return True

    def received_publish(self, fields):
        """A PUBLISH read by ``publish_fields``; False when its state takes none."""
        if self.state is not ACTIVE:
            return False
        if self.period is not None:
            self.deadline = self.clock.seconds() + self.period
        (self._publishing or self.publishing).publish(*fields)
        return True

    def watch(self, seconds):
        """The client is lost if silent 1.5 times ``seconds`` from now (0: never)."""
        watchdog = self.listener.watchdog
        if not seconds:
            self.period = self.deadline = None
            watchdog.unwatch(self)
            return
        self.period = seconds * 1.5
        self.deadline = self.clock.seconds() + self.period
        watchdog.watch(self)

    def overdue(self):
        """Its deadline passed in silence: lost, its will published."""
        asleep = self.state is not ACTIVE
        log.info(
            "MQTT-SN client {client_id} at {peer} is lost: silent past its {what} x 1.5",
            client_id=self.log_id,
            peer=self.peer,
            what="sleep duration" if asleep else "keep alive",
        )
        self.close(publish_will=True, reason="lost")

    def close(self, publish_will, reason=None):
        if self.state is LOST:
            return
        self.state = LOST
        self.listener.watchdog.unwatch(self)
        call, self._awake_call = self._awake_call, None
        if call is not None and call.active():
            call.cancel()
        self.held = None
        if self.listener.limits.connection_messages and reason is not None:
            log.info("client {client_id} ({peer}, MQTT-SN) gone: {reason}", client_id=self.log_id,
                     peer=self.peer, reason=reason)
        self.listener.forget(self)
        session, self.session = self.session, None
        if session is not None:
            self.router.stats.clients_mqttsn -= 1
            self.router.disconnect(session, publish_will)

    # Output

    def write(self, frame):
        """A frame the session (or a part) sends: held while asleep, or until its topic is registered."""
        state = self.state
        if state is ASLEEP or state is LOST:
            # In flight or queued in the session; it goes again on waking.
            return
        if len(frame) == 4 and frame[0] == _MQTT_PUBREL:
            frame = Pubrel((frame[2] << 8) | frame[3]).encode()
        elif self.topics.pending and self._hold(frame):
            return
        self.listener.send(self.route, frame)

    def send(self, frame):
        self.listener.send(self.route, frame)

    def write_if_connected(self, frame):
        if self.state is not LOST:
            self.send(frame)

    def _hold(self, frame):
        """Whether ``frame`` is a PUBLISH whose topic id waits for its REGACK (then it is held)."""
        where = publish_topic_id(frame)
        if where is None or where[0] != C.NORMAL_TOPIC_ID or where[1] not in self.topics.pending:
            return False
        topic_id = where[1]
        if self.clock.seconds() - self.topics.pending[topic_id] >= REGISTER_RETRY:
            self._send_register(topic_id, self.topics.names[topic_id])
        held = self.held
        if held is None:
            held = self.held = {}
        if sum(len(frames) for frames in held.values()) >= MAX_HELD:
            # A client that never answers REGISTER: QoS 1/2 ones go again on retry.
            self.router.stats.messages_dropped += 1
            return True
        held.setdefault(topic_id, []).append(frame)
        return True

    def register_topic(self, name):
        topic_id = self.topics.register(name)
        if topic_id is not None:
            self._send_register(topic_id, name)
        return topic_id

    def _send_register(self, topic_id, name):
        if self.state is ASLEEP:
            # Sent with the first delivery on it once awake.
            self.topics.registering(topic_id, float("-inf"))
            return
        self.topics.registering(topic_id, self.clock.seconds())
        mid = self.next_mid
        self.next_mid = mid + 1 if mid < 0x7FFF else 1
        self.send(Register(topic_id, mid, name).encode())

    def registered(self, topic_id, return_code):
        topics = self.topics
        if topic_id not in topics.pending:
            return
        held = self.held.pop(topic_id, ()) if self.held else ()
        if return_code != C.ACCEPTED:
            topics.forget(topic_id)
            self.router.stats.messages_dropped += len(held)
            return
        topics.acknowledged(topic_id)
        self.listener.kept.added(self.session, self.client_id, topic_id, topics.names[topic_id])
        for frame in held:
            self.send(frame)

    def register_own(self, name):
        topics = self.topics
        known = topics.ids.get(name)
        if known is not None:
            if known in topics.pending:
                # The gateway's own REGISTER of it is unanswered, but the
                # client now knows the id: it outlives a restart too.
                self.listener.kept.added(self.session, self.client_id, known, name)
            return known
        topic_id = topics.register(name)
        if topic_id is not None:
            self.listener.kept.added(self.session, self.client_id, topic_id, name)
        return topic_id

    def unknown_topic(self, topic_id):
        topics = self.topics
        if topic_id in topics.names and topic_id not in topics.pending:
            self.listener.kept.removed(self.session, self.client_id, topic_id)
        topics.forget(topic_id)

    # What the broker and the admin API ask

    def taken_over(self, publish_will=True):
        log.info("MQTT-SN client {client_id} at {peer} taken over", client_id=self.log_id, peer=self.peer)
        self.close(publish_will, reason="taken over")

    def kick(self):
        log.info("MQTT-SN client {client_id} disconnected by the admin API", client_id=self.log_id)
        self.send(Disconnect().encode())
        self.close(publish_will=True, reason="kicked")

    def shutting_down(self):
        # A sleeper's radio is off: it learns on waking, with no answer.
        if self.state is not ASLEEP:
            self.send(Disconnect().encode())
        self.close(publish_will=True, reason="shutting down")

    # Messages the client itself handles

    def handle_PINGREQ(self, message):
        if self.state is ACTIVE:
            self.send(Pingresp().encode())
            return
        self.wake()

    def wake(self):
        """A sleeper's PINGREQ: what waited for it goes, then PINGRESP once acknowledged."""
        session = self.session
        self.state = AWAKE
        topics = self.topics
        # A REGISTER sent as it fell asleep went unanswered: what waits for
        # its REGACK (QoS 0 deliveries too, which are never sent again)
        # goes only once it is answered, so it is asked again first.
        for topic_id in list(topics.pending):
            self._send_register(topic_id, topics.names[topic_id])
        session.window.resume_flights(self.clock.seconds())
        session.resume()
        if self._awake_call is None:
            self._awake_call = self.clock.callLater(AWAKE_LIMIT, self._sleep_again)
        self.acknowledged()

    def acknowledged(self):
        session = self.session
        if self.state is AWAKE and not session.inflight and not session.queued and not self.held:
            self._sleep_again()

    def _sleep_again(self):
        call, self._awake_call = self._awake_call, None
        if call is not None and call.active():
            call.cancel()
        if self.state is not AWAKE:
            return
        self.send(Pingresp().encode())
        self.state = ASLEEP
        self.session.pause()

    def handle_DISCONNECT(self, message):
        self.send(Disconnect().encode())
        duration = message.duration
        if not duration:
            # A clean DISCONNECT: the will is not published.
            self.close(publish_will=False, reason="disconnected")
            return
        call, self._awake_call = self._awake_call, None
        if call is not None and call.active():
            call.cancel()
        self.state = ASLEEP
        self.session.pause()
        self.watch(duration)

    def handle_WILLTOPICUPD(self, message):
        session = self.session
        if message.will_topic is None:
            session.will = None
            self.send(WillTopicResp(C.ACCEPTED).encode())
            return
        try:
            validate_topic_name(message.will_topic)
        except InvalidTopic:
            self.send(WillTopicResp(C.REJECTED_NOT_SUPPORTED).encode())
            return
        router = self.router
        if not write_allowed(self.may_write, router.access, self.username, self.client_id, message.will_topic):
            self.send(WillTopicResp(C.REJECTED_NOT_SUPPORTED).encode())
            return
        payload = session.will.payload if session.will is not None else b""
        session.will = P.Publish(message.will_topic, payload, max(message.qos, 0), message.retain)
        self.send(WillTopicResp(C.ACCEPTED).encode())

    def handle_WILLMSGUPD(self, message):
        session = self.session
        will = session.will
        if will is None:
            self.send(WillMsgResp(C.REJECTED_NOT_SUPPORTED).encode())
            return
        session.will = P.Publish(will.topic, message.will_message, will.qos, will.retain)
        self.send(WillMsgResp(C.ACCEPTED).encode())

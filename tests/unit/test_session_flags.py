"""
One client id, connected again and again by 3.1.1 and 5.0 clients with
every mix of CONNECT flags (Clean Start / Clean Session, Session Expiry
Interval 0, short, long or 0xFFFFFFFF, a will with no delay or a short
one), dropped, disconnected (with or without its will, changing the
expiry) and taken over, while QoS 1 and 2 messages are published for it
and time passes.  After every step the gateway agrees with a model of the
standards: which session exists and whether it outlives its connection
(in the store too), Session Present, which messages a resumed session
delivers and at which QoS, and which wills have been published, and when
([MQTT-3.1.2-4], [MQTT-3.1.2-5], [MQTT-3.1.2-8], [MQTT-3.1.2-23],
[MQTT-3.1.3-9], [MQTT-3.1.4-3], [MQTT-3.2.2-3], [MQTT-4.1.0-2]; 3.1.1's
[MQTT-3.1.2-4] to [MQTT-3.1.2-6]).

Where the standard leaves the gateway a choice, the model follows what
tests/CONFORMANCE5.md says the gateway does: a connection taken over
publishes a will without a delay when its session ends there.
"""

import shutil
import tempfile

import attr
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R

CLIENT_ID = "c"
TOPIC = "t"
NEVER = 0xFFFFFFFF
# Seconds: a short expiry ends a session before a short will delay does.
SHORT_EXPIRY, LONG_EXPIRY, WILL_DELAY = 3, 1000, 5
EXPIRIES = [0, SHORT_EXPIRY, LONG_EXPIRY, NEVER]


@attr.s
class Session:
    durable = attr.ib()
    # Seconds it outlives its connection, or None: for ever.
    expiry = attr.ib()
    # The QoS of its subscription to TOPIC (every connection subscribes).
    granted = attr.ib(default=None)
    # (payload, qos) waiting for the client.
    queue = attr.ib(factory=list)
    # When it ends, while its client is away (or None: never).
    ends_at = attr.ib(default=None)


@attr.s
class Connection:
    client = attr.ib()
    v5 = attr.ib()
    expiry = attr.ib()
    # The will's payload, or None; its delay.
    will = attr.ib()
    delay = attr.ib()


def connected(machine):
    return machine.connection is not None


class SessionFlags(RuleBasedStateMachine):
    @initialize(with_store=st.booleans())
    def start(self, with_store):
        self.directory = tempfile.mkdtemp(prefix="mqttgw-flags-") if with_store else None
        self.broker = broker = FakeBroker(store_dir=self.directory)
        if broker.store is not None:
            # What every commit survives does not matter here.
            broker.store._db.execute("PRAGMA synchronous = OFF")
        self.watcher = broker.client(client_id="watcher", keepalive=0)
        self.watcher.send(P.Subscribe(1, [("will/#", 0)]))
        self.watcher.received()
        self.publisher = broker.client(client_id="publisher", keepalive=0)
        self.publisher.received()
        self.next_mid = 0
        self.wills = 0
        # The model.
        self.session = None
        self.connection = None
        # (due, payload) of a will waiting for its delay.
        self.pending_will = None
        self.wills_published = []
        # (payload, qos) the client is to receive next.
        self.expected = []

    def teardown(self):
        if getattr(self, "directory", None) is not None:
            self.broker.store._db.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def now(self):
        return self.broker.clock.seconds()

    # The model's consequences

    def _publish_will(self, payload):
        if payload is not None:
            self.wills_published.append(payload)

    def _connection_ends(self, will):
        """The connection closed, ``will`` (its payload or None) to publish."""
        connection, self.connection = self.connection, None
        session = self.session
        if not session.durable:
            # [MQTT-4.1.0-2]: a session with expiry 0 ends with it, and so a
            # will goes whatever its delay ([MQTT-3.1.2-8]).
            self.session = None
            self._publish_will(will)
            return
        if session.expiry is not None:
            session.ends_at = self.now + session.expiry
        if will is not None:
            if connection.delay:
                self.pending_will = (self.now + connection.delay, will)
            else:
                self._publish_will(will)

    def _time_passes(self, until):
        while True:
            session = self.session
            ends = session.ends_at if session is not None and self.connection is None else None
            will = self.pending_will[0] if self.pending_will is not None else None
            due = min((t for t in (ends, will) if t is not None), default=None)
            if due is None or due > until:
                return
            if will is not None and will <= due:
                self._publish_will(self.pending_will[1])
                self.pending_will = None
            if ends is not None and ends <= due:
                self.session = None
                # The session ends: a will still waiting goes now.
                if self.pending_will is not None:
                    self._publish_will(self.pending_will[1])
                    self.pending_will = None

    # Driving the clients

    def _settle(self, packets=()):
        """
        Commits run; every client answers what it was sent (``packets``
        already read from the client id's connection), until all is quiet.
        """
        for _ in range(10):
            if self.broker.store is not None:
                self.broker.commit()
            answered = False
            due = []
            for packet in self.publisher.received():
                if isinstance(packet, P.Pubrec):
                    due.append(P.Pubrel(packet.message_id))
            if due:
                self.publisher.send(*due)
                answered = True
            if self.connection is not None:
                client = self.connection.client
                due = self._answers(list(packets) + client.received())
                packets = ()
                if due:
                    client.send(*due)
                    answered = True
            if not answered:
                return
        raise AssertionError("still answering after ten rounds")

    def _answers(self, packets):
        """What the client sends back; each PUBLISH is the one expected next."""
        due = []
        for packet in packets:
            if isinstance(packet, P.Publish):
                assert packet.topic == TOPIC
                assert self.expected, f"unexpected {packet}"
                assert (packet.payload, packet.qos) == self.expected.pop(0), packet
                if packet.qos == 1:
                    due.append(P.Puback(packet.message_id))
                else:
                    due.append(P.Pubrec(packet.message_id))
            elif isinstance(packet, P.Pubrel):
                due.append(P.Pubcomp(packet.message_id))
            else:
                assert isinstance(packet, P.Suback), packet
        return due

    # Rules

    @rule(
        v5=st.booleans(),
        clean=st.booleans(),
        expiry=st.sampled_from(EXPIRIES),
        will=st.booleans(),
        delay=st.sampled_from([0, WILL_DELAY]),
        subscribe=st.sampled_from([1, 2]),
    )
    def connect(self, v5, clean, expiry, will, delay, subscribe):
        """A new connection for the client id, taking over any that holds it,
        and its subscription (at the same QoS or another)."""
        self._connect(v5, clean, expiry, will, delay, subscribe)

    @precondition(lambda machine: machine.session is not None and machine.connection is None)
    @rule(
        v5=st.booleans(),
        # Half the time with expiry 0: the session goes on for this
        # connection only, the change of durability most often got wrong.
        expiry=st.sampled_from([0, 0, 0] + EXPIRIES[1:]),
        will=st.booleans(),
        delay=st.sampled_from([0, WILL_DELAY]),
        subscribe=st.sampled_from([1, 2]),
    )
    def resume(self, v5, expiry, will, delay, subscribe):
        """The client comes back to its session, which waited."""
        self._connect(v5, False, expiry, will, delay, subscribe)

    def _connect(self, v5, clean, expiry, will, delay, subscribe):
        self.wills += 1
        will_payload = f"will {self.wills}".encode() if will else None
        fields = {}
        if will:
            fields = {"will_topic": f"will/{self.wills}", "will_message": will_payload, "will_qos": 1}
        if v5:
            properties = {"session_expiry_interval": expiry} if expiry else {}
            if will and delay:
                fields["will_properties"] = {"will_delay_interval": delay}
            connect = P.Connect(
                CLIENT_ID, protocol_level=P.MQTT_5, clean_session=clean, keepalive=0,
                properties=properties, **fields,
            )
        else:
            delay = 0
            connect = P.Connect(CLIENT_ID, clean_session=clean, keepalive=0, **fields)
        # The model: the old connection is taken over ([MQTT-3.1.4-3]).
        old = self.connection
        if old is not None:
            ends = clean or not self.session.durable
            # A will with a delay is not published: this new connection came
            # within it.  Without one, it is when the session ends here.
            self._connection_ends(old.will if not old.delay and ends else None)
        # [MQTT-3.1.2-8]: a new connection within the delay: no will.
        self.pending_will = None
        present = self.session is not None and not clean
        self.expected = []
        if present:
            # What waited is delivered now ([MQTT-3.1.2-5]).
            self.expected, self.session.queue = self.session.queue, []
        else:
            self.session = Session(None, None)
        # Whether it outlives this connection: the expiry, for 5.0.
        self.session.durable = expiry > 0 if v5 else not clean
        self.session.expiry = (None if expiry == NEVER else expiry) if v5 else None
        self.session.ends_at = None
        # The gateway.
        client = self.broker.client(connect)
        if old is not None:
            old.client.finish_close()
        self.connection = Connection(client, v5, expiry if v5 else 0, will_payload, delay)
        if self.broker.store is not None:
            self.broker.commit()
        packets = client.received()
        connack = packets[0]
        assert isinstance(connack, P.Connack) and connack.return_code == 0, packets
        assert connack.session_present is present
        self._settle(packets[1:])
        client.send(P.Subscribe(1, [(TOPIC, subscribe)], {} if v5 else None))
        self.session.granted = subscribe
        self._settle()
        assert self.expected == []

    @precondition(connected)
    @rule()
    def drop(self):
        """The network fails: the will is due."""
        self.connection.client.lose_connection()
        self._connection_ends(self.connection.will)

    @precondition(connected)
    @rule(with_will=st.booleans(), expiry=st.sampled_from([None, 0, LONG_EXPIRY]))
    def disconnect(self, with_will, expiry):
        """DISCONNECT: normal (the will goes away) or 0x04 (it is due); a
        5.0 client may change a non-zero expiry, but not set one where
        CONNECT had 0 (3.14.2.2.2: a Protocol Error)."""
        connection = self.connection
        properties = None
        will = connection.will if with_will else None
        if connection.v5:
            properties = {}
            if expiry is not None:
                properties["session_expiry_interval"] = expiry
                if connection.expiry == 0 and expiry:
                    # A Protocol Error: closed as if the network failed.
                    will = connection.will
                elif expiry != connection.expiry:
                    self.session.durable = expiry > 0
                    self.session.expiry = None if expiry == NEVER else expiry
            code = R.DISCONNECT_WITH_WILL_MESSAGE if with_will else R.NORMAL_DISCONNECTION
            connection.client.send(P.Disconnect(code, properties))
        elif with_will:
            connection.client.lose_connection()
        else:
            connection.client.send(P.Disconnect())
        connection.client.finish_close()
        self._connection_ends(will)

    @rule(qos=st.sampled_from([1, 2]), count=st.integers(1, 3))
    def publish(self, qos, count):
        """Messages for the client id's subscription, live or queued."""
        for _ in range(count):
            self.next_mid = self.next_mid % 65535 + 1
            payload = f"m{self.next_mid}".encode()
            self.publisher.send(P.Publish(TOPIC, payload, qos, message_id=self.next_mid))
            session = self.session
            if session is not None and session.granted is not None:
                delivery = (payload, min(qos, session.granted))
                if self.connection is not None:
                    self.expected.append(delivery)
                else:
                    session.queue.append(delivery)
        self._settle()
        assert self.expected == []

    @rule(seconds=st.sampled_from([1, 2, 4, 2000]))
    def time_passes(self, seconds):
        """Will delays and session expiries run out."""
        until = self.now + seconds
        self._time_passes(until)
        self.broker.clock.advance(seconds)
        self._settle()

    # What must hold after every step

    @invariant()
    def sessions_are_the_models(self):
        router = self.broker.router
        session = router.sessions.get(CLIENT_ID)
        if self.session is None:
            assert session is None
        else:
            assert session is not None
            assert session.ends_with_connection is not self.session.durable
            assert (session.connection is None) is (self.connection is None)
        durable = bool(self.session and self.session.durable)
        assert router.stats.persistent_sessions == int(durable)
        assert router.stats.clients_disconnected == int(durable and self.connection is None)
        store = self.broker.store
        if store is not None:
            self.broker.commit()
            stored = {r[0] for r in store._db.execute("SELECT client_id FROM sessions")}
            assert (CLIENT_ID in stored) is durable

    @invariant()
    def wills_are_the_models(self):
        got = [p.payload for p in self.watcher.received() if isinstance(p, P.Publish)]
        assert got == self.wills_published[: len(got)]
        del self.wills_published[: len(got)]
        assert self.wills_published == []


SessionFlags.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_sessions_and_wills_follow_the_standard = SessionFlags.TestCase

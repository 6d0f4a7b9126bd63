"""
The session gauges in the router's Stats (clients connected and away,
persistent sessions, messages stored and their bytes) are kept where
things change, not counted by readers: after any sequence of connects,
takeovers, subscriptions, publishes at each QoS, acks, full sockets,
disconnects, expiry, deletes, a bridge's session and restarts, they equal
what a scan of every session finds.
"""

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mqttgw.broker.session import INTERNAL_PREFIX, NEVER_EXPIRES, SessionLimits
from mqttgw.service.gateway import Gateway
from mqttgw.testing import FakeBroker
from mqttgw.web.metrics import Metrics
from mqttgw.web.systopics import SysTopics
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer

CLIENT_IDS = ["a", "b", "c"]
TOPICS = ["t/1", "t/2", "u"]
FILTERS = ["t/1", "t/+", "#", "u"]
BRIDGE_ID = INTERNAL_PREFIX + "bridge/up"
EXPIRATION = 100.0


def scanned(router):
    """The gauges as a scan of every session finds them."""
    sessions = list(router.sessions.values())
    return {
        "clients_connected": sum(1 for s in sessions if s.connection is not None and not s.internal),
        "clients_disconnected": sum(
            1 for s in sessions if s.connection is None and not s.ends_with_connection and not s.internal
        ),
        "persistent_sessions": sum(1 for s in sessions if not s.ends_with_connection),
        "stored_messages": sum(s.queued + len(s.inflight) for s in sessions),
        "queued_bytes": sum(s.queued_bytes for s in sessions),
    }


def counted(router):
    stats = router.stats
    return {name: getattr(stats, name) for name in scanned(router)}


def answers(packets):
    """What a well-behaved client sends back for ``packets``."""
    out = []
    for packet in packets:
        if isinstance(packet, P.Publish) and packet.qos == 1:
            out.append(P.Puback(packet.message_id))
        elif isinstance(packet, P.Publish) and packet.qos == 2:
            out.append(P.Pubrec(packet.message_id))
        elif isinstance(packet, P.Pubrec):
            out.append(P.Pubrel(packet.message_id))
        elif isinstance(packet, P.Pubrel):
            out.append(P.Pubcomp(packet.message_id))
    return out


class Upstream:
    """What a bridge attaches to its session: frames written, acked by hand."""

    def __init__(self):
        self.framer = Framer(P.MAX_REMAINING_LENGTH + 5)
        self.pending = []

    def write(self, data):
        self.pending += self.framer.feed(data)


def connected_client(machine):
    return any(not client.closed for client, _ in machine.clients.values())


def bridge_attached(machine):
    return machine.upstream is not None


def with_store(machine):
    return machine.broker.store is not None


class SessionGauges(RuleBasedStateMachine):
    @initialize(
        with_store=st.booleans(),
        queue_qos0=st.booleans(),
        drop_oldest=st.booleans(),
        max_inflight=st.integers(1, 3),
        max_queued=st.integers(1, 4),
        max_queued_bytes=st.sampled_from([8, 40, 1 << 20]),
    )
    def start(self, with_store, queue_qos0, drop_oldest, max_inflight, max_queued, max_queued_bytes):
        self.limits = SessionLimits(
            max_inflight_messages=max_inflight,
            max_queued_messages=max_queued,
            max_queued_bytes=max_queued_bytes,
            queue_qos0_messages=queue_qos0,
            drop_oldest=drop_oldest,
            retry_interval=20.0,
        )
        self.directory = tempfile.mkdtemp(prefix="mqttgw-counters-") if with_store else None
        self.use(FakeBroker(self.limits, store_dir=self.directory))

    def use(self, broker):
        self.broker = broker
        broker.router.persistent_client_expiration = EXPIRATION
        # client id -> (its latest connection, packets received and not yet answered)
        self.clients = {}
        self.upstream = None
        # A publisher that stays, so that messages flow whoever else is there.
        self.publisher = broker.client(client_id="publisher", keepalive=0)
        self.publisher.received()
        self.next_mid = 0

    def teardown(self):
        if getattr(self, "broker", None) is not None:
            self.broker.close()
        if getattr(self, "directory", None) is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _client(self, which):
        """The ``which``-th (modulo) client connected now."""
        connected = [self.clients[c] for c in sorted(self.clients) if not self.clients[c][0].closed]
        return connected[which % len(connected)]

    # Connections

    @rule(
        client_id=st.sampled_from(CLIENT_IDS),
        clean=st.booleans(),
        will_qos=st.none() | st.integers(0, 2),
        topic_filter=st.sampled_from(FILTERS),
        qos=st.integers(0, 2),
    )
    def connect(self, client_id, clean, will_qos, topic_filter, qos):
        """A new connection, taking over any that holds the client id, and
        its subscription."""
        will = {}
        if will_qos is not None:
            will = {"will_topic": "t/1", "will_message": b"gone", "will_qos": will_qos}
        client = self.broker.client(client_id=client_id, clean_session=clean, keepalive=0, **will)
        self.clients[client_id] = (client, [])
        client.send(P.Subscribe(1, [(topic_filter, qos)]))

    @precondition(connected_client)
    @rule(which=st.integers(0, 2), graceful=st.booleans())
    def disconnect(self, which, graceful):
        client = self._client(which)[0]
        if graceful:
            client.send(P.Disconnect())
            client.finish_close()
        else:
            client.lose_connection()

    @precondition(connected_client)
    @rule(which=st.integers(0, 2), full=st.booleans())
    def socket(self, which, full):
        """The client's socket fills up (its reads stop too), or drains."""
        protocol = self._client(which)[0].protocol
        if full:
            protocol.pauseProducing()
        else:
            protocol.resumeProducing()
        self.broker.clock.advance(0)

    # Messages

    @precondition(connected_client)
    @rule(which=st.integers(0, 2), topic_filter=st.sampled_from(FILTERS), qos=st.integers(0, 2))
    def subscribe(self, which, topic_filter, qos):
        self._client(which)[0].send(P.Subscribe(1, [(topic_filter, qos)]))

    @precondition(connected_client)
    @rule(which=st.integers(0, 2), topic_filter=st.sampled_from(FILTERS))
    def unsubscribe(self, which, topic_filter):
        self._client(which)[0].send(P.Unsubscribe(1, [topic_filter]))

    @rule(
        topic=st.sampled_from(TOPICS),
        qos=st.integers(0, 2),
        size=st.integers(0, 24),
        retain=st.booleans(),
        count=st.integers(1, 5),
    )
    def publish(self, topic, qos, size, retain, count):
        """``count`` messages from the publisher, which answers PUBREC at once."""
        for _ in range(count):
            self.next_mid = self.next_mid % 65535 + 1
            message_id = self.next_mid if qos else None
            self.publisher.send(P.Publish(topic, bytes(size), qos, retain, message_id=message_id))
        due = answers(self.publisher.received())
        if due:
            self.publisher.send(*due)

    @precondition(connected_client)
    @rule(which=st.integers(0, 2), topic=st.sampled_from(TOPICS), qos=st.integers(0, 2))
    def client_publishes(self, which, topic, qos):
        """A subscriber publishes too (its PUBREC is answered when it acknowledges)."""
        self.next_mid = self.next_mid % 65535 + 1
        message_id = self.next_mid if qos else None
        self._client(which)[0].send(P.Publish(topic, b"mine", qos, message_id=message_id))

    @precondition(connected_client)
    @rule(which=st.integers(0, 2), how_many=st.sampled_from([1, 2, 100]))
    def acknowledge(self, which, how_many):
        """The client reads what came and answers up to ``how_many`` packets."""
        client, pending = self._client(which)
        pending += client.received()
        due = answers(pending[:how_many])
        del pending[:how_many]
        if due:
            client.send(*due)

    @precondition(with_store)
    @rule()
    def commit(self):
        self.broker.commit()

    # Sessions ending without a client

    @rule(seconds=st.sampled_from([1.0, 30.0, EXPIRATION + 1]))
    def time_passes(self, seconds):
        """Retries fire; the sweep expires sessions away too long."""
        self.broker.clock.advance(seconds)
        self.broker.router.expire_sessions()

    @rule(client_id=st.sampled_from(CLIENT_IDS))
    def delete_session(self, client_id):
        """The admin API's delete (of a session not in use)."""
        self.broker.router.delete_session(client_id)

    @precondition(with_store)
    @rule()
    def restart(self):
        """A new broker on the same store: sessions and queues come back."""
        self.broker.commit()
        self.use(self.broker.restart())

    # A bridge: the gateway's own persistent session

    @precondition(lambda machine: not bridge_attached(machine))
    @rule(qos=st.integers(0, 2))
    def bridge_up(self, qos):
        router = self.broker.router
        session, _ = router.connect(BRIDGE_ID, clean_start=False, expiry_interval=NEVER_EXPIRES)
        router.subscribe(session, [("t/#", qos)])
        self.upstream = Upstream()
        session.attach(self.upstream)

    @precondition(bridge_attached)
    @rule()
    def bridge_down(self):
        router = self.broker.router
        router.disconnect(router.sessions[BRIDGE_ID], publish_will=False)
        self.upstream = None

    @precondition(bridge_attached)
    @rule(how_many=st.sampled_from([1, 2, 100]))
    def bridge_acknowledges(self, how_many):
        session = self.broker.router.sessions[BRIDGE_ID]
        upstream = self.upstream
        self.broker.clock.advance(0)
        due, upstream.pending = upstream.pending[:how_many], upstream.pending[how_many:]
        for packet in due:
            if isinstance(packet, P.Publish) and packet.qos == 1:
                session.puback(packet.message_id)
            elif isinstance(packet, P.Publish) and packet.qos == 2:
                session.pubrec(packet.message_id)
            elif isinstance(packet, P.Pubrel):
                session.pubcomp(packet.message_id)

    @invariant()
    def gauges_equal_a_scan(self):
        router = self.broker.router
        assert counted(router) == scanned(router)


SessionGauges.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_session_gauges_equal_a_scan_after_every_step = SessionGauges.TestCase


def test_readers_take_the_gauges_from_stats():
    """$SYS, /metrics and the admin overview read the same numbers."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=1))
    sub = broker.client(client_id="s", clean_session=False)
    sub.send(P.Subscribe(1, [("t", 1)]))
    away = broker.client(client_id="away", clean_session=False)
    away.send(P.Disconnect())
    away.finish_close()
    pub = broker.client(client_id="p")
    pub.send(P.Publish("t", b"12345", 1, message_id=1), P.Publish("t", b"678", 1, message_id=2))

    router = broker.router
    stats = router.stats
    assert (stats.clients_connected, stats.clients_disconnected) == (2, 1)
    # One in flight (its bytes are not counted), one queued behind it.
    assert (stats.stored_messages, stats.queued_bytes) == (2, 3)

    sys_values = SysTopics(router, broker.clock, 0).values()
    assert sys_values["$SYS/broker/clients/connected"] == 2
    assert sys_values["$SYS/broker/clients/disconnected"] == 1
    assert sys_values["$SYS/broker/clients/total"] == 3
    assert sys_values["$SYS/broker/messages/stored"] == 2
    assert sys_values["$SYS/broker/store/messages/bytes"] == 3

    text = Metrics(router).text().decode()
    assert "mqttgw_clients_connected 2.0" in text
    assert "mqttgw_messages_stored 2.0" in text

    overview = Gateway(router, broker.clock).overview()
    assert (overview["clients"], overview["stored_messages"], overview["stored_bytes"]) == (2, 2, 3)

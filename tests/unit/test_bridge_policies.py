"""
A bridge's queue policies while its upstream is away, in-process with a
real store: QoS 0 dropped, kept in memory, or stored in order with QoS 1/2
(and kept across a restart); a full queue dropping its oldest or newest.
"""

import pytest
from twisted.internet.testing import MemoryReactorClock

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.broker.access import Access
from mqttgw.broker.router import Router
from mqttgw.broker.store import Store
from mqttgw.schema import ConfigError
from mqttgw.wire import packets as P
from tests.fake_network import accept

UPSTREAM = "127.0.0.1:1001"


class Gateway:
    """A router on a store in ``path``, and its bridge, on a fake reactor."""

    def __init__(self, path, **table):
        self.reactor = reactor = MemoryReactorClock()
        reactor.callFromThread = lambda f, *a, **kw: f(*a, **kw)
        self.store = Store(path, reactor)
        self.router = Router(reactor, store=self.store)
        self.router.restore(*self.store.load())
        self.router.access = Access()
        settings = MQTTBridgeKind.check(
            {"name": "up", "addresses": [UPSTREAM], "rules": ["t/# out 1"], **table}
        )
        self.bridge = MQTTBridgeKind.make_service(self.router, settings, reactor)
        self.bridge.startService()

    def publish(self, payload, qos):
        self.router.publish(P.Publish("t/a", payload, qos))
        self.store.run_pending()
        self.reactor.advance(0)

    def upstream(self):
        upstream = accept(self.reactor)
        upstream.received()
        upstream.send(P.Connack(0))
        return [(p.payload, p.qos) for p in upstream.received() if isinstance(p, P.Publish) and p.topic == "t/a"]

    def close(self):
        self.bridge.stopService()
        self.store.run_pending()
        self.store._db.close()
        self.store._lock.close()


@pytest.fixture
def gateways(tmp_path):
    made = []

    def make(**table):
        gateway = Gateway(tmp_path / "data", **table)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        try:
            gateway.close()
        except Exception:
            pass


def outage(gateway):
    for payload, qos in ((b"a", 0), (b"b", 1), (b"c", 0), (b"d", 1)):
        gateway.publish(payload, qos)


def test_qos0_is_dropped_during_an_outage_by_default(gateways):
    gateway = gateways()
    outage(gateway)
    assert gateway.upstream() == [(b"b", 1), (b"d", 1)]


def test_qos0_kept_in_memory_goes_ahead_of_the_qos1_backlog(gateways):
    gateway = gateways(qos0_policy="memory")
    outage(gateway)
    assert gateway.upstream() == [(b"a", 0), (b"c", 0), (b"b", 1), (b"d", 1)]


def test_qos0_stored_keeps_one_order_with_qos1_and_survives_a_restart(gateways):
    gateway = gateways(qos0_policy="store")
    outage(gateway)
    gateway.close()
    again = gateways(qos0_policy="store")
    assert again.upstream() == [(b"a", 0), (b"b", 1), (b"c", 0), (b"d", 1)]
    # Sent at QoS 0, so gone from the store: none comes back after another restart.
    again.store.run_pending()
    assert [d.seq for d in again.store.load()[1][0].deliveries if d.qos == 0] == []


def test_a_full_queue_drops_its_newest_with_drop_policy_newest(gateways):
    gateway = gateways(max_queued_messages=2, drop_policy="newest")
    for payload in (b"1", b"2", b"3"):
        gateway.publish(payload, 1)
    assert gateway.upstream() == [(b"1", 1), (b"2", 1)]


def test_a_full_queue_drops_its_oldest_by_default(gateways):
    gateway = gateways(max_queued_messages=2)
    for payload in (b"1", b"2", b"3"):
        gateway.publish(payload, 1)
    assert gateway.upstream() == [(b"2", 1), (b"3", 1)]


def test_queue_qos0_is_qos0_policy_memory_and_may_not_contradict_it():
    table = {"name": "up", "addresses": [UPSTREAM], "rules": ["t/# out 1"]}
    assert MQTTBridgeKind.check({**table, "queue_qos0": True}).qos0_policy == "memory"
    with pytest.raises(ConfigError, match="queue_qos0 and bridge.qos0_policy disagree"):
        MQTTBridgeKind.check({**table, "queue_qos0": True, "qos0_policy": "store"})
    with pytest.raises(ConfigError, match="qos0_policy must be one of"):
        MQTTBridgeKind.check({**table, "qos0_policy": "disk"})


# Drain pacing


def test_a_paced_backlog_drains_at_its_rate_while_live_messages_go_first(gateways):
    gateway = gateways(drain_messages_per_second=10, max_inflight_messages=20)
    for i in range(30):
        gateway.publish(b"old-%d" % i, 1)
    upstream = accept(gateway.reactor)
    upstream.received()
    upstream.send(P.Connack(0))

    def taken():
        packets = [p for p in upstream.received() if isinstance(p, P.Publish) and p.topic == "t/a"]
        upstream.send(*(P.Puback(p.message_id) for p in packets))
        return [p.payload for p in packets]

    # A second's worth at once, no more.
    first = taken()
    assert first == [b"old-%d" % i for i in range(10)]
    # Live messages meanwhile are not behind the backlog.
    gateway.publish(b"live-1", 1)
    assert taken() == [b"live-1"]
    got = list(first) + [b"live-1"]
    steps = []
    for _ in range(40):
        gateway.reactor.advance(0.5)
        step = taken()
        steps.append(len(step))
        got += step
    backlog = [p for p in got if p.startswith(b"old-")]
    assert backlog == [b"old-%d" % i for i in range(30)]
    # The other 20 at 10 a second: about 5 each half second, over 2 s.
    assert max(steps) <= 6 and sum(1 for n in steps if n) >= 4, steps
    assert gateway.bridge.status()["queued"] == 0


def test_paced_drain_never_passes_its_rate(gateways):
    gateway = gateways(drain_messages_per_second=5)
    for i in range(40):
        gateway.publish(b"%d" % i, 1)
    upstream = accept(gateway.reactor)
    upstream.received()
    upstream.send(P.Connack(0))
    per_second = []
    for _ in range(8):
        packets = [p for p in upstream.received() if isinstance(p, P.Publish) and p.topic == "t/a"]
        upstream.send(*(P.Puback(p.message_id) for p in packets))
        per_second.append(len(packets))
        gateway.reactor.advance(1.0)
    # The first second's burst, then the rate.
    assert per_second[0] == 5
    assert all(n <= 6 for n in per_second[1:]), per_second
    assert sum(per_second) == 40


def test_a_byte_rate_paces_by_payload_size(gateways):
    gateway = gateways(drain_bytes_per_second=100)
    for i in range(10):
        gateway.publish(b"x" * 50, 1)
    upstream = accept(gateway.reactor)
    upstream.received()
    upstream.send(P.Connack(0))
    packets = [p for p in upstream.received() if isinstance(p, P.Publish) and p.topic == "t/a"]
    # 100 bytes a second: two 50-byte messages.
    assert len(packets) == 2


def test_unpaced_everything_keeps_one_order(gateways):
    gateway = gateways(max_inflight_messages=2)
    for i in range(5):
        gateway.publish(b"old-%d" % i, 1)
    upstream = accept(gateway.reactor)
    upstream.received()
    upstream.send(P.Connack(0))
    gateway.publish(b"live", 1)
    got = []
    for _ in range(10):
        packets = [p for p in upstream.received() if isinstance(p, P.Publish) and p.topic == "t/a"]
        upstream.send(*(P.Puback(p.message_id) for p in packets))
        got += [p.payload for p in packets]
    assert got == [b"old-%d" % i for i in range(5)] + [b"live"]

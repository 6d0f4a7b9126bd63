"""
limits.max_queued_bytes_total: one bound on the payload bytes queued across
every session and bridge, beyond each session's own; at it a message that
would be queued is dropped, counted and logged, and a bridge's queue gives
up its oldest first.
"""

from twisted.internet.testing import MemoryReactorClock

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.broker.access import Access
from mqttgw.broker.router import Router
from mqttgw.service import config
from mqttgw.service.build import build_router
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P


def offline_subscriber(broker, client_id):
    client = broker.client(P.Connect(client_id, clean_session=False, keepalive=0))
    client.send(P.Subscribe(1, [("t/#", 1)]))
    client.received()
    client.lose_connection()


def test_sessions_together_hold_no_more_than_the_total_bound(logged):
    broker = FakeBroker()
    broker.router.stats.max_queued_bytes_total = 100
    offline_subscriber(broker, "a")
    offline_subscriber(broker, "b")
    pub = broker.client(P.Connect("pub", keepalive=0))
    for i in range(8):
        pub.send(P.Publish("t/x", b"0123456789", 1, message_id=i + 1))
    stats = broker.router.stats
    # Ten 10-byte copies fit; of the sixteen, six were dropped.
    assert stats.queued_bytes == 100
    assert stats.dropped_at_total_bound == 6
    assert stats.messages_dropped == 6
    assert broker.router.sessions["a"].queued + broker.router.sessions["b"].queued == 10
    warnings = [line for line in logged() if "max_queued_bytes_total (100 bytes)" in line]
    assert len(warnings) == 1
    # Room again once some are delivered.
    back = broker.client(P.Connect("a", clean_session=False, keepalive=0))
    back.received()
    assert stats.queued_bytes < 100


def test_a_bridge_at_the_total_bound_gives_up_its_oldest():
    reactor = MemoryReactorClock()
    router = Router(reactor)
    router.access = Access()
    router.stats.max_queued_bytes_total = 50
    settings = MQTTBridgeKind.check({"name": "up", "addresses": ["127.0.0.1:1"], "rules": ["t/# out 1"]})
    bridge = MQTTBridgeKind.make_service(router, settings, reactor)
    bridge.startService()
    for i in range(10):
        router.publish(P.Publish("t/x", b"%09d" % i + b"!", 1))
    session = bridge.session
    assert session.queued == 5
    assert [m.payload[:9] for m, *_ in session.deliveries.queue] == [b"%09d" % i for i in range(5, 10)]
    assert bridge.status()["drops"]["queue_full"] == 5
    bridge.stopService()


def test_the_bound_is_a_configuration_key():
    settings = config.build({"limits.max_queued_bytes_total": 1 << 30}, {})
    assert build_router(settings, None).stats.max_queued_bytes_total == 1 << 30
    assert build_router(config.build({}, {}), None).stats.max_queued_bytes_total == 0

"""
What a bridge tells operators about its queue and link, in-process on a
MemoryReactorClock: queued messages and bytes, the oldest one's age, the
drain rate, drops by reason, link state changes; in the admin API's
status, /metrics and $SYS.
"""


from mqttgw.web.metrics import Metrics
from mqttgw.web.systopics import SysTopics
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests.fake_network import Listener
from tests.mqtt5_bridge import connected, local5, published, start_bridge


def test_the_queue_its_bytes_and_its_oldest_message_while_the_link_is_down(router, reactor):
    bridge = start_bridge(router, reactor, max_inflight_messages=2)
    publisher = Listener.of(router, reactor).client("pub", keepalive=0)
    status = bridge.status()
    assert (status["queued"], status["queued_bytes"], status["oldest_queued_s"]) == (0, 0, None)
    publisher.send(P.Publish("t/a", b"12345", 1, message_id=1))
    reactor.advance(30)
    publisher.send(P.Publish("t/a", b"678", 1, message_id=2))
    reactor.advance(10)
    status = bridge.status()
    assert (status["queued"], status["queued_bytes"]) == (2, 8)
    assert status["oldest_queued_s"] == 40
    # Once the upstream takes them: nothing waits, and the rate shows it.
    upstream = connected(reactor)
    sent = published(upstream)
    upstream.send(*(P.Puback(p.message_id) for p in sent))
    reactor.advance(2)
    status = bridge.status()
    assert (status["queued"], status["oldest_queued_s"]) == (0, None)
    assert status["drain_rate"] > 0


def test_link_changes_count_each_up_and_down(router, reactor):
    bridge = start_bridge(router, reactor)
    assert bridge.status()["link_changes"] == 0
    upstream = connected(reactor)
    upstream.lose()
    reactor.advance(120)
    connected(reactor)
    assert bridge.status()["link_changes"] == 3


def test_drops_by_reason(router, reactor):
    bridge = start_bridge(router, reactor, max_queued_messages=2)
    publisher = Listener.of(router, reactor).client("pub", keepalive=0)
    # Beyond the queue's bound while the link is down: the oldest goes.
    for i in range(3):
        publisher.send(P.Publish("t/a", str(i).encode(), 1, message_id=i + 1))
    upstream = connected(reactor, maximum_packet_size=60)
    # Refused by the upstream.
    for p in published(upstream):
        upstream.send(P.Puback(p.message_id, R.QUOTA_EXCEEDED))
    # Too large for the upstream.
    publisher.send(P.Publish("t/big", b"x" * 100, 1, message_id=9))
    # Expired while waiting (a 5.0 publisher's expiry).
    upstream.lose()
    five = local5(router, reactor, "pub5")
    five.send(P.Publish("t/x", b"stale", 1, message_id=1, properties={"message_expiry_interval": 5}))
    reactor.advance(120)
    upstream = connected(reactor)
    assert published(upstream) == []
    assert bridge.status()["drops"] == {"queue_full": 1, "too_large": 1, "expired": 1, "refused": 2}


def test_the_counters_are_in_metrics_and_sys(router, reactor):
    bridge = start_bridge(router, reactor)
    publisher = Listener.of(router, reactor).client("pub", keepalive=0)
    publisher.send(P.Publish("t/a", b"12345", 1, message_id=1))
    reactor.advance(7)
    families = {f.name: f for f in Metrics(router, bridges=[bridge]).collect()}
    assert families["mqttgw_bridge_queued_bytes"].samples[0].value == 5
    assert families["mqttgw_bridge_oldest_queued_seconds"].samples[0].value == 7
    assert families["mqttgw_bridge_link_changes"].samples[0].value == 0
    reasons = {s.labels["reason"] for s in families["mqttgw_bridge_drops"].samples}
    assert reasons == {"queue_full", "too_large", "expired", "refused"}
    values = SysTopics(router, reactor, 10, bridges=[bridge]).values()
    prefix = "$SYS/broker/bridge/up/"
    assert values[prefix + "queued/bytes"] == 5
    assert values[prefix + "queued/oldest"] == "7"
    assert values[prefix + "link/changes"] == 0
    assert values[prefix + "dropped/queue_full"] == 0

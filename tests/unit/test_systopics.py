"""
The ``$SYS`` topics in-process: SysTopics over the fake broker, its ticks
driven by the broker's Clock.  tests/system/test_operations.py checks the same
tree against a real mosquitto's names under twistd.
"""

import math

import pytest

from mqttgw import __version__
from mqttgw.broker.session import NEVER_EXPIRES
from mqttgw.testing import connected
from mqttgw.web import systopics
from mqttgw.web.systopics import SHARED, SysTopics
from mqttgw.wire import packets as P

INTERVAL = 10.0


def watching(broker, client_id, *topic_filters):
    """A client subscribed to ``topic_filters``; returns it and the retained values it got."""
    client = connected(broker, client_id)
    client.send(P.Subscribe(1, [(f, 0) for f in topic_filters]))
    suback, *retained = client.received()
    assert suback == P.Suback(1, [0] * len(topic_filters))
    return client, retained


def values(packets):
    return {p.topic: p.payload.decode() for p in packets if isinstance(p, P.Publish)}


@pytest.fixture
def sys_topics(broker):
    topics = SysTopics(broker.router, broker.clock, INTERVAL)
    topics.start()
    yield topics
    topics.stop()


class MonotonicClock:
    """``time`` for systopics: its monotonic() is the broker's Clock."""

    def __init__(self, clock):
        self.monotonic = clock.seconds


def test_the_first_tick_publishes_the_tree_retained_with_mosquittos_names(broker, sys_topics):
    _, retained = watching(broker, "late", "$SYS/#")
    assert all(p.retain for p in retained)
    # Load averages need two ticks: a rate is over an interval.
    loads = {t for t in SHARED if t.startswith("$SYS/broker/load/")}
    assert {p.topic for p in retained} == set(SHARED) - loads
    got = values(retained)
    assert got["$SYS/broker/version"] == f"mqttgw version {__version__}"
    assert got["$SYS/broker/uptime"] == "0 seconds"
    assert got["$SYS/broker/publish/messages/received"] == "0"


def test_the_second_tick_adds_every_load_average_and_nothing_of_its_own(broker, sys_topics):
    broker.clock.advance(INTERVAL)
    _, retained = watching(broker, "late", "$SYS/#")
    # With no store and no bridge, the tree is exactly the topics both
    # mqttgw and mosquitto publish (test_operations checks that list
    # against a running mosquitto).
    assert sorted(p.topic for p in retained) == sorted(SHARED)
    assert all(p.retain for p in retained)


def test_traffic_shows_in_the_counters_at_the_next_tick(broker, sys_topics):
    watcher, retained = watching(
        broker,
        "watcher",
        "$SYS/broker/publish/messages/received",
        "$SYS/broker/publish/bytes/received",
        "$SYS/broker/clients/connected",
        "$SYS/broker/clients/maximum",
        "$SYS/broker/uptime",
    )
    assert values(retained) == {
        "$SYS/broker/publish/messages/received": "0",
        "$SYS/broker/publish/bytes/received": "0",
        "$SYS/broker/clients/connected": "0",
        "$SYS/broker/clients/maximum": "0",
        "$SYS/broker/uptime": "0 seconds",
    }
    publisher = connected(broker, "publisher")
    for mid in range(1, 6):
        publisher.send(P.Publish("a", b"12345", 1, message_id=mid))
    assert publisher.received() == [P.Puback(mid) for mid in range(1, 6)]
    # Between ticks nothing is published.
    assert watcher.received() == []
    broker.clock.advance(INTERVAL)
    assert values(watcher.received()) == {
        "$SYS/broker/publish/messages/received": "5",
        "$SYS/broker/publish/bytes/received": "25",
        "$SYS/broker/clients/connected": "2",
        "$SYS/broker/clients/maximum": "2",
        "$SYS/broker/uptime": "10 seconds",
    }
    # Late comers get the latest values, retained.
    _, retained = watching(broker, "late", "$SYS/broker/publish/messages/received")
    assert [(p.payload, p.retain) for p in retained] == [(b"5", True)]


def test_a_value_is_published_again_only_when_it_changed(broker, sys_topics):
    watcher, _ = watching(broker, "watcher", "$SYS/broker/version", "$SYS/broker/uptime")
    broker.clock.advance(INTERVAL)
    broker.clock.advance(INTERVAL)
    assert [(p.topic, p.payload) for p in watcher.received()] == [
        ("$SYS/broker/uptime", b"10 seconds"),
        ("$SYS/broker/uptime", b"20 seconds"),
    ]


def test_clients_and_sessions_are_counted_without_the_bridges_own(broker, sys_topics):
    watcher, _ = watching(broker, "watcher", "$SYS/broker/clients/#")
    away = connected(broker, "away", clean_session=False)
    away.lose_connection()
    # A bridge's session is internal: its client id starts with NUL.
    broker.router.connect("\x00bridge/up", clean_start=False, expiry_interval=NEVER_EXPIRES)
    broker.clock.advance(INTERVAL)
    got = values(watcher.received())
    assert got["$SYS/broker/clients/connected"] == "1"
    assert got["$SYS/broker/clients/disconnected"] == "1"
    assert got["$SYS/broker/clients/total"] == "2"


def test_clients_cannot_write_under_sys(broker, sys_topics):
    forger = connected(broker, "forger")
    forger.send(P.Publish("$SYS/broker/version", b"forged", 1, retain=True, message_id=1))
    assert forger.received() == [P.Puback(1)]
    broker.clock.advance(INTERVAL)
    _, retained = watching(broker, "late", "$SYS/broker/version")
    assert values(retained) == {"$SYS/broker/version": f"mqttgw version {__version__}"}


def test_load_averages_are_damped_rates_per_minute_as_mosquitto_computes_them(broker, monkeypatch):
    # The load averages time their intervals with time.monotonic(), not the
    # clock SysTopics is given: made the broker's Clock here.
    monkeypatch.setattr(systopics, "time", MonotonicClock(broker.clock))
    topics = SysTopics(broker.router, broker.clock, 60.0)
    topics.start()
    watcher, _ = watching(broker, "watcher", "$SYS/broker/load/publish/received/+")
    publisher = connected(broker, "publisher")
    for _ in range(60):
        publisher.send(P.Publish("a", b"x", 0))
    broker.clock.advance(60.0)
    got = values(watcher.received())
    # 60 messages in a minute: 60 a minute, damped by exp(-t/period).
    assert got == {
        f"$SYS/broker/load/publish/received/{period}": f"{60 * (1 - math.exp(-60 / seconds)):.2f}"
        for period, seconds in (("1min", 60), ("5min", 300), ("15min", 900))
    }
    topics.stop()


def test_an_interval_of_zero_publishes_nothing(broker):
    topics = SysTopics(broker.router, broker.clock, 0)
    topics.start()
    broker.clock.advance(3600)
    _, retained = watching(broker, "late", "$SYS/#")
    assert retained == []


def test_stopped_there_are_no_more_ticks(broker, sys_topics):
    watcher, _ = watching(broker, "watcher", "$SYS/broker/uptime")
    sys_topics.stop()
    broker.clock.advance(INTERVAL * 3)
    assert watcher.received() == []


class Bridge:
    """What SysTopics reads of a bridge: its status."""

    def __init__(self, name, connected):
        self._status = {
            "name": name, "connected": connected, "queued": 3, "dropped": 1, "sent": 7, "received": 2,
        }

    def status(self):
        return self._status


class Store:
    """What SysTopics reads of the store."""

    state = "ok"
    last_commit_seconds = 0.0015


def test_bridges_and_the_store_have_topics_of_mqttgws_own(broker):
    bridges = [Bridge("up", True), Bridge("down", False)]
    topics = SysTopics(broker.router, broker.clock, INTERVAL, bridges, Store())
    topics.start()
    _, retained = watching(broker, "late", "$SYS/broker/bridge/#", "$SYS/broker/store/#")
    assert values(retained) == {
        "$SYS/broker/bridge/up/state": "1",
        "$SYS/broker/bridge/up/queued": "3",
        "$SYS/broker/bridge/up/dropped": "1",
        "$SYS/broker/bridge/up/sent": "7",
        "$SYS/broker/bridge/up/received": "2",
        "$SYS/broker/bridge/down/state": "0",
        "$SYS/broker/bridge/down/queued": "3",
        "$SYS/broker/bridge/down/dropped": "1",
        "$SYS/broker/bridge/down/sent": "7",
        "$SYS/broker/bridge/down/received": "2",
        "$SYS/broker/store/state": "ok",
        "$SYS/broker/store/commit/latency": "0.001500",
        # mosquitto's, under the same prefix.
        "$SYS/broker/store/messages/count": "0",
        "$SYS/broker/store/messages/bytes": "0",
    }
    bridges[1]._status["connected"] = True
    watcher, _ = watching(broker, "watcher", "$SYS/broker/bridge/+/state")
    broker.clock.advance(INTERVAL)
    assert values(watcher.received()) == {"$SYS/broker/bridge/down/state": "1"}
    topics.stop()

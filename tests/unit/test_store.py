"""
Durable state on a real SQLite store whose commits the tests drive: ack
means safe, what survives a restart, and a store that cannot be used.
"""

import json
import sqlite3

import pytest
from twisted.internet.testing import MemoryReactorClock

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.broker import store as store_module
from mqttgw.broker import writes
from mqttgw.broker.session import INTERNAL_PREFIX, NEVER_EXPIRES, SessionLimits
from mqttgw.broker.store import Store, StoreDamaged, StoreError
from mqttgw.testing import FakeBroker, connected, deliveries, publishes
from mqttgw.transports.protocol import MQTTServerFactory
from mqttgw.wire import packets as P
from tests.fake_network import accept


def persistent_subscriber(store_broker, client_id, *topics):
    client = connected(store_broker, client_id, clean_session=False)
    client.send(P.Subscribe(1, list(topics)))
    assert isinstance(client.received()[0], P.Suback)
    store_broker.commit()
    return client


# Ack means safe


def test_qos1_to_a_persistent_session_is_acknowledged_after_commit(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 1))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    assert pub.received() == []
    # At least once: the subscriber may have it before the commit (after a
    # crash it would come again, never not at all) ...
    assert deliveries(sub.received()) == [("a", b"x", 1)]
    # ... but the publisher may forget it only once it is on disk.
    store_broker.commit()
    assert pub.received() == [P.Puback(1)]


def test_qos2_to_a_persistent_session_goes_out_after_commit_and_qos1_behind_it_waits(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 2))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"two", 2, message_id=1), P.Publish("a", b"one", 1, message_id=2))
    # Exactly once: the message id is on disk before the client sees it,
    # and the QoS 1 message keeps its place behind.
    assert sub.received() == []
    store_broker.commit()
    assert deliveries(sub.received()) == [("a", b"two", 2), ("a", b"one", 1)]
    # With nothing waiting, QoS 1 goes at once again.
    pub.send(P.Publish("a", b"next", 1, message_id=3))
    assert deliveries(sub.received()) == [("a", b"next", 1)]


def test_traffic_between_clean_sessions_never_waits_for_the_disk(store_broker):
    sub = connected(store_broker, "s")
    sub.send(P.Subscribe(1, [("a", 2)]))
    sub.received()
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"1", 1, message_id=1), P.Publish("a", b"2", 2, message_id=2))
    assert pub.received() == [P.Puback(1), P.Pubrec(2)]
    assert len(deliveries(sub.received())) == 2


def test_retained_publish_is_acknowledged_after_commit(store_broker):
    pub = connected(store_broker, "p")
    pub.send(P.Publish("r", b"v", 1, retain=True, message_id=3))
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Puback(3)]


def test_acks_keep_their_order_behind_one_that_waits(store_broker):
    persistent_subscriber(store_broker, "s", ("durable", 1))
    pub = connected(store_broker, "p")
    pub.send(
        P.Publish("durable", b"x", 1, message_id=1),
        P.Publish("elsewhere", b"y", 1, message_id=2),
    )
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Puback(1), P.Puback(2)]


def test_qos2_from_a_persistent_publisher_is_acknowledged_after_commit(store_broker):
    pub = connected(store_broker, "p", clean_session=False)
    pub.send(P.Publish("a", b"x", 2, message_id=7))
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Pubrec(7)]
    pub.send(P.Pubrel(7))
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Pubcomp(7)]


def test_pubrel_to_a_persistent_subscriber_waits_for_the_recorded_pubrec(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 2))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"x", 2, message_id=1))
    store_broker.commit()
    [delivered] = publishes(sub.received())
    sub.send(P.Pubrec(delivered.message_id))
    assert sub.received() == []
    store_broker.commit()
    assert sub.received() == [P.Pubrel(delivered.message_id)]


# What a restart keeps


def test_uncommitted_state_is_lost_and_was_never_acknowledged(store_broker):
    pub = connected(store_broker, "p")
    pub.send(P.Publish("r", b"v", 1, retain=True, message_id=3))
    assert pub.received() == []
    after = store_broker.restart()
    assert len(after.router.retained) == 0


def test_retained_messages_survive_a_restart(store_broker):
    pub = connected(store_broker, "p")
    pub.send(
        P.Publish("r/1", b"one", 1, retain=True, message_id=1),
        P.Publish("r/2", b"two", 0, retain=True),
        P.Publish("r/3", b"three", 0, retain=True),
        P.Publish("r/3", b"", 0, retain=True),
    )
    store_broker.commit()
    after = store_broker.restart()
    sub = connected(after, "s")
    sub.send(P.Subscribe(1, [("r/#", 1)]))
    got = sorted((m.topic, m.payload, m.qos, m.retain) for m in publishes(sub.received()))
    assert got == [("r/1", b"one", 1, True), ("r/2", b"two", 0, True)]


def test_persistent_session_subscriptions_and_queue_survive_a_restart(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a/#", 2), ("b", 1))
    sub.lose_connection()
    pub = connected(store_broker, "p")
    for i in range(5):
        pub.send(P.Publish(f"a/{i}", b"%d" % i, 1 + i % 2, message_id=i + 1))
    store_broker.commit()
    after = store_broker.restart()
    assert after.router.sessions["s"].subscriptions == {"a/#": 2, "b": 1}
    back = after.client(client_id="s", clean_session=False)
    packets = back.received()
    assert packets[0] == P.Connack(0, session_present=True)
    after.commit()
    # The first (QoS 1) needs no commit to go out; the rest follow in order.
    got = [(m.topic, m.qos) for m in publishes(packets[1:] + back.received())]
    assert got == [(f"a/{i}", 1 + i % 2) for i in range(5)]
    # Still subscribed after the restart.
    pub = connected(after, "p2")
    pub.send(P.Publish("b", b"live", 1, message_id=9))
    after.commit()
    assert deliveries(back.received()) == [("b", b"live", 1)]


def test_unacknowledged_deliveries_come_back_with_dup_and_the_same_id(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 2))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"1", 1, message_id=1), P.Publish("a", b"2", 2, message_id=2))
    store_broker.commit()
    first = publishes(sub.received())
    sub.send(P.Pubrec(first[1].message_id))
    store_broker.commit()
    after = store_broker.restart()
    back = after.client(client_id="s", clean_session=False)
    packets = back.received()
    resent = publishes(packets)
    assert [(p.message_id, p.payload, p.dup) for p in resent] == [(first[0].message_id, b"1", True)]
    assert P.Pubrel(first[1].message_id) in packets
    back.send(P.Puback(first[0].message_id), P.Pubcomp(first[1].message_id))
    after.commit()
    assert after.router.sessions["s"].inflight == {}
    assert after.restart().router.sessions["s"].inflight == {}


def statements_of(store):
    """Every statement the store's database runs from now on, as text."""
    seen = []
    store._db.set_trace_callback(seen.append)
    return seen


def queued_while_away(store_broker, count):
    """``count`` QoS 1 messages on "a", committed to the queue of "s" (away)."""
    sub = persistent_subscriber(store_broker, "s", ("a", 1))
    sub.lose_connection()
    pub = connected(store_broker, "p")
    for i in range(count):
        pub.send(P.Publish("a", b"%d" % i, 1, message_id=i + 1))
    store_broker.commit()
    return pub


def test_queued_qos1_sent_before_a_restart_comes_back_dup_and_one_never_sent_does_not(store_broker):
    pub = queued_while_away(store_broker, 3)
    # Sent from the queue, not acknowledged; two more queue behind them.
    back = store_broker.client(client_id="s", clean_session=False)
    assert [(p.payload, p.dup) for p in publishes(back.received())] == [
        (b"0", False), (b"1", False), (b"2", False)
    ]
    back.lose_connection()
    for i in range(3, 5):
        pub.send(P.Publish("a", b"%d" % i, 1, message_id=i + 1))
    store_broker.commit()
    after = store_broker.restart()
    again = after.client(client_id="s", clean_session=False)
    after.commit()
    got = publishes(again.received() + again.received())
    assert [(p.payload, p.dup) for p in got] == [
        (b"0", True), (b"1", True), (b"2", True), (b"3", False), (b"4", False)
    ]
    again.send(*[P.Puback(p.message_id) for p in got])
    after.commit()
    assert after.restart().router.sessions["s"].inflight == {}


def test_a_backlog_drains_without_an_update_per_qos1_delivery_or_a_delete_per_ack(store_broker):
    queued_while_away(store_broker, 60)
    seen = statements_of(store_broker.store)
    back = store_broker.client(client_id="s", clean_session=False)
    # The client acknowledges each window as it arrives; one commit at the end.
    got = []
    for _ in range(10):
        window = publishes(back.received())
        if not window:
            break
        got += window
        back.send(*[P.Puback(p.message_id) for p in window])
    store_broker.commit()
    assert [p.payload for p in got] == [b"%d" % i for i in range(60)]
    deliveries = [s for s in seen if "deliveries" in s]
    assert not [s for s in deliveries if s.startswith("UPDATE")]
    # The acknowledged run of sequence numbers goes as one range.
    assert len([s for s in deliveries if s.startswith("DELETE")]) == 1
    assert store_broker.store._db.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)


def test_a_turns_queued_deliveries_sent_make_one_sent_op_for_their_session(store_broker, monkeypatch):
    queued_while_away(store_broker, 20)
    handed = []
    add = writes.Compaction.add
    monkeypatch.setattr(writes.Compaction, "add", lambda self, ops: (handed.extend(ops), add(self, ops)))
    back = store_broker.client(client_id="s", clean_session=False)
    assert len(publishes(back.received())) == 20
    store_broker.commit()
    assert [op for op in handed if op[0] == writes.SENT] == [(writes.SENT, "s", 20)]
    assert store_broker.store._db.execute("SELECT sent_seq FROM sessions WHERE client_id = 's'").fetchone() == (20,)


def test_a_dropped_session_takes_its_turns_sent_mark_with_it(tmp_path):
    store = Store(tmp_path, reactor=None)
    store.add_session("c")
    store.sent("c", 7)
    # The session goes and a new one takes its client id in the same turn:
    # nothing it has sent yet may be marked as the old one's was.
    store.delete_session("c")
    store.add_session("c")
    store.run_pending()
    assert store._db.execute("SELECT sent_seq FROM sessions WHERE client_id = 'c'").fetchone() == (None,)
    store.sent("c", 3)
    store.run_pending()
    assert store._db.execute("SELECT sent_seq FROM sessions WHERE client_id = 'c'").fetchone() == (3,)
    store.stop()


def test_a_delivery_acknowledged_before_its_commit_never_reaches_the_disk(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 1))
    pub = connected(store_broker, "p")
    seen = statements_of(store_broker.store)
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    [message] = publishes(sub.received())
    assert pub.received() == []
    # Its only receiver has it: nothing is left that a crash could lose,
    # so the publisher's ack need not wait for the commit.
    sub.send(P.Puback(message.message_id))
    assert pub.received() == [P.Puback(1)]
    store_broker.commit()
    assert not [s for s in seen if "deliveries" in s]
    assert store_broker.store.ops_folded == 2


def test_an_ack_waits_for_the_commit_while_any_stored_copy_is_unacknowledged(store_broker):
    first = persistent_subscriber(store_broker, "s1", ("a", 1))
    second = persistent_subscriber(store_broker, "s2", ("a", 1))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    [copy] = publishes(first.received())
    first.send(P.Puback(copy.message_id))
    assert pub.received() == []
    [copy] = publishes(second.received())
    second.send(P.Puback(copy.message_id))
    assert pub.received() == [P.Puback(1)]


def test_a_copy_queued_behind_the_window_releases_the_ack_once_sent_and_acknowledged(tmp_path):
    store_broker = FakeBroker(SessionLimits(max_inflight_messages=1), store_dir=tmp_path)
    sub = persistent_subscriber(store_broker, "s", ("a", 1))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"1", 1, message_id=1), P.Publish("a", b"2", 1, message_id=2))
    [first] = publishes(sub.received())
    sub.send(P.Puback(first.message_id))
    assert pub.received() == [P.Puback(1)]
    [second] = publishes(sub.received())
    sub.send(P.Puback(second.message_id))
    assert pub.received() == [P.Puback(2)]


def test_an_ack_waits_for_the_commit_when_a_copy_was_queued_or_retained(store_broker):
    online = persistent_subscriber(store_broker, "on", ("a", 1))
    away = persistent_subscriber(store_broker, "away", ("a", 1))
    away.lose_connection()
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    [copy] = publishes(online.received())
    online.send(P.Puback(copy.message_id))
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Puback(1)]
    pub.send(P.Publish("a", b"kept", 1, retain=True, message_id=2))
    [copy] = publishes(online.received())
    online.send(P.Puback(copy.message_id))
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Puback(2)]


def test_an_ack_released_early_still_waits_behind_an_earlier_one(store_broker):
    slow = persistent_subscriber(store_broker, "slow", ("a", 1))
    quick = persistent_subscriber(store_broker, "quick", ("b", 1))
    pub = connected(store_broker, "p")
    pub.send(P.Publish("a", b"1", 1, message_id=1), P.Publish("b", b"2", 1, message_id=2))
    assert len(publishes(slow.received())) == 1
    [copy] = publishes(quick.received())
    quick.send(P.Puback(copy.message_id))
    assert pub.received() == []
    store_broker.commit()
    assert pub.received() == [P.Puback(1), P.Puback(2)]


def test_inbound_qos2_id_survives_a_restart_so_a_resend_is_not_routed_twice(store_broker):
    persistent_subscriber(store_broker, "s", ("a", 2))
    pub = connected(store_broker, "p", clean_session=False)
    pub.send(P.Publish("a", b"once", 2, message_id=5))
    store_broker.commit()
    assert pub.received() == [P.Pubrec(5)]
    after = store_broker.restart()
    pub = after.client(client_id="p", clean_session=False)
    pub.received()
    pub.send(P.Publish("a", b"once", 2, dup=True, message_id=5))
    after.commit()
    assert pub.received() == [P.Pubrec(5)]
    back = after.client(client_id="s", clean_session=False)
    after.commit()
    assert [p.payload for p in publishes(back.received())] == [b"once"]


def test_a_clean_session_removes_the_stored_one(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 1))
    sub.send(P.Disconnect())
    sub.finish_close()
    connected(store_broker, "s", clean_session=True)
    store_broker.commit()
    assert "s" not in store_broker.restart().router.sessions


def test_a_bridge_session_is_internal_after_a_restart_and_a_client_session_is_not(store_broker):
    # A bridge holds its session through the router, as MQTTBridge does.
    bridge, _ = store_broker.router.connect(INTERNAL_PREFIX + "bridge/up", clean_start=False, expiry_interval=NEVER_EXPIRES)
    persistent_subscriber(store_broker, "s", ("a", 1))
    store_broker.commit()
    assert bridge.internal
    assert not store_broker.router.sessions["s"].internal
    after = store_broker.restart().router.sessions
    assert after[INTERNAL_PREFIX + "bridge/up"].internal
    assert not after["s"].internal


def test_unsubscribe_is_stored(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("a", 1), ("b", 1))
    sub.send(P.Unsubscribe(2, ["a"]))
    store_broker.commit()
    assert store_broker.restart().router.sessions["s"].subscriptions == {"b": 1}


# A store that cannot be used


def test_corrupt_store_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "mqttgw.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"mqttgw\.db: cannot be used"):
        Store(tmp_path, reactor=None)
    # Never silently replaced.
    assert (tmp_path / "mqttgw.db").read_bytes().startswith(b"this is not")


def test_store_path_that_is_a_directory_is_an_error_naming_it(tmp_path):
    (tmp_path / "mqttgw.db").mkdir()
    with pytest.raises(StoreError, match="mqttgw.db"):
        Store(tmp_path, reactor=None)


def test_store_of_another_schema_version_is_refused(tmp_path):
    Store(tmp_path, reactor=None).stop()
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.execute("UPDATE meta SET value = 99 WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        Store(tmp_path, reactor=None)


def test_data_dir_that_cannot_be_made_is_an_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="data directory"):
        Store(tmp_path / "file" / "sub", reactor=None)


def test_a_second_store_on_the_same_directory_is_refused(tmp_path):
    first = Store(tmp_path, reactor=None)
    with pytest.raises(StoreError, match=r"in use by another gateway \(pid \d+\)"):
        Store(tmp_path, reactor=None)
    first.stop()
    Store(tmp_path, reactor=None).stop()


def test_a_version_1_store_is_upgraded_and_its_sessions_kept(tmp_path):
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
        "INSERT INTO meta VALUES ('schema', 1);"
        "CREATE TABLE sessions (client_id TEXT PRIMARY KEY);"
        "INSERT INTO sessions VALUES ('old');"
    )
    db.commit()
    db.close()
    store = Store(tmp_path, reactor=None)
    _, sessions = store.load()
    assert [(s.client_id, s.last_seen) for s in sessions] == [("old", None)]
    store.touch_session("old", 1234.5)
    store.run_pending()
    _, sessions = store.load()
    assert sessions[0].last_seen == 1234.5
    store.stop()



def test_a_version_5_store_without_topic_ids_loads_and_then_keeps_them(tmp_path):
    store = Store(tmp_path, reactor=None)
    store.add_session("sn", owner="")
    store.run_pending()
    store.stop()
    # What a store of schema version 5 was: no topic_ids table.
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.executescript("DROP TABLE topic_ids; UPDATE meta SET value = 5 WHERE key = 'schema';")
    db.commit()
    db.close()
    store = Store(tmp_path, reactor=None)
    _, [session] = store.load()
    assert (session.client_id, session.topic_ids) == ("sn", {})
    store.add_topic_id("sn", 3, "a/b")
    store.run_pending()
    store.stop()
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == store_module.SCHEMA_VERSION
    db.close()
    store = Store(tmp_path, reactor=None)
    _, [session] = store.load()
    assert session.topic_ids == {3: "a/b"}
    store.stop()


def test_topic_ids_go_with_their_session_and_alone(tmp_path):
    store = Store(tmp_path, reactor=None)
    for client_id in ("a", "b"):
        store.add_session(client_id, owner="")
        store.add_topic_id(client_id, 1, f"{client_id}/1")
        store.add_topic_id(client_id, 2, f"{client_id}/2")
    store.run_pending()
    store.delete_topic_id("a", 1)
    store.delete_session("b")
    store.run_pending()
    _, sessions = store.load()
    assert {s.client_id: s.topic_ids for s in sessions} == {"a": {2: "a/2"}}
    store.delete_topic_ids("a")
    # A row left of a session gone (written after its drop) is passed over.
    store.add_topic_id("gone", 1, "x")
    store.run_pending()
    _, sessions = store.load()
    assert {s.client_id: s.topic_ids for s in sessions} == {"a": {}}
    store.stop()


# How a batch of ops is folded (mqttgw.broker.writes)


def folded(*ops):
    compaction = writes.Compaction()
    compaction.add(list(ops))
    return [(sql.split()[0], sql.split()[2], args) for sql, args in compaction.statements()]


def test_removals_of_consecutive_deliveries_go_as_ranges():
    assert list(writes.ranges({7, 3, 4, 5, 9, 10})) == [(3, 5), (7, 7), (9, 10)]
    assert folded(*[(writes.DELETE, "c", seq) for seq in (1, 2, 3, 5)]) == [
        ("DELETE", "deliveries", [("c", 1, 3), ("c", 5, 5)])
    ]


def test_an_update_of_a_delivery_added_in_the_batch_goes_into_its_row():
    message = P.Publish("t", b"p", 2)
    [(verb, _, rows)] = folded(
        (writes.ADD, "c", 1, message, 2, False, None, 0), (writes.UPDATE, "c", 1, 7, 1)
    )
    assert verb == "INSERT" and rows[0][:8] == ["c", 1, "t", b"p", 2, 0, 7, 1]


def test_a_qos2_id_removed_added_and_removed_again_in_one_batch_is_removed():
    assert folded(
        (writes.PUBREL_DELETE, "c", 4), (writes.PUBREL_ADD, "c", 4), (writes.PUBREL_DELETE, "c", 4)
    ) == [("DELETE", "awaiting_pubrel", [("c", 4)])]
    assert folded((writes.PUBREL_ADD, "c", 4), (writes.PUBREL_DELETE, "c", 4)) == []
    assert folded((writes.PUBREL_DELETE, "c", 4), (writes.PUBREL_ADD, "c", 4)) == [
        ("INSERT", "IGNORE", [("c", 4)])
    ]


def test_a_dropped_session_supersedes_its_earlier_ops_and_not_its_later_ones():
    message = P.Publish("t", b"p", 1)
    got = folded(
        (writes.ADD, "c", 1, message, 1, False, None, 0),
        (writes.DELETE, "c", 0),
        (writes.SENT, "c", 1),
        (writes.DROP_SESSION, "c"),
        (writes.ADD, "c", 1, message, 1, False, None, 0),
    )
    assert [(verb, table) for verb, table, _ in got] == [
        ("DELETE", "sessions"), ("DELETE", "subscriptions"), ("DELETE", "deliveries"),
        ("DELETE", "awaiting_pubrel"), ("DELETE", "topic_ids"), ("INSERT", "deliveries"),
    ]


def test_a_row_that_cannot_be_made_fails_its_batch_and_the_writer_goes_on(tmp_path):
    store = Store(tmp_path, None)
    failures = []
    store.on_state_change = failures.append
    bad = P.Publish("t", b"p", 1, properties={"no_such_property": 1})
    store.add_delivery("c", 1, bad, 1, False)
    waited = store.barrier()
    errors = []
    waited.addErrback(errors.append)
    store.run_pending()
    assert store.state == "failed" and len(errors) == 1 and len(failures) == 1
    store.add_session("c")
    store.probe()
    store.run_pending()
    assert store.state == "ok"
    store.stop()


def bridged(store_broker, rule):
    """A started bridge of ``store_broker`` with ``rule``, and its upstream, connected."""
    reactor = MemoryReactorClock()
    settings = MQTTBridgeKind.check(
        {"name": "up", "addresses": ["127.0.0.1:1001"], "rules": [rule]}
    )
    bridge = MQTTBridgeKind.make_service(store_broker.router, settings, reactor)
    bridge.startService()
    upstream = accept(reactor)
    upstream.received()
    upstream.send(P.Connack(0))
    return bridge, upstream


def test_a_bridge_acknowledges_upstream_once_the_stored_local_copy_is_acknowledged(store_broker):
    sub = persistent_subscriber(store_broker, "s", ("t/#", 1))
    bridge, upstream = bridged(store_broker, "t/# in 1")
    upstream.received()
    upstream.send(P.Publish("t/a", b"x", 1, message_id=7))
    assert P.Puback(7) not in upstream.received()
    [copy] = publishes(sub.received())
    sub.send(P.Puback(copy.message_id))
    assert P.Puback(7) in upstream.received()
    bridge.stopService()


def test_only_a_retained_topics_last_value_in_a_batch_is_written():
    one, two = P.Publish("r", b"1", 1, retain=True), P.Publish("r", b"2", 1, retain=True)
    assert folded(
        (writes.RETAIN, "r", one), (writes.RETAIN, "r", None), (writes.RETAIN, "r", two)
    ) == [("INSERT", "REPLACE", [("r", b"2", 1, None, None)])]
    assert folded((writes.RETAIN, "r", one), (writes.RETAIN, "r", None)) == [
        ("DELETE", "retained", [("r",)])
    ]


# A disk behind the traffic


def test_a_store_behind_stops_reading_from_clients_until_half_of_it_is_written(
    store_broker, monkeypatch, logged
):
    monkeypatch.setattr(store_module, "MAX_BACKLOG", 10)
    sub = persistent_subscriber(store_broker, "s", ("a", 1))
    sub.lose_connection()
    pub = connected(store_broker, "p", keepalive=10)
    # Twelve copies for the store, handed to its writer at the end of the turn.
    pub.send(*[P.Publish("a", b"%d" % i, 1, message_id=i + 1) for i in range(12)])
    assert store_broker.store.congested
    assert [line for line in logged() if "writes waiting for the disk" in line]
    # Nothing more is read from anyone, a new client included; a client
    # is not dropped for the silence this makes.
    pub.send(P.Publish("a", b"12", 1, message_id=13))
    store_broker.clock.advance(60)
    late = store_broker.client(client_id="late")
    assert pub.transport.producerState == "paused"
    assert late.received() == [] and not pub.closed
    assert store_broker.store._ops == []
    # The writer catches up: what waited is read, in order.
    store_broker.commit()
    assert not store_broker.store.congested
    assert [type(p) for p in late.received()] == [P.Connack]
    assert pub.transport.producerState == "producing"
    store_broker.commit()
    assert [p.message_id for p in pub.received()] == list(range(1, 14))
    back = store_broker.client(client_id="s", clean_session=False)
    store_broker.commit()
    got = publishes(back.received() + back.received())
    assert [p.payload for p in got][:13] == [b"%d" % i for i in range(13)]


def test_a_failed_commit_counts_as_written_for_the_backlog(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_BACKLOG", 2)
    store_broker = FakeBroker(store_dir=tmp_path)
    told = []
    store_broker.store.congestion_listeners.append(told.append)
    pub = connected(store_broker, "p", clean_session=False)
    pub.send(P.Subscribe(1, [("t/#", 1)]), *[P.Publish("r", b"x", 0, retain=True) for _ in range(3)])
    assert told == [True]
    store_broker.store._db.close()
    store_broker.commit()
    assert told == [True, False]
    assert store_broker.store.backlog == 0


def test_a_store_behind_holds_a_bridges_upstream_back_too(store_broker, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_BACKLOG", 10)
    sub = persistent_subscriber(store_broker, "s", ("t/#", 1))
    sub.lose_connection()
    bridge, upstream = bridged(store_broker, "t/# in 1")
    # From upstream, kept for "s" (away): twelve copies for the store.
    upstream.send(*[P.Publish("t/a", b"%d" % i, 1, message_id=i + 1) for i in range(12)])
    store_broker.clock.advance(0)
    assert store_broker.store.congested
    assert upstream.transport.producerState == "paused"
    store_broker.commit()
    assert not store_broker.store.congested
    assert upstream.transport.producerState == "producing"
    # Once the link is gone, the store no longer tells the bridge.
    upstream.lose()
    assert store_broker.store.congestion_listeners == [store_broker.factory.flusher.hold_reading]
    bridge.stopService()


def test_listeners_sharing_a_flusher_register_it_once(tmp_path):
    store_broker = FakeBroker(store_dir=tmp_path)
    # A second listener, as a gateway with TCP and WebSocket ports has.
    MQTTServerFactory(store_broker.router, clock=store_broker.clock, flusher=store_broker.factory.flusher)
    assert store_broker.store.congestion_listeners == [store_broker.factory.flusher.hold_reading]


# What the store held: its record (mqttgw.db.state) and the files at its path


def record_of(path):
    return json.loads((path / "mqttgw.db.state").read_text())


def committed_session(path, client_id="s"):
    store = Store(path, None)
    store.add_session(client_id)
    store.run_pending()
    return store


def test_the_record_names_the_database_and_follows_its_commits_never_ahead(tmp_path):
    store = Store(tmp_path, None)
    first = record_of(tmp_path)
    assert first == {"id": store.id, "commits": 0}
    store.add_session("a")
    store.run_pending()
    assert record_of(tmp_path) == {"id": store.id, "commits": 1}
    # A commit that writes nothing is not counted.
    store.barrier()
    store.run_pending()
    assert store.committed == 1
    # A commit that fails leaves database and record where they were.
    store.add_delivery("a", 1, P.Publish("t", b"p", 1, properties={"no_such_property": 1}), 1, False)
    store.run_pending()
    assert store.state == "failed"
    assert record_of(tmp_path)["commits"] == 1
    store.stop()
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    assert dict(db.execute("SELECT key, value FROM meta")) == {
        "schema": store_module.SCHEMA_VERSION, "id": store.id, "commits": 1,
    }
    db.close()
    again = Store(tmp_path, None)
    assert (again.id, again.committed) == (store.id, 1)
    again.stop()


def test_a_database_behind_its_record_is_refused(tmp_path):
    store = committed_session(tmp_path)
    # As after a lost -wal: the record counted commits the database lacks.
    store._record.update(store_module.Record(store.id, store.committed + 5))
    store.stop()
    state = tmp_path / "mqttgw.db.state"
    with pytest.raises(StoreDamaged, match=rf"older than its record {state}: it holds 1 commit\(s\), the record says 6"):
        Store(tmp_path, None)
    # Nothing was changed by looking.
    assert record_of(tmp_path)["commits"] == 6


def test_another_database_under_the_record_is_refused(tmp_path):
    committed_session(tmp_path / "a").stop()
    committed_session(tmp_path / "b").stop()
    (tmp_path / "b" / "mqttgw.db").replace(tmp_path / "a" / "mqttgw.db")
    with pytest.raises(StoreDamaged, match="is not the database its record .* describes"):
        Store(tmp_path / "a", None)


def test_a_missing_or_empty_database_is_refused(tmp_path):
    committed_session(tmp_path).stop()
    db = tmp_path / "mqttgw.db"
    db.write_bytes(b"")
    with pytest.raises(StoreDamaged, match=r"is empty \(0 bytes\), and its record says it held 1 commit"):
        Store(tmp_path, None)
    db.unlink()
    with pytest.raises(StoreDamaged, match="is missing, and its record says it held 1 commit"):
        Store(tmp_path, None)
    assert not db.exists()
    # Empty is damage even without a record: SQLite never leaves one so.
    (tmp_path / "mqttgw.db.state").unlink()
    db.write_bytes(b"")
    with pytest.raises(StoreDamaged, match=r"is empty \(0 bytes\)$"):
        Store(tmp_path, None)


def test_a_damaged_record_is_refused_naming_it(tmp_path):
    committed_session(tmp_path).stop()
    (tmp_path / "mqttgw.db.state").write_bytes(b"")
    with pytest.raises(StoreDamaged, match=r"its record .*mqttgw\.db\.state is damaged \(0 bytes\)"):
        Store(tmp_path, None)


def test_a_record_lost_from_a_database_with_an_id_is_refused(tmp_path):
    store = committed_session(tmp_path)
    store.stop()
    (tmp_path / "mqttgw.db.state").unlink()
    with pytest.raises(StoreDamaged, match="mqttgw.db.state is missing"):
        Store(tmp_path, None)
    assert not (tmp_path / "mqttgw.db.state").exists()


def test_a_database_from_before_the_record_is_given_one(tmp_path, logged):
    store = committed_session(tmp_path)
    store.stop()
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.execute("DELETE FROM meta WHERE key IN ('id', 'commits')")
    db.commit()
    db.close()
    (tmp_path / "mqttgw.db.state").unlink()
    again = Store(tmp_path, None)
    assert record_of(tmp_path) == {"id": again.id, "commits": 0}
    assert any("is missing: made again from the database" in line for line in logged())
    again.stop()


def test_recover_sets_the_damaged_files_aside_and_starts_empty(tmp_path, logged):
    store = committed_session(tmp_path)
    store._record.update(store_module.Record(store.id, 9))
    store.stop()
    again = Store(tmp_path, None, recover=True)
    assert again.load() == ([], [])
    assert again.id != store.id and again.committed == 0
    again.stop()
    aside = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mqttgw.db.2"))
    assert len(aside) == 2 and aside[1] == aside[0] + ".state"
    # What was set aside is as it was.
    old = sqlite3.connect(tmp_path / aside[0])
    assert old.execute("SELECT client_id FROM sessions").fetchall() == [("s",)]
    old.close()
    assert json.loads((tmp_path / aside[1]).read_text()) == {"id": store.id, "commits": 9}
    [line] = [l for l in logged() if "persistence.recover" in l]
    assert "it holds 1 commit(s), the record says 9" in line
    assert "the database held 1 commit(s): 1 session(s), 0 queued message(s), 0 retained" in line
    assert f"set aside mqttgw.db, mqttgw.db.state as {tmp_path / aside[0]}*" in line


def test_recover_leaves_a_sound_store_as_it_is(tmp_path):
    store = committed_session(tmp_path)
    store.stop()
    again = Store(tmp_path, None, recover=True)
    assert again.id == store.id and [s.client_id for s in again.load()[1]] == ["s"]
    again.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mqttgw.db", "mqttgw.db.state", "mqttgw.lock"]


def test_a_database_removed_while_open_fails_commits_until_made_again_with_all_it_held(tmp_path):
    store = committed_session(tmp_path)
    changes = []
    store.on_state_change = changes.append
    for path in list(tmp_path.iterdir()):
        path.unlink()
    store.add_session("after")
    waited = store.barrier()
    errors = []
    waited.addErrback(errors.append)
    store.run_pending()
    assert len(errors) == 1 and store.state == "failed"
    assert "removed or replaced while open" in str(changes[0])
    # Later commits fail too, until a probe makes the store again.
    store.add_session("later")
    store.run_pending()
    assert store.state == "failed"
    store.probe()
    store.run_pending()
    assert store.state == "ok" and changes[-1] is None
    assert record_of(tmp_path) == {"id": store.id, "commits": store.committed}
    store.stop()
    again = Store(tmp_path, None)
    assert sorted(s.client_id for s in again.load()[1]) == ["after", "later", "s"]
    again.stop()


def test_a_database_replaced_while_open_is_left_and_the_store_stays_failed(tmp_path):
    store = committed_session(tmp_path / "a")
    committed_session(tmp_path / "b", "other").stop()
    foreign = (tmp_path / "b" / "mqttgw.db").read_bytes()
    (tmp_path / "b" / "mqttgw.db").replace(tmp_path / "a" / "mqttgw.db")
    store.add_session("after")
    store.run_pending()
    assert store.state == "failed"
    store.probe()
    store.run_pending()
    assert store.state == "failed"
    assert "is another file than the one opened" in str(store.failed)
    store.stop()
    assert (tmp_path / "a" / "mqttgw.db").read_bytes() == foreign


def test_a_record_removed_alone_is_written_again_at_the_next_probe(tmp_path):
    store = committed_session(tmp_path)
    (tmp_path / "mqttgw.db.state").unlink()
    store.add_session("t")
    store.run_pending()
    assert not (tmp_path / "mqttgw.db.state").exists()
    store.probe()
    store.run_pending()
    assert store.state == "ok"
    assert record_of(tmp_path) == {"id": store.id, "commits": 3}
    store.stop()


def test_a_wal_removed_alone_fails_commits_until_the_store_is_made_again(tmp_path):
    store = committed_session(tmp_path)
    (tmp_path / "mqttgw.db-wal").unlink()
    store.add_session("after")
    store.run_pending()
    assert store.state == "failed"
    store.probe()
    store.run_pending()
    assert store.state == "ok"
    store.add_session("later")
    store.run_pending()
    # What is at the paths holds every commit (as a crash would find it).
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    assert sorted(db.execute("SELECT client_id FROM sessions")) == [("after",), ("later",), ("s",)]
    db.close()
    store.stop()

"""
Acknowledgements held for the store's commit, in order, and the failure
callback a failed commit calls, named by whoever waits (no introspection).
"""

from mqttgw.broker.acks import Held, OrderedAcks
from mqttgw.broker.store import Store


def store(tmp_path):
    s = Store(tmp_path, None)
    s.load()
    return s


def test_acks_wait_for_the_commit_and_keep_their_order(tmp_path):
    s = store(tmp_path)
    written = []
    acks = OrderedAcks(s, written.append)
    acks.send(b"first", durable=True)
    acks.send(b"second", durable=False)
    assert written == [] and acks.waiting == 2
    s.run_pending()
    assert written == [b"first", b"second"] and acks.waiting == 0


def test_without_a_store_or_a_wait_an_ack_goes_at_once(tmp_path):
    written = []
    OrderedAcks(None, written.append).send(b"ack", durable=True)
    OrderedAcks(store(tmp_path), written.append).send(b"ack2", durable=False)
    assert written == [b"ack", b"ack2"]


def test_a_failed_commit_calls_each_waiters_failure_callback_once(tmp_path):
    s = store(tmp_path)
    failures = {"a": [], "b": []}
    written = []
    acks_a = OrderedAcks(s, written.append)
    acks_a.on_failure = failures["a"].append
    acks_b = OrderedAcks(s, written.append)
    acks_b.on_failure = failures["b"].append
    for acks in (acks_a, acks_a, acks_b):
        acks.send(b"ack", durable=True)
    later = []
    # A callback that names no failure callback waits for a later commit.
    s.after_commit(later.append, "after")
    s.add_session("c")
    s._db.close()
    s.run_pending()
    assert [len(failures["a"]), len(failures["b"])] == [1, 1]
    assert written == [] and later == []


def test_after_commit_takes_its_failure_callback_explicitly(tmp_path):
    s = store(tmp_path)
    failed = []
    s.after_commit(lambda: None, failed=failed.append)
    s.after_commit(lambda: None, failed=failed.append)
    s.add_session("c")
    s._db.close()
    s.run_pending()
    # One batch, one failure callback named twice: told once.
    assert len(failed) == 1


def test_a_held_ack_goes_before_the_commit_once_its_copies_are_acknowledged(tmp_path):
    s = store(tmp_path)
    written = []
    acks = OrderedAcks(s, written.append)
    held = Held()
    held.pending = 2
    acks.send(b"ack", durable=True, held=held)
    held.delivered()
    assert written == []
    held.delivered()
    assert written == [b"ack"]

"""
A store that can be read but not written when it is opened (a full disk,
a read-only data directory or database file) after a crash left commits
in its -wal: it is read, with nothing written, it is failed as a store
whose commit failed, and a probe opens it for writing once it can be.
A store that cannot be read, fails its identity check or needs a schema
upgrade stops start-up with one line.  The disk is made full in process
with a file size limit, and files read-only with the immutable attribute
(root) or their modes.
"""

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
from contextlib import contextmanager

import pytest
from twisted.internet.task import Clock

from mqttgw.broker import sql, storelock, storeread
from mqttgw.broker.record import RecordFile
from mqttgw.broker.router import Router
from mqttgw.broker.store import Record, Store, StoreDamaged, StoreError, StoreFailed, StoreUnwritable
from mqttgw.service.gateway import PROBE_INTERVAL, RETRY_INTERVAL, Gateway
from mqttgw.testing import FakeBroker, connect, connected, deliveries
from mqttgw.wire import packets as P
from tests.conftest import require_program
from tests.gateway import gateway_env

QUEUED = 60
# Bytes of each queued payload: QUEUED of them in the -wal are more than
# FULL_AT, so the database cannot take them in (a checkpoint) when full.
PAYLOAD = 3000
FULL_AT = 96 * 1024 + 100

# A gateway's store killed after its commits: they are in its -wal (the
# database file was checkpointed when it was opened), the record counts
# them, the -shm is left.
CRASH = f"""
import os, sys
from mqttgw.broker.store import Store
from mqttgw.wire import packets as P
store = Store(sys.argv[1], None)
store.add_session("s")
store.subscribe("s", "t/#", 1)
store.run_pending()
for seq in range(1, {QUEUED} + 1):
    store.add_delivery("s", seq, P.Publish(f"t/{{seq}}", b"%d." % seq + b"." * {PAYLOAD}, 1), 1, False)
    store.run_pending()
print(store.id, store.committed)
os._exit(0)
"""


def crashed_store(path):
    """A store in ``path`` as a SIGKILL leaves it: (id, commits)."""
    out = subprocess.run(
        [sys.executable, "-c", CRASH, str(path)],
        capture_output=True, text=True, env=gateway_env(), timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (path / "mqttgw.db-wal").stat().st_size > QUEUED * PAYLOAD
    return tuple(map(int, out.stdout.split()))


def record_of(path):
    return json.loads((path / "mqttgw.db.state").read_text())


@contextmanager
def disk_full_past(size):
    """
    Meanwhile, no file of this process grows past ``size`` bytes (the
    write fails, as on a full disk, instead of the process being killed).
    """
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)


@pytest.fixture
def read_only():
    """
    ``read_only(path, on=True)``: ``path`` refuses writes (for root, whom
    modes do not stop, with the immutable attribute); undone after.
    """
    made = []
    chattr = require_program("chattr") if os.geteuid() == 0 else None

    def set_(path, on=True):
        if chattr is not None:
            subprocess.run([chattr, "+i" if on else "-i", str(path)], check=True)
        elif path.is_dir():
            path.chmod(0o555 if on else 0o700)
        else:
            path.chmod(0o400 if on else 0o600)
        if on:
            made.append(path)

    yield set_
    for path in reversed(made):
        set_(path, False)


def unchanged(path):
    """The store's files as they are: (name, size, mtime) of each."""
    return sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir() if p.name.startswith("mqttgw.db")
    )


def queued(store):
    """Payloads of the session ``s`` that a store's load gives."""
    _, sessions = store.load()
    [session] = sessions
    return [d.payload for d in session.deliveries]


def expected_payloads():
    return [b"%d." % seq + b"." * PAYLOAD for seq in range(1, QUEUED + 1)]


def test_a_full_disk_at_start_up_reads_the_store_with_its_wal_and_changes_neither_nor_its_record(tmp_path):
    identity = crashed_store(tmp_path)
    before = unchanged(tmp_path)
    with disk_full_past(FULL_AT):
        store = Store(tmp_path, None)
        assert queued(store) == expected_payloads()
    assert (store.id, store.committed) == identity
    assert store.state == "failed"
    assert isinstance(store.failed, StoreUnwritable)
    assert "disk" in str(store.failed)
    # (SQLite's attempts to checkpoint may have copied committed pages
    # into the database file; the -wal that holds them is as it was.)
    kept = ("mqttgw.db-wal", "mqttgw.db.state")
    assert [f for f in unchanged(tmp_path) if f[0] in kept] == [f for f in before if f[0] in kept]
    store.stop()


def test_a_store_read_on_a_full_disk_fails_writes_until_a_probe_finds_space(tmp_path):
    identity = crashed_store(tmp_path)
    with disk_full_past(FULL_AT):
        store = Store(tmp_path, None)
        store.load()
    changes = []
    store.on_state_change = changes.append
    # What needs a write fails, as after a failed commit: its waiters are told.
    store.add_session("new")
    waited = store.barrier()
    errors = []
    waited.addErrback(lambda f: errors.append(f.value))
    store.run_pending()
    assert len(errors) == 1 and isinstance(errors[0], StoreFailed)
    assert store.state == "failed" and store.committed == identity[1]
    # A probe while the disk is still full leaves it so.
    with disk_full_past(FULL_AT):
        store.probe()
        store.run_pending()
    assert store.state == "failed" and changes == []
    assert record_of(tmp_path)["commits"] == identity[1]
    # Space again: the next probe opens it for writing and commits.
    store.probe()
    store.run_pending()
    assert store.state == "ok" and changes == [None]
    assert store.id == identity[0] and store.committed == identity[1] + 1
    assert record_of(tmp_path) == {"id": store.id, "commits": store.committed}
    store.add_session("later")
    store.run_pending()
    store.stop()
    again = Store(tmp_path, None)
    assert again.state == "ok"
    _, sessions = again.load()
    by_id = {s.client_id: s for s in sessions}
    assert sorted(by_id) == ["later", "s"]
    assert [d.payload for d in by_id["s"].deliveries] == expected_payloads()
    again.stop()


def test_a_read_only_data_directory_defers_the_record_until_it_takes_files(tmp_path, read_only):
    identity = crashed_store(tmp_path)
    read_only(tmp_path)
    store = Store(tmp_path, None)
    assert queued(store) == expected_payloads()
    assert "its record cannot be written" in str(store.failed)
    store.probe()
    store.run_pending()
    assert store.state == "failed"
    assert record_of(tmp_path)["commits"] == identity[1]
    read_only(tmp_path, False)
    store.probe()
    store.run_pending()
    assert store.state == "ok"
    assert record_of(tmp_path) == {"id": identity[0], "commits": identity[1] + 1}
    store.stop()


def test_a_read_only_database_file_is_read_and_written_once_it_can_be(tmp_path, read_only):
    crashed_store(tmp_path)
    read_only(tmp_path / "mqttgw.db")
    store = Store(tmp_path, None)
    assert queued(store) == expected_payloads()
    assert store.state == "failed" and isinstance(store.failed, StoreUnwritable)
    read_only(tmp_path / "mqttgw.db", False)
    store.probe()
    store.run_pending()
    assert store.state == "ok"
    store.stop()


def test_a_store_neither_written_nor_read_stops_start_up_naming_both(tmp_path, read_only):
    crashed_store(tmp_path)
    # Without its -shm, on a directory that cannot take one, and a
    # database file that cannot be locked for writing: SQLite cannot read
    # the -wal, and the database file alone would lose its commits.
    (tmp_path / "mqttgw.db-shm").unlink()
    read_only(tmp_path / "mqttgw.db")
    read_only(tmp_path)
    before = unchanged(tmp_path)
    with pytest.raises(StoreError) as raised:
        Store(tmp_path, None)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"store {tmp_path / 'mqttgw.db'}: cannot be used: it can")
    assert " nor read (" in message
    assert unchanged(tmp_path) == before


def test_a_store_behind_its_record_is_refused_even_when_it_can_only_be_read(tmp_path, read_only):
    identity = crashed_store(tmp_path)
    (tmp_path / "mqttgw.db.state").write_text(
        json.dumps({"id": identity[0], "commits": identity[1] + 5}).ljust(127) + "\n"
    )
    read_only(tmp_path / "mqttgw.db")
    read_only(tmp_path)
    with pytest.raises(StoreDamaged, match=r"older than its record .*the record says %d" % (identity[1] + 5)):
        Store(tmp_path, None)


def test_a_schema_upgrade_that_cannot_be_written_stops_start_up_naming_it(tmp_path, read_only):
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
        "INSERT INTO meta VALUES ('schema', 1);"
        "CREATE TABLE sessions (client_id TEXT PRIMARY KEY);"
        "INSERT INTO sessions VALUES ('old');"
    )
    db.commit()
    db.close()
    read_only(tmp_path / "mqttgw.db")
    with pytest.raises(StoreError) as raised:
        Store(tmp_path, None)
    assert str(raised.value) == (
        f"store {tmp_path / 'mqttgw.db'}: cannot be used: its schema version 1 needs an upgrade"
        f" to {sql.SCHEMA_VERSION}, which cannot be written (attempt to write a readonly database)"
    )


def test_a_version_5_store_that_cannot_be_upgraded_is_read_without_its_topic_ids(tmp_path, read_only):
    # The upgrade to 6 only adds MQTT-SN's topic_ids: a gateway upgraded on
    # a full disk (or a read-only store) still starts, its sessions served.
    store = Store(tmp_path, None)
    store.add_session("old", owner="")
    store.add_topic_id("old", 3, "a/b")
    store.run_pending()
    store.stop()
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.executescript("DROP TABLE topic_ids; UPDATE meta SET value = 5 WHERE key = 'schema';")
    db.commit()
    db.close()
    read_only(tmp_path / "mqttgw.db")
    store = Store(tmp_path, None)
    assert store.file.unwritable
    _, [session] = store.load()
    assert (session.client_id, session.topic_ids) == ("old", {})
    store.stop()


def test_a_probe_finding_another_database_leaves_the_store_failed(tmp_path, read_only):
    crashed_store(tmp_path)
    read_only(tmp_path)
    store = Store(tmp_path, None)
    store.load()
    read_only(tmp_path, False)
    other = tmp_path / "other"
    other.mkdir()
    Store(other, None).stop()
    (other / "mqttgw.db").replace(tmp_path / "mqttgw.db")
    (tmp_path / "mqttgw.db-wal").unlink()
    store.probe()
    store.run_pending()
    assert store.state == "failed"
    assert "is not the database its record" in str(store.failed)
    store.stop()


def test_the_immutable_way_is_never_taken_over_a_wal_with_commits(tmp_path):
    crashed_store(tmp_path)
    path, wal = tmp_path / "mqttgw.db", tmp_path / "mqttgw.db-wal"
    assert storeread._immutable(path, wal) is None
    db = storeread.connect(path, wal)
    assert db.execute("SELECT count(*) FROM deliveries").fetchone() == (QUEUED,)
    db.close()


def test_the_lock_falls_back_to_the_directory_and_moves_to_its_file_once_it_can(tmp_path, read_only):
    read_only(tmp_path)
    lock = storelock.take(tmp_path / "mqttgw.lock")
    assert not lock.on_file and not (tmp_path / "mqttgw.lock").exists()
    with pytest.raises(storelock.LockRefused, match="in use by another gateway"):
        storelock.take(tmp_path / "mqttgw.lock")
    with pytest.raises(storelock.LockRefused, match="data directory"):
        storelock.take(tmp_path / "mqttgw.lock", fallback=False)
    read_only(tmp_path, False)
    on_file = storelock.take(tmp_path / "mqttgw.lock", fallback=False)
    assert on_file.on_file and (tmp_path / "mqttgw.lock").read_text() == f"{os.getpid()}\n"
    on_file.close()
    lock.close()


def test_a_store_started_degraded_takes_its_lock_file_when_writable(tmp_path, read_only):
    crashed_store(tmp_path)
    (tmp_path / "mqttgw.lock").unlink()
    read_only(tmp_path)
    store = Store(tmp_path, None)
    store.load()
    read_only(tmp_path, False)
    store.probe()
    store.run_pending()
    assert store.state == "ok"
    assert (tmp_path / "mqttgw.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(StoreError, match="in use by another gateway"):
        Store(tmp_path, None)
    store.stop()


# The running gateway's refusals, from a store started degraded


def test_a_degraded_store_serves_its_sessions_and_refuses_what_needs_a_write(tmp_path, read_only):
    crashed_store(tmp_path)
    read_only(tmp_path)
    broker = FakeBroker(store_dir=tmp_path)
    assert broker.store.state == "failed"
    # The persistent session it holds is resumed, and its queue delivered.
    keeper = broker.client(connect("s", clean_session=False))
    connack, *sent = keeper.received()
    assert connack.return_code == 0 and connack.session_present
    got = [payload for _, payload, _ in deliveries(sent)]
    assert got and got == expected_payloads()[: len(got)]
    # A new persistent session needs a row: CONNACK 3, as while running.
    newcomer = broker.client(connect("new", clean_session=False))
    [connack] = newcomer.received()
    assert connack.return_code == P.CONNACK_SERVER_UNAVAILABLE
    # A QoS 1 publish for the persistent session closes its connection
    # without PUBACK; one between clean sessions goes on.
    publisher = connected(broker, "p")
    publisher.send(P.Publish("t/x", b"needs the store", 1, message_id=1))
    assert publisher.closed
    clean = connected(broker, "c")
    clean.send(P.Subscribe(1, [("live", 1)]))
    clean.send(P.Publish("live", b"on", 1, message_id=2))
    assert ("live", b"on", 1) in deliveries(clean.received())
    # Writable again after a probe: the newcomer is taken.
    read_only(tmp_path, False)
    broker.store.probe()
    broker.commit()
    assert broker.store.state == "ok"
    connected(broker, "new", clean_session=False)


def test_a_failed_store_is_probed_more_often_until_it_commits():
    clock = Clock()

    class Probed:
        failed = None
        probes = 0

        def probe(self):
            self.probes += 1

    store = Probed()
    gateway = Gateway(Router(clock), clock, store)
    gateway.startService()
    assert store.probes == 1
    clock.pump([RETRY_INTERVAL] * int(PROBE_INTERVAL / RETRY_INTERVAL))
    assert store.probes == 2
    store.failed = OSError("No space left on device")
    clock.pump([RETRY_INTERVAL] * 4)
    assert store.probes == 6
    store.failed = None
    clock.pump([RETRY_INTERVAL] * int(PROBE_INTERVAL / RETRY_INTERVAL))
    assert store.probes == 7
    gateway.stopService()


def test_one_probe_at_a_time_is_handed_to_the_writer(tmp_path):
    store = Store(tmp_path, None)
    store.probe()
    store.probe()
    assert store._queue.qsize() == 1
    store.run_pending()
    store.probe()
    assert store._queue.qsize() == 1
    store.stop()


def test_the_record_is_read_without_writing(tmp_path, read_only):
    identity = crashed_store(tmp_path)
    read_only(tmp_path / "mqttgw.db.state")
    read_only(tmp_path)
    assert RecordFile(tmp_path / "mqttgw.db.state").read() == Record(*identity)


def test_an_admin_socket_a_read_only_data_directory_cannot_take_is_gone_without(tmp_path, read_only, logged):
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    from mqttgw.service.build import unix_description
    from mqttgw.transports.listening import ListenerService

    read_only(tmp_path)
    path = str(tmp_path / "admin.sock")
    optional = ListenerService(
        reactor, "http", unix_description(path), Factory.forProtocol(Protocol), name=path, required=False
    )
    optional.privilegedStartService()
    assert optional.port is None
    assert any(f"http listener {path}: cannot listen: " in line and "going on without it" in line for line in logged())
    optional.stopService()
    # One that is required still stops start-up, with one line.
    required = ListenerService(reactor, "http", unix_description(path), Factory.forProtocol(Protocol), name=path)
    with pytest.raises(SystemExit, match=f"^mqttgw: http listener {path}: cannot listen: "):
        required.privilegedStartService()

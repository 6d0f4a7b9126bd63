"""
The durable store: retained messages, persistent sessions with their
subscriptions, queued and in-flight messages, and inbound QoS 2 ids, in
SQLite (WAL).  The reactor thread never touches the disk: writes go to one
writer thread that commits them in batches, and ``barrier()`` gives a
Deferred that fires (in the reactor) once everything written before it is
committed.  Loading happens once, at start-up, before the reactor runs.
"""

import os
import queue
import sqlite3
import threading
import time
from pathlib import Path

import attr
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttgw.wire.properties import PUBLISH, decode_properties, encode_properties

log = Logger()

DB_NAME = "mqttgw.db"
LOCK_NAME = "mqttgw.lock"
# 2: sessions.last_seen; 3: MQTT 5.0's session expiry, and message
# properties and expiry (older stores are upgraded in place).
SCHEMA_VERSION = 3

# --durability: what a commit survives, as SQLite's synchronous setting.
DURABILITY = {
    "fsync": "FULL",  # power loss: every commit is fsynced
    "os": "NORMAL",  # a crash of the process: the OS holds what was written
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    properties BLOB, expiry REAL);
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY, last_seen REAL, expiry_interval INTEGER);
CREATE TABLE IF NOT EXISTS subscriptions (
    client_id TEXT NOT NULL, topic_filter TEXT NOT NULL, qos INTEGER NOT NULL,
    PRIMARY KEY (client_id, topic_filter));
CREATE TABLE IF NOT EXISTS deliveries (
    client_id TEXT NOT NULL, seq INTEGER NOT NULL,
    topic TEXT NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    retain INTEGER NOT NULL, message_id INTEGER, state INTEGER NOT NULL,
    properties BLOB, expiry REAL,
    PRIMARY KEY (client_id, seq));
CREATE TABLE IF NOT EXISTS awaiting_pubrel (
    client_id TEXT NOT NULL, message_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, message_id));
"""


# Columns added since version 1 (a table made new already has them).
_ADDED_COLUMNS = [
    ("sessions", "last_seen", "REAL"),
    ("sessions", "expiry_interval", "INTEGER"),
    ("retained", "properties", "BLOB"),
    ("retained", "expiry", "REAL"),
    ("deliveries", "properties", "BLOB"),
    ("deliveries", "expiry", "REAL"),
]


def _upgrade(db):
    for table, column, type_ in _ADDED_COLUMNS:
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {type_}")


class StoreError(Exception):
    """The store cannot be opened or read; the message names the file."""


@attr.s(slots=True)
class StoredDelivery:
    seq = attr.ib()
    topic = attr.ib()
    payload = attr.ib()
    qos = attr.ib()
    retain = attr.ib()
    message_id = attr.ib()
    state = attr.ib()
    properties = attr.ib(default=None)
    expiry = attr.ib(default=None)


@attr.s(slots=True)
class StoredSession:
    client_id = attr.ib()
    last_seen = attr.ib(default=None)
    # MQTT 5.0's session expiry interval, or None (3.1.1).
    expiry_interval = attr.ib(default=None)
    subscriptions = attr.ib(factory=dict)
    deliveries = attr.ib(factory=list)
    awaiting_pubrel = attr.ib(factory=set)


class _Barrier:
    __slots__ = ("deferred",)

    def __init__(self):
        self.deferred = Deferred()


_STOP = object()
_PROBE = object()


class StoreFailed(Exception):
    """A commit failed: what waited for it is not safe."""


def _lock(path):
    """
    An exclusive lock on the data directory for this process's life: a
    second gateway on the same store would corrupt what both acknowledge.
    """
    import fcntl

    try:
        f = open(path, "a+")
    except OSError as e:
        raise StoreError(f"data directory {path.parent}: {e.strerror}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise StoreError(
            f"data directory {path.parent} is in use by another gateway (pid {holder})"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class Store:
    """
    Open (creating if need be) the store in ``data_dir``.  Anything wrong
    with an existing file raises StoreError; it is never replaced.
    """

    def __init__(self, data_dir, reactor, durability="fsync", batch=1000):
        self.path = Path(data_dir) / DB_NAME
        self.reactor = reactor
        self.batch = batch
        self.failed = None
        self._queue = queue.SimpleQueue()
        self._thread = None
        # Work waiting for the commit of what was written this reactor turn.
        self._after_commit = []
        self._turn_end = None
        self.data_dir = Path(data_dir)
        # Health, as operators see it: None while commits succeed, else the
        # error of the last failed commit or probe.
        self.commits = 0
        self.last_commit_seconds = None
        self.last_commit_at = None
        self.on_commit = None
        self.on_state_change = None
        try:
            Path(data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"data directory {data_dir}: {e.strerror}") from None
        self._lock = _lock(self.data_dir / LOCK_NAME)
        try:
            self._db = self._open(DURABILITY[durability])
        except StoreError:
            self._lock.close()
            raise

    def _open(self, synchronous):
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            ok = db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(ok)
            db.executescript(SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] < SCHEMA_VERSION:
                _upgrade(db)
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {row[0]} is not {SCHEMA_VERSION}")
        except sqlite3.Error as e:
            raise StoreError(f"store {self.path}: cannot be used: {e}") from None
        return db

    # Start-up

    def load(self):
        """Everything stored: ``(retained [(topic, payload, qos)], sessions)``."""
        try:
            db = self._db
            retained = db.execute(
                "SELECT topic, payload, qos, properties, expiry FROM retained"
            ).fetchall()
            sessions = {
                cid: StoredSession(cid, last_seen, expiry_interval)
                for (cid, last_seen, expiry_interval) in db.execute(
                    "SELECT client_id, last_seen, expiry_interval FROM sessions"
                )
            }
            for cid, topic_filter, qos in db.execute(
                "SELECT client_id, topic_filter, qos FROM subscriptions"
            ):
                sessions[cid].subscriptions[topic_filter] = qos
            for row in db.execute(
                "SELECT client_id, seq, topic, payload, qos, retain, message_id, state,"
                " properties, expiry FROM deliveries ORDER BY client_id, seq"
            ):
                sessions[row[0]].deliveries.append(
                    StoredDelivery(
                        row[1], row[2], bytes(row[3]), row[4], bool(row[5]), row[6], row[7],
                        _properties(row[8]), row[9],
                    )
                )
            for cid, mid in db.execute("SELECT client_id, message_id FROM awaiting_pubrel"):
                sessions[cid].awaiting_pubrel.add(mid)
        except (sqlite3.Error, KeyError) as e:
            raise StoreError(f"store {self.path}: cannot be read: {e!r}") from None
        return (
            [(t, bytes(p), q, _properties(props), e) for t, p, q, props, e in retained],
            list(sessions.values()),
        )

    def start(self):
        self._thread = threading.Thread(target=self._write_loop, name="mqttgw-store", daemon=True)
        self._thread.start()

    def stop(self):
        """Commit everything submitted, then close (blocks: for shutdown)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._db.close()
        self._lock.close()

    @property
    def state(self):
        return "ok" if self.failed is None else "failed"

    def probe(self):
        """
        Check, in the writer thread, that the data directory still takes a
        new file and the database a commit; a failure makes the store
        failed (as a failed commit does) until a later commit succeeds.
        """
        self._queue.put(_PROBE)

    # Writes, from the reactor thread

    def write(self, sql, args=()):
        self._queue.put((sql, args))

    def barrier(self):
        """A Deferred fired once every write submitted so far is committed."""
        barrier = _Barrier()
        self._queue.put(barrier)
        return barrier.deferred

    def after_commit(self, callback, *args):
        """
        Call ``callback(*args)`` once every write submitted so far is
        committed.  Callbacks run in the order given; those of one reactor
        turn share one barrier.
        """
        self._after_commit.append((callback, args))
        if self._turn_end is None:
            self._turn_end = self.reactor.callLater(0, self._end_turn)

    def _end_turn(self):
        self._turn_end = None
        waiting, self._after_commit = self._after_commit, []
        self.barrier().addCallbacks(_run_all, _fail_all, (waiting,), None, (waiting,))

    def set_retained(self, message):
        self.write(
            "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?)",
            (message.topic, message.payload, message.qos, *_message_columns(message)),
        )

    def delete_retained(self, topic):
        self.write("DELETE FROM retained WHERE topic = ?", (topic,))

    def add_session(self, client_id, expiry_interval=None):
        self.write(
            "INSERT OR REPLACE INTO sessions VALUES (?, NULL, ?)", (client_id, expiry_interval)
        )

    def set_session_expiry(self, client_id, expiry_interval):
        self.write(
            "UPDATE sessions SET expiry_interval = ? WHERE client_id = ?",
            (expiry_interval, client_id),
        )

    def touch_session(self, client_id, last_seen):
        self.write("UPDATE sessions SET last_seen = ? WHERE client_id = ?", (last_seen, client_id))

    def delete_session(self, client_id):
        for table in ("sessions", "subscriptions", "deliveries", "awaiting_pubrel"):
            self.write(f"DELETE FROM {table} WHERE client_id = ?", (client_id,))

    def subscribe(self, client_id, topic_filter, qos):
        self.write(
            "INSERT OR REPLACE INTO subscriptions VALUES (?, ?, ?)",
            (client_id, topic_filter, qos),
        )

    def unsubscribe(self, client_id, topic_filter):
        self.write(
            "DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?",
            (client_id, topic_filter),
        )

    def add_delivery(self, client_id, seq, message, qos, retain, message_id=None, state=0):
        self.write(
            "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                client_id, seq, message.topic, message.payload, qos, int(retain),
                message_id, state, *_message_columns(message),
            ),
        )

    def update_delivery(self, client_id, seq, message_id, state):
        self.write(
            "UPDATE deliveries SET message_id = ?, state = ? WHERE client_id = ? AND seq = ?",
            (message_id, state, client_id, seq),
        )

    def delete_delivery(self, client_id, seq):
        self.write("DELETE FROM deliveries WHERE client_id = ? AND seq = ?", (client_id, seq))

    def add_awaiting_pubrel(self, client_id, message_id):
        self.write("INSERT OR IGNORE INTO awaiting_pubrel VALUES (?, ?)", (client_id, message_id))

    def delete_awaiting_pubrel(self, client_id, message_id):
        self.write(
            "DELETE FROM awaiting_pubrel WHERE client_id = ? AND message_id = ?",
            (client_id, message_id),
        )

    # The writer thread

    def _write_loop(self):
        while True:
            batch = [self._queue.get()]
            # Group commit: everything already waiting goes in this batch.
            while len(batch) < self.batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not self._commit(batch, self.reactor.callFromThread):
                return

    def run_pending(self):
        """
        Without a writer thread (tests): commit what was submitted, here,
        and fire the barriers it covers.
        """
        if self._turn_end is not None and self._turn_end.active():
            self._turn_end.cancel()
            self._end_turn()
        batch = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._commit(batch, lambda f, *a: f(*a))

    def _commit(self, batch, call_in_reactor):
        """One transaction for ``batch``; False once told to stop."""
        db = self._db
        barriers = []
        carry_on = True
        probe = False
        # Runs of the same statement go to SQLite as one executemany.
        runs = []
        for item in batch:
            if item is _STOP:
                carry_on = False
            elif item is _PROBE:
                probe = True
            elif isinstance(item, _Barrier):
                barriers.append(item)
            elif runs and runs[-1][0] == item[0]:
                runs[-1][1].append(item[1])
            else:
                runs.append((item[0], [item[1]]))
        started = time.perf_counter()
        try:
            if probe:
                self._probe_directory()
            db.execute("BEGIN")
            for sql, args in runs:
                db.executemany(sql, args)
            if probe:
                db.execute("UPDATE meta SET value = value WHERE key = 'schema'")
            db.execute("COMMIT")
        except (sqlite3.Error, OSError) as e:
            # The disk failed us: nothing in this batch is acknowledged as
            # safe.  Those waiting are told, so their clients see it (the
            # connection closes, and they send again) instead of waiting for
            # ever.
            was_ok = self.failed is None
            self.failed = e
            if was_ok:
                call_in_reactor(self._state_changed, e)
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for barrier in barriers:
                call_in_reactor(barrier.deferred.errback, StoreFailed(str(e)))
            return carry_on
        elapsed = time.perf_counter() - started
        self.commits += 1
        self.last_commit_seconds = elapsed
        self.last_commit_at = time.monotonic()
        if self.on_commit is not None:
            self.on_commit(elapsed)
        # Only a probe (a new file and a commit) clears a failure: a commit
        # to an open database can succeed where the directory cannot take
        # a new file.
        if self.failed is not None and probe:
            self.failed = None
            call_in_reactor(self._state_changed, None)
        for barrier in barriers:
            call_in_reactor(barrier.deferred.callback, None)
        return carry_on

    def _probe_directory(self):
        probe = self.data_dir / ".probe"
        with open(probe, "wb") as f:
            f.write(b"mqttgw")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()

    def _state_changed(self, error):
        if error is not None:
            log.critical(
                "store {path}: cannot write: {error}; publishes that need the store"
                " are refused (their connections closed) until it can",
                path=self.path,
                error=str(error),
            )
        else:
            log.warn("store {path}: writable again", path=self.path)
        if self.on_state_change is not None:
            self.on_state_change(error)


class OrderedAcks:
    """
    Ack means safe: an ack for a message written to the store waits for
    its commit, and every later ack of the same connection waits behind
    it, since acks go out in the order their packets came in.
    """

    def __init__(self, store, write):
        self._store = store
        self._write = write
        self._waiting = 0

    def send(self, ack, durable):
        if self._store is None or not (durable or self._waiting):
            self._write(ack)
            return
        self._waiting += 1
        self._store.after_commit(self._release, ack)

    @property
    def waiting(self):
        """Acks held back for a commit."""
        return self._waiting

    def _release(self, ack):
        self._waiting -= 1
        self._write(ack)

    # Called instead of _release when the commit failed.
    on_failure = None


def _message_columns(message):
    """A message's 5.0 properties (encoded) and expiry, as stored."""
    props = message.properties
    return (encode_properties(props) if props else None), message.expiry


def _properties(blob):
    if blob is None:
        return None
    blob = bytes(blob)
    return decode_properties(blob, 0, len(blob), PUBLISH)[0]


def _run_all(_, callbacks):
    for callback, args in callbacks:
        callback(*args)


def _fail_all(reason, callbacks):
    """
    The commit these waited for failed: whoever holds an ack that cannot
    be sent is told (once), everything else waits for a retry.
    """
    told = set()
    for callback, args in callbacks:
        owner = getattr(callback, "__self__", None)
        failed = getattr(owner, "on_failure", None)
        if failed is not None and id(owner) not in told:
            told.add(id(owner))
            failed(reason.value)
    return None

"""
The durable store: retained messages, persistent sessions with their
subscriptions, queued and in-flight messages, and inbound QoS 2 ids, in
SQLite (WAL).  The reactor thread never touches the disk: writes go to one
writer thread that commits them in batches, and ``barrier()`` gives a
Deferred that fires (in the reactor) once everything written before it is
committed.  Loading happens once, at start-up, before the reactor runs.

The store knows what it held: a record beside the database (record.py)
says which database it is and how far it was committed, so a database
lost, emptied, set back or without its record is refused at start-up;
the files are readable by the gateway's user only; and after each commit
the writer checks that the open files are still the ones at their paths,
so nothing is acknowledged into a file that was removed.
"""

import os
import queue
import sqlite3
import threading
import time
from functools import partial
from pathlib import Path

import attr
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttgw.broker import sql, writes
from mqttgw.broker.record import (
    SUFFIX as RECORD_SUFFIX,
    Record,
    RecordFile,
    RecordUnreadable,
    create_private,
    file_id,
    fsync_directory,
    new_id,
    tighten,
)
from mqttgw.broker.sql import SCHEMA_VERSION
from mqttgw.wire.properties import PUBLISH, decode_properties

log = Logger()

DB_NAME = "mqttgw.db"
LOCK_NAME = "mqttgw.lock"

# A commit takes about this long at most: batches are sized from the
# measured cost per op.
COMMIT_TARGET = 0.05
# While nobody waits for its commits, or most of what it is handed cancels
# out (receivers acknowledge before the commit), the writer lets a batch
# gather for GATHER_COMMITS times the last commit's duration, within
# GATHER_BOUNDS seconds: fewer commits, and more that never reaches disk.
GATHER_COMMITS = 4
GATHER_BOUNDS = (0.001, 0.01)
# Ops handed to the writer and not yet committed past which the store is
# congested: reading from clients stops until half of them are written, so
# a disk slower than the traffic holds the clients back instead of filling
# memory.
MAX_BACKLOG = 100_000

# --durability: what a commit survives, as SQLite's synchronous setting.
DURABILITY = {
    "fsync": "FULL",  # power loss: every commit is fsynced
    "os": "NORMAL",  # a crash of the process: the OS holds what was written
}

class StoreError(Exception):
    """The store cannot be opened or read; the message names the file."""


class StoreDamaged(StoreError):
    """
    The database does not hold what its record says it held (or cannot be
    read): ``persistence.recover`` sets its files aside.  ``held`` says
    what it holds, for the log.
    """

    def __init__(self, message, held="nothing"):
        super().__init__(message)
        self.held = held


class StoreMoved(Exception):
    """The open database is no longer the file at its path."""


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
    # Queued QoS 1 deliveries up to this seq may have been sent.
    sent_seq = attr.ib(default=None)
    # The identity that made it (see Session.owner), or None: stored
    # before owners were.
    owner = attr.ib(default=None)
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
        create_private(path)
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

    def __init__(self, data_dir, reactor, durability="fsync", batch=1000, recover=False):
        self.path = Path(data_dir) / DB_NAME
        self._wal = Path(data_dir) / (DB_NAME + "-wal")
        # As str, for the stats after each commit.
        self._paths = (str(self.path), str(self._wal))
        self._record = RecordFile(Path(data_dir) / (DB_NAME + RECORD_SUFFIX))
        # The database's identity and its commits (a commit that writes
        # nothing is not counted), kept in its meta table.
        self.id = None
        self.committed = 0
        # (st_dev, st_ino) of the database and its -wal as opened; set when
        # they are found elsewhere, until the store is made again at its
        # path (see _restore).
        self._file_ids = None
        self._moved = False
        self._synchronous = DURABILITY[durability]
        self.reactor = reactor
        self.batch = batch
        self.failed = None
        self._queue = queue.SimpleQueue()
        self._thread = None
        # Ops of this reactor turn, not yet handed to the writer; and per
        # client id, its last queued delivery sent this turn (see sent).
        self._ops = []
        self._sent_through = {}
        self._seconds_per_op = None
        # Seconds the writer lets a batch gather before it commits.
        self._gather = 0
        # Ops committed, and those that cancelled out before reaching disk.
        self.ops_written = 0
        self.ops_folded = 0
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
        # Ops handed to the writer, not yet committed (reactor thread only),
        # and whether that is past MAX_BACKLOG; every callable in
        # congestion_listeners is told (with a bool) when that changes.
        self.backlog = 0
        self.congested = False
        self.congestion_listeners = []
        try:
            # Queued payloads are in the store (and its -wal): readable by
            # the gateway's user only, whatever the umask.
            Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            wider = tighten(
                [self.data_dir]
                + [self.data_dir / (DB_NAME + s) for s in ("", "-wal", "-shm", RECORD_SUFFIX)]
                + [self.data_dir / LOCK_NAME]
            )
        except OSError as e:
            raise StoreError(f"data directory {data_dir}: {e.strerror}") from None
        if wider:
            log.warn(
                "data directory {dir}: {paths} could be read by other users: now by its owner only",
                dir=self.data_dir,
                paths=", ".join(wider),
            )
        self._lock = _lock(self.data_dir / LOCK_NAME)
        try:
            try:
                self._db = self._open()
            except StoreDamaged as e:
                if not recover:
                    raise
                self._set_aside(e)
                self._db = self._open()
            else:
                if recover:
                    log.info(
                        "store {path}: sound; persistence.recover set nothing aside", path=self.path
                    )
        except StoreError:
            self._lock.close()
            self._record.close()
            raise

    def _open(self, warn=log.warn, restoring=False):
        """
        The database, checked against its record (StoreDamaged when it
        does not hold what the record says) and made if there is neither.
        ``warn`` logs (from the writer thread, through the reactor);
        ``restoring``: the database was just copied from the open one, so
        a missing record is made again from it.
        """
        try:
            recorded = self._record.read()
        except RecordUnreadable as e:
            raise StoreDamaged(f"store {self.path}: its {e}", _held_unread) from None
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = None
        except OSError as e:
            raise StoreError(f"store {self.path}: cannot be used: {e.strerror}") from None
        if recorded is not None and size is None:
            raise StoreDamaged(
                f"store {self.path} is missing, and its record says it held"
                f" {recorded.commits} commit(s)"
            )
        if size == 0:
            raise StoreDamaged(
                f"store {self.path} is empty (0 bytes)"
                + (f", and its record says it held {recorded.commits} commit(s)" if recorded else "")
            )
        db = None
        try:
            if size is None:
                # SQLite gives the -wal and -shm the database file's mode.
                create_private(self.path)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute(sql.JOURNAL_WAL)
            db.execute(sql.SYNCHRONOUS.format(self._synchronous))
            ok = db.execute(sql.QUICK_CHECK).fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(ok)
            db.executescript(sql.SCHEMA)
            row = db.execute(sql.SCHEMA_READ).fetchone()
            if row is None:
                db.execute(sql.SCHEMA_ADD, (SCHEMA_VERSION,))
            elif row[0] < SCHEMA_VERSION:
                sql.upgrade(db)
                db.execute(sql.SCHEMA_SET, (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.path}: cannot be used: schema version {row[0]} is not {SCHEMA_VERSION}"
                )
            self._identify(db, recorded, warn, size is not None and not restoring, restoring)
            # The database file itself holds its identity, whatever becomes
            # of its -wal.
            db.execute(sql.CHECKPOINT)
            self._file_ids = (file_id(self.path), file_id(self._wal))
        except sqlite3.OperationalError as e:
            _close(db)
            raise StoreError(f"store {self.path}: cannot be used: {e}") from None
        except sqlite3.Error as e:
            _close(db)
            raise StoreDamaged(f"store {self.path}: cannot be used: {e}", _held_unread) from None
        except StoreError:
            _close(db)
            raise
        try:
            self._record.write(Record(self.id, self.committed))
        except OSError as e:
            _close(db)
            raise StoreError(f"store {self.path}: its record cannot be written: {e.strerror}") from None
        return db

    def _identify(self, db, recorded, warn, existed, restoring):
        """
        The database's id and commits, checked against ``recorded``.  A
        database with an id had a record: without it, what it held is not
        known (its write-ahead log may have gone with the record).  One
        without (made before the record existed) is given one.
        """
        meta = dict(db.execute(sql.IDENTITY_READ))
        if "id" not in meta and recorded is None:
            if existed:
                warn(
                    "store {path}: its record {record} is missing: made again from the database",
                    path=self.path,
                    record=self._record.path,
                )
            meta = {"id": new_id(), "commits": 0}
            db.executemany(sql.META_ADD, meta.items())
        elif recorded is None and not restoring:
            raise StoreDamaged(
                f"store {self.path}: its record {self._record.path} is missing, so what the"
                f" database should hold is not known (it holds {meta.get('commits', 0)} commit(s);"
                " its write-ahead log may be lost too)",
                _contents(db),
            )
        elif recorded is None:
            warn(
                "store {path}: its record {record} is missing: made again from the database",
                path=self.path,
                record=self._record.path,
            )
        elif meta.get("id") != recorded.id:
            raise StoreDamaged(
                f"store {self.path} is not the database its record {self._record.path}"
                f" describes (id {meta.get('id')}, not {recorded.id})",
                _contents(db),
            )
        elif meta.get("commits", 0) < recorded.commits:
            raise StoreDamaged(
                f"store {self.path} is older than its record {self._record.path}: it holds"
                f" {meta.get('commits', 0)} commit(s), the record says {recorded.commits}"
                " (its write-ahead log was lost?)",
                _contents(db),
            )
        self.id, self.committed = meta["id"], meta.get("commits", 0)

    def _set_aside(self, damage):
        """
        persistence.recover: the damaged database, its -wal and -shm, and
        its record are renamed (never deleted), and a new store is made.
        """
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        stem = f"{DB_NAME}.{stamp}"
        suffixes = ("", "-wal", "-shm", RECORD_SUFFIX)
        n = 1
        while any(os.path.lexists(self.data_dir / (stem + s)) for s in suffixes):
            n += 1
            stem = f"{DB_NAME}.{stamp}.{n}"
        moved = []
        try:
            for suffix in suffixes:
                source = self.data_dir / (DB_NAME + suffix)
                if os.path.lexists(source):
                    os.rename(source, self.data_dir / (stem + suffix))
                    moved.append(DB_NAME + suffix)
            fsync_directory(self.data_dir)
        except OSError as e:
            raise StoreError(f"store {self.path}: cannot be set aside: {e}") from None
        self._record.close()
        # A warning: a critical event before logging starts is also printed
        # to stderr, so it would show twice.
        log.warn(
            "{damage}; persistence.recover: set aside {moved} as {stem}*; the database"
            " held {held}: all of it is lost to the new, empty store",
            damage=str(damage),
            moved=", ".join(moved) or "nothing",
            stem=self.data_dir / stem,
            held=damage.held,
        )

    # Start-up

    def load(self):
        """Everything stored: ``(retained [(topic, payload, qos)], sessions)``."""
        try:
            db = self._db
            retained = db.execute(sql.RETAINED_ALL).fetchall()
            sessions = {
                cid: StoredSession(cid, last_seen, expiry_interval, sent_seq, owner)
                for (cid, last_seen, expiry_interval, sent_seq, owner) in db.execute(sql.SESSIONS_ALL)
            }
            for cid, topic_filter, qos in db.execute(sql.SUBSCRIPTIONS_ALL):
                sessions[cid].subscriptions[topic_filter] = qos
            for row in db.execute(sql.DELIVERIES_ALL):
                sessions[row[0]].deliveries.append(
                    StoredDelivery(
                        row[1], row[2], bytes(row[3]), row[4], bool(row[5]), row[6], row[7],
                        _properties(row[8]), row[9],
                    )
                )
            for cid, mid in db.execute(sql.PUBRELS_ALL):
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
            self._hand_over()
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
            if self._moved:
                self.reactor.callFromThread(
                    partial(
                        log.critical,
                        "store {path}: stopped before it could be made again at its path"
                        " ({error}): the {n} commit(s) it held are lost",
                        path=self.path,
                        error=str(self.failed),
                        n=self.committed,
                    )
                )
        self._db.close()
        self._lock.close()
        self._record.close()

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

    # Writes, from the reactor thread: ops gathered for the turn, handed
    # to the writer thread as one list when the turn ends (or a barrier
    # asks for them).  No row or SQL is made here (see writes.py).

    def _put(self, op):
        self._ops.append(op)
        if self._turn_end is None:
            self._end_turn_later()

    def _end_turn_later(self):
        """The turn's writes go to the writer when the turn ends.  Without
        a reactor (tools, tests) they wait for a barrier, run_pending or
        stop."""
        if self.reactor is not None:
            self._turn_end = self.reactor.callLater(0, self._end_turn)

    def _hand_over(self):
        if self._sent_through:
            self._ops.extend((writes.SENT, client_id, seq) for client_id, seq in self._sent_through.items())
            self._sent_through = {}
        if self._ops:
            self._queue.put(self._ops)
            self.backlog += len(self._ops)
            self._ops = []
            if self.backlog > MAX_BACKLOG and not self.congested:
                self.congested = True
                log.warn(
                    "store {path}: {n} writes waiting for the disk: reading from"
                    " clients paused until half of them are written",
                    path=self.path,
                    n=self.backlog,
                )
                for listener in list(self.congestion_listeners):
                    listener(True)

    def _written(self, ops):
        """The writer is done with ``ops`` handed over (committed or failed)."""
        self.backlog -= ops
        if self.congested and self.backlog <= MAX_BACKLOG // 2:
            self.congested = False
            log.info("store {path}: caught up; reading from clients again", path=self.path)
            for listener in list(self.congestion_listeners):
                listener(False)

    def write(self, sql, args=()):
        self._put((writes.SQL, sql, args))

    def barrier(self):
        """A Deferred fired once every write submitted so far is committed."""
        self._hand_over()
        barrier = _Barrier()
        self._queue.put(barrier)
        return barrier.deferred

    def after_commit(self, callback, *args, failed=None):
        """
        Call ``callback(*args)`` once every write submitted so far is
        committed.  Callbacks run in the order given; those of one reactor
        turn share one barrier.  If that commit fails, ``failed(error)``
        is called instead (once per batch, however many callbacks name
        it); a callback without one waits for a later commit.
        """
        self._after_commit.append((callback, args, failed))
        if self._turn_end is None:
            self._end_turn_later()

    def _end_turn(self):
        self._turn_end = None
        self._hand_over()
        if self._after_commit:
            waiting, self._after_commit = self._after_commit, []
            self.barrier().addCallbacks(_run_all, _fail_all, (waiting,), None, (waiting,))

    def set_retained(self, message):
        self._put((writes.RETAIN, message.topic, message))

    def delete_retained(self, topic):
        self._put((writes.RETAIN, topic, None))

    def add_session(self, client_id, expiry_interval=None, owner=None):
        self.write(sql.SESSION_ADD, (client_id, expiry_interval, owner))

    def set_session_owner(self, client_id, owner):
        self.write(sql.SESSION_OWNER, (owner, client_id))

    def set_session_expiry(self, client_id, expiry_interval):
        self.write(sql.SESSION_EXPIRY, (expiry_interval, client_id))

    def touch_session(self, client_id, last_seen):
        self.write(sql.SESSION_TOUCH, (last_seen, client_id))

    def delete_session(self, client_id):
        # What it sent goes with it (a new session may take its client id).
        self._sent_through.pop(client_id, None)
        self._put((writes.DROP_SESSION, client_id))

    def subscribe(self, client_id, topic_filter, qos):
        self.write(sql.SUBSCRIPTION_ADD, (client_id, topic_filter, qos))

    def unsubscribe(self, client_id, topic_filter):
        self.write(sql.SUBSCRIPTION_DELETE, (client_id, topic_filter))

    def add_delivery(self, client_id, seq, message, qos, retain, message_id=None, state=0):
        self._put((writes.ADD, client_id, seq, message, qos, retain, message_id, state))

    def update_delivery(self, client_id, seq, message_id, state):
        self._put((writes.UPDATE, client_id, seq, message_id, state))

    def sent(self, client_id, seq):
        """
        A queued QoS 1 delivery went out (under an id not recorded): after
        a restart it is sent again marked DUP, as every one up to ``seq``.
        Only the last of a turn matters: one op per session a turn, made
        when the turn's ops are handed over, not one per message.
        """
        if self._turn_end is None:
            self._end_turn_later()
        self._sent_through[client_id] = seq

    def delete_delivery(self, client_id, seq):
        self._put((writes.DELETE, client_id, seq))

    def add_awaiting_pubrel(self, client_id, message_id):
        self._put((writes.PUBREL_ADD, client_id, message_id))

    def delete_awaiting_pubrel(self, client_id, message_id):
        self._put((writes.PUBREL_DELETE, client_id, message_id))

    # The writer thread

    def _commit_limit(self):
        """
        Ops per commit: as many as the measured cost per op fits in
        COMMIT_TARGET seconds, so a commit stays short under any load while
        a fast disk takes large batches.
        """
        per_op = self._seconds_per_op
        if not per_op:
            return self.batch
        return max(self.batch, int(COMMIT_TARGET / per_op))

    def _write_loop(self):
        while True:
            batch = [self._queue.get()]
            if self._gather:
                # More of what is coming cancels out or shares the commit.
                time.sleep(self._gather)
            ops = len(batch[0]) if type(batch[0]) is list else 1
            # Group commit: what is already waiting goes in this batch.
            limit = self._commit_limit()
            while ops < limit:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
                ops += len(item) if type(item) is list else 1
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
        compaction = writes.Compaction()
        handed = 0
        for item in batch:
            if type(item) is list:
                handed += len(item)
                compaction.add(item)
            elif item is _STOP:
                carry_on = False
                # A last chance to make a removed store again.
                probe = probe or self._moved
            elif item is _PROBE:
                probe = True
            else:
                barriers.append(item)
        started = time.perf_counter()
        try:
            if probe:
                if self._moved:
                    self._restore(lambda *a, **kw: call_in_reactor(partial(log.warn, *a, **kw)))
                    db = self._db
                self._probe_directory()
                if self._record.displaced():
                    # Only the record: nothing acknowledged depends on it.
                    self._record.write(Record(self.id, self.committed))
            db.execute("BEGIN")
            wrote = probe
            for statement, args in compaction.statements():
                db.executemany(statement, args)
                wrote = True
            if wrote:
                db.execute(sql.COMMITS_SET, (self.committed + 1,))
            db.execute("COMMIT")
            if wrote:
                self.committed += 1
            self._check_in_place()
            if wrote:
                self._record.update(Record(self.id, self.committed))
        except Exception as e:
            # The disk failed us (or a row could not be made): nothing in
            # this batch is acknowledged as safe.  Those waiting are told,
            # so their clients see it (the connection closes, and they send
            # again) instead of waiting for ever.
            was_ok = self.failed is None
            self.failed = e
            if was_ok:
                call_in_reactor(self._state_changed, e)
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if handed:
                call_in_reactor(self._written, handed)
            for barrier in barriers:
                call_in_reactor(barrier.deferred.errback, StoreFailed(str(e)))
            return carry_on
        elapsed = time.perf_counter() - started
        self.commits += 1
        self.ops_written += compaction.ops
        self.ops_folded += compaction.folded
        if compaction.ops:
            self._seconds_per_op = elapsed / compaction.ops
        self._gather = _gather(elapsed, compaction, barriers)
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
        if handed:
            call_in_reactor(self._written, handed)
        for barrier in barriers:
            call_in_reactor(barrier.deferred.callback, None)
        return carry_on

    def _check_in_place(self):
        """
        StoreMoved unless the database and its -wal are still the files at
        their paths (two stats a commit): a commit to a file removed or
        replaced would be acknowledged and lost.  (The record is looked at
        by the probes: nothing acknowledged depends on it.)
        """
        try:
            found = tuple((st.st_dev, st.st_ino) for st in map(os.stat, self._paths))
        except FileNotFoundError:
            found = None
        if self._moved or found != self._file_ids:
            self._moved = True
            raise StoreMoved(
                "the database or its -wal was removed or replaced while open"
                " (what it held is kept, to be made again at its path)"
            )

    def _restore(self, warn):
        """
        Make the store again at its path from the open database, which
        holds everything committed (SQLite's backup reads it through the
        open files, removed or not), once the data directory is there again
        and nothing else took the paths; StoreMoved while it cannot.
        """
        if not self.data_dir.is_dir():
            raise StoreMoved(f"data directory {self.data_dir} is missing")
        for path, opened in zip((self.path, self._wal), self._file_ids):
            found = file_id(path)
            if found is not None and found != opened:
                raise StoreMoved(
                    f"{path} is another file than the one opened: it is left as it is,"
                    " and the store stays unwritable until a restart"
                )
        lock_path = self.data_dir / LOCK_NAME
        if file_id(lock_path) != _fd_id(self._lock):
            try:
                lock = _lock(lock_path)
            except StoreError as e:
                raise StoreMoved(str(e)) from None
            self._lock.close()
            self._lock = lock
        copy = self.data_dir / (DB_NAME + ".restoring")
        for stale in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
            if os.path.lexists(stale):
                stale.unlink()
        create_private(copy)
        target = sqlite3.connect(copy)
        try:
            self._db.backup(target)
        finally:
            target.close()
        with open(copy, "rb+") as f:
            os.fsync(f.fileno())
        held = (self.id, self.committed)
        self._db.close()
        os.replace(copy, self.path)
        fsync_directory(self.data_dir)
        # Until it is open and holds what was committed, the store stays
        # unwritable (a later probe finds the copy, not the file opened).
        self._db = self._open(warn, restoring=True)
        if (self.id, self.committed) != held:
            raise StoreMoved(f"{self.path} as made again holds commit {self.committed}, not {held[1]}")
        self._moved = False
        warn(
            "store {path}: made again at its path from the open database ({n} commit(s))",
            path=self.path,
            n=self.committed,
        )

    def _probe_directory(self):
        probe = self.data_dir / ".probe"
        with open(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
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


def _properties(blob):
    if blob is None:
        return None
    blob = bytes(blob)
    return decode_properties(blob, 0, len(blob), PUBLISH)[0]


def _gather(elapsed, compaction, barriers):
    """Seconds to let the next batch gather (see GATHER_COMMITS)."""
    if not compaction.ops or (barriers and compaction.folded * 2 < compaction.ops):
        return 0
    low, high = GATHER_BOUNDS
    return min(high, max(low, GATHER_COMMITS * elapsed))


def _run_all(_, callbacks):
    for callback, args, _failed in callbacks:
        callback(*args)


def _fail_all(reason, callbacks):
    """
    The commit these waited for failed: whoever holds an ack that cannot
    be sent is told (once), everything else waits for a retry.
    """
    told = set()
    for _callback, _args, failed in callbacks:
        if failed is not None and failed not in told:
            told.add(failed)
            failed(reason.value)
    return None


_held_unread = "what could not be read"


def _contents(db):
    """What a database holds, in words, for the log."""
    try:
        count = lambda table: db.execute(sql.count(table)).fetchone()[0]  # noqa: E731
        commits = db.execute(sql.COMMITS_READ).fetchone()
        return (
            f"{commits[0] if commits else 0} commit(s): {count('sessions')} session(s),"
            f" {count('deliveries')} queued message(s), {count('retained')} retained message(s)"
        )
    except sqlite3.Error:
        return _held_unread


def _fd_id(f):
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def _close(db):
    if db is not None:
        db.close()

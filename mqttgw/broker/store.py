"""
The durable store: retained messages, persistent sessions with their
subscriptions, queued and in-flight messages, inbound QoS 2 ids and
topic ids (MQTT-SN's registrations), in SQLite (WAL).  The reactor thread never touches the disk: writes go to one
writer thread (writer.py) that commits them in batches, and ``barrier()``
gives a Deferred that fires (in the reactor) once everything written
before it is committed.  Loading (storeload.py) happens once, at start-up,
before the reactor runs.

The store knows what it held: its database file (storefile.py) is opened
only when it holds what its record says it held, and after each commit
the writer checks that the open files are still the ones at their paths,
so nothing is acknowledged into a file that was removed.  One that can be
read but not written at start-up starts failed, as a failed commit leaves
it, until a probe opens it for writing.

This module is the reactor's side: the writes of a turn gathered and
handed over when it ends, callbacks after their commit, and congestion
when the disk falls behind.
"""

import queue

from twisted.logger import Logger

from mqttgw.broker import sql, storeload, writes
from mqttgw.broker.record import Record
from mqttgw.broker.sql import SCHEMA_VERSION
from mqttgw.broker.storefile import StoreDamaged, StoreError, StoreFile, StoreMoved, StoreUnwritable
from mqttgw.broker.writer import PROBE, Barrier, StoreFailed, StoreWriter

# What callers and tests name through this module, wherever it is kept.
__all__ = [
    "MAX_BACKLOG", "SCHEMA_VERSION", "Record", "Store", "StoreDamaged", "StoreError", "StoreFailed",
    "StoreMoved", "StoreUnwritable",
]

log = Logger()

# Ops handed to the writer and not yet committed past which the store is
# congested: reading from clients stops until half of them are written, so
# a disk slower than the traffic holds the clients back instead of filling
# memory.
MAX_BACKLOG = 100_000


def _part(part, name):
    """The attribute ``name`` of the store's ``part``, through the store."""

    def get(store):
        return getattr(getattr(store, part), name)

    def set_(store, value):
        setattr(getattr(store, part), name, value)

    return property(get, set_)


class Store:
    """
    Open (creating if need be) the store in ``data_dir``.  Anything wrong
    with an existing file raises StoreError; it is never replaced.  One
    that can be read but not written starts failed (storefile.py).
    """

    def __init__(self, data_dir, reactor, durability="fsync", batch=1000, recover=False):
        self.file = StoreFile(data_dir, durability, recover)
        self.reactor = reactor
        self._queue = queue.SimpleQueue()
        self.writer = StoreWriter(self.file, self._queue, reactor, batch, self._written, self._probed)
        if self.file.unwritable is not None:
            # Read for reading only: failed, as after a failed commit, so
            # what needs a write is refused until a probe opens it for
            # writing.
            self.writer.failed = StoreUnwritable(self.file.unwritable)
        # Whether a probe is handed over and not yet done with.
        self._probing = False
        # Ops of this reactor turn, not yet handed to the writer; and per
        # client id, its last queued delivery sent this turn (see sent).
        self._ops = []
        self._sent_through = {}
        # Work waiting for the commit of what was written this reactor turn.
        self._after_commit = []
        self._turn_end = None
        # Ops handed to the writer, not yet committed (reactor thread only),
        # and whether that is past MAX_BACKLOG; every callable in
        # congestion_listeners is told (with a bool) when that changes.
        self.backlog = 0
        self.congested = False
        self.congestion_listeners = []

    # The database file's: where it is, which database, its commits.
    path = _part("file", "path")
    data_dir = _part("file", "data_dir")
    id = _part("file", "id")
    committed = _part("file", "committed")
    # Open files that tests (and mqttgw.testing's restart) reach.
    _db = _part("file", "db")
    _lock = _part("file", "lock")
    _record = _part("file", "record")
    # The writer's: health as operators see it (see StoreWriter).
    batch = _part("writer", "batch")
    commits = _part("writer", "commits")
    ops_written = _part("writer", "ops_written")
    ops_folded = _part("writer", "ops_folded")
    last_commit_seconds = _part("writer", "last_commit_seconds")
    last_commit_at = _part("writer", "last_commit_at")
    on_commit = _part("writer", "on_commit")
    on_state_change = _part("writer", "on_state_change")

    @property
    def failed(self):
        """None while commits succeed, else the last failed commit's error."""
        return self.writer.failed

    @property
    def state(self):
        return "ok" if self.writer.failed is None else "failed"

    # Start-up

    def load(self):
        """Everything stored: ``(retained [(topic, payload, qos, properties,
        expiry)], sessions)``."""
        held = storeload.load(self.file.db, self.file.path)
        self.file.loaded()
        return held

    def start(self):
        if self.file.unwritable is not None:
            # Here, once logging has started: a critical line before it is
            # also printed to stderr.
            log.critical(
                "store {path}: started degraded, read but not written: {error}; it serves"
                " what it holds, and publishes that need the store and new persistent"
                " sessions are refused until a probe finds it can be written",
                path=self.path,
                error=self.file.unwritable,
            )
        self.writer.start()

    def stop(self):
        """Commit everything submitted, then close (blocks: for shutdown)."""
        if self.writer.running:
            self._hand_over()
            self.writer.stop()
        self.file.close()

    def probe(self):
        """
        Check, in the writer thread, that the data directory still takes a
        new file and the database a commit (opening it for writing first
        if it was read for reading only); a failure makes the store failed
        (as a failed commit does) until a later probe succeeds.  One probe
        at a time: a disk that hangs is not handed more.
        """
        if self._probing:
            return
        self._probing = True
        self._queue.put(PROBE)

    def _probed(self):
        self._probing = False

    def run_pending(self):
        """
        Without a writer thread (tests): commit what was submitted, here,
        and fire the barriers it covers.
        """
        if self._turn_end is not None and self._turn_end.active():
            self._turn_end.cancel()
        self._end_turn()
        self.writer.run_pending()

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
        barrier = Barrier()
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

    def add_topic_id(self, client_id, topic_id, topic):
        """A session's client registered ``topic`` as ``topic_id`` (MQTT-SN)."""
        self.write(sql.TOPIC_ID_ADD, (client_id, topic_id, topic))

    def delete_topic_id(self, client_id, topic_id):
        self.write(sql.TOPIC_ID_DELETE, (client_id, topic_id))

    def delete_topic_ids(self, client_id):
        """Every topic id of the session (its session stays)."""
        self.write(sql.TOPIC_IDS_DELETE, (client_id,))

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

"""
The store's writer thread: it takes what the reactor handed over (lists
of ops, barriers, probes), commits each batch as one transaction sized
from the measured cost per op, and tells the reactor (through
``callFromThread``) which barriers are safe, how far it has got, and when
the store fails or is writable again.
"""

import queue
import sqlite3
import threading
import time
from functools import partial

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttgw.broker import sql, writes
from mqttgw.broker.record import Record

# Logged as the store: one name for whatever operators filter on.
log = Logger(namespace="mqttgw.broker.store")

# A commit takes about this long at most: batches are sized from the
# measured cost per op.
COMMIT_TARGET = 0.05
# While nobody waits for its commits, or most of what it is handed cancels
# out (receivers acknowledge before the commit), the writer lets a batch
# gather for GATHER_COMMITS times the last commit's duration, within
# GATHER_BOUNDS seconds: fewer commits, and more that never reaches disk.
GATHER_COMMITS = 4
GATHER_BOUNDS = (0.001, 0.01)


class StoreFailed(Exception):
    """A commit failed: what waited for it is not safe."""


class Barrier:
    """Its Deferred fires once everything handed over before it is committed."""

    __slots__ = ("deferred",)

    def __init__(self):
        self.deferred = Deferred()


# Handed over as a barrier is: stop after this batch; check the store.
STOP = object()
PROBE = object()


class StoreWriter:
    """
    Commits what is put on ``queue`` to ``file`` (a StoreFile), in a
    thread of its own once started (or, without one, when run_pending is
    called); ``written(n)`` is called in the reactor once n ops handed over
    are done with, committed or failed.  Its health is what operators
    see: ``failed`` is None while commits succeed, else the error of the
    last failed commit or probe (or, for a store opened for reading only,
    why it could not be written); ``on_commit(seconds)`` and
    ``on_state_change(error or None)`` are told, and ``probed()`` once a
    batch with a probe is done with.
    """

    def __init__(self, file, queue, reactor, batch, written, probed=None):
        self.file = file
        self.queue = queue
        self.reactor = reactor
        self.batch = batch
        self._written = written
        self._probed = probed
        self._thread = None
        self._seconds_per_op = None
        # Seconds the writer lets a batch gather before it commits.
        self._gather = 0
        self.failed = None
        self.commits = 0
        # Ops committed, and those that cancelled out before reaching disk.
        self.ops_written = 0
        self.ops_folded = 0
        self.last_commit_seconds = None
        self.last_commit_at = None
        self.on_commit = None
        self.on_state_change = None

    @property
    def running(self):
        return self._thread is not None

    def start(self):
        self._thread = threading.Thread(target=self._write_loop, name="mqttgw-store", daemon=True)
        self._thread.start()

    def stop(self):
        """Commit everything handed over, then end the thread (blocks)."""
        self.queue.put(STOP)
        self._thread.join()
        self._thread = None
        file = self.file
        if file.moved:
            self.reactor.callFromThread(
                partial(
                    log.critical,
                    "store {path}: stopped before it could be made again at its path"
                    " ({error}): the {n} commit(s) it held are lost",
                    path=file.path,
                    error=str(self.failed),
                    n=file.committed,
                )
            )

    def run_pending(self):
        """Without a thread (tests): commit what was handed over, here."""
        batch = []
        while True:
            try:
                batch.append(self.queue.get_nowait())
            except queue.Empty:
                break
        self.commit(batch, lambda f, *a: f(*a))

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
            batch = [self.queue.get()]
            if self._gather:
                # More of what is coming cancels out or shares the commit.
                time.sleep(self._gather)
            ops = len(batch[0]) if type(batch[0]) is list else 1
            # Group commit: what is already waiting goes in this batch.
            limit = self._commit_limit()
            while ops < limit:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
                ops += len(item) if type(item) is list else 1
            if not self.commit(batch, self.reactor.callFromThread):
                return

    def commit(self, batch, call_in_reactor):
        """One transaction for ``batch``; False once told to stop."""
        barriers = []
        carry_on = True
        probe = False
        compaction = writes.Compaction()
        handed = 0
        for item in batch:
            if type(item) is list:
                handed += len(item)
                compaction.add(item)
            elif item is STOP:
                carry_on = False
                # A last chance to make a removed store again.
                probe = probe or self.file.moved
            elif item is PROBE:
                probe = True
            else:
                barriers.append(item)
        started = time.perf_counter()
        try:
            self._transaction(compaction, probe, call_in_reactor)
        except Exception as e:
            self._failed(e, call_in_reactor, handed, barriers)
            if probe and self._probed is not None:
                call_in_reactor(self._probed)
            return carry_on
        self._committed(time.perf_counter() - started, compaction, barriers)
        # Only a probe (a new file and a commit) clears a failure: a commit
        # to an open database can succeed where the directory cannot take
        # a new file.
        if self.failed is not None and probe:
            self.failed = None
            call_in_reactor(self._state_changed, None)
        if probe and self._probed is not None:
            call_in_reactor(self._probed)
        if handed:
            call_in_reactor(self._written, handed)
        for barrier in barriers:
            call_in_reactor(barrier.deferred.callback, None)
        return carry_on

    def _transaction(self, compaction, probe, call_in_reactor):
        file = self.file
        if probe:
            file.probe(lambda *a, **kw: call_in_reactor(partial(log.warn, *a, **kw)))
        db = file.writable_db()
        db.execute("BEGIN")
        wrote = probe
        for statement, args in compaction.statements():
            db.executemany(statement, args)
            wrote = True
        if wrote:
            db.execute(sql.COMMITS_SET, (file.committed + 1,))
        db.execute("COMMIT")
        if wrote:
            file.committed += 1
        file.check_in_place()
        if wrote:
            file.record.update(Record(file.id, file.committed))

    def _failed(self, error, call_in_reactor, handed, barriers):
        """
        The disk failed us (or a row could not be made): nothing in this
        batch is acknowledged as safe.  Those waiting are told, so their
        clients see it (the connection closes, and they send again)
        instead of waiting for ever.
        """
        was_ok = self.failed is None
        self.failed = error
        if was_ok:
            call_in_reactor(self._state_changed, error)
        db = self.file.db
        try:
            if db is not None:
                db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if handed:
            call_in_reactor(self._written, handed)
        for barrier in barriers:
            call_in_reactor(barrier.deferred.errback, StoreFailed(str(error)))

    def _committed(self, elapsed, compaction, barriers):
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

    def _state_changed(self, error):
        if error is not None:
            log.critical(
                "store {path}: cannot write: {error}; publishes that need the store"
                " are refused (their connections closed) until it can",
                path=self.file.path,
                error=str(error),
            )
        else:
            log.warn("store {path}: writable again", path=self.file.path)
        if self.on_state_change is not None:
            self.on_state_change(error)


def _gather(elapsed, compaction, barriers):
    """Seconds to let the next batch gather (see GATHER_COMMITS)."""
    if not compaction.ops or (barriers and compaction.folded * 2 < compaction.ops):
        return 0
    low, high = GATHER_BOUNDS
    return min(high, max(low, GATHER_COMMITS * elapsed))

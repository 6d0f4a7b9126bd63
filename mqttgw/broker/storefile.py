"""
The store's database file and what it must be: opened (and made, when
there is neither it nor its record) only when it holds what its record
(record.py) says it held, readable by the gateway's user only, locked
against a second gateway; set aside when damaged (persistence.recover);
opened for reading only when it can be read but not written, and for
writing once a probe finds it can be; checked after each commit to still
be the file at its path, and made again there from the open database
when it is not.
"""

import os
import sqlite3
import time
from pathlib import Path

from twisted.logger import Logger

from mqttgw.broker import sql, storelock, storeread
from mqttgw.broker.record import (
    SUFFIX as RECORD_SUFFIX,
    Record,
    RecordFile,
    RecordUnreadable,
    create_private,
    file_id,
    fsync_directory,
    tighten,
)
from mqttgw.broker.storecheck import HELD_UNREAD, StoreChecks, StoreDamaged, StoreError, quick_check

# What callers name through this module, wherever it is kept.
__all__ = ["StoreDamaged", "StoreError", "StoreFile", "StoreMoved", "StoreUnwritable"]

# Logged as the store: one name for whatever operators filter on.
log = Logger(namespace="mqttgw.broker.store")

DB_NAME = "mqttgw.db"
LOCK_NAME = "mqttgw.lock"

# --durability: what a commit survives, as SQLite's synchronous setting.
DURABILITY = {
    "fsync": "FULL",  # power loss: every commit is fsynced
    "os": "NORMAL",  # a crash of the process: the OS holds what was written
}


class StoreMoved(Exception):
    """The open database is no longer the file at its path."""


class StoreUnwritable(Exception):
    """
    The store was opened for reading only (it could not be written at
    start-up): nothing is committed until a probe opens it for writing.
    """


class StoreFile:
    """
    Open (creating if need be) the database in ``data_dir``.  Anything
    wrong with an existing file raises StoreError; it is never replaced.
    ``db`` is the open connection, ``id`` and ``committed`` the database's
    identity and its commits (a commit that writes nothing is not
    counted), as its meta table and its record keep them.

    A store that exists and can be read but not written (a full disk, a
    read-only mount or file) is opened for reading only: ``unwritable``
    says why, ``db`` reads it until ``loaded()``, and nothing is written
    (not even its record) until ``probe()`` opens it for writing.
    """

    def __init__(self, data_dir, durability="fsync", recover=False):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self._wal = self.data_dir / (DB_NAME + "-wal")
        # As str, for the stats after each commit.
        self._paths = (str(self.path), str(self._wal))
        self.record = RecordFile(self.data_dir / (DB_NAME + RECORD_SUFFIX))
        self.checks = StoreChecks(self.path, self.record.path)
        self.id = None
        self.committed = 0
        # (st_dev, st_ino) of the database and its -wal as opened; moved
        # when they are found elsewhere, until the database is made again
        # at its path (see restore).
        self._file_ids = None
        self.moved = False
        self._synchronous = DURABILITY[durability]
        # Why it was opened for reading only, or None: it is writable.
        self.unwritable = None
        self._make_private()
        self.lock = _lock(self.data_dir / LOCK_NAME)
        try:
            self.db = self._open_or_recover(recover)
        except StoreError:
            self.lock.close()
            self.record.close()
            raise

    def _make_private(self, strict=False):
        """
        Queued payloads are in the store (and its -wal): readable by the
        gateway's user only, whatever the umask.  Unless ``strict``, modes
        that cannot be changed (a read-only mount) are a warning: the
        store is then read, and ``strict`` again before it is written.
        """
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"data directory {self.data_dir}: {e.strerror}") from None
        try:
            wider = tighten(
                [self.data_dir]
                + [self.data_dir / (DB_NAME + s) for s in ("", "-wal", "-shm", RECORD_SUFFIX)]
                + [self.data_dir / LOCK_NAME]
            )
        except OSError as e:
            if strict:
                raise
            log.warn(
                "data directory {dir}: cannot be made readable by its owner only: {error}",
                dir=self.data_dir,
                error=e.strerror,
            )
            return
        if wider:
            log.warn(
                "data directory {dir}: {paths} could be read by other users: now by its owner only",
                dir=self.data_dir,
                paths=", ".join(wider),
            )

    def _open_or_recover(self, recover):
        try:
            db = self._open_or_read()
        except StoreDamaged as e:
            if not recover:
                raise
            self._set_aside(e)
            return self._open()
        if recover:
            log.info("store {path}: sound; persistence.recover set nothing aside", path=self.path)
        return db

    def _open_or_read(self):
        """
        The database opened for writing, or, when it exists and only
        writing failed, for reading only (see unwritable).
        """
        try:
            return self._open()
        except StoreUnwritable as e:
            return self._read(str(e))

    def _open(self, warn=log.warn, restoring=False, expected=None):
        """
        The database, checked against its record (StoreDamaged when it
        does not hold what the record says) and made if there is neither.
        ``warn`` logs (from the writer thread, through the reactor);
        ``restoring``: the database was just copied from the open one, so
        a missing record is made again from it; ``expected``: the (id,
        commits) it was read with for reading only (it is never made
        then).  An existing store that fails a write raises StoreUnwritable.
        """
        recorded = self._recorded()
        size = self.checks.size(recorded)
        if size is None and expected is not None:
            raise StoreDamaged(f"store {self.path} is missing (it held {expected[1]} commit(s) at start-up)")
        # Where a write failure stops start-up rather than leave a store to read.
        stop = size is None or restoring
        if size is None:
            try:
                # SQLite gives the -wal and -shm the database file's mode.
                create_private(self.path)
            except OSError as e:
                raise StoreError(f"store {self.path}: cannot be made: {e.strerror}") from None
        db = None
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute(sql.JOURNAL_WAL)
            db.execute(sql.SYNCHRONOUS.format(self._synchronous))
            if expected is None:
                # (A store read for reading only was checked then.)
                quick_check(db)
            self.checks.schema(db)
            identity = self.checks.identify(db, recorded, warn, size is not None and not restoring, restoring)
            self.checks.same(identity, expected)
            # The database file itself holds its identity, whatever becomes
            # of its -wal.
            db.execute(sql.CHECKPOINT)
            file_ids = (file_id(self.path), file_id(self._wal))
        except sqlite3.OperationalError as e:
            _close(db)
            if stop:
                raise StoreError(f"store {self.path}: cannot be used: {e}") from None
            raise StoreUnwritable(str(e)) from None
        except sqlite3.Error as e:
            _close(db)
            raise StoreDamaged(f"store {self.path}: cannot be used: {e}", HELD_UNREAD) from None
        except StoreError:
            _close(db)
            raise
        try:
            self.record.write(Record(*identity))
        except OSError as e:
            _close(db)
            why = f"its record cannot be written: {e.strerror}"
            if stop:
                raise StoreError(f"store {self.path}: {why}") from None
            raise StoreUnwritable(why) from None
        self.id, self.committed = identity
        self._file_ids = file_ids
        return db

    def _read(self, unwritable):
        """
        The database opened for reading only (storeread.py), as it could
        not be written: checked as _open checks it, with nothing written.
        A store that cannot be read either, or whose schema needs an
        upgrade, stops start-up.
        """
        recorded = self._recorded()
        try:
            db = storeread.connect(self.path, self._wal)
        except sqlite3.Error as e:
            why = (
                f"it can be neither written nor read ({e})"
                if str(e) == unwritable
                else f"it cannot be written ({unwritable}) nor read ({e})"
            )
            raise StoreError(f"store {self.path}: cannot be used: {why}") from None
        try:
            quick_check(db)
            self.checks.schema_current(db, unwritable)
            identity = self.checks.identify(db, recorded, None, True, False)
        except sqlite3.OperationalError as e:
            db.close()
            raise StoreError(f"store {self.path}: cannot be used: {e}") from None
        except sqlite3.Error as e:
            db.close()
            raise StoreDamaged(f"store {self.path}: cannot be used: {e}", HELD_UNREAD) from None
        except StoreError:
            db.close()
            raise
        self.id, self.committed = identity
        self.unwritable = unwritable
        return db

    def _recorded(self):
        try:
            return self.record.read()
        except RecordUnreadable as e:
            raise StoreDamaged(f"store {self.path}: its {e}", HELD_UNREAD) from None

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
        self.record.close()
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

    # From the writer thread

    def check_in_place(self):
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
        if self.moved or found != self._file_ids:
            self.moved = True
            raise StoreMoved(
                "the database or its -wal was removed or replaced while open"
                " (what it held is kept, to be made again at its path)"
            )

    def probe(self, warn):
        """
        Made again at its path if it was moved (see restore), the data
        directory still takes a new file, a store read for reading only
        opened for writing (see reopen), and a displaced record written
        again; raises what stands in the way.
        """
        if self.moved:
            self.restore(warn)
        self._probe_directory()
        if self.unwritable is not None:
            self.reopen(warn)
        if self.record.displaced():
            # Only the record: nothing acknowledged depends on it.
            self.record.write(Record(self.id, self.committed))

    def restore(self, warn):
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
        self._relock(StoreMoved)
        copy = self.data_dir / (DB_NAME + ".restoring")
        for stale in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
            if os.path.lexists(stale):
                stale.unlink()
        create_private(copy)
        target = sqlite3.connect(copy)
        try:
            self.db.backup(target)
        finally:
            target.close()
        with open(copy, "rb+") as f:
            os.fsync(f.fileno())
        held = (self.id, self.committed)
        self.db.close()
        os.replace(copy, self.path)
        fsync_directory(self.data_dir)
        # Until it is open and holds what was committed, the store stays
        # unwritable (a later probe finds the copy, not the file opened).
        self.db = self._open(warn, restoring=True)
        if (self.id, self.committed) != held:
            raise StoreMoved(f"{self.path} as made again holds commit {self.committed}, not {held[1]}")
        self.moved = False
        warn(
            "store {path}: made again at its path from the open database ({n} commit(s))",
            path=self.path,
            n=self.committed,
        )

    def reopen(self, warn):
        """
        Open for writing the store read for reading only at start-up,
        once it is the same database (id and commits) and the lock is on
        the lock file; until then it raises (StoreUnwritable for a write
        that still fails) and the store stays as it was.
        """
        self._relock(StoreUnwritable)
        self._make_private(strict=True)
        expected = (self.id, self.committed)
        if self.db is not None:
            self.db.close()
            self.db = None
        self.db = self._open(warn, expected=expected)
        self.unwritable = None

    def loaded(self):
        """
        What it held is read: a store read for reading only lets go of its
        database (and SQLite's locks on it) until it is opened for writing.
        """
        if self.unwritable is not None and self.db is not None:
            self.db.close()
            self.db = None

    def writable_db(self):
        """The database to write to; StoreUnwritable while read for reading only."""
        if self.unwritable is not None:
            raise StoreUnwritable(self.unwritable)
        return self.db

    def _relock(self, error):
        """The lock taken again on the lock file if it is not held there; ``error`` if it cannot be."""
        lock_path = self.data_dir / LOCK_NAME
        if self.lock.on_file and file_id(lock_path) == _fd_id(self.lock):
            return
        try:
            lock = storelock.take(lock_path, fallback=False)
        except storelock.LockRefused as e:
            raise error(str(e)) from None
        self.lock.close()
        self.lock = lock

    def _probe_directory(self):
        probe = self.data_dir / ".probe"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"mqttgw")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()

    def close(self):
        if self.db is not None:
            self.db.close()
        self.lock.close()
        self.record.close()


def _lock(path):
    try:
        return storelock.take(path)
    except storelock.LockRefused as e:
        raise StoreError(str(e)) from None


def _fd_id(f):
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def _close(db):
    if db is not None:
        db.close()

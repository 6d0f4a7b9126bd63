"""
The store's database file and what it must be: opened (and made, when
there is neither it nor its record) only when it holds what its record
(record.py) says it held, readable by the gateway's user only, locked
against a second gateway; set aside when damaged (persistence.recover);
checked after each commit to still be the file at its path, and made
again there from the open database when it is not.
"""

import os
import sqlite3
import time
from pathlib import Path

from twisted.logger import Logger

from mqttgw.broker import sql
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

# Logged as the store: one name for whatever operators filter on.
log = Logger(namespace="mqttgw.broker.store")

DB_NAME = "mqttgw.db"
LOCK_NAME = "mqttgw.lock"

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


class StoreFile:
    """
    Open (creating if need be) the database in ``data_dir``.  Anything
    wrong with an existing file raises StoreError; it is never replaced.
    ``db`` is the open connection, ``id`` and ``committed`` the database's
    identity and its commits (a commit that writes nothing is not
    counted), as its meta table and its record keep them.
    """

    def __init__(self, data_dir, durability="fsync", recover=False):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self._wal = self.data_dir / (DB_NAME + "-wal")
        # As str, for the stats after each commit.
        self._paths = (str(self.path), str(self._wal))
        self.record = RecordFile(self.data_dir / (DB_NAME + RECORD_SUFFIX))
        self.id = None
        self.committed = 0
        # (st_dev, st_ino) of the database and its -wal as opened; moved
        # when they are found elsewhere, until the database is made again
        # at its path (see restore).
        self._file_ids = None
        self.moved = False
        self._synchronous = DURABILITY[durability]
        self._make_private()
        self.lock = _lock(self.data_dir / LOCK_NAME)
        try:
            self.db = self._open_or_recover(recover)
        except StoreError:
            self.lock.close()
            self.record.close()
            raise

    def _make_private(self):
        """
        Queued payloads are in the store (and its -wal): readable by the
        gateway's user only, whatever the umask.
        """
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            wider = tighten(
                [self.data_dir]
                + [self.data_dir / (DB_NAME + s) for s in ("", "-wal", "-shm", RECORD_SUFFIX)]
                + [self.data_dir / LOCK_NAME]
            )
        except OSError as e:
            raise StoreError(f"data directory {self.data_dir}: {e.strerror}") from None
        if wider:
            log.warn(
                "data directory {dir}: {paths} could be read by other users: now by its owner only",
                dir=self.data_dir,
                paths=", ".join(wider),
            )

    def _open_or_recover(self, recover):
        try:
            db = self._open()
        except StoreDamaged as e:
            if not recover:
                raise
            self._set_aside(e)
            return self._open()
        if recover:
            log.info("store {path}: sound; persistence.recover set nothing aside", path=self.path)
        return db

    def _open(self, warn=log.warn, restoring=False):
        """
        The database, checked against its record (StoreDamaged when it
        does not hold what the record says) and made if there is neither.
        ``warn`` logs (from the writer thread, through the reactor);
        ``restoring``: the database was just copied from the open one, so
        a missing record is made again from it.
        """
        try:
            recorded = self.record.read()
        except RecordUnreadable as e:
            raise StoreDamaged(f"store {self.path}: its {e}", _held_unread) from None
        size = self._size(recorded)
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
            self._schema(db)
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
            self.record.write(Record(self.id, self.committed))
        except OSError as e:
            _close(db)
            raise StoreError(f"store {self.path}: its record cannot be written: {e.strerror}") from None
        return db

    def _size(self, recorded):
        """The database file's size, None if there is none: StoreDamaged
        when it is missing though ``recorded``, or empty."""
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
        return size

    def _schema(self, db):
        """The tables made, or upgraded from an older schema version."""
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
                    record=self.record.path,
                )
            meta = {"id": new_id(), "commits": 0}
            db.executemany(sql.META_ADD, meta.items())
        elif recorded is None and not restoring:
            raise StoreDamaged(
                f"store {self.path}: its record {self.record.path} is missing, so what the"
                f" database should hold is not known (it holds {meta.get('commits', 0)} commit(s);"
                " its write-ahead log may be lost too)",
                _contents(db),
            )
        elif recorded is None:
            warn(
                "store {path}: its record {record} is missing: made again from the database",
                path=self.path,
                record=self.record.path,
            )
        elif meta.get("id") != recorded.id:
            raise StoreDamaged(
                f"store {self.path} is not the database its record {self.record.path}"
                f" describes (id {meta.get('id')}, not {recorded.id})",
                _contents(db),
            )
        elif meta.get("commits", 0) < recorded.commits:
            raise StoreDamaged(
                f"store {self.path} is older than its record {self.record.path}: it holds"
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
        directory still takes a new file, and a displaced record is
        written again; raises what stands in the way.
        """
        if self.moved:
            self.restore(warn)
        self._probe_directory()
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
        lock_path = self.data_dir / LOCK_NAME
        if file_id(lock_path) != _fd_id(self.lock):
            try:
                lock = _lock(lock_path)
            except StoreError as e:
                raise StoreMoved(str(e)) from None
            self.lock.close()
            self.lock = lock
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

    def _probe_directory(self):
        probe = self.data_dir / ".probe"
        with open(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(b"mqttgw")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()

    def close(self):
        self.db.close()
        self.lock.close()
        self.record.close()


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

"""
Reading a store that cannot be written (a full disk, a read-only mount or
file) as SQLite allows it, with the commits of its -wal: the ways that
need no free space and write nothing of the store's, tried in turn.
"""

import os
import sqlite3
from urllib.parse import quote

# A statement that makes SQLite open the database and its -wal.
_FIRST_READ = "SELECT count(*) FROM sqlite_master"


def _exclusive(path, wal):
    """
    Read-write, with SQLite's exclusive locking mode set before the first
    read: the -wal's index is then kept in memory, so no -shm is needed (a
    full disk cannot grow one).  Needs a writable database file: the
    exclusive lock is a write lock.  (Closing it may checkpoint the -wal
    into the database: that moves commits, it loses none.)
    """
    db = _connect(path, "mode=rw")
    db.execute("PRAGMA locking_mode=EXCLUSIVE")
    return db


def _read_only(path, wal):
    """
    Read-only, through the -shm: on a read-only mount SQLite reads the
    -wal into memory when the -shm is there but cannot be written.
    """
    return _connect(path, "mode=ro")


def _immutable(path, wal):
    """
    As a file nothing changes, without -wal or -shm: right only when no
    -wal holds commits, else those would be left out (the store would
    seem older than its record).
    """
    try:
        if os.stat(wal).st_size:
            return None
    except FileNotFoundError:
        pass
    return _connect(path, "mode=ro&immutable=1")


WAYS = (_exclusive, _read_only, _immutable)


def connect(path, wal):
    """
    A connection that reads the database at ``path`` (its -wal at
    ``wal``) as committed: the first of WAYS that can read it, or the
    sqlite3.Error of the last that could not.
    """
    error = None
    for way in WAYS:
        db = None
        try:
            db = way(path, wal)
            if db is None:
                continue
            db.execute(_FIRST_READ).fetchone()
            return db
        except sqlite3.Error as e:
            error = e
            if db is not None:
                db.close()
    raise error


def _connect(path, query):
    return sqlite3.connect(
        f"file:{quote(str(path))}?{query}", uri=True, check_same_thread=False, isolation_level=None
    )

"""
What an existing store must be to be opened: a file that is not empty,
not missing while its record is there, of this version's schema (or
upgraded to it), and the database its record describes, with no fewer
commits than the record counted.
"""

import sqlite3

from mqttgw.broker import sql
from mqttgw.broker.record import new_id
from mqttgw.broker.sql import SCHEMA_VERSION

# What a database that could not be read is said to hold.
HELD_UNREAD = "what could not be read"


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


class StoreChecks:
    """The checks of the database at ``path`` against its record at ``record_path``."""

    def __init__(self, path, record_path):
        self.path = path
        self.record_path = record_path

    def same(self, identity, expected):
        """StoreDamaged unless ``identity`` is what it was read with (``expected``)."""
        if expected is None:
            return
        (id_, commits), (read_id, read_commits) = identity, expected
        if commits != read_commits or read_id not in (None, id_):
            raise StoreDamaged(
                f"store {self.path} is not the database read at start-up (id {id_},"
                f" {commits} commit(s); it was id {read_id}, {read_commits} commit(s))"
            )

    def size(self, recorded):
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

    def schema(self, db):
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

    def schema_current(self, db, unwritable):
        """
        Read for reading only: its schema must be this version's, or one
        whose upgrade only adds tables (sql.READABLE_FROM), as no upgrade
        can be written.
        """
        row = db.execute(sql.SCHEMA_READ).fetchone()
        version = row[0] if row is not None else None
        if version is not None and sql.READABLE_FROM <= version <= SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(
                f"store {self.path}: cannot be used: schema version {version} is not {SCHEMA_VERSION}"
            )
        raise StoreError(
            f"store {self.path}: cannot be used: its schema version {version} needs an upgrade"
            f" to {SCHEMA_VERSION}, which cannot be written ({unwritable})"
        )

    def identify(self, db, recorded, warn, existed, restoring):
        """
        The database's (id, commits), checked against ``recorded``.  A
        database with an id had a record: without it, what it held is not
        known (its write-ahead log may have gone with the record).  One
        without (made before the record existed) is given one, unless
        ``warn`` is None (read for reading only: id None until then).
        """
        meta = dict(db.execute(sql.IDENTITY_READ))
        if "id" not in meta and recorded is None:
            if warn is None:
                return None, meta.get("commits", 0)
            if existed:
                warn(
                    "store {path}: its record {record} is missing: made again from the database",
                    path=self.path,
                    record=self.record_path,
                )
            meta = {"id": new_id(), "commits": 0}
            db.executemany(sql.META_ADD, meta.items())
        elif recorded is None and not restoring:
            raise StoreDamaged(
                f"store {self.path}: its record {self.record_path} is missing, so what the"
                f" database should hold is not known (it holds {meta.get('commits', 0)} commit(s);"
                " its write-ahead log may be lost too)",
                contents(db),
            )
        elif recorded is None:
            warn(
                "store {path}: its record {record} is missing: made again from the database",
                path=self.path,
                record=self.record_path,
            )
        elif meta.get("id") != recorded.id:
            raise StoreDamaged(
                f"store {self.path} is not the database its record {self.record_path}"
                f" describes (id {meta.get('id')}, not {recorded.id})",
                contents(db),
            )
        elif meta.get("commits", 0) < recorded.commits:
            raise StoreDamaged(
                f"store {self.path} is older than its record {self.record_path}: it holds"
                f" {meta.get('commits', 0)} commit(s), the record says {recorded.commits}"
                " (its write-ahead log was lost?)",
                contents(db),
            )
        return meta["id"], meta.get("commits", 0)


def quick_check(db):
    ok = db.execute(sql.QUICK_CHECK).fetchone()[0]
    if ok != "ok":
        raise sqlite3.DatabaseError(ok)


HELD_UNREAD = "what could not be read"


def contents(db):
    """What a database holds, in words, for the log."""
    try:
        count = lambda table: db.execute(sql.count(table)).fetchone()[0]  # noqa: E731
        commits = db.execute(sql.COMMITS_READ).fetchone()
        return (
            f"{commits[0] if commits else 0} commit(s): {count('sessions')} session(s),"
            f" {count('deliveries')} queued message(s), {count('retained')} retained message(s)"
        )
    except sqlite3.Error:
        return HELD_UNREAD

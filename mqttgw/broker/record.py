"""
The store's record of itself, beside the database (``mqttgw.db.state``):
which database it is (a random id the database keeps too) and how many
commits it had made when last written.  A database that is missing,
empty, another one, or behind its record (a write-ahead log lost after a
crash) has lost what was acknowledged: start-up refuses it rather than
run silently empty.  So does a database that has an id but no record
(its -wal may have gone with it); one without an id predates the record.

The record is made with a write to a new file, fsync and rename, so it is
whole or absent.  After each commit its count is written over, in place,
at a fixed size (one write of less than a sector, not flushed): it lags
the database after a power loss, never leads it, as it is written only
once the commit has returned.
"""

import json
import os
import secrets

import attr

SUFFIX = ".state"
# Bytes of the record, padded: each update overwrites all of it at once.
SIZE = 128


class RecordUnreadable(Exception):
    """The record exists but is not one."""


@attr.s(frozen=True, slots=True)
class Record:
    id = attr.ib()
    commits = attr.ib()


def new_id():
    """An identity for a new database (a positive SQLite integer)."""
    return secrets.randbits(62)


def _encode(record):
    text = json.dumps({"id": record.id, "commits": record.commits})
    return text.encode().ljust(SIZE - 1) + b"\n"


def fsync_directory(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_private(path):
    """Make ``path`` (if missing) readable and writable by its owner only."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def tighten(paths):
    """
    Take group and other access from each of ``paths`` that exists and is
    ours (a directory 0700, a file 0600): the paths changed.
    """
    changed = []
    for path in paths:
        try:
            st = os.stat(path)
            if st.st_mode & 0o077 and st.st_uid == os.geteuid():
                os.chmod(path, st.st_mode & 0o700)
                changed.append(str(path))
        except FileNotFoundError:
            pass
    return changed


def file_id(path):
    """(st_dev, st_ino) of ``path``, or None if nothing is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class RecordFile:
    def __init__(self, path):
        self.path = path
        self._fd = None
        self._file_id = None

    def read(self):
        """The record, None if there is none; RecordUnreadable if damaged."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RecordUnreadable(f"record {self.path} cannot be read: {e.strerror}") from None
        try:
            fields = json.loads(data)
            record = Record(fields["id"], fields["commits"])
        except (ValueError, TypeError, KeyError):
            raise RecordUnreadable(f"record {self.path} is damaged ({len(data)} bytes)") from None
        if not all(type(v) is int and v >= 0 for v in (record.id, record.commits)):
            raise RecordUnreadable(f"record {self.path} is damaged")
        return record

    def write(self, record):
        """Replace the record whole (new file, fsync, rename, fsync of the directory)."""
        self.close()
        temporary = self.path.with_name(self.path.name + ".new")
        # Readable by the gateway's user only, as the whole data directory.
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as f:
            f.write(_encode(record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        fsync_directory(self.path.parent)
        self._fd = os.open(self.path, os.O_WRONLY)
        self._file_id = file_id(self.path)

    def update(self, record):
        """Write the count over the record in place (after a commit)."""
        os.pwrite(self._fd, _encode(record), 0)

    def displaced(self):
        """Whether the file written to is no longer the one at the path."""
        return self._fd is not None and file_id(self.path) != self._file_id

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

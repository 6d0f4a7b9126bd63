"""
The store's record of itself, beside the database (``mqttgw.db.state``):
which database it is (a random id the database keeps too) and how many
commits it had made when last written.  A database that is missing,
empty, another one, or behind its record (a write-ahead log lost after a
crash) has lost what was acknowledged: start-up refuses it rather than
run silently empty.

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
        with open(temporary, "wb") as f:
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

"""
The data directory's lock: one gateway per store, for the life of the
process.  It is taken on ``mqttgw.lock`` (which names the holder's pid for
a second gateway's refusal), and, where that file cannot be made (a
read-only data directory), on the directory itself until it can be.
"""

import errno
import fcntl
import os
import stat

# What keeps the lock file from being made or written, while the store
# may still be read: the gateway starts degraded rather than not at all.
UNWRITABLE = frozenset((errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT))


class LockRefused(Exception):
    """The data directory cannot be locked; the message names it."""


class Lock:
    """
    An open descriptor holding the lock; ``on_file``: on the lock file
    (not the data directory, taken while the file could not be made).
    """

    def __init__(self, fd, on_file):
        self._fd = fd
        self.on_file = on_file

    def fileno(self):
        return self._fd

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def take(path, fallback=True):
    """
    An exclusive lock for this process on the data directory of the lock
    file ``path``: a second gateway on the same store would corrupt what
    both acknowledge.  ``fallback``: where the file cannot be made or
    written, lock it read-only, or the directory when it is missing.
    """
    directory = path.parent
    on_file = writable = True
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        if not fallback or e.errno not in UNWRITABLE:
            raise LockRefused(f"data directory {directory}: {e.strerror}") from None
        writable = False
        fd, on_file = _read_only(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd) if on_file else ""
        os.close(fd)
        raise LockRefused(
            f"data directory {directory} is in use by another gateway (pid {holder or 'another process'})"
        ) from None
    if writable:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            # Only for a second gateway's line: it says "another process".
            pass
    return Lock(fd, on_file)


def _read_only(path):
    """(descriptor, on the file): the lock file read-only, else its directory."""
    try:
        return os.open(path, os.O_RDONLY), True
    except FileNotFoundError:
        pass
    except OSError as e:
        raise LockRefused(f"data directory {path.parent}: {e.strerror}") from None
    try:
        return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY), False
    except OSError as e:
        raise LockRefused(f"data directory {path.parent}: {e.strerror}") from None


def _holder(fd):
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return ""

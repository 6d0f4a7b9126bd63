"""
Passwords from a file in mosquitto's format (``mosquitto_passwd``'s ``$7$``
PBKDF2-SHA512 and older ``$6$`` SHA-512 entries), and the checker over it.
Hashing runs in a small thread pool, never on the reactor thread, with a
cache of recent successes so reconnect storms stay cheap.
"""

import base64
import hashlib
import hmac
import os
from collections import Counter, OrderedDict

import attr
from twisted.cred import checkers, credentials, error
from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from zope.interface import implementer

from mqttgw.security.files import AuthConfigError, read_lines

# Iterations for the entries this project writes; mosquitto_passwd writes
# 101, and reads whatever count an entry names, as mqttgw does.
PBKDF2_ITERATIONS = 20_000


def hash_password(password, iterations=PBKDF2_ITERATIONS, salt=None):
    """A ``$7$`` entry (PBKDF2-HMAC-SHA512) as mosquitto_passwd writes it."""
    salt = os.urandom(12) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _verify(entry, password):
    """Whether ``password`` (bytes) matches a parsed entry.  CPU-heavy."""
    kind, iterations, salt, digest = entry
    if kind == "7":
        found = hashlib.pbkdf2_hmac("sha512", password, salt, iterations)
    else:
        found = hashlib.sha512(password + salt).digest()
    return hmac.compare_digest(found, digest)


def parse_entry(text):
    """The hash of a password file entry as (kind, iterations, salt, digest), or None."""
    parts = text.split("$")
    try:
        if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
            iterations = int(parts[2])
            if iterations < 1:
                raise ValueError
            return ("7", iterations, base64.b64decode(parts[3], validate=True),
                    base64.b64decode(parts[4], validate=True))
        if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
            return ("6", 0, base64.b64decode(parts[2], validate=True),
                    base64.b64decode(parts[3], validate=True))
    except ValueError:
        pass
    return None


def stand_in(entries):
    """
    The hash an unknown user's password is checked against: a random one
    of the same algorithm and parameters as most of ``entries`` (kind,
    iterations, salt and digest lengths), so that refusing an unknown user
    costs what refusing a known one does, whatever the file's parameters.
    """
    kinds = Counter(
        (kind, iterations, len(salt), len(digest)) for kind, iterations, salt, digest in entries
    )
    if not kinds:
        kind, iterations, salt_size, digest_size = "7", PBKDF2_ITERATIONS, 12, 64
    else:
        [((kind, iterations, salt_size, digest_size), _)] = kinds.most_common(1)
    return (kind, iterations, os.urandom(salt_size), os.urandom(digest_size))


@attr.s(frozen=True, slots=True)
class PasswordTable:
    """A password file, parsed once; replaced whole on reload."""

    path = attr.ib()
    entries = attr.ib()
    # What an unknown user's password is hashed against (see stand_in).
    stand_in = attr.ib(
        default=attr.Factory(lambda self: stand_in(self.entries.values()), takes_self=True),
        eq=False,
        repr=False,
    )

    @classmethod
    def from_file(cls, path):
        entries = {}
        lines = {}
        for number, line in enumerate(read_lines(path), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, hashed = line.partition(":")
            entry = parse_entry(hashed) if sep else None
            if not user or entry is None:
                # Never echo the line: it holds a hash, or a plain password.
                raise AuthConfigError(
                    f"{path}:{number}: not a 'user:$7$...' or 'user:$6$...' entry"
                    " (plain text passwords are converted with mosquitto_passwd -U"
                    " or python -m mqttgw.passwd -U)"
                )
            if user in lines:
                # Which of the two holds is not for the file's order to decide.
                raise AuthConfigError(
                    f"{path}:{number}: user {user!r} is given again (first at line {lines[user]})"
                )
            lines[user] = number
            entries[user] = entry
        return cls(str(path), entries)

    def verify(self, username, password):
        entry = self.entries.get(username)
        if entry is None:
            # As costly as a known user, so timing does not tell who exists.
            _verify(self.stand_in, password)
            return False
        return _verify(entry, password)


class Busy(error.UnauthorizedLogin):
    """Too many logins are waiting for a hashing thread."""


@implementer(checkers.ICredentialsChecker)
class PasswordChecker:
    """
    Checks user names and passwords against a :class:`PasswordTable`, in
    ``pool`` (a ThreadPool).  Successes are remembered for ``cache_seconds``
    by a digest of the password, so a fleet reconnecting at once is checked
    without hashing again; the table's replacement empties the cache.
    """

    credentialInterfaces = (credentials.IUsernamePassword,)
    MAX_WAITING = 1024
    CACHE_SIZE = 10_000

    def __init__(self, table, reactor, pool, cache_seconds=300.0):
        self.table = table
        self.reactor = reactor
        self.pool = pool
        self.cache_seconds = cache_seconds
        self._cache = OrderedDict()
        self._waiting = 0

    def replace(self, table):
        self.table = table
        self._cache.clear()

    def requestAvatarId(self, creds):
        username = creds.username.decode("utf-8", "replace")
        password = creds.password
        key = (username, hashlib.sha256(password).digest())
        now = self.reactor.seconds()
        expires = self._cache.get(key)
        if expires is not None and expires > now:
            return defer.succeed(username)
        if self._waiting >= self.MAX_WAITING:
            return defer.fail(Busy("too many logins waiting"))
        self._waiting += 1
        table = self.table
        d = deferToThreadPool(self.reactor, self.pool, table.verify, username, password)

        def checked(ok):
            self._waiting -= 1
            if not ok:
                return Failure(error.UnauthorizedLogin())
            if table is self.table:
                self._cache[key] = self.reactor.seconds() + self.cache_seconds
                if len(self._cache) > self.CACHE_SIZE:
                    self._cache.popitem(last=False)
            return username

        def failed(reason):
            self._waiting -= 1
            return reason

        d.addCallbacks(checked, failed)
        return d

"""
Who may connect: ``twisted.cred`` checkers plugged into one portal that
every listener shares.  Passwords come from a file in mosquitto's format
(``mosquitto_passwd``'s ``$7$`` PBKDF2-SHA512 and older ``$6$`` SHA-512
entries); hashing runs in a small thread pool, never on the reactor
thread, with a cache of recent successes so reconnect storms stay cheap.
"""

import base64
import hashlib
import hmac
import os
from collections import OrderedDict

import attr
from twisted.cred import checkers, credentials, error, portal
from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from zope.interface import Interface, implementer


class AuthConfigError(Exception):
    """A password or ACL file that cannot be used; the message says where."""


def read_lines(path):
    """The lines of a text file, or AuthConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AuthConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None


class IIdentity(Interface):
    """What a client is once logged in: see :class:`Identity`."""


@implementer(IIdentity)
@attr.s(frozen=True, slots=True)
class Identity:
    # None for an anonymous client.
    username = attr.ib()
    # From a token: the topic filters its holder may publish to and
    # subscribe to (None: as the ACL says), and when it expires (epoch s).
    publish = attr.ib(default=None)
    subscribe = attr.ib(default=None)
    expires = attr.ib(default=None)


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


@attr.s(frozen=True, slots=True)
class PasswordTable:
    """A password file, parsed once; replaced whole on reload."""

    path = attr.ib()
    entries = attr.ib()

    @classmethod
    def from_file(cls, path):
        entries = {}
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
            entries[user] = entry
        return cls(str(path), entries)

    def verify(self, username, password):
        entry = self.entries.get(username)
        if entry is None:
            # As costly as a known user, so timing does not tell who exists.
            _verify(("7", PBKDF2_ITERATIONS, b"0" * 12, b""), password)
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


# Signed tokens (JWT) sent as the password.

TOKEN_ALGORITHMS = ("HS256", "HS384", "HS512", "RS256", "ES256")


def looks_like_token(password):
    """Three base64url segments: a JWT rather than a password."""
    parts = password.split(b".")
    return len(parts) == 3 and all(parts) and password[:2] == b"ey"


@attr.s(frozen=True, slots=True)
class TokenKeys:
    """
    What tokens are checked with: an HS256 secret or an RS256/ES256 public
    key (PEM), the claim that names the user, and an audience if required.
    """

    key = attr.ib()
    algorithms = attr.ib()
    username_claim = attr.ib(default="sub")
    audience = attr.ib(default=None)

    @classmethod
    def from_settings(cls, secret_file, public_key_file, username_claim="sub", audience=""):
        if secret_file and public_key_file:
            raise AuthConfigError("auth.jwt_secret_file and auth.jwt_public_key: set one, not both")
        path = secret_file or public_key_file
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                key = f.read().strip()
        except OSError as e:
            raise AuthConfigError(f"{path}: cannot read: {e.strerror}") from None
        if secret_file:
            if len(key) < 32:
                raise AuthConfigError(f"{path}: an HS256 secret needs at least 32 bytes")
            algorithms = ("HS256", "HS384", "HS512")
        else:
            from cryptography.hazmat.primitives.asymmetric import ec, rsa
            from cryptography.hazmat.primitives.serialization import load_pem_public_key

            try:
                public = load_pem_public_key(key)
            except ValueError as e:
                raise AuthConfigError(f"{path}: not a PEM public key: {e}") from None
            if isinstance(public, ec.EllipticCurvePublicKey):
                algorithms = ("ES256",)
            elif isinstance(public, rsa.RSAPublicKey):
                algorithms = ("RS256",)
            else:
                raise AuthConfigError(f"{path}: an RSA or EC public key is needed")
            key = public
        return cls(key, algorithms, username_claim, audience or None)

    def verify(self, token, now):
        """
        The holder's :class:`Identity`, or UnauthorizedLogin saying why not.
        ``now`` (epoch seconds, the reactor's) is what ``exp`` is held to.
        """
        import jwt

        try:
            claims = jwt.decode(
                token,
                self.key,
                algorithms=list(self.algorithms),
                audience=self.audience,
                options={
                    "require": ["exp"],
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": self.audience is not None,
                },
            )
        except jwt.PyJWTError as e:
            raise error.UnauthorizedLogin(f"token refused: {e}") from None
        expires = claims["exp"]
        if not isinstance(expires, (int, float)) or expires <= now:
            raise error.UnauthorizedLogin("token expired")
        not_before = claims.get("nbf")
        if isinstance(not_before, (int, float)) and not_before > now + 60:
            raise error.UnauthorizedLogin("token not valid yet")
        username = claims.get(self.username_claim)
        if not isinstance(username, str) or not username:
            raise error.UnauthorizedLogin(f"token has no {self.username_claim!r} claim")
        topics = {}
        for claim in ("publish", "subscribe"):
            value = claims.get(f"mqtt_{claim}")
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                raise error.UnauthorizedLogin(f"token claim mqtt_{claim} is not a list of topic filters")
            topics[claim] = tuple(value) if value is not None else None
        return Identity(username, topics["publish"], topics["subscribe"], float(claims["exp"]))


class TokenIssuer:
    """
    The gateway's own short-lived tokens, handed to a user signed in to
    the dashboard: one token for its MQTT connection and the admin API.
    The key is made at start-up and never leaves the process, so a
    restart signs everyone out.  Tokens name their audience, so tokens
    signed with a configured key are never taken for the gateway's.
    """

    AUDIENCE = "mqttgw-dashboard"

    def __init__(self, lifetime=300.0, key=None):
        self.lifetime = lifetime
        self.keys = TokenKeys(key or os.urandom(32), ("HS256",), "sub", self.AUDIENCE)

    def issue(self, username, now, read_only):
        """A token for ``username`` valid from ``now`` (epoch s); read-only ones may not publish."""
        import jwt

        claims = {"sub": username, "aud": self.AUDIENCE, "iat": int(now), "exp": now + self.lifetime}
        if read_only:
            claims["mqtt_publish"] = []
        return jwt.encode(claims, self.keys.key, algorithm="HS256")

    def ours(self, token):
        """Whether ``token`` (bytes) claims to be one of ours; cheap, not a check."""
        import jwt

        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return False
        return claims.get("aud") == self.AUDIENCE


@implementer(checkers.ICredentialsChecker)
class TokenOrPasswordChecker:
    """
    A password that is a JWT is checked as a token: the gateway's own
    (``issuer``) or one signed with the configured token keys; any other
    password against the password file (when there is one).  The avatar
    id is then an :class:`Identity`.
    """

    credentialInterfaces = (credentials.IUsernamePassword,)

    def __init__(self, tokens, passwords, reactor, pool, issuer=None):
        self.tokens = tokens
        self.passwords = passwords
        self.reactor = reactor
        self.pool = pool
        self.issuer = issuer

    def requestAvatarId(self, creds):
        if looks_like_token(creds.password):
            tokens = self.tokens
            if self.issuer is not None and self.issuer.ours(creds.password):
                tokens = self.issuer.keys
            if tokens is not None:
                return deferToThreadPool(
                    self.reactor,
                    self.pool,
                    tokens.verify,
                    creds.password.decode("ascii", "replace"),
                    self.reactor.seconds(),
                )
        if self.passwords is None:
            return defer.fail(error.UnauthorizedLogin())
        return self.passwords.requestAvatarId(creds).addCallback(Identity)


@implementer(portal.IRealm)
class Realm:
    """An avatar id (an Identity, or ANONYMOUS) becomes an :class:`Identity`."""

    def requestAvatar(self, avatarId, mind, *interfaces):
        if IIdentity not in interfaces:
            raise NotImplementedError("mqttgw's realm only gives identities")
        if avatarId is checkers.ANONYMOUS:
            avatarId = Identity(None)
        elif not isinstance(avatarId, Identity):
            avatarId = Identity(avatarId)
        return IIdentity, avatarId, lambda: None


def credentials_checker(password_checker=None, tokens=None, reactor=None, pool=None, issuer=None):
    """The one checker of user names and passwords (or tokens), or None."""
    if tokens is not None or (issuer is not None and password_checker is not None):
        return TokenOrPasswordChecker(tokens, password_checker, reactor, pool, issuer)
    return password_checker


def make_portal(checker=None, allow_anonymous=False):
    """A listener's portal; with no checker and no anonymous access, it refuses everything."""
    found = []
    if checker is not None:
        found.append(checker)
    if allow_anonymous:
        found.append(checkers.AllowAnonymousAccess())
    return portal.Portal(Realm(), found)


class Throttle:
    """
    Refusals from one address are answered after a delay that doubles with
    each failure (from ``first`` up to ``longest`` seconds), so guessing
    passwords is slow; a success forgets the address.  Bounded in size.
    """

    def __init__(self, first=0.1, longest=10.0, size=10_000):
        self.first = first
        self.longest = longest
        self.size = size
        self._failures = OrderedDict()

    def failed(self, host):
        """The delay before this refusal is answered."""
        n = self._failures.pop(host, 0)
        self._failures[host] = n + 1
        if len(self._failures) > self.size:
            self._failures.popitem(last=False)
        return min(self.first * 2**n, self.longest)

    def succeeded(self, host):
        self._failures.pop(host, None)

"""
Who may connect: ``twisted.cred`` checkers plugged into one portal that
every listener shares.  A password that is a token is checked as one;
any other against the password file.
"""

from twisted.cred import checkers, credentials, error, portal
from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from zope.interface import implementer

from mqttgw.security.identity import Identity, IIdentity
from mqttgw.security.tokens import looks_like_token


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

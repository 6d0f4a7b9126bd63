"""
Signed tokens (JWT) sent as the password: the keys configured tokens are
checked with, and the gateway's own short-lived tokens for the dashboard.
"""

import os

import attr
from twisted.cred import error

from mqttgw.security.files import AuthConfigError
from mqttgw.security.identity import Identity

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

"""
What an attempt to connect upstream ended with, said as the upstream did
it (unreachable, CONNACK refusal, closed before CONNACK, accepted then
closed at once), with what a log line about it advises changing.
"""

from twisted.internet.error import ConnectionDone, ConnectionLost

from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R

# What to change, by CONNACK code: 3.1/3.1.1 return codes, then 5.0's.
_ADVICE = {
    P.CONNACK_IDENTIFIER_REJECTED: "set client_id to one the upstream accepts",
    P.CONNACK_SERVER_UNAVAILABLE: "the upstream is not serving clients now",
    P.CONNACK_BAD_CREDENTIALS: "check username and password",
    P.CONNACK_NOT_AUTHORIZED: "check username and password, and the upstream's rights for client id {client_id!r}",
    R.CLIENT_IDENTIFIER_NOT_VALID: "set client_id to one the upstream accepts",
    R.BAD_USER_NAME_OR_PASSWORD: "check username and password",
    R.NOT_AUTHORIZED: "check username and password, and the upstream's rights for client id {client_id!r}",
    R.BANNED: "the upstream banned client id {client_id!r}",
    R.SERVER_UNAVAILABLE: "the upstream is not serving clients now",
    R.SERVER_BUSY: "the upstream is not serving clients now",
    R.CONNECTION_RATE_EXCEEDED: "the upstream takes connections more slowly: raise reconnect_initial",
    R.USE_ANOTHER_SERVER: "the upstream names another server{reference}",
    R.SERVER_MOVED: "the upstream names another server{reference}: change addresses",
}

# Refusals that may be the session's rather than the client's: a clean
# session may still be served there (session_fallback).
_SESSION_CODES = frozenset((
    P.CONNACK_SERVER_UNAVAILABLE, R.UNSPECIFIED_ERROR, R.IMPLEMENTATION_SPECIFIC_ERROR,
    R.SERVER_UNAVAILABLE, R.SERVER_BUSY,
))


class AttemptFailed(Exception):
    """
    An attempt at one address that did not give a working link.
    ``reason``: what the upstream did, as status and $SYS show it;
    ``kind``: its metrics label; ``session_suspect``: whether the
    persistent session may be what the upstream could not serve.
    """

    kind = "unreachable"
    session_suspect = False

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason

    def advice(self, settings):
        """What to change, if anything, for a log line."""
        return ""


class Unreachable(AttemptFailed):
    """No connection, or no TLS session over it."""

    def __init__(self, error, kind="unreachable"):
        what = "TLS handshake failed" if kind == "tls" else "unreachable"
        super().__init__(f"{what}: {describe(error)}")
        self.kind = kind

    def advice(self, settings):
        if self.kind == "tls":
            return "check ca, cert, key and the upstream's host name"
        return ""


class UpstreamRefused(AttemptFailed):
    """CONNACK with a refusal: the ConnectRefused of bridges.client."""

    kind = "refused"

    def __init__(self, refusal):
        text = f"refused CONNECT: {refusal}"
        if refusal.reason_string:
            text += f" ({refusal.reason_string})"
        super().__init__(text)
        self.code = refusal.code
        self.server_reference = refusal.server_reference
        self.session_suspect = refusal.code in _SESSION_CODES

    def advice(self, settings):
        advice = _ADVICE.get(self.code)
        if self.code == P.CONNACK_UNACCEPTABLE_PROTOCOL and settings.protocol_level == P.MQTT_311:
            advice = 'the upstream speaks neither 3.1.1 nor 5.0 to it: try protocol = "mqttv31"'
        if advice is None:
            return ""
        reference = f" ({self.server_reference})" if self.server_reference else ""
        return advice.format(client_id=settings.client_id, reference=reference)


class ClosedBeforeConnack(AttemptFailed):
    """The upstream took the CONNECT and closed the connection unanswered."""

    kind = "closed_before_connack"

    def __init__(self):
        super().__init__("closed the connection before CONNACK")

    def advice(self, settings):
        return (
            f"the upstream's log says why; it may refuse client id {settings.client_id!r}, the"
            " user name, or this session without saying so"
        )


class NoConnack(AttemptFailed):
    """The upstream did not answer CONNECT in time."""

    kind = "no_connack"

    def __init__(self, seconds):
        super().__init__(f"did not answer CONNECT within {seconds:g} s")


class Dropped(AttemptFailed):
    """Accepted, then closed before the link had lasted its first seconds."""

    kind = "dropped"

    def __init__(self, seconds, disconnect=None):
        said = ""
        if disconnect is not None and disconnect.reason_code:
            why = (disconnect.properties or {}).get("reason_string")
            said = f" with DISCONNECT {disconnect.reason_code:#04x} ({R.name(disconnect.reason_code)}{': ' + why if why else ''})"
        super().__init__(f"accepted CONNECT and closed the connection {seconds:.1f} s later{said}")
        code = disconnect.reason_code if disconnect is not None else 0
        self.taken_over = code == R.SESSION_TAKEN_OVER
        self.session_suspect = not self.taken_over

    def advice(self, settings):
        if self.taken_over:
            return f"another client connects as {settings.client_id!r}: each bridge needs its own client_id"
        return (
            "it went down, cannot serve this session there (a cluster node without the"
            f" session's queue), or another client connects as {settings.client_id!r}"
        )


def lost_before_connack(error):
    """The failure of a connection lost before its CONNACK: ``error`` is why."""
    if isinstance(error, (ConnectionDone, ConnectionLost)):
        return ClosedBeforeConnack()
    # TLS: the handshake failed, or the certificate is not the host's.
    tls = type(error).__module__.startswith(("OpenSSL", "service_identity"))
    return Unreachable(error, "tls" if tls else "unreachable")


def describe(error):
    """A one-line reason, TLS errors included."""
    text = str(error) or type(error).__name__
    reasons = getattr(error, "reason", None)
    if hasattr(reasons, "getErrorMessage"):
        text = reasons.getErrorMessage()
    return text.replace("\n", " ")

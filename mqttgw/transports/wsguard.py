"""
The WebSocket port's connections until they upgrade: counted from the
accept, bounded in bytes (the request's head, its body) and in time,
anything that is not HTTP closed at once.
"""

from twisted.internet.interfaces import IProtocolNegotiationFactory, ISSLTransport
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from zope.interface import directlyProvides, implementer, providedBy

log = Logger()


def peer_text(peer):
    """An address as a log line names it."""
    host = getattr(peer, "host", None)
    return f"{host}:{peer.port}" if host else str(peer)


# Bytes a connection may send before its upgrade: a request line and
# headers (twisted.web allows 16 KiB of them) and a small body.
MAX_REQUEST_BYTES = 64 * 1024
# The largest request body taken: only the dashboard's API reads one (a
# sign-in, a publish form), and only where the dashboard is served.
MAX_BODY_BYTES = 16 * 1024


class HandshakeGuard(ProtocolWrapper):
    """
    One connection to the WebSocket port, until it becomes a WebSocket:
    anything that is not HTTP, a request larger than ``MAX_REQUEST_BYTES``,
    a body where none is read (or over ``MAX_BODY_BYTES``), or no upgrade
    within ``connect_timeout`` closes it.  A refused request is answered
    at once and nothing more is read from it.
    """

    _received = 0
    _http = None
    _timer = None
    # The request's head until its end has been seen; then None.
    _head = None

    def makeConnection(self, transport):
        self._http = self.wrappedProtocol
        factory = self.factory
        self._timer = factory.clock.callLater(
            factory.limits.connect_timeout, self._timed_out
        )
        super().makeConnection(transport)
        # Not a TLS transport itself (autobahn would ask it for TLS channel
        # details); the TLS below is still reached through it.
        directlyProvides(
            self, *(i for i in providedBy(transport) if not i.isOrExtends(ISSLTransport))
        )

    def dataReceived(self, data):
        if self._http is None:
            self.wrappedProtocol.dataReceived(data)
            return
        if self._received < 0:
            return
        if self._received == 0 and not b"A" <= data[:1] <= b"Z":
            # MQTT (0x10), TLS (0x16) or anything else that is not HTTP.
            return self._refuse(f"not HTTP (first byte {data[0]:#04x})", None)
        self._received += len(data)
        self.factory.router.stats.bytes_received += len(data)
        if self._received > MAX_REQUEST_BYTES:
            return self._refuse(f"request over {MAX_REQUEST_BYTES} bytes", _TOO_LARGE)
        head = self._head
        if head is not None or self._received == len(data):
            if head is None:
                head = self._head = bytearray()
            seen = len(head)
            head += data
            end = head.find(b"\r\n\r\n", max(0, seen - 3))
            if end >= 0:
                self._head = None
                refusal = self._body_refusal(bytes(head[:end]))
                if refusal is not None:
                    return self._refuse(*refusal)
        self.wrappedProtocol.dataReceived(data)
        if self.wrappedProtocol is not self._http:
            self._upgraded()

    def _body_refusal(self, head):
        """Why a request with this head is refused for its body, or None."""
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                return "a request body of unknown length", _LENGTH_REQUIRED
            if name == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    return "a malformed Content-Length", _BAD_REQUEST
        bound = MAX_BODY_BYTES if self.factory.reads_bodies else 0
        if length > bound:
            return f"a request body of {length} bytes (at most {bound})", _TOO_LARGE
        return None

    def _refuse(self, reason, response):
        log.info("closing connection from {peer} to the WebSocket port: {reason}",
                 peer=peer_text(self.transport.getPeer()), reason=reason)
        self.factory.router.stats.protocol_errors += 1
        # Whatever else it sends is not even read.
        self._received = -1
        if response is None:
            self.transport.abortConnection()
        else:
            self.transport.pauseProducing()
            self.transport.write(response)
            self.transport.loseConnection()

    def _upgraded(self):
        self._http = None
        self.factory.handshake_done(self)
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _timed_out(self):
        self._timer = None
        if self._http is not None:
            log.info(
                "no WebSocket upgrade from {peer} in time: closing",
                peer=peer_text(self.transport.getPeer()),
            )
            self.transport.abortConnection()

    def connectionLost(self, reason):
        if self._http is not None:
            self._upgraded()
        super().connectionLost(reason)


def _answer(status):
    return b"HTTP/1.1 " + status + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


_TOO_LARGE = _answer(b"413 Request Entity Too Large")
_LENGTH_REQUIRED = _answer(b"411 Length Required")
_BAD_REQUEST = _answer(b"400 Bad Request")


@implementer(IProtocolNegotiationFactory)
class GuardedSite(WrappingFactory):
    """The WebSocket port's factory: connections counted from the accept."""

    protocol = HandshakeGuard

    def __init__(self, site, mqtt_factory, reads_bodies=False):
        super().__init__(site)
        # Whether anything behind it reads a request body (the dashboard's API).
        self.reads_bodies = reads_bodies
        self.mqtt_factory = mqtt_factory
        self.router = mqtt_factory.router
        self.clock = mqtt_factory.clock
        self.noisy = False

    @property
    def limits(self):
        # Read when used: a reload replaces the MQTT factory's.
        return self.mqtt_factory.limits

    def buildProtocol(self, addr):
        if not self.mqtt_factory.accepts(addr):
            return None
        self.router.stats.handshakes += 1
        return super().buildProtocol(addr)

    def handshake_done(self, guard):
        self.router.stats.handshakes -= 1

    def acceptableProtocols(self):
        # TLS offers the site's protocols by ALPN (browsers ask for it).
        return self.wrappedFactory.acceptableProtocols()

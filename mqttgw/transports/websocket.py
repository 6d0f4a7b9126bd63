"""
MQTT over WebSocket (autobahn): binary messages carry the MQTT byte
stream, so a packet may span messages and a message may hold several
packets.  The same port answers plain HTTP: ``GET /healthz``.  Until a
connection has upgraded it is held to the same bounds as an MQTT one:
counted against ``max_connections``, closed if not upgraded within
``connect_timeout``, and never allowed to send more than a request's worth
of bytes.
"""

import json
import time
from ipaddress import ip_address, ip_network

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from autobahn.websocket.xormasker import create_xor_masker
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IProtocolNegotiationFactory, ISSLTransport
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from zope.interface import directlyProvides, implementer, providedBy

from mqttgw.transports.httpguard import HostNames, HostSite
from mqttgw.wire.printable import printable

log = Logger()

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
# Offered by the gateway's dashboard page: MQTT, sent at most
# page_delivery_rate messages a second.
DASHBOARD_SUBPROTOCOL = "mqttgw-dashboard"
_INPUT_SLICE = 2048
# Work per connection per reactor turn, in frames of a packet or more:
# 256, as the MQTT side takes 256 packets a turn.  A frame too small for
# any packet but PINGREQ and DISCONNECT costs about as much to take as
# one of a packet, so it counts for more (a packet dripped a byte a frame
# must not take a whole turn), and one that goes through autobahn's
# parser, several times slower, for more again.
FRAMES_PER_TURN = 256
_TINY_FRAME = 4
_TINY_FRAME_COST = 4
_AUTOBAHN_FRAME_COST = 8
_OPEN = WebSocketProtocol.STATE_OPEN
_SEND_GROUND = WebSocketProtocol.SEND_STATE_GROUND
# Below this many bytes a frame is unmasked with one integer XOR, above it
# by autobahn's native masker (whose set-up costs more than small frames).
_SMALL_FRAME = 2048
# First bytes of the frames the fast path takes: binary data, whole or
# fragmented, and ping and pong (always final, never compressed).
_FAST_FRAMES = frozenset((0x82, 0x02, 0x00, 0x80, 0x89, 0x8A))


def _unmask(payload, mask):
    n = len(payload)
    if n > _SMALL_FRAME:
        return create_xor_masker(mask, n).process(bytes(payload))
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def _unmask_all(masked, keys):
    """Small frames' payloads, each beside its key: unmasked with one XOR."""
    payload = b"".join(masked)
    n = len(payload)
    return (int.from_bytes(payload, "little") ^ int.from_bytes(b"".join(keys), "little")).to_bytes(n, "little")


def _frame_header(n):
    """A final, unmasked binary frame's header (a server's frames are not masked)."""
    if n < 126:
        return bytes((0x82, n))
    if n < 65536:
        return b"\x82\x7e" + n.to_bytes(2, "big")
    return b"\x82\x7f" + n.to_bytes(8, "big")


class _Transport:
    """What the MQTT protocol sees as its transport: one WebSocket."""

    def __init__(self, websocket, peer, max_message_size):
        self._websocket = websocket
        self._peer = peer
        self._max_message_size = max_message_size
        self.disconnecting = False

    def write(self, data):
        if self.disconnecting:
            return
        websocket = self._websocket
        if websocket.state != _OPEN:
            # Closing already (the peer broke a WebSocket rule, say):
            # there is no one to write to.
            return
        if (
            websocket._perMessageCompress is None
            and websocket.send_state == _SEND_GROUND
            and not websocket.send_queue
        ):
            # The common case, framed here: autobahn's sendMessage costs
            # several times the write itself (checks, statistics, a debug
            # line formatted for every frame).
            write = websocket.transport.writeSequence
            if len(data) <= self._max_message_size:
                write((_frame_header(len(data)), data))
            else:
                for chunk in self._messages(data):
                    write((_frame_header(len(chunk)), chunk))
        else:
            for chunk in self._messages(data):
                websocket.sendMessage(chunk, isBinary=True)

    def _messages(self, data):
        # MQTT packets may span messages: output larger than the peer's
        # message limit goes in several.
        size = self._max_message_size
        return (data[start : start + size] for start in range(0, len(data), size))

    def writeSequence(self, data):
        self.write(b"".join(data))

    def loseConnection(self):
        if not self.disconnecting:
            self.disconnecting = True
            self._websocket.sendClose()

    def abortConnection(self):
        self.disconnecting = True
        self._websocket.dropConnection(abort=True)

    def getPeer(self):
        return self._peer

    def getHost(self):
        return self._websocket.transport.getHost()

    def registerProducer(self, producer, streaming):
        # The bytes end up in the TCP (or TLS) transport below; it is the
        # one whose buffer fills when the browser reads too slowly.  The
        # HTTP channel that carried the upgrade is still registered there.
        below = self._websocket.transport
        try:
            below.registerProducer(producer, streaming)
        except RuntimeError:
            below.unregisterProducer()
            below.registerProducer(producer, streaming)

    def unregisterProducer(self):
        self._websocket.transport.unregisterProducer()

    # Reading: the MQTT protocol stops reading from a peer that does not
    # read what it is sent.

    def pauseProducing(self):
        below = self._websocket.transport
        if below is not None:
            below.pauseProducing()

    def resumeProducing(self):
        below = self._websocket.transport
        # Input the WebSocket layer put off keeps reading paused too.
        if below is not None and self._websocket._backlog is None:
            below.resumeProducing()

    def setTcpNoDelay(self, enabled):
        setter = getattr(self._websocket.transport, "setTcpNoDelay", None)
        if setter is not None:
            setter(enabled)

    def getPeerCertificate(self):
        getter = getattr(self._websocket.transport, "getPeerCertificate", None)
        return getter() if getter is not None else None


class MQTTWebSocketProtocol(WebSocketServerProtocol):
    _mqtt = None
    _peer = None
    _own_page = False

    def onConnect(self, request):
        self._peer = self._client_address(request)
        origin = request.headers.get("origin")
        if origin is not None and not self.factory.origin_allowed(
            origin, request.headers.get("host"), self.transport.getHost()
        ):
            log.info(
                "refusing WebSocket from {peer}: origin {origin} is not allowed",
                peer=_peer_text(self._peer),
                origin=printable(origin),
            )
            self.factory.mqtt_factory.router.stats.connections_refused += 1
            raise ConnectionDeny(403, "origin not allowed")
        if self.factory.page_delivery_rate and DASHBOARD_SUBPROTOCOL in request.protocols:
            # The dashboard page says so (see broker.delivery_budget).
            self._own_page = True
            return DASHBOARD_SUBPROTOCOL
        # Offer-less clients still connect; otherwise one MQTT subprotocol.
        for offered in request.protocols:
            if offered in SUBPROTOCOLS:
                return offered
        return None

    def _client_address(self, request):
        peer = self.transport.getPeer()
        forwarded = request.headers.get("x-forwarded-for")
        host = getattr(peer, "host", None)
        if forwarded and self.factory.is_trusted_proxy(host):
            # The right-most address is the one our trusted proxy saw.
            client = forwarded.split(",")[-1].strip()
            try:
                address = ip_address(client)
            except ValueError:
                log.warn(
                    "ignoring malformed X-Forwarded-For {value!r} from {proxy}",
                    value=forwarded,
                    proxy=host,
                )
                return peer
            cls = IPv6Address if address.version == 6 else IPv4Address
            return cls("TCP", client, 0)
        return peer

    def onOpen(self):
        # The connection was counted against the limit when it was accepted.
        mqtt = self._mqtt = self.factory.mqtt_factory.admit(self._peer)
        mqtt.listener_kind = "wss" if self.factory.isSecure else "ws"
        if self._own_page:
            mqtt.max_delivery_rate = self.factory.page_delivery_rate
        self._transport = _Transport(self, self._peer, self.maxMessagePayloadSize)
        mqtt.makeConnection(self._transport)

    _frames = 0
    # Input put off to a later reactor turn, reading paused meanwhile: the
    # buffers (the first one resumes at _backlog_at), or None.
    _backlog = None
    _backlog_at = 0
    # A small frame the last read cut short, kept to be completed by the
    # next one rather than handed to autobahn (whose parser then takes
    # every frame after it, at several times the cost).
    _partial = None
    # The bytes that frame needs before it can be parsed (its header, or
    # all of it).
    _partial_need = 0
    _fragment = None

    def dataReceived(self, data):
        if self._backlog is not None:
            self._backlog.append(data)
            return
        partial = self._partial
        if partial is not None:
            # Gathered until the frame it starts can be parsed, so a large
            # frame over many reads is copied once, not once a read.
            partial += data
            if len(partial) < self._partial_need:
                return
            self._partial = None
            data = bytes(partial)
        self._take(data, 0)

    def _take(self, data, at):
        """Handle ``data`` from offset ``at``, or put off what one turn may not take."""
        if (
            self._mqtt is not None
            and self.state == _OPEN
            and not self.data
            and self.current_frame is None
            and not self.inside_message
        ):
            at = self._simple_frames(data, at)
            if at is None or at == len(data):
                return
        self._feed(data, at)

    def _put_off(self, data, at):
        # The offset, not a copy of the rest: a read of many tiny frames
        # would otherwise be copied again on every turn it takes.
        self._backlog = [data]
        self._backlog_at = at
        self.transport.pauseProducing()
        self.factory.mqtt_factory.clock.callLater(0, self._next_turn)

    def _simple_frames(self, data, at):
        """
        The common case without autobahn: masked binary frames within the
        size limits, whole messages or fragments (MQTT is a byte stream, so
        where messages end does not matter), and pings.  Their payloads go
        to MQTT in one call.  Returns the offset of the first frame that is
        anything else (close, text, compressed), for autobahn's full
        parser, or None when the rest was put off to the next turn or the
        connection failed.
        """
        limit = self.maxFramePayloadSize
        size = len(data)
        view = memoryview(data)
        payloads = []
        # The small data frames' payloads since the last large one, still
        # masked, and their keys: unmasked together, not a frame at a time.
        masked = []
        keys = []
        frames = 0
        # Bytes so far of a fragmented message, or None outside one.
        fragment = self._fragment
        # A frame the read cut short, to complete with the next read: (its
        # offset, the bytes it needs), or None.
        cut = None
        while frames < FRAMES_PER_TURN and at < size:
            first = data[at]
            if first == 0x82:
                if fragment is not None:
                    # A new message inside one.
                    break
            elif first not in _FAST_FRAMES:
                break
            elif first < 0x89:
                if (fragment is None) != (first == 0x02):
                    # A continuation outside a message, or a new message
                    # inside one.
                    break
            if at + 2 > size:
                cut = (at, 6)
                break
            length = data[at + 1] ^ 0x80
            header = 6
            if length >= 126:
                if length == 126:
                    header, minimum = 8, 126
                elif length == 127:
                    header, minimum = 14, 65536
                else:  # not masked
                    break
                if first >= 0x89:
                    break
            if at + header > size:
                cut = (at, header)
                break
            if header != 6:
                length = int.from_bytes(view[at + 2 : at + header - 4], "big")
                if length < minimum:
                    break
            if limit and (length > limit or (fragment is not None and fragment + length > limit)):
                break
            if at + header + length > size:
                # A small frame, or a fragment of a message this path has
                # begun (autobahn could not take it up halfway): kept whole.
                # Larger frames are autobahn's, which streams them.
                if header + length <= _SMALL_FRAME or fragment is not None:
                    cut = (at, header + length)
                break
            start = at + header
            at = start + length
            frames += 1 if length >= _TINY_FRAME else _TINY_FRAME_COST
            if first >= 0x89:
                if first == 0x89:
                    self.sendPong(_unmask(view[start:at], data[start - 4 : start]))
                continue
            if length > _SMALL_FRAME:
                if masked:
                    payloads.append(_unmask_all(masked, keys))
                    masked, keys = [], []
                payloads.append(_unmask(view[start:at], data[start - 4 : start]))
            else:
                masked.append(view[start:at])
                keys.append((data[start - 4 : start] * ((length >> 2) + 1))[:length])
            if first != 0x82:
                fragment = None if first & 0x80 else (fragment or 0) + length
        if masked:
            payloads.append(_unmask_all(masked, keys))
        self._fragment = fragment
        if cut is not None:
            at, self._partial_need = cut
            self._partial = bytearray(view[at:])
            at = size
        if payloads:
            self._mqtt.dataReceived(payloads[0] if len(payloads) == 1 else b"".join(payloads))
            if self.transport is None:
                return None
        if at < size:
            if frames >= FRAMES_PER_TURN:
                # Fair to the others: the rest on the next reactor turn.
                self._put_off(data, at)
                return None
            if fragment is not None and data[at] != 0x88:
                # Inside a message only its continuations, a ping, a pong
                # or a close may come.
                self._fragment = None
                log.info(
                    "closing WebSocket from {peer}: frame {first:#04x} inside a fragmented message",
                    peer=_peer_text(self._peer),
                    first=data[at],
                )
                self._protocol_violation("unexpected frame inside a fragmented message")
                return None
        return at

    def _feed(self, data, at):
        # autobahn copies its unparsed input after every frame it takes off
        # the front, which makes one read of many small frames quadratic:
        # fed in small slices, each copy stays short.  Past FRAMES_PER_TURN
        # frames the rest waits for the next reactor turn, reading paused,
        # so tiny frames cannot take a whole turn.
        self._frames = 0
        size = len(data)
        view = memoryview(data)
        for start in range(at, size, _INPUT_SLICE):
            self._dataReceived(bytes(view[start : start + _INPUT_SLICE]) if at or size > _INPUT_SLICE else data)
            if self.transport is None:
                return
            if self._frames >= FRAMES_PER_TURN and start + _INPUT_SLICE < size:
                self._put_off(data, start + _INPUT_SLICE)
                return

    def _next_turn(self):
        backlog, self._backlog = self._backlog, None
        if self.transport is None:
            return
        data, at = backlog[0], self._backlog_at
        if len(backlog) > 1:
            # What was already on its way when reading paused.
            data, at = b"".join([memoryview(data)[at:], *backlog[1:]]), 0
        self._take(data, at)
        mqtt = self._mqtt
        if self._backlog is None and not (mqtt is not None and mqtt.reading_paused):
            self.transport.resumeProducing()

    def onFrameBegin(self):
        self._frames += _AUTOBAHN_FRAME_COST
        super().onFrameBegin()

    # MQTT is a byte stream, so frames are fed to it as they arrive through
    # autobahn's streaming hooks, without assembling whole messages.

    def onMessageBegin(self, isBinary):
        super().onMessageBegin(isBinary)
        if self._mqtt is not None and not isBinary:
            log.warn(
                "closing WebSocket from {peer}: MQTT needs binary messages",
                peer=_peer_text(self._peer),
            )
            self._mqtt.protocol_error("text WebSocket message")

    def onMessageFrameData(self, payload):
        if self._mqtt is not None and self.message_is_binary and not self.failedByMe:
            self._mqtt.dataReceived(payload)

    def onMessageFrameEnd(self):
        pass

    def onMessageEnd(self):
        pass

    def onClose(self, wasClean, code, reason):
        mqtt, self._mqtt = self._mqtt, None
        if mqtt is not None:
            self._transport.disconnecting = True
            error = ConnectionDone if wasClean else ConnectionLost
            mqtt.connectionLost(Failure(error(f"WebSocket closed ({code})")))


class MQTTWebSocketFactory(WebSocketServerFactory):
    protocol = MQTTWebSocketProtocol

    def __init__(
        self,
        mqtt_factory,
        max_message_size,
        trusted_proxies=(),
        compression=False,
        allowed_origins=(),
        secure=False,
        page_delivery_rate=0,
        hosts=None,
    ):
        super().__init__(protocols=[*SUBPROTOCOLS, DASHBOARD_SUBPROTOCOL])
        # The names the listener answers to (see transports.httpguard).
        self.hosts = hosts if hosts is not None else HostNames()
        self.mqtt_factory = mqtt_factory
        # Messages a second sent at most to the dashboard page, where one is
        # served (0: none is).
        self.page_delivery_rate = page_delivery_rate
        self.trusted_proxies = [
            p if not isinstance(p, str) else ip_network(p, strict=False) for p in trusted_proxies
        ]
        self.allowed_origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self.secure = secure
        options = dict(
            maxFramePayloadSize=max_message_size,
            maxMessagePayloadSize=max_message_size,
            # Browsers and proxies close idle sockets; MQTT keepalive covers it.
            openHandshakeTimeout=10,
            failByDrop=False,
            # Origins are checked in onConnect (origin_allowed), which also
            # knows the gateway's own origin.
            allowedOrigins=["*"],
            allowNullOrigin=True,
        )
        if compression:
            from autobahn.websocket.compress import (
                PerMessageDeflateOffer,
                PerMessageDeflateOfferAccept,
            )

            def accept(offers):
                for offer in offers:
                    if isinstance(offer, PerMessageDeflateOffer):
                        return PerMessageDeflateOfferAccept(offer)

            options["perMessageCompressionAccept"] = accept
        self.setProtocolOptions(**options)

    def is_trusted_proxy(self, host):
        """Whether ``host`` is, or is in a network of, ``trusted_proxies``."""
        if not self.trusted_proxies or host is None:
            return False
        try:
            address = ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.trusted_proxies)

    def origin_allowed(self, origin, host, local):
        """
        Whether a page from ``origin`` may connect to the listener reached
        at ``local`` (its address) with ``host`` (the Host header).
        Without this check any page a user happens to open could talk to a
        broker on their network (MQTT over WebSocket has no other defence
        against that): by default only pages of the listener's own names
        (see HostNames; a page of a name re-pointed at this machine is not
        one), plus ``allowed_origins`` (exact origins, or ``*`` for any).
        """
        return self.hosts.origin_allowed(origin, host, local, self.secure, self.allowed_origins)


class Health(Resource):
    """``GET /healthz``: 200 and a small JSON status while the router runs."""

    isLeaf = True

    def __init__(self, router, clock):
        super().__init__()
        self.router = router
        self.clock = clock
        self.started = time.time()

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"x-content-type-options", b"nosniff")
        router = self.router
        status = {
            "status": "ok",
            "uptime_s": round(time.time() - self.started, 1),
            "sessions": len(router.sessions),
            "subscriptions": router.subscriptions.count,
            "retained": len(router.retained),
            **router.stats.as_dict(),
        }
        return json.dumps(status).encode()


class _Root(Resource):
    """
    ``/healthz`` for HTTP; with a dashboard, requests that do not ask for
    a WebSocket are the dashboard's; every other path is the MQTT
    WebSocket.
    """

    def __init__(self, websocket, health, dashboard=None):
        super().__init__()
        self._websocket = websocket
        self._health = health
        self._dashboard = dashboard

    def _is_page(self, request):
        upgrade = request.getHeader(b"upgrade")
        if self._dashboard is None or (upgrade is not None and upgrade.lower() == b"websocket"):
            return False
        # One request per connection: the guard's deadline and byte budget
        # are for one handshake, not a page's keep-alive.
        request.channel.persistent = False
        request.setHeader(b"connection", b"close")
        return True

    def getChild(self, path, request):
        if request.path == b"/healthz":
            return self._health
        if self._is_page(request):
            return self._dashboard.getChildWithDefault(path, request)
        return self._websocket

    def render(self, request):
        if self._is_page(request):
            return self._dashboard.render(request)
        return self._websocket.render(request)


# Bytes a connection may send before its upgrade: a request line and
# headers (twisted.web allows 16 KiB of them) and a small body.
MAX_REQUEST_BYTES = 64 * 1024
# The largest request body taken: only the dashboard's API reads one (a
# sign-in, a publish form), and only where the dashboard is served.
MAX_BODY_BYTES = 16 * 1024


class _HandshakeGuard(ProtocolWrapper):
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
                 peer=_peer_text(self.transport.getPeer()), reason=reason)
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
                peer=_peer_text(self.transport.getPeer()),
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


def _peer_text(peer):
    host = getattr(peer, "host", None)
    return f"{host}:{peer.port}" if host else str(peer)


@implementer(IProtocolNegotiationFactory)
class _GuardedSite(WrappingFactory):
    """The WebSocket port's factory: connections counted from the accept."""

    protocol = _HandshakeGuard

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


def websocket_resource(
    mqtt_factory,
    max_message_size,
    trusted_proxies=(),
    compression=False,
    allowed_origins=(),
    secure=False,
    page_delivery_rate=0,
    hosts=None,
):
    """MQTT over WebSocket as a twisted.web resource."""
    return WebSocketResource(
        MQTTWebSocketFactory(
            mqtt_factory, max_message_size, trusted_proxies, compression, allowed_origins, secure,
            page_delivery_rate, hosts,
        )
    )


def websocket_site(
    mqtt_factory, router, clock, max_message_size, trusted_proxies=(), compression=False,
    allowed_origins=(), secure=False, page_delivery_rate=0, dashboard=None, hosts=None,
):
    """
    The WebSocket port's factory: a twisted.web Site serving MQTT over
    WebSocket (the options as :func:`websocket_resource` takes them),
    /healthz and the ``dashboard`` (a resource) if any, behind the guard
    that bounds connections that have not upgraded yet.  Requests other
    than the MQTT upgrade (whose Origin is checked instead) must name one
    of ``hosts``, and changes come only from the listener's own pages.
    """
    hosts = hosts if hosts is not None else HostNames()
    ws = websocket_resource(
        mqtt_factory, max_message_size, trusted_proxies, compression, allowed_origins, secure,
        page_delivery_rate, hosts,
    )
    site = HostSite(
        _Root(ws, Health(router, clock), dashboard), hosts, secure, allowed_origins,
        upgrades_by_origin=True,
    )
    return _GuardedSite(site, mqtt_factory, reads_bodies=dashboard is not None)

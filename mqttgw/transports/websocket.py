"""
MQTT over WebSocket (autobahn): binary messages carry the MQTT byte
stream, so a packet may span messages and a message may hold several
packets.  The same port answers plain HTTP (transports.wsroutes:
``GET /healthz``).  Until a connection has upgraded it is held to the
same bounds as an MQTT one (transports.wsguard): counted against
``max_connections``, closed if not upgraded within ``connect_timeout``,
and never allowed to send more than a request's worth of bytes.  The
common frames are read by transports.wsframes, the rest by autobahn.
"""

from ipaddress import ip_address, ip_network

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttgw.transports.httpguard import HostNames, HostSite
from mqttgw.transports.wsframes import FRAMES_PER_TURN, frame_header, scan
from mqttgw.transports.wsguard import GuardedSite, peer_text
from mqttgw.transports.wsroutes import Health, Root
from mqttgw.wire.printable import printable

log = Logger()

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
# Offered by the gateway's dashboard page: MQTT, sent at most
# page_delivery_rate messages a second.
DASHBOARD_SUBPROTOCOL = "mqttgw-dashboard"
_INPUT_SLICE = 2048
# A frame that goes through autobahn's parser, several times slower than
# wsframes' scan, counts for more against FRAMES_PER_TURN.
_AUTOBAHN_FRAME_COST = 8
_OPEN = WebSocketProtocol.STATE_OPEN
_SEND_GROUND = WebSocketProtocol.SEND_STATE_GROUND


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
                write((frame_header(len(data)), data))
            else:
                for chunk in self._messages(data):
                    write((frame_header(len(chunk)), chunk))
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
        if below is not None and self._websocket._reads_put_off is None:
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
                peer=peer_text(self._peer),
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
    # buffers (the first one resumes at _reads_put_off_at), or None.
    _reads_put_off = None
    _reads_put_off_at = 0
    # A small frame the last read cut short, kept to be completed by the
    # next one rather than handed to autobahn (whose parser then takes
    # every frame after it, at several times the cost).
    _partial = None
    # The bytes that frame needs before it can be parsed (its header, or
    # all of it).
    _partial_need = 0
    _fragment = None

    def dataReceived(self, data):
        if self._reads_put_off is not None:
            self._reads_put_off.append(data)
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
        self._reads_put_off = [data]
        self._reads_put_off_at = at
        self.transport.pauseProducing()
        self.factory.mqtt_factory.clock.callLater(0, self._next_turn)

    def _simple_frames(self, data, at):
        """
        The common case without autobahn (see transports.wsframes): the
        payloads go to MQTT in one call.  Returns the offset of the first
        frame that is anything else, for autobahn's full parser, or None
        when the rest was put off to the next turn or the connection failed.
        """
        found = scan(data, at, self.maxFramePayloadSize, self._fragment)
        for ping in found.pings:
            self.sendPong(ping)
        at, frames, fragment, cut = found.at, found.frames, found.fragment, found.cut
        self._fragment = fragment
        size = len(data)
        if cut is not None:
            at, self._partial_need = cut
            self._partial = bytearray(memoryview(data)[at:])
            at = size
        if found.payload is not None:
            self._mqtt.dataReceived(found.payload)
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
                    peer=peer_text(self._peer),
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
        reads, self._reads_put_off = self._reads_put_off, None
        if self.transport is None:
            return
        data, at = reads[0], self._reads_put_off_at
        if len(reads) > 1:
            # What was already on its way when reading paused.
            data, at = b"".join([memoryview(data)[at:], *reads[1:]]), 0
        self._take(data, at)
        mqtt = self._mqtt
        if self._reads_put_off is None and not (mqtt is not None and mqtt.reading_paused):
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
                peer=peer_text(self._peer),
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
        Root(ws, Health(router, clock), dashboard), hosts, secure, allowed_origins,
        upgrades_by_origin=True,
    )
    return GuardedSite(site, mqtt_factory, reads_bodies=dashboard is not None)

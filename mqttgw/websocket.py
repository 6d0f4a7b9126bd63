"""
MQTT over WebSocket (autobahn): binary messages carry the MQTT byte
stream, so a packet may span messages and a message may hold several
packets.  The same port answers plain HTTP: ``GET /healthz``.
"""

import json
import time
from ipaddress import ip_address

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Site

log = Logger()

SUBPROTOCOLS = ("mqtt", "mqttv3.1")


class _Transport:
    """What the MQTT protocol sees as its transport: one WebSocket."""

    def __init__(self, websocket, peer):
        self._websocket = websocket
        self._peer = peer
        self.disconnecting = False

    def write(self, data):
        if not self.disconnecting:
            self._websocket.sendMessage(data, isBinary=True)

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

    def onConnect(self, request):
        self._peer = self._client_address(request)
        # Offer-less clients still connect; otherwise one MQTT subprotocol.
        for offered in request.protocols:
            if offered in SUBPROTOCOLS:
                return offered
        return None

    def _client_address(self, request):
        peer = self.transport.getPeer()
        forwarded = request.headers.get("x-forwarded-for")
        host = getattr(peer, "host", None)
        if forwarded and host in self.factory.trusted_proxies:
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
        mqtt = self.factory.mqtt_factory.buildProtocol(self._peer)
        if mqtt is None:
            self.dropConnection(abort=True)
            return
        self._mqtt = mqtt
        self._transport = _Transport(self, self._peer)
        mqtt.makeConnection(self._transport)

    # MQTT is a byte stream, so frames are fed to it as they arrive through
    # autobahn's streaming hooks, without assembling whole messages.

    def onMessageBegin(self, isBinary):
        super().onMessageBegin(isBinary)
        if self._mqtt is not None and not isBinary:
            log.warn(
                "closing WebSocket from {peer}: MQTT needs binary messages",
                peer=self._peer,
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

    def __init__(self, mqtt_factory, max_message_size, trusted_proxies=(), compression=False):
        super().__init__(protocols=list(SUBPROTOCOLS))
        self.mqtt_factory = mqtt_factory
        self.trusted_proxies = frozenset(trusted_proxies)
        options = dict(
            maxFramePayloadSize=max_message_size,
            maxMessagePayloadSize=max_message_size,
            # Browsers and proxies close idle sockets; MQTT keepalive covers it.
            openHandshakeTimeout=10,
            failByDrop=False,
            # Like mosquitto, any page may connect: MQTT authenticates in
            # CONNECT, not with cookies, so an Origin check guards nothing.
            # "null" is what pages opened from files and sandboxes send.
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
    """``/healthz`` for HTTP; every other path is the MQTT WebSocket."""

    def __init__(self, websocket, health):
        super().__init__()
        self._websocket = websocket
        self._health = health

    def getChild(self, path, request):
        if request.path == b"/healthz":
            return self._health
        return self._websocket

    def render(self, request):
        return self._websocket.render(request)


def websocket_site(mqtt_factory, router, clock, max_message_size, trusted_proxies=(), compression=False):
    """A twisted.web Site serving MQTT over WebSocket and /healthz."""
    ws = MQTTWebSocketFactory(mqtt_factory, max_message_size, trusted_proxies, compression)
    site = Site(_Root(WebSocketResource(ws), Health(router, clock)))
    site.noisy = False
    return site

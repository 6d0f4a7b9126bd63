"""
The client side of MQTT on Twisted, as bridges use it: CONNECT with a
will, keepalive pings, and the packets of both QoS flows handed to a
handler, over 3.1, 3.1.1 or 5.0.  Framing is shared with the server
(:mod:`mqttgw.wire.framing`).
"""

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from mqttgw.bridges.versions import Upstream3
from mqttgw.transports.schedulers import Stalls
from mqttgw.wire import packets as P
from mqttgw.wire.framing import ProtocolViolation

log = Logger()

# A link's version when none is given: 3.1/3.1.1 (no settings needed).
_V3 = Upstream3(None)


class ConnectRefused(Exception):
    """
    The broker answered CONNECT with a refusal: a 3.1/3.1.1 return code, or
    a 5.0 reason code, as ``text`` says (see bridges.versions).
    """

    def __init__(self, code, text, properties=None):
        super().__init__(text)
        self.code = code
        properties = properties or {}
        # 5.0: why, and where to go instead, if the upstream said.
        self.reason_string = properties.get("reason_string")
        self.server_reference = properties.get("server_reference")


class MQTTClientProtocol(Protocol):
    """
    ``handler`` receives ``connected(protocol)``, ``packet(protocol,
    packet)`` for every packet after CONNACK, and ``disconnected(protocol,
    reason)``.  ``connack`` fires with the CONNACK, or fails.  ``version``:
    what differs with the version ``connect`` speaks (bridges.versions),
    3.1/3.1.1's unless given.
    """

    def __init__(self, connect, handler, clock, max_packet_size=P.MAX_REMAINING_LENGTH + 5, version=None):
        self.connect_packet = connect
        self.handler = handler
        self.clock = clock
        self.version = version = version if version is not None else _V3
        self.framer = version.framer(connect, max_packet_size)
        # Fires with the CONNACK, or fails (refused, or lost before it).
        self.connack = Deferred()
        # Fires once the connection is lost, whenever that is, with why
        # (the exception, not a Failure: nothing waiting on it fails).
        self.lost = Deferred()
        # The upstream's last DISCONNECT (5.0: its reason code).
        self.disconnect_packet = None
        # 5.0: the server's CONNACK properties, its limits among them.
        self.server_properties = {}
        # The keepalive in use: ours, or the server's keep alive (5.0).
        self.keepalive = connect.keepalive
        # Whether the server had a session for us (CONNACK).
        self.session_present = False
        # A close under way: aborted if the server does not finish it.
        self._closing = None
        self.is_connected = False
        self._ping = None
        self._last_received = 0.0
        # While a read is handled, what it answers (acknowledgements, the
        # messages a bridge sends as its window opens) goes out in one write.
        self._out = None

    def connectionMade(self):
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        self.transport.write(self.connect_packet.encode())

    def write(self, data):
        if self._out is not None:
            self._out.append(data)
        else:
            self.transport.write(data)

    def dataReceived(self, data):
        self._last_received = self.clock.seconds()
        out = self._out = []
        try:
            for packet in self.framer.feed(data):
                if not self.is_connected:
                    self._connack(packet)
                else:
                    if type(packet) is P.Disconnect:
                        self.disconnect_packet = packet
                    self.handler.packet(self, packet)
        except ProtocolViolation as e:
            log.warn("upstream sent a malformed packet: {reason}", reason=str(e))
            disconnect = self.version.closing(e.reason_code) if self.is_connected else None
            if disconnect is not None:
                # Said why before closing: the DISCONNECT goes out, then
                # the connection closes, aborted if that takes long.
                out.append(disconnect)
                self.transport.write(b"".join(out))
                out.clear()
                self._close_gracefully()
            else:
                self.transport.abortConnection()
        except Exception:
            log.failure("error handling a packet from upstream")
            self.transport.abortConnection()
        finally:
            self._out = None
            if out:
                self.transport.write(b"".join(out))

    def disconnect(self):
        """Ends the link with DISCONNECT: the upstream discards the will."""
        self.transport.write(P.Disconnect().encode())
        self._close_gracefully()

    def _close_gracefully(self, timeout=5.0):
        if self._closing is None:
            self.transport.loseConnection()
            self._closing = self.clock.callLater(timeout, self.transport.abortConnection)

    def _connack(self, packet):
        if not isinstance(packet, P.Connack):
            raise ProtocolViolation(f"expected CONNACK, got {type(packet).__name__}")
        if packet.return_code:
            self.connack.errback(ConnectRefused(
                packet.return_code, self.version.refused(packet.return_code),
                packet.properties,
            ))
            self.transport.loseConnection()
            return
        self.is_connected = True
        self.session_present = packet.session_present
        self.server_properties = self.version.accepted(packet)
        # The server's keep alive (5.0) overrides ours ([MQTT-3.1.2-21]).
        keepalive = self.keepalive = self.server_properties.get("server_keep_alive", self.connect_packet.keepalive)
        if keepalive:
            self._ping = self.clock.callLater(keepalive, self._keepalive)
        self.connack.callback(packet)
        self.handler.connected(self)

    def _keepalive(self):
        # Ping every keepalive; silence for 1.5 keepalives means it is gone.
        keepalive = self.keepalive
        now = self.clock.seconds()
        late = now - self._ping.getTime()
        if late > Stalls.LATE:
            # This process did not run meanwhile (see Stalls): the
            # upstream's answers may wait unread, and the time is not
            # its silence.
            self._last_received = min(now, self._last_received + late)
        if now - self._last_received > keepalive * 1.5:
            log.warn("upstream silent for {s}s: closing", s=keepalive * 1.5)
            self._ping = None
            self.transport.abortConnection()
            return
        self.transport.write(P.Pingreq().encode())
        self._ping = self.clock.callLater(keepalive / 2, self._keepalive)

    def connectionLost(self, reason):
        if self._ping is not None and self._ping.active():
            self._ping.cancel()
        self._ping = None
        if self._closing is not None and self._closing.active():
            self._closing.cancel()
        if not self.connack.called:
            self.connack.errback(reason)
        if self.is_connected:
            self.is_connected = False
            self.handler.disconnected(self, reason)
        self.lost.callback(reason.value)


class MQTTClientFactory(Factory):
    # No "Starting factory <... object at 0x...>" at each reconnection.
    noisy = False

    def __init__(self, connect, handler, clock, version=None):
        self.connect_packet = connect
        self.handler = handler
        self.clock = clock
        self.version = version

    def buildProtocol(self, addr):
        protocol = MQTTClientProtocol(self.connect_packet, self.handler, self.clock, version=self.version)
        protocol.factory = self
        return protocol

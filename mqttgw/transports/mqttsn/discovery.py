"""
Gateway discovery (MQTT-SN 1.2 section 6.1): ADVERTISE on the multicast
group every ``advertise_interval`` seconds, and GWINFO answering a
SEARCHGW heard on the group, to the group and to the asking address.
Nothing is sent to a client's own address unasked (a client waiting for
an answer takes any datagram for it).
"""

from twisted.internet.error import CannotListenError
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqttgw.wire.mqttsn import Advertise, GwInfo, MalformedDatagram, SearchGw, decode

log = Logger()


class MulticastDiscovery(DatagramProtocol):
    """The group's datagrams: SEARCHGW answered, anything else (our own ADVERTISE too) ignored."""

    noisy = False

    def __init__(self, gateway_id, group, port):
        self.gateway_id = gateway_id
        self.group = group
        self.port = port

    def logPrefix(self):
        return "MQTT-SN discovery"

    def datagramReceived(self, data, addr):
        try:
            message = decode(data, 255)
        except MalformedDatagram:
            return
        if type(message) is SearchGw:
            # Three bytes each, as the SEARCHGW was.
            answer = GwInfo(self.gateway_id).encode()
            self.transport.write(answer, (self.group, self.port))
            self.transport.write(answer, addr)

    def advertise(self, interval):
        self.transport.write(Advertise(self.gateway_id, interval).encode(), (self.group, self.port))


class Discovery:
    """
    The discovery of one listener: ``multicast`` is (group, port) or None
    (off); ``interface`` the IPv4 address the group is joined and sent on
    ("": the system's choice).
    """

    def __init__(self, reactor, gateway_id, multicast, interval, interface=""):
        self.reactor = reactor
        self.gateway_id = gateway_id
        self.multicast = multicast
        # ADVERTISE's Duration field is 16 bits.
        self.interval = max(1, min(int(interval), 0xFFFF))
        self.interface = interface
        self.protocol = None
        self._port = None
        self._loop = None

    def start(self):
        if self.multicast is None:
            return
        group, port = self.multicast
        self.protocol = MulticastDiscovery(self.gateway_id, group, port)
        try:
            self._port = self.reactor.listenMulticast(port, self.protocol, listenMultiple=True)
        except CannotListenError as e:
            # The listener serves its clients without discovery.
            log.error("MQTT-SN discovery: cannot listen on port {port}: {error}; going on without it",
                      port=port, error=str(e.socketError))
            return
        if self.interface:
            self._port.setOutgoingInterface(self.interface)
        joined = self._port.joinGroup(group, self.interface or "0.0.0.0")
        joined.addErrback(self._not_joined, group)
        self._loop = LoopingCall(self.protocol.advertise, self.interval)
        self._loop.clock = self.reactor
        self._loop.start(self.interval, now=True).addErrback(
            lambda failure: log.failure("MQTT-SN ADVERTISE failed", failure)
        )
        log.info("MQTT-SN discovery on {group}:{port}, ADVERTISE every {interval}s", group=group,
                 port=port, interval=self.interval)

    def _not_joined(self, failure, group):
        log.error("MQTT-SN discovery: cannot join {group}: {error}", group=group, error=failure.getErrorMessage())

    def stop(self):
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        port, self._port = self._port, None
        if port is not None:
            return port.stopListening()
        return None

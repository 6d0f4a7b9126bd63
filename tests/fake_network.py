"""
Both ends of a gateway's connections without sockets, on a
MemoryReactorClock: local MQTT clients of a router (the fake clients of
mqttgw.testing), and the upstream brokers a bridge dials, answered or
refused by the test.
"""

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttgw.testing import FakeClient
from mqttgw.transports.protocol import ConnectionLimits, MQTTServerFactory
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer


class Listener:
    """
    What a FakeClient connects to: an MQTT server factory and the clock
    its reactor turns are made with (the MemoryReactorClock).
    """

    def __init__(self, factory, clock):
        self.factory = factory
        self.clock = clock
        self._port = 40000

    @classmethod
    def of(cls, router, reactor, **limits):
        return cls(MQTTServerFactory(router, ConnectionLimits(**limits), reactor), reactor)

    def client(self, client_id, **connect_fields):
        """A client that sent CONNECT and was accepted."""
        self._port += 1
        client = FakeClient(self, IPv4Address("TCP", "127.0.0.1", self._port))
        client.send(P.Connect(client_id=client_id, **connect_fields))
        assert client.received() == [P.Connack(0)]
        return client


class Upstream:
    """One connection a bridge made to an upstream, seen from the upstream."""

    def __init__(self, protocol, transport):
        self.protocol = protocol
        self.transport = transport
        self._framer = Framer(P.MAX_REMAINING_LENGTH + 5)

    def received(self):
        """Packets the bridge has written since the last call."""
        data = self.transport.value()
        self.transport.clear()
        return list(self._framer.feed(data))

    def send(self, *packets):
        self.protocol.dataReceived(b"".join(p.encode() for p in packets))

    def lose(self):
        """The connection drops."""
        self.protocol.connectionLost(Failure(ConnectionLost()))

    @property
    def closed(self):
        return self.transport.disconnecting


def attempts(reactor):
    """``host:port`` of every TCP connection attempted so far, in order."""
    return [f"{host}:{port}" for host, port, *_ in reactor.tcpClients]


def accept(reactor, index=-1):
    """The ``index``th attempt connects: the upstream's side of it."""
    host, port, factory, *_ = reactor.tcpClients[index]
    transport = StringTransport(peerAddress=IPv4Address("TCP", host, port))
    protocol = factory.buildProtocol(transport.getPeer())
    protocol.makeConnection(transport)
    return Upstream(protocol, transport)


def refuse(reactor, index=-1):
    """Nothing listens at the ``index``th attempt's address."""
    host, port, factory, *_ = reactor.tcpClients[index]
    factory.clientConnectionFailed(None, Failure(ConnectionRefusedError(host, port)))

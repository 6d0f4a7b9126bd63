"""
The listeners' TCP transport (mqttgw.transports.tcpserver.Server): what
Twisted's tcp.Server gives the layers above it, in one slotted object that
keeps no strings, buffer or flags of its own while idle; and the ports
that make them (mqttgw.transports.tcp).
"""

import socket
import sys
from types import SimpleNamespace

import pytest
from twisted.internet import address, reactor
from twisted.internet.error import ConnectionAborted, ConnectionDone
from twisted.internet.interfaces import (
    IConsumer,
    IHalfCloseableDescriptor,
    IPushProducer,
    IReadWriteDescriptor,
    ISystemHandle,
    ITCPTransport,
)
from twisted.internet.main import CONNECTION_DONE
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from zope.interface.verify import verifyObject

from mqttgw.transports import tcp as lean
from mqttgw.transports.listening import ListenerService
from mqttgw.transports.tcpserver import Server

# What a transport needs of its listening port.
PORT = SimpleNamespace(reactor=reactor, _realPortNumber=1883, _addressType=address.IPv4Address)


class Recorded(Protocol):
    """A protocol that keeps what it is told, and is a streaming producer."""

    def __init__(self):
        self.received = []
        self.lost = []
        self.paused = 0
        self.resumed = 0
        self.stopped = 0

    def dataReceived(self, data):
        self.received.append(data)

    def connectionLost(self, reason):
        self.lost.append(reason)

    def pauseProducing(self):
        self.paused += 1

    def resumeProducing(self):
        self.resumed += 1

    def stopProducing(self):
        self.stopped += 1


def lean_pair():
    ours, theirs = socket.socketpair()
    protocol = Recorded()
    transport = Server(ours, protocol, ("127.0.0.1", 40000), PORT)
    protocol.makeConnection(transport)
    # A read that would wait forever fails instead.
    theirs.settimeout(5)
    return transport, theirs


def close_pair(transport, theirs):
    reactor.removeReader(transport)
    reactor.removeWriter(transport)
    if transport.socket is not None:
        transport.socket.close()
    theirs.close()


def test_the_transport_provides_what_twisteds_tcp_server_does():
    transport, theirs = lean_pair()
    try:
        for interface in (ITCPTransport, ISystemHandle, IPushProducer, IConsumer, IReadWriteDescriptor,
                          IHalfCloseableDescriptor):
            assert verifyObject(interface, transport)
        assert transport.getPeer() == address.IPv4Address("TCP", "127.0.0.1", 40000)
        assert transport.getHandle() is transport.socket
        assert transport.connected == 1 and not transport.disconnecting and not transport.disconnected
        transport.setTcpKeepAlive(True)
        assert transport.getTcpKeepAlive()
    finally:
        close_pair(transport, theirs)


def test_an_idle_transport_keeps_no_dictionary_and_no_integer_of_its_own():
    transport, theirs = lean_pair()
    try:
        transport.registerProducer(transport.protocol, True)
        assert not hasattr(transport, "__dict__")
        # Its flags are one of the integers CPython keeps (-5 to 256).
        assert transport._flags is int(str(transport._flags)) and transport._flags <= 256
        assert transport._pending is None
    finally:
        close_pair(transport, theirs)


def test_the_transport_names_itself_and_its_descriptor_follows_its_socket():
    transport, theirs = lean_pair()
    try:
        fd = transport.socket.fileno()
        assert transport.fileno() == fd > 0
        assert transport.logPrefix() == f"Recorded,{fd},127.0.0.1"
        assert repr(transport) == f"<Recorded #{fd} on 1883>"
        transport.connectionLost(Failure(ConnectionDone()))
        assert transport.fileno() == -1 and transport.disconnected
        assert transport.logPrefix() == "Closed,-1,127.0.0.1"
    finally:
        close_pair(transport, theirs)


def test_the_protocol_is_told_once_that_the_connection_was_lost():
    transport, theirs = lean_pair()
    protocol = transport.protocol
    try:
        transport.connectionLost(Failure(ConnectionDone()))
        transport.connectionLost(Failure(ConnectionAborted()))
        assert [r.type for r in protocol.lost] == [ConnectionDone]
        # Its socket is closed: the peer reads the end of the stream.
        assert theirs.recv(16) == b""
    finally:
        close_pair(transport, theirs)


def test_the_transport_reads_into_its_protocol_and_reports_the_peers_close():
    transport, theirs = lean_pair()
    try:
        theirs.sendall(b"\x10\x00")
        assert transport.doRead() is None
        assert transport.protocol.received == [b"\x10\x00"]
        # Nothing more yet.
        assert transport.doRead() is None
        theirs.shutdown(socket.SHUT_WR)
        assert transport.doRead() is CONNECTION_DONE
    finally:
        close_pair(transport, theirs)


def test_lean_server_sends_at_once_with_nothing_waiting():
    transport, theirs = lean_pair()
    try:
        transport.write(b"\x20\x02\x00\x00")
        # Already on the wire, without a turn of the reactor.
        assert theirs.recv(16) == b"\x20\x02\x00\x00"
        assert transport._pending is None
        assert transport not in reactor.getWriters()
    finally:
        close_pair(transport, theirs)


def written_through(transport, theirs, size):
    """What ``theirs`` reads while ``transport`` writes what it buffered,
    until ``size`` bytes came (or the transport fails, or 10,000 rounds)."""
    received = bytearray()
    for _ in range(10_000):
        if transport.doWrite() is not None:
            break
        while True:
            try:
                received += theirs.recv(1 << 20)
            except BlockingIOError:
                break
        if len(received) >= size:
            break
    return bytes(received)


@pytest.mark.parametrize(
    "send, tail",
    [
        (lambda transport: transport.write(b"tail"), b"tail"),
        (lambda transport: transport.writeSequence([b"\x82\x02", b"\xd0\x00"]), b"\x82\x02\xd0\x00"),
    ],
    ids=["write", "writeSequence"],
)
def test_lean_server_keeps_order_behind_what_waits(send, tail):
    transport, theirs = lean_pair()
    theirs.setblocking(False)
    try:
        # More than the socket takes at once: the rest waits for doWrite,
        # and what is written next goes behind it.
        big = bytes(range(256)) * 40_000
        transport.write(big)
        assert len(transport._pending) > 0
        send(transport)
        assert transport in reactor.getWriters()
        assert written_through(transport, theirs, len(big) + len(tail)) == big + tail
        # All written: no buffer, and not waiting to write.
        assert transport._pending is None
        assert transport not in reactor.getWriters()
    finally:
        close_pair(transport, theirs)


def test_a_streaming_producer_is_paused_past_the_buffer_and_resumed_once_it_drained():
    transport, theirs = lean_pair()
    protocol = transport.protocol
    theirs.setblocking(False)
    try:
        transport.registerProducer(protocol, True)
        big = bytes(range(256)) * 40_000
        transport.write(big)
        assert len(transport._pending) > transport.bufferSize
        assert protocol.paused == 1 and transport.producerPaused
        # More while paused does not pause it again.
        transport.write(b"more")
        assert protocol.paused == 1 and protocol.resumed == 0
        assert written_through(transport, theirs, len(big) + 4) == big + b"more"
        assert protocol.resumed == 1 and not transport.producerPaused
        with pytest.raises(RuntimeError):
            transport.registerProducer(protocol, True)
        transport.unregisterProducer()
        assert transport.producer is None
        # A producer's end: unregistered, and the connection closes once written.
        transport.registerProducer(protocol, True)
        transport.stopConsuming()
        assert transport.producer is None and transport.disconnecting
    finally:
        close_pair(transport, theirs)


def test_a_paused_transport_is_not_read_from():
    transport, theirs = lean_pair()
    try:
        assert transport in reactor.getReaders()
        transport.pauseProducing()
        assert transport not in reactor.getReaders()
        transport.resumeProducing()
        assert transport in reactor.getReaders()
    finally:
        close_pair(transport, theirs)


def test_lose_connection_writes_what_waits_first():
    transport, theirs = lean_pair()
    theirs.setblocking(False)
    try:
        big = bytes(range(256)) * 40_000
        transport.write(big)
        transport.loseConnection()
        assert transport.disconnecting and transport not in reactor.getReaders()
        received = bytearray()
        for _ in range(10_000):
            result = transport.doWrite()
            try:
                received += theirs.recv(1 << 20)
            except BlockingIOError:
                pass
            if result is not None:
                break
        # Then the reactor is told the connection is done.
        assert result is CONNECTION_DONE
        while len(received) < len(big):
            received += theirs.recv(1 << 20)
        assert bytes(received) == big
    finally:
        close_pair(transport, theirs)


def test_lose_write_connection_ends_the_peers_stream_and_reads_on():
    transport, theirs = lean_pair()
    try:
        transport.write(b"last")
        transport.loseWriteConnection()
        assert transport.doWrite() is None
        assert theirs.recv(16) == b"last"
        assert theirs.recv(16) == b""
        # Nothing more goes out; what the peer still sends is read.
        transport.write(b"ignored")
        theirs.sendall(b"\xe0\x00")
        assert transport.doRead() is None
        assert transport.protocol.received == [b"\xe0\x00"]
    finally:
        close_pair(transport, theirs)


def test_abort_resets_the_connection_on_the_next_turn():
    from twisted.internet.task import Clock

    clock = Clock()
    # A TCP pair, for the reset.
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=5)
    accepted, peer = listener.accept()
    port = SimpleNamespace(reactor=SimpleNamespace(
        addReader=reactor.addReader, removeReader=reactor.removeReader, addWriter=reactor.addWriter,
        removeWriter=reactor.removeWriter, callLater=clock.callLater,
    ), _realPortNumber=1883, _addressType=address.IPv4Address)
    protocol = Recorded()
    transport = Server(accepted, protocol, peer, port)
    protocol.makeConnection(transport)
    try:
        transport.write(b"x" * 10)
        client.recv(16)
        transport.abortConnection()
        transport.abortConnection()
        assert transport not in reactor.getReaders() and protocol.lost == []
        clock.advance(0)
        assert [r.type for r in protocol.lost] == [ConnectionAborted]
        with pytest.raises(ConnectionResetError):
            client.recv(16)
    finally:
        for s in (listener, client):
            s.close()


def test_lean_server_leaves_a_broken_socket_to_the_reactor():
    transport, theirs = lean_pair()
    theirs.close()
    try:
        transport.write(b"\x20\x02\x00\x00")
        transport.write(b"\x20\x02\x00\x00")
        # The error surfaces as tcp.Server's would: from doWrite.
        assert transport.doWrite() is not None
    finally:
        close_pair(transport, theirs)


def test_lean_server_sends_a_sequence_at_once():
    transport, theirs = lean_pair()
    try:
        transport.writeSequence([b"\x82\x04", b"\x20\x02\x00\x00"])
        assert theirs.recv(16) == b"\x82\x04\x20\x02\x00\x00"
        assert transport not in reactor.getWriters()
        with pytest.raises(TypeError):
            transport.write("text")
    finally:
        close_pair(transport, theirs)


def test_listeners_accept_lean_servers_with_no_delay_from_the_listening_socket():
    built = []

    class Counting(Factory):
        protocol = Protocol

        def buildProtocol(self, addr):
            protocol = super().buildProtocol(addr)
            built.append(protocol)
            return protocol

    service = ListenerService(reactor, "tcp", "tcp:0:interface=127.0.0.1", Counting())
    service.privilegedStartService()
    port = service.port
    clients = []
    try:
        assert type(port) is lean.Port and port.transport is Server
        for _ in range(3):
            clients.append(socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5))
        for _ in range(100):
            port.doRead()
            if len(built) == 3:
                break
        assert all(p.transport.getTcpNoDelay() for p in built)
        if sys.platform.startswith("linux"):
            # Known once the kernel's queue was found empty.
            assert port.no_delay
        assert built[0].transport.getHost().port == port.getHost().port
    finally:
        _close_all(port, built, clients)


def _close_all(port, built, clients):
    """The listening port, the connections it made, and their clients."""
    port.stopListening()
    for protocol in built:
        reactor.removeReader(protocol.transport)
        protocol.transport.socket.close()
    for c in clients:
        c.close()


def test_a_storm_of_connects_is_accepted_in_bounded_batches(monkeypatch):
    monkeypatch.setattr(lean.Port, "ACCEPTS_PER_READ", 4)
    storm = 40  # within the listen backlog: connected before any accept
    built = []

    class Counting(Factory):
        protocol = Protocol

        def buildProtocol(self, addr):
            protocol = super().buildProtocol(addr)
            built.append(protocol)
            return protocol

    service = ListenerService(reactor, "tcp", "tcp:0:interface=127.0.0.1", Counting())
    service.privilegedStartService()
    port = service.port
    clients = []
    try:
        for _ in range(storm):
            clients.append(socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5))
        batches = []
        for _ in range(100):
            before = len(built)
            port.doRead()
            batches.append(len(built) - before)
            if len(built) == storm:
                break
        # tcp.Port would have grown its batch to 21 after the first.
        assert len(built) == storm
        assert max(batches) == 4
    finally:
        _close_all(port, built, clients)


def test_a_port_accepts_no_more_than_its_admission_has_room_for():
    from twisted.internet.task import Clock

    from mqttgw.transports.handshake import AWAITING_CONNECT
    from mqttgw.transports.schedulers import Flusher

    clock = Clock()
    flusher = Flusher(clock)
    flusher.OPENINGS = 3
    built = []

    class Opening(Protocol):
        state = AWAITING_CONNECT
        opening = False

        def connectionMade(self):
            assert flusher.admit(self), "accepted without room"
            built.append(self)

    service = ListenerService(reactor, "tcp", "tcp:0:interface=127.0.0.1", Factory.forProtocol(Opening))
    service.factory.flusher = flusher
    service.privilegedStartService()
    port = service.port
    clients = []
    try:
        for _ in range(10):
            clients.append(socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5))
        port.doRead()
        assert len(built) == 3
        # No room: the port stops reading, the rest wait in the kernel.
        port.doRead()
        assert len(built) == 3 and port not in reactor.getReaders()
        # Two are read from: the port reads again, and takes two.
        flusher.opened(built[0])
        flusher.opened(built[1])
        clock.advance(0)
        assert port in reactor.getReaders()
        port.doRead()
        assert len(built) == 5
        port.doRead()
        assert port not in reactor.getReaders()
        # Three that send nothing give their places up in time.
        clock.advance(flusher.OPENING_HOLD)
        assert port in reactor.getReaders()
        port.doRead()
        assert len(built) == 8
    finally:
        _close_all(port, built, clients)


def test_connections_from_one_address_share_one_string_for_it():
    from twisted.internet.task import Clock

    from mqttgw.transports.handshake import AWAITING_CONNECT
    from mqttgw.transports.schedulers import Flusher

    flusher = Flusher(Clock())
    built = []

    class Opening(Protocol):
        state = AWAITING_CONNECT
        opening = False

        def connectionMade(self):
            flusher.admit(self)
            built.append(self)

    factory = Factory.forProtocol(Opening)
    factory.flusher = flusher
    # A listener that counts its connections takes sockets in as it has room.
    factory.vacancies = lambda: 100
    service = ListenerService(reactor, "tcp", "tcp:0:interface=127.0.0.1", factory)
    service.privilegedStartService()
    port = service.port
    clients = []
    try:
        for _ in range(5):
            clients.append(socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5))
        for _ in range(100):
            port.doRead()
            if len(built) == 5:
                break
        hosts = [p.transport.getPeer().host for p in built]
        assert hosts == ["127.0.0.1"] * 5
        assert all(p.transport.client[0] is built[0].transport.client[0] for p in built)
        assert built[0].transport.hostname == "127.0.0.1"
    finally:
        _close_all(port, built, clients)


def test_the_port_keeps_ipv4_peers_ports_and_the_transport_its_own_once_closed():
    ours, theirs = socket.socketpair()
    port = SimpleNamespace(**vars(PORT), peer_ports=lean.PeerPorts())
    protocol = Recorded()
    transport = Server(ours, protocol, ("127.0.0.1", 40001), port)
    protocol.makeConnection(transport)
    try:
        assert transport._peer is None and port.peer_ports[ours.fileno()] == 40001
        assert transport.getPeer() == address.IPv4Address("TCP", "127.0.0.1", 40001)
        assert transport.client == ("127.0.0.1", 40001)
        transport.connectionLost(Failure(ConnectionDone()))
        # A line about the lost connection still names the peer.
        assert transport.getPeer() == address.IPv4Address("TCP", "127.0.0.1", 40001)
    finally:
        close_pair(transport, theirs)


def test_an_ipv6_peer_keeps_its_flow_info_and_scope():
    ours, theirs = socket.socketpair()
    port = SimpleNamespace(**vars(PORT), peer_ports=lean.PeerPorts())
    protocol = Recorded()
    transport = Server(ours, protocol, ("::1", 40002, 0, 0), port)
    protocol.makeConnection(transport)
    try:
        assert transport.getPeer() == address.IPv6Address("TCP", "::1", 40002, 0, 0)
        assert transport.client == ("::1", 40002, 0, 0)
    finally:
        close_pair(transport, theirs)

"""
A burst of TCP connections, then their first writes, leaves no transport
with an instance dictionary of its own, and the listeners' transports keep
no strings for logs per connection (see mqttgw.transports.tcp).
"""

import gc
import socket
import sys

import pytest
from twisted.internet import reactor, tcp
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from mqttgw.transports import tcp as lean
from mqttgw.transports.listening import ListenerService

BURST = 100


def own_dictionary(obj):
    """Whether ``obj`` holds a dictionary of its own (not inline values)."""
    return any(type(r) is dict for r in gc.get_referents(obj))


def connections_written_to(cls):
    """``BURST`` transports of ``cls`` made at once, then each written to."""
    port = tcp.Port(0, None, reactor=reactor)
    pairs = [socket.socketpair() for _ in range(BURST)]
    transports = []
    try:
        for n, (ours, _) in enumerate(pairs):
            protocol = Protocol()
            transport = cls(ours, protocol, ("127.0.0.1", 40000 + n), port, n, reactor)
            protocol.makeConnection(transport)
            transports.append(transport)
        for transport in transports:
            transport.registerProducer(protocol, True)
            transport.write(b"\x20\x02\x00\x00")
            assert transport.doWrite() is None
        return transports
    finally:
        for transport in transports:
            reactor.removeReader(transport)
            reactor.removeWriter(transport)
        for pair in pairs:
            for s in pair:
                s.close()


@pytest.fixture
def server_class():
    """A class of its own per test: shared keys are per class."""
    return type("Server", (tcp.Server,), {})


def test_shared_keys_leave_no_dictionary(server_class):
    lean.share(server_class)
    transports = connections_written_to(server_class)
    assert [t for t in transports if own_dictionary(t)] == []
    # The names a live connection has are those shared.
    assert set(vars(transports[0])) <= set(lean.LIVE_ATTRIBUTES)


def test_without_them_each_connection_has_one(server_class):
    transports = connections_written_to(server_class)
    with_dict = [t for t in transports if own_dictionary(t)]
    if sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11):
        # What share() is for: once the burst used up the room for new
        # names, the first write gives each connection a dictionary.
        assert len(with_dict) > BURST // 2


def test_lean_server_keeps_no_strings_and_still_names_itself():
    cls = type("Server", (lean.Server,), {})
    lean.share(cls)
    transports = connections_written_to(cls)
    assert [t for t in transports if own_dictionary(t)] == []
    first = transports[0]
    assert {"logstr", "repstr", "fileno"} & set(vars(first)) == set()
    assert first.logPrefix() == first.logstr == "Protocol,0,127.0.0.1"
    assert repr(first) == first.repstr == f"<Protocol #0 on {first.server._realPortNumber}>"


def test_lean_server_fileno_follows_its_socket():
    ours, theirs = socket.socketpair()
    try:
        protocol = Protocol()
        transport = lean.Server(ours, protocol, ("127.0.0.1", 40000), None, 7, reactor)
        protocol.makeConnection(transport)
        assert transport.fileno() == ours.fileno() > 0
        transport.connectionLost(Failure(ConnectionDone()))
        # As a closed tcp.Server: no descriptor, and a name all the same.
        assert transport.fileno() == -1
        assert transport.logPrefix() == "Closed,7,127.0.0.1"
        assert repr(transport) == "<Closed #7 on 40000>"
    finally:
        reactor.removeReader(transport)
        theirs.close()
        ours.close()


def test_listeners_accept_lean_servers():
    service = ListenerService(reactor, "tcp", "tcp:0:interface=127.0.0.1", Factory.forProtocol(Protocol))
    service.privilegedStartService()
    try:
        assert type(service.port) is lean.Port
        assert service.port.transport is lean.Server
    finally:
        service.port.stopListening()


def lean_pair():
    ours, theirs = socket.socketpair()
    protocol = Protocol()
    transport = lean.Server(ours, protocol, ("127.0.0.1", 40000), None, 1, reactor)
    protocol.makeConnection(transport)
    # A read that would wait forever fails instead.
    theirs.settimeout(5)
    return transport, theirs


def close_pair(transport, theirs):
    reactor.removeReader(transport)
    reactor.removeWriter(transport)
    transport.socket.close()
    theirs.close()


def test_lean_server_sends_at_once_with_nothing_waiting():
    transport, theirs = lean_pair()
    try:
        transport.write(b"\x20\x02\x00\x00")
        # Already on the wire, without a turn of the reactor.
        assert theirs.recv(16) == b"\x20\x02\x00\x00"
        assert transport._tempDataLen == 0
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
        assert transport._tempDataLen > 0
        send(transport)
        assert transport in reactor.getWriters()
        assert written_through(transport, theirs, len(big) + len(tail)) == big + tail
    finally:
        close_pair(transport, theirs)


def test_lean_server_holds_a_write_buffer_only_while_bytes_wait():
    idle, other = lean_pair()
    transport, theirs = lean_pair()
    theirs.setblocking(False)
    try:
        # Idle connections share one empty buffer, not a list each.
        assert idle._tempDataBuffer is transport._tempDataBuffer == []
        big = bytes(range(256)) * 40_000
        transport.write(big)
        transport.write(b"tail")
        assert transport._tempDataBuffer[-1] == b"tail"
        assert idle._tempDataBuffer == []
        assert written_through(transport, theirs, len(big) + 4) == big + b"tail"
        assert transport._tempDataBuffer is idle._tempDataBuffer
    finally:
        close_pair(transport, theirs)
        close_pair(idle, other)


def test_lean_server_leaves_a_broken_socket_to_the_reactor():
    transport, theirs = lean_pair()
    theirs.close()
    try:
        transport.write(b"\x20\x02\x00\x00")
        transport.write(b"\x20\x02\x00\x00")
        # The error surfaces as tcp.Server's would: from doWrite.
        assert transport.doWrite() is not None
    finally:
        reactor.removeReader(transport)
        reactor.removeWriter(transport)
        transport.socket.close()


def test_lean_server_sends_a_sequence_at_once():
    transport, theirs = lean_pair()
    try:
        transport.writeSequence([b"\x82\x04", b"\x20\x02\x00\x00"])
        assert theirs.recv(16) == b"\x82\x04\x20\x02\x00\x00"
        assert transport not in reactor.getWriters()
    finally:
        close_pair(transport, theirs)


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

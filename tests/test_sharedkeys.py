"""
A burst of TCP connections, then their first writes, leaves no transport
with an instance dictionary of its own, and the listeners' transports keep
no strings for logs per connection (see mqttgw.transports.sharedkeys).
"""

import gc
import socket
import sys

import pytest
from twisted.internet import reactor, tcp
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from mqttgw.transports import sharedkeys
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
    sharedkeys.share(server_class)
    transports = connections_written_to(server_class)
    assert [t for t in transports if own_dictionary(t)] == []
    # The names a live connection has are those shared.
    assert set(vars(transports[0])) <= set(sharedkeys.LIVE_ATTRIBUTES)


def test_without_them_each_connection_has_one(server_class):
    transports = connections_written_to(server_class)
    with_dict = [t for t in transports if own_dictionary(t)]
    if sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11):
        # What sharedkeys is for: once the burst used up the room for new
        # names, the first write gives each connection a dictionary.
        assert len(with_dict) > BURST // 2


def test_lean_server_keeps_no_strings_and_still_names_itself():
    cls = type("Server", (sharedkeys.Server,), {})
    sharedkeys.share(cls)
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
        transport = sharedkeys.Server(ours, protocol, ("127.0.0.1", 40000), None, 7, reactor)
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
        assert service.port.transport is sharedkeys.Server
    finally:
        service.port.stopListening()

"""
A connection storm: many clients connecting at once, as a site's devices
do when the gateway comes back.  Every one is answered, the log sums the
burst up instead of a line per client, clean sessions leave the store as
it was, and the listen backlog asked of the kernel is the one configured.
"""

import contextlib
import random
import socket
import sqlite3
import subprocess

from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock

from bench import burst
from mqttgw.service.build import kernel_somaxconn
from mqttgw.transports.connlog import CONNECTED, DISCONNECTED, LOST, ConnectionMessages
from mqttgw.transports.listening import ListenerService
from mqttgw.transports.schedulers import Flusher
from mqttgw.wire import packets as P
from tests.conftest import require_program

STORM = 2000


def storm(port, count):
    """``count`` clients connecting at once from a loopback address of their own."""
    results = [0.0] * burst.FIELDS
    burst.storm(port, count, results, f"127.{random.randrange(1, 255)}.{random.randrange(256)}")
    return results


def stored_rows(data_dir):
    """Rows of the store's sessions, subscriptions and queued messages."""
    db = sqlite3.connect(f"file:{data_dir / 'mqttgw.db'}?mode=ro", uri=True)
    try:
        return {
            table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("sessions", "subscriptions", "deliveries", "awaiting_pubrel")
        }
    finally:
        db.close()


def test_a_burst_of_connects_is_answered_summed_up_in_the_log_and_leaves_the_store_alone(gateway_with, tmp_path):
    data_dir = tmp_path / "data"
    gw = gateway_with("--data-dir", str(data_dir))
    empty = stored_rows(data_dir)
    results = storm(gw.port, STORM)
    assert results[burst.CONNACKS] == STORM
    assert results[burst.REFUSED] == results[burst.FAILED] == 0
    # The clients' connects and losses, counted in lines a second.
    gw.wait_for_log("connection burst over", timeout=30)
    log = gw.log()
    assert "connection burst: " in log
    assert log.count(" connected from ") <= ConnectionMessages.BURST
    assert log.count(" connection lost") <= ConnectionMessages.BURST
    # Clean sessions came and went: nothing was stored for them.
    assert stored_rows(data_dir) == empty == {table: 0 for table in empty}
    # One client alone is a line of its own again.
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(P.Connect(client_id="alone", keepalive=0).encode())
        assert s.recv(4) == b"\x20\x02\x00\x00"
        gw.wait_for_log("client alone connected from")


def listen_queue(port):
    """The backlog a listening socket on ``port`` was given (``ss``'s Send-Q)."""
    out = subprocess.run(
        [require_program("ss"), "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return [int(line.split()[2]) for line in out.splitlines() if line.strip()]


def test_the_listen_backlog_is_the_connection_limit_unless_configured(gateway_with):
    cap = kernel_somaxconn()
    gw = gateway_with("--no-persistence", "--max-connections", "1500")
    assert listen_queue(gw.port) == [min(1500, cap)]
    assert gw.port and "net.core.somaxconn" not in gw.log()
    configured = gateway_with("--no-persistence", "--listen-backlog", "1234")
    assert listen_queue(configured.port) == [min(1234, cap)]
    # Above what the kernel allows: said once, at start-up.
    above = gateway_with("--no-persistence", "--listen-backlog", str(cap + 1))
    assert listen_queue(above.port) == [cap]
    assert above.log().count(f"is capped by the kernel at net.core.somaxconn {cap}") == 1


def test_connection_lines_are_summed_up_in_a_burst_and_logged_again_after(logged):
    clock = Clock()
    messages = ConnectionMessages(clock)
    burst_size = ConnectionMessages.BURST * 3
    for i in range(burst_size):
        messages.info(CONNECTED, "client {client_id} connected", client_id=f"c{i}")
    messages.info(DISCONNECTED, "client {client_id} disconnected", client_id="c0")
    messages.info(LOST, "client {client_id} connection lost", client_id="c1")
    lines = logged()
    assert sum("connected" in line and "burst" not in line for line in lines) == ConnectionMessages.BURST
    clock.advance(ConnectionMessages.INTERVAL)
    summary = [line for line in logged() if "connection burst:" in line]
    assert len(summary) == 1
    assert f"{burst_size - ConnectionMessages.BURST} clients connected" in summary[0]
    assert "1 disconnected and 1 connections lost" in summary[0]
    # A quiet second ends it; then each line is logged again.
    clock.advance(ConnectionMessages.INTERVAL)
    assert any("connection burst over" in line for line in logged())
    messages.info(CONNECTED, "client {client_id} connected", client_id="later")
    assert "client later connected" in logged()[-1]


@contextlib.contextmanager
def listening(factory, built, clients=10):
    """A lean TCP port for ``factory`` with ``clients`` connected and waiting in its queue."""
    service = ListenerService(reactor, "tcp", "tcp:0:interface=127.0.0.1", factory)
    service.privilegedStartService()
    port = service.port
    connected = []
    try:
        for _ in range(clients):
            connected.append(socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5))
        yield port
    finally:
        for skt, _ in port.held:
            skt.close()
        port.stopListening()
        for protocol in built:
            reactor.removeReader(protocol.transport)
            protocol.transport.socket.close()
        for c in connected:
            c.close()


def opening_factory(openings, limit=100):
    """
    A factory whose connections take a place among ``openings``, at most
    ``limit`` of them, and what it made.
    """
    flusher = Flusher(Clock())
    flusher.OPENINGS = openings
    built = []

    class Opening(Protocol):
        def connectionMade(self):
            assert flusher.admit(self), "made without room"
            built.append(self)

    class Counted(Factory):
        protocol = Opening

        def vacancies(self):
            return limit - len(built)

    factory = Counted()
    factory.flusher = flusher
    return factory, built


def test_a_storm_beyond_the_room_to_read_is_taken_out_of_the_kernels_queue():
    factory, built = opening_factory(3)
    with listening(factory, built) as port:
        port.doRead()
        # Three made, the other seven taken in; the port goes on reading,
        # so the kernel's queue stays empty for the next SYNs.
        assert len(built) == 3 and len(port.held) == 7
        assert port in reactor.getReaders()
        for protocol in list(built):
            factory.flusher.opened(protocol)
        factory.flusher.clock.advance(0)
        assert len(built) == 6 and len(port.held) == 4


def test_no_more_are_taken_in_than_the_connection_limit_has_room_for():
    factory, built = opening_factory(3, limit=5)
    with listening(factory, built) as port:
        port.doRead()
        # Five taken in, three of them made; the rest wait in the kernel,
        # the port not read until there is room.
        assert len(built) == 3 and len(port.held) == 2
        assert port not in reactor.getReaders()


def test_connections_refused_on_taking_in_take_no_room():
    factory, built = opening_factory(3)
    refused = []
    make = factory.buildProtocol

    def every_other_refused(addr):
        if (len(built) + len(refused)) % 2:
            refused.append(addr)
            return None
        return make(addr)

    factory.buildProtocol = every_other_refused
    with listening(factory, built) as port:
        port.doRead()
        # Three made and two refused in between: the room was for three made.
        assert len(built) == 3 and len(refused) == 2 and len(port.held) == 5

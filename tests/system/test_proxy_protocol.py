"""
Listeners behind a load balancer speaking the PROXY protocol, through
Twisted's ``haproxy:`` endpoint prefix (``--tcp haproxy:tcp:1883``): a
client is logged, and its logins counted, by the address the PROXY header
gives, not the load balancer's.
"""

import socket
import struct
import time

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.protocols.haproxy._wrapper import HAProxyWrappingFactory

from mqttgw.security.throttle import Throttle
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer

BALANCER = IPv4Address("TCP", "10.0.0.2", 40000)


def proxy_v1(source, port):
    return f"PROXY TCP4 {source} 192.0.2.1 {port} 1883\r\n".encode()


def proxy_v2(source, port):
    """A PROXY v2 header: PROXY command, TCP over IPv4."""
    addresses = socket.inet_aton(source) + socket.inet_aton("192.0.2.1") + struct.pack("!HH", port, 1883)
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack("!H", len(addresses)) + addresses


def _connack(sock):
    framer = Framer(1024)
    framer.from_client = False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        data = sock.recv(1024)
        if not data:
            return None
        packets = list(framer.feed(data))
        if packets:
            return packets[0]
    raise AssertionError("no CONNACK in time")


@pytest.mark.parametrize("header", [proxy_v1, proxy_v2], ids=["v1", "v2"])
def test_a_proxy_listener_logs_the_client_by_the_address_its_header_gives(gateway_with, header):
    gw = gateway_with("--tcp", "haproxy:tcp:0:interface=127.0.0.1")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(header("203.0.113.7", 51234) + P.Connect(client_id="behind-lb").encode())
        connack = _connack(sock)
    assert isinstance(connack, P.Connack) and connack.return_code == 0
    gw.wait_for_log("client behind-lb connected from 203.0.113.7:51234")


def test_a_connection_without_a_proxy_header_is_closed_and_others_go_on(gateway_with):
    gw = gateway_with("--tcp", "haproxy:tcp:0:interface=127.0.0.1")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(P.Connect(client_id="direct").encode())
        assert _connack(sock) is None
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(proxy_v1("198.51.100.9", 40001) + P.Connect(client_id="next").encode())
        assert _connack(sock).return_code == 0
    assert "client direct connected" not in gw.log()


def _through_the_balancer(broker, source, port, connect):
    """A connection accepted from the load balancer, its header naming ``source``."""
    factory = HAProxyWrappingFactory(broker.factory)
    protocol = factory.buildProtocol(BALANCER)
    transport = StringTransport(peerAddress=BALANCER)
    protocol.makeConnection(transport)
    protocol.dataReceived(proxy_v1(source, port) + connect.encode())
    broker.clock.advance(0)
    return transport


def _connack_of(transport):
    framer = Framer(1024)
    framer.from_client = False
    [connack] = framer.feed(transport.value())
    return connack


def test_waiting_logins_are_counted_per_client_address_not_per_balancer():
    broker = FakeBroker(passwords={"sensor": "right", "other": "pw"})
    # One login at a time per address: a second from the same one is busy.
    broker.factory.throttle = Throttle(max_waiting=1, seconds=broker.clock.seconds)
    wrong = _through_the_balancer(
        broker, "203.0.113.7", 50001, P.Connect(client_id="a", username="sensor", password=b"wrong")
    )
    # The wrong password's answer is held back by the throttle meanwhile.
    assert wrong.value() == b""
    other = _through_the_balancer(
        broker, "198.51.100.9", 50002, P.Connect(client_id="b", username="other", password=b"pw")
    )
    same = _through_the_balancer(
        broker, "203.0.113.7", 50003, P.Connect(client_id="c", username="other", password=b"pw")
    )
    assert _connack_of(other).return_code == 0
    assert _connack_of(same).return_code == 3
    broker.clock.advance(60)
    assert _connack_of(wrong).return_code == 4

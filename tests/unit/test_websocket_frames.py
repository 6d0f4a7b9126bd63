"""
WebSocket frames as the gateway's own reader takes them, in process: any
way the reads cut the frames, the MQTT byte stream comes out whole.
"""

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from bench.hostile import ws_frame
from mqttgw.testing import FakeBroker
from mqttgw.transports.websocket import websocket_site
from mqttgw.wire import packets as P

PEER = IPv4Address("TCP", "127.0.0.1", 5555)
UPGRADE = (
    b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: bXF0dGd3LWJlbmNobWFyaw==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)


def websocket(broker):
    """A connection to the WebSocket port that has upgraded and sent CONNECT."""
    site = websocket_site(broker.factory, broker.router, broker.clock, 1024 * 1024)
    protocol = site.buildProtocol(PEER)
    transport = StringTransport(peerAddress=PEER)
    protocol.makeConnection(transport)
    protocol.dataReceived(UPGRADE)
    assert transport.value().startswith(b"HTTP/1.1 101 "), transport.value()[:80]
    protocol.dataReceived(ws_frame(P.Connect(client_id="frag").encode()))
    broker.clock.advance(0)
    return protocol, transport


def watching(broker):
    """A client of ``broker`` subscribed to every ``frag/`` topic."""
    watcher = broker.client(client_id="watcher")
    watcher.send(P.Subscribe(1, [("frag/#", 0)]))
    watcher.received()
    return watcher


def published(watcher):
    """The PUBLISH packets ``watcher`` has received since last asked."""
    return [p for p in watcher.received() if isinstance(p, P.Publish)]


def fragmented(packet, first=10):
    """``packet`` as one binary message: a short first frame, one long continuation."""
    return ws_frame(packet[:first], fin=False) + ws_frame(packet[first:], opcode=0)


def test_a_fragmented_message_cut_anywhere_by_the_reads_arrives_whole():
    packet = P.Publish("frag/a", bytes(range(256)) * 20, 0).encode()
    stream = fragmented(packet)
    # Cuts in the first frame, in each header and mask, and through the
    # long continuation (over the size kept without autobahn otherwise).
    cuts = sorted({*range(1, 40), *range(40, len(stream), 251), len(stream) - 1})
    for cut in cuts:
        broker = FakeBroker()
        watcher = watching(broker)
        protocol, transport = websocket(broker)
        protocol.dataReceived(stream[:cut])
        protocol.dataReceived(stream[cut:])
        broker.clock.advance(0)
        assert not transport.disconnecting, cut
        [message] = published(watcher)
        assert message.payload == bytes(range(256)) * 20, cut


def test_a_long_frame_dripped_a_byte_a_read_arrives_whole():
    broker = FakeBroker()
    watcher = watching(broker)
    protocol, transport = websocket(broker)
    stream = fragmented(P.Publish("frag/b", b"x" * 70_000, 0).encode())
    for i in range(len(stream)):
        protocol.dataReceived(stream[i : i + 1])
    broker.clock.advance(0)
    assert not transport.disconnecting
    [message] = published(watcher)
    assert len(message.payload) == 70_000


def test_frames_of_every_size_in_one_read_arrive_in_order():
    # Small frames are unmasked together, a large one (past 2 KiB) on its
    # own: each with its own random mask, a ping and a fragmented message
    # among them, the bytes must come out whole and in order.
    broker = FakeBroker()
    watcher = watching(broker)
    protocol, transport = websocket(broker)
    transport.clear()
    payloads = [bytes([n]) * size for n, size in enumerate((0, 1, 3, 64, 5000, 7, 2049, 2048, 100))]
    packets = [P.Publish(f"frag/{n}", p, 0).encode() for n, p in enumerate(payloads)]
    stream = b"".join(
        [
            ws_frame(packets[0]),
            # One packet over three frames, each under 4 bytes.
            ws_frame(packets[1][:2], fin=False) + ws_frame(packets[1][2:3], opcode=0, fin=False)
            + ws_frame(packets[1][3:], opcode=0),
            ws_frame(packets[2]) + ws_frame(packets[3]),
            ws_frame(b"are you there", opcode=9),
            *(ws_frame(p) for p in packets[4:7]),
            fragmented(packets[7], first=3000),
            ws_frame(packets[8]),
        ]
    )
    protocol.dataReceived(stream)
    broker.clock.advance(0)
    assert not transport.disconnecting
    messages = published(watcher)
    assert [m.payload for m in messages] == payloads
    # The ping's answer: a pong with its payload, unmasked.
    assert transport.value() == b"\x8a\x0dare you there"

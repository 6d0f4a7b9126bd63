"""
WebSocket frames: the scan from bytes alone (transports/wsframes.py: what
it takes, where it stops for autobahn's parser, what it keeps for the next
read), then as the gateway's own reader takes them, in process: any way
the reads cut the frames, the MQTT byte stream comes out whole.
"""

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from bench.hostile import ws_frame
from mqttgw.testing import FakeBroker
from mqttgw.transports.websocket import websocket_site
from mqttgw.transports.wsframes import FRAMES_PER_TURN, TINY_FRAME_COST, frame_header, scan, unmask
from mqttgw.wire import packets as P


# The scan from bytes alone

LIMIT = 1024 * 1024


def test_whole_binary_frames_come_out_as_one_payload_in_order():
    payloads = [b"a" * 10, b"", b"b" * 3000, b"c" * 125, b"d" * 126, b"e" * 70_000]
    data = b"".join(ws_frame(p) for p in payloads)
    found = scan(data, 0, LIMIT, None)
    assert found.payload == b"".join(payloads)
    assert (found.at, found.fragment, found.cut, found.pings) == (len(data), None, None, [])


def test_the_scan_starts_at_the_offset_given():
    data = b"junk" + ws_frame(b"hello")
    assert scan(data, 4, LIMIT, None).payload == b"hello"


def test_nothing_taken_gives_no_payload():
    found = scan(b"", 0, LIMIT, None)
    assert (found.payload, found.at, found.frames) == (None, 0, 0)


@pytest.mark.parametrize("opcode, fin", [(8, True), (1, True), (1, False), (0, True)])
def test_close_text_and_stray_continuations_stop_the_scan_where_they_begin(opcode, fin):
    first = ws_frame(b"mqtt bytes")
    data = first + ws_frame(b"other", opcode=opcode, fin=fin) + ws_frame(b"after")
    found = scan(data, 0, LIMIT, None)
    assert found.payload == b"mqtt bytes"
    assert found.at == len(first)


def test_an_unmasked_frame_stops_the_scan():
    data = frame_header(5) + b"plain"
    found = scan(data, 0, LIMIT, None)
    assert (found.payload, found.at) == (None, 0)


def test_a_compressed_frame_stops_the_scan():
    frame = bytearray(ws_frame(b"deflated?"))
    frame[0] |= 0x40  # RSV1: per-message compression
    assert scan(bytes(frame), 0, LIMIT, None).at == 0


def test_a_frame_over_the_limit_stops_the_scan():
    data = ws_frame(b"x" * 10) + ws_frame(b"y" * 101)
    found = scan(data, 0, 100, None)
    assert (found.payload, found.at) == (b"x" * 10, len(ws_frame(b"x" * 10)))
    # 0: no limit.
    assert scan(data, 0, 0, None).at == len(data)


def test_a_fragmented_message_over_the_limit_in_total_stops_at_the_fragment_past_it():
    head = ws_frame(b"a" * 60, fin=False)
    data = head + ws_frame(b"b" * 60, opcode=0)
    found = scan(data, 0, 100, None)
    assert (found.payload, found.at, found.fragment) == (b"a" * 60, len(head), 60)


def test_a_fragmented_message_is_carried_from_one_scan_to_the_next():
    head = ws_frame(b"first ", fin=False)
    found = scan(head, 0, LIMIT, None)
    assert (found.payload, found.fragment) == (b"first ", 6)
    middle = ws_frame(b"middle ", opcode=0, fin=False)
    found = scan(middle, 0, LIMIT, found.fragment)
    assert (found.payload, found.fragment) == (b"middle ", 13)
    found = scan(ws_frame(b"last", opcode=0), 0, LIMIT, found.fragment)
    assert (found.payload, found.fragment) == (b"last", None)


def test_a_new_message_inside_a_fragmented_one_stops_the_scan():
    assert scan(ws_frame(b"new"), 0, LIMIT, 5).at == 0
    assert scan(ws_frame(b"new", fin=False), 0, LIMIT, 5).at == 0


def test_pings_are_answered_with_their_payload_and_pongs_skipped():
    data = ws_frame(b"one") + ws_frame(b"are you there", opcode=9) + ws_frame(b"x", opcode=10) + ws_frame(b"two")
    found = scan(data, 0, LIMIT, None)
    assert found.pings == [b"are you there"]
    assert (found.payload, found.at) == (b"onetwo", len(data))


def test_pings_are_taken_inside_a_fragmented_message():
    data = ws_frame(b"ping", opcode=9) + ws_frame(b"rest", opcode=0)
    found = scan(data, 0, LIMIT, 3)
    assert (found.pings, found.payload, found.fragment) == ([b"ping"], b"rest", None)


def test_a_ping_with_a_long_length_stops_the_scan():
    assert scan(ws_frame(b"p" * 200, opcode=9), 0, LIMIT, None).at == 0


@pytest.mark.parametrize("size", [10, 125, 126, 2000, 65536])
def test_a_small_frame_the_data_ends_inside_is_kept_for_the_next_read(size):
    before = ws_frame(b"whole")
    frame = ws_frame(b"z" * size)
    header = len(frame) - size
    for end in (1, 2, header - 1, header, header + 1, len(frame) - 1):
        found = scan(before + frame[:end], 0, LIMIT, None)
        assert found.payload == b"whole", end
        if end < 2:
            assert found.cut == (len(before), 6), end
        elif end < header:
            assert found.cut == (len(before), header), end
        elif len(frame) <= 2048:
            assert found.cut == (len(before), len(frame)), end
        else:
            # Larger frames are left to autobahn, which streams them.
            assert found.cut is None, end
            assert found.at == len(before), end


def test_a_fragment_of_a_message_begun_here_is_kept_whole_however_large():
    head = ws_frame(b"h" * 10, fin=False)
    rest = ws_frame(b"r" * 5000, opcode=0)
    found = scan(head + rest[:100], 0, LIMIT, None)
    assert (found.payload, found.fragment, found.cut) == (b"h" * 10, 10, (len(head), len(rest)))


def test_the_scan_stops_at_its_budget_tiny_frames_counting_for_more():
    frame = ws_frame(b"four")
    data = frame * (FRAMES_PER_TURN + 10)
    found = scan(data, 0, LIMIT, None)
    assert (found.frames, found.at) == (FRAMES_PER_TURN, FRAMES_PER_TURN * len(frame))
    tiny = ws_frame(b"\xc0\x00")  # PINGREQ
    found = scan(tiny * FRAMES_PER_TURN, 0, LIMIT, None)
    assert found.at == (FRAMES_PER_TURN // TINY_FRAME_COST) * len(tiny)
    assert found.payload == b"\xc0\x00" * (FRAMES_PER_TURN // TINY_FRAME_COST)


def test_frames_whose_length_is_not_in_its_shortest_form_stop_the_scan():
    frame = bytearray(b"\x82\xfe\x00\x05" + b"\x00" * 4 + b"abcde")  # 5 in two bytes
    assert scan(bytes(frame), 0, LIMIT, None).at == 0


@pytest.mark.parametrize("size, header", [(0, b"\x82\x00"), (125, b"\x82\x7d"), (126, b"\x82\x7e\x00\x7e"),
                                          (65536, b"\x82\x7f" + (65536).to_bytes(8, "big"))])
def test_the_servers_frame_header_is_final_binary_unmasked_in_the_shortest_form(size, header):
    assert frame_header(size) == header


@pytest.mark.parametrize("size", [0, 1, 5, 2048, 2049, 10_000])
def test_unmask_undoes_a_clients_mask(size):
    payload = bytes(range(256)) * (size // 256 + 1)
    frame = ws_frame(payload[:size])
    header = len(frame) - size
    assert unmask(frame[header:], frame[header - 4 : header]) == payload[:size]


# As the gateway's reader takes them

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

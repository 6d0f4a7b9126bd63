"""
Careless and hostile clients, one function each: what a gateway at the
edge of a field network meets.  The robustness tests run them one at a
time and check the gateway's answer; the "hostile neighbours" benchmark
runs them all at once beside well-behaved traffic.  Every function does one
bounded round of its behaviour against 127.0.0.1 and returns.
"""

import os
import socket
import time

from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer

HOST = "127.0.0.1"


def connection(port, timeout=10):
    sock = socket.create_connection((HOST, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_packets(sock, framer, count, timeout=10):
    """``count`` packets (fewer if the connection ends or time runs out)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 20)
        except (socket.timeout, BlockingIOError):
            break
        except OSError:
            break
        if not data:
            break
        out.extend(framer.feed(data))
    return out


def mqtt_connect(port, client_id, keepalive=0, clean_session=True, version=P.MQTT_311):
    """A connected raw socket and its framer, CONNACK read."""
    sock = connection(port)
    framer = Framer(P.MAX_REMAINING_LENGTH + 5)
    sock.sendall(
        P.Connect(
            client_id=client_id,
            keepalive=keepalive,
            clean_session=clean_session,
            protocol_level=version,
            protocol_name="MQTT" if version == P.MQTT_311 else "MQIsdp",
        ).encode()
    )
    [connack] = recv_packets(sock, framer, 1)
    if connack.return_code != 0:
        raise RuntimeError(f"{client_id}: CONNACK {connack.return_code}")
    return sock, framer


def closed_by_peer(sock, timeout=10):
    """Whether the other end closes ``sock`` (EOF or reset) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except socket.timeout:
            return False
        except OSError:
            return True
    return False


def send_for(sock, data, seconds):
    """Send ``data`` over and over for ``seconds`` without reading; bytes sent."""
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    view = memoryview(data)
    while time.monotonic() < deadline:
        try:
            sent += sock.send(view)
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            break
    return sent


# WebSocket, just enough of a client to control framing exactly.


def ws_frame(payload, opcode=2, fin=True):
    mask = os.urandom(4)
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        header = bytes((first, 0x80 | n))
    elif n < 65536:
        header = bytes((first, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((first, 0x80 | 127)) + n.to_bytes(8, "big")
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    masked = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")
    return header + mask + masked


def ws_upgrade(port, path="/mqtt"):
    """A socket that has completed the WebSocket upgrade; its leftover bytes."""
    sock = connection(port)
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: bXF0dGd3LWJlbmNobWFyaw==\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("WebSocket upgrade refused")
        response += chunk
    head, rest = response.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"WebSocket upgrade refused: {head[:60]!r}")
    return sock, rest


class WSReader:
    """MQTT packets out of the server's (unmasked) WebSocket frames."""

    def __init__(self, sock, leftover=b""):
        self.sock = sock
        self.buffer = bytearray(leftover)
        self.framer = Framer(P.MAX_REMAINING_LENGTH + 5)
        self.closed = False

    def _frames(self):
        buf = self.buffer
        while len(buf) >= 2:
            n = buf[1] & 0x7F
            start = 2
            if n == 126:
                if len(buf) < 4:
                    return
                n, start = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                if len(buf) < 10:
                    return
                n, start = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < start + n:
                return
            opcode = buf[0] & 0x0F
            payload = bytes(buf[start : start + n])
            del buf[: start + n]
            if opcode == 8:
                self.closed = True
            elif opcode in (0, 2):
                yield from self.framer.feed(payload)

    def packets(self, count, timeout=10):
        out = list(self._frames())
        deadline = time.monotonic() + timeout
        while len(out) < count and not self.closed and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 20)
            except (socket.timeout, OSError):
                break
            if not data:
                self.closed = True
                break
            self.buffer += data
            out.extend(self._frames())
        return out


def ws_mqtt_connect(port, client_id):
    sock, rest = ws_upgrade(port)
    sock.sendall(ws_frame(P.Connect(client_id=client_id).encode()))
    reader = WSReader(sock, rest)
    [connack] = reader.packets(1)
    if connack.return_code != 0:
        raise RuntimeError(f"{client_id}: CONNACK {connack.return_code}")
    return sock, reader


# The behaviours (numbered as in the robustness issue).


def big_retained_ws_subscriber(tcp_port, ws_port, tag, count=3, size=500_000):
    """1: retained messages that together exceed a WebSocket message, sent to a WS '#'."""
    pub, framer = mqtt_connect(tcp_port, f"{tag}-retainer")
    for i in range(count):
        pub.sendall(P.Publish(f"{tag}/big/{i}", bytes(size), 1, retain=True, message_id=i + 1).encode())
    # Retained before the subscriber comes: every PUBACK is in.
    recv_packets(pub, framer, count, timeout=20)
    pub.close()
    sock, reader = ws_mqtt_connect(ws_port, f"{tag}-ws")
    sock.sendall(ws_frame(P.Subscribe(1, [(f"{tag}/big/#", 0)]).encode()))
    got = [p for p in reader.packets(count + 1, timeout=20) if isinstance(p, P.Publish)]
    sock.close()
    return got


def retained_amplification(tcp_port, tag, copies=4000, size=64 * 1024):
    """2: one SUBSCRIBE naming the same retained topic thousands of times."""
    topic = f"{tag}/amp"
    pub, framer = mqtt_connect(tcp_port, f"{tag}-amp")
    pub.sendall(P.Publish(topic, bytes(size), 0, retain=True).encode())
    pub.sendall(P.Subscribe(1, [(topic, 1)] * copies).encode())
    got = recv_packets(pub, framer, 3, timeout=3)
    pub.close()
    return got


def long_topics(tcp_port, tag, count=2000, length=60_000):
    """3: QoS 0 publishes to many distinct, very long topics."""
    sock, _ = mqtt_connect(tcp_port, f"{tag}-long")
    stem = "x" * length
    for i in range(count):
        sock.sendall(P.Publish(f"{tag}/{i}/{stem}", b"v").encode())
    sock.sendall(P.Disconnect().encode())
    sock.close()


def ws_one_byte_messages(ws_port, tag, size=256 * 1024):
    """4: a large PUBLISH sent as one-byte WebSocket messages."""
    sock, rest = ws_mqtt_connect(ws_port, f"{tag}-drip")
    packet = P.Publish(f"{tag}/drip", bytes(size), 1, message_id=1).encode()
    frames = b"".join(ws_frame(packet[i : i + 1]) for i in range(len(packet)))
    sock.sendall(frames)
    got = rest.packets(1, timeout=60)
    sock.close()
    return got


def ws_one_byte_fragments(ws_port, tag, size=256 * 1024):
    """4b: a large PUBLISH sent as one WebSocket message in one-byte fragments."""
    sock, rest = ws_mqtt_connect(ws_port, f"{tag}-frag")
    packet = P.Publish(f"{tag}/frag", bytes(size), 1, message_id=1).encode()
    last = len(packet) - 1
    frames = b"".join(
        ws_frame(packet[i : i + 1], opcode=0 if i else 2, fin=i == last) for i in range(len(packet))
    )
    sock.sendall(frames)
    got = rest.packets(1, timeout=60)
    sock.close()
    return got


def wildcard_subscribe(tcp_port, tag, filters=500):
    """5a: one SUBSCRIBE with hundreds of wildcard filters over many retained topics."""
    sock, framer = mqtt_connect(tcp_port, f"{tag}-wild")
    sock.sendall(P.Subscribe(1, [(f"{tag}/+/{i}/#", 0) for i in range(filters)] + [(f"{tag}/#", 0)]).encode())
    return sock, framer


def invalid_filters(tcp_port, tag, count=100_000):
    """5b: one SUBSCRIBE with a hundred thousand invalid filters (3.1.1)."""
    sock, framer = mqtt_connect(tcp_port, f"{tag}-invalid")
    sock.sendall(P.Subscribe(1, [("a#", 0)] * count).encode())
    got = recv_packets(sock, framer, 1, timeout=20)
    sock.close()
    return got


def unread_pings(tcp_port, tag, seconds=3.0):
    """6: PINGREQs pipelined for ``seconds``, their answers never read."""
    sock, _ = mqtt_connect(tcp_port, f"{tag}-pinger")
    sent = send_for(sock, P.Pingreq().encode() * 32768, seconds)
    sock.close()
    return sent


def pre_connect_hoard(tcp_port, connections=64, seconds=2.0):
    """7: connections announcing a 1 MB CONNECT and sending its bytes slowly."""
    socks = []
    header = bytes((0x10, 0xFF, 0xFF, 0x3F))  # CONNECT, 1 MB remaining
    for _ in range(connections):
        try:
            s = connection(tcp_port)
            s.sendall(header)
            socks.append(s)
        except OSError:
            pass
    chunk = bytes(16 * 1024)
    deadline = time.monotonic() + seconds
    alive = list(socks)
    while alive and time.monotonic() < deadline:
        for s in list(alive):
            try:
                s.send(chunk)
            except OSError:
                alive.remove(s)
        time.sleep(0.05)
    for s in socks:
        s.close()
    return len(socks), len(alive)


def http_post(ws_port, size=64 * 1024 * 1024, seconds=3.0):
    """8a: a huge request body to the WebSocket port."""
    sock = connection(ws_port)
    sock.sendall(
        f"POST / HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {size}\r\n\r\n".encode()
    )
    sent = send_for(sock, bytes(256 * 1024), seconds)
    sock.close()
    return sent


def slow_upgrade(ws_port, interval=0.5, limit=30.0):
    """8b: the upgrade request one byte at a time; seconds until closed."""
    sock = connection(ws_port)
    request = f"GET /mqtt HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\n".encode() + b"X-Pad: " + b"p" * 4096
    started = time.monotonic()
    for byte in request:
        try:
            sock.send(bytes((byte,)))
        except OSError:
            break
        if closed_by_peer(sock, interval):
            break
        if time.monotonic() - started > limit:
            break
    sock.close()
    return time.monotonic() - started


def raw_mqtt_to_websocket_port(ws_port):
    """8c: MQTT spoken to the WebSocket port: whether it is closed."""
    sock = connection(ws_port)
    sock.sendall(P.Connect(client_id="lost").encode())
    closed = closed_by_peer(sock, 5)
    sock.close()
    return closed


def reconnect_storm(tcp_port, tag, count=2000, timeout=30.0, connect_packet=None):
    """
    9: ``count`` clients connecting at once; how many were accepted
    (CONNACK 0) in time.  ``connect_packet(i)``: the i-th client's CONNECT.
    """
    import selectors

    if connect_packet is None:
        connect_packet = lambda i: P.Connect(client_id=f"{tag}-{i}")  # noqa: E731
    sel = selectors.DefaultSelector()
    connect = {}
    for i in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((HOST, tcp_port))
        connect[s] = connect_packet(i).encode()
        sel.register(s, selectors.EVENT_WRITE)
    done = 0
    deadline = time.monotonic() + timeout
    while connect and time.monotonic() < deadline:
        for key, events in sel.select(0.1):
            s = key.fileobj
            if events & selectors.EVENT_WRITE:
                try:
                    s.send(connect[s])
                except OSError:
                    sel.unregister(s)
                    del connect[s]
                    s.close()
                    continue
                sel.modify(s, selectors.EVENT_READ)
            else:
                try:
                    ok = s.recv(4) == P.Connack(0).encode()
                except OSError:
                    ok = False
                done += ok
                sel.unregister(s)
                del connect[s]
                s.close()
    for s in connect:
        s.close()
    return done


def keepalive_drip(tcp_port, tag, keepalive=1, limit=10.0):
    """10: bytes of a packet that is never finished; seconds until closed."""
    sock, _ = mqtt_connect(tcp_port, f"{tag}-dripper", keepalive=keepalive)
    packet = P.Publish(f"{tag}/never", bytes(1000)).encode()
    started = time.monotonic()
    for byte in packet:
        try:
            sock.send(bytes((byte,)))
        except OSError:
            break
        if closed_by_peer(sock, keepalive / 4) or time.monotonic() - started > limit:
            break
    sock.close()
    return time.monotonic() - started

"""
TLS and WebSocket listeners feeding the one router, with clients nobody
here wrote: paho-mqtt over WebSocket and TLS, mosquitto_pub/mosquitto_sub
over TLS (with and without client certificates).  Certificates are made by
the tests with trustme.
"""

import base64
import json
import os
import random
import socket
import ssl
import subprocess
import time
import urllib.request

import pytest
import trustme

from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer
from tests.conftest import require_program
from tests.mosquitto_clients import Sub, pub
from tests.network import LOCAL, endpoint, free_port
from tests.paho import PahoClient


def ws_client(port, client_id, version="MQTTv311", path="/mqtt", **kwargs):
    c = PahoClient(port, client_id, version, transport="websockets", **kwargs)
    c.client.ws_set_options(path=path)
    return c


def tls_client(port, client_id, pki, version="MQTTv311", client_cert=False):
    c = PahoClient(port, client_id, version)
    if client_cert:
        c.client.tls_set(ca_certs=pki["ca"], certfile=pki["client_cert"], keyfile=pki["client_key"])
    else:
        c.client.tls_set(ca_certs=pki["ca"])
    return c


# Every transport, one router


def test_a_message_published_on_each_transport_reaches_all_three(gateway_with, pki):
    ws, tls = free_port(), free_port()
    gw = gateway_with(
        "--ws", endpoint(ws), "--tls", endpoint(tls), "--cert", pki["cert"], "--key", pki["key"]
    )
    subscribers = {
        "tcp": PahoClient(gw.port, "sub-tcp", "MQTTv311"),
        "ws": ws_client(ws, "sub-ws"),
        "tls": tls_client(tls, "sub-tls", pki),
    }
    publishers = {
        "tcp": PahoClient(gw.port, "pub-tcp", "MQTTv311"),
        "ws": ws_client(ws, "pub-ws"),
        "tls": tls_client(tls, "pub-tls", pki),
    }
    for c in list(subscribers.values()) + list(publishers.values()):
        c.connect()
    for c in subscribers.values():
        c.subscribe("all/+", 1)
    for name, c in publishers.items():
        c.publish(f"all/{name}", f"from {name}".encode(), 1)
    for name, c in subscribers.items():
        got = sorted((m.topic, m.payload) for m in c.receive(3))
        assert got == [(f"all/{n}", f"from {n}".encode()) for n in ("tcp", "tls", "ws")], name


# WebSocket


@pytest.mark.parametrize("version", ["MQTTv31", "MQTTv311"])
def test_paho_over_websocket(gateway_with, version):
    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws))
    sub = ws_client(ws, "ws-sub", version)
    sub.connect()
    assert sub.subscribe("w/#", 2) == [2]
    pub = ws_client(ws, "ws-pub", version, path="/any/path/works")
    pub.connect()
    for qos in (0, 1, 2):
        pub.publish(f"w/{qos}", b"x" * (qos * 1000), qos)
    got = {m.topic: (len(m.payload), m.qos) for m in sub.receive(3)}
    assert got == {"w/0": (0, 0), "w/1": (1000, 1), "w/2": (2000, 2)}
    gw.wait_for_log("client ws-sub connected from 127.0.0.1")


class RawWebSocket:
    """Just enough of a WebSocket client to control framing exactly."""

    def __init__(self, port, protocols=None, headers=()):
        self.sock = socket.create_connection((LOCAL, port), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET /mqtt HTTP/1.1",
            f"Host: {LOCAL}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if protocols:
            lines.append(f"Sec-WebSocket-Protocol: {protocols}")
        lines.extend(headers)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        self.response, self.buffer = response.split(b"\r\n\r\n", 1)
        self.framer = Framer()

    def send_frame(self, payload, opcode=2):
        self.sock.sendall(frame(payload, opcode))

    def _recv_into_buffer(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def packets(self, count):
        """MQTT packets (and "close", "pong") from the frames the gateway sends."""
        out = []
        while len(out) < count:
            if not self._recv_into_buffer(2):
                return out
            assert not self.buffer[1] & 0x80, "a server's frames are not masked"
            n, header = self.buffer[1], 2
            if n >= 126:
                header = 4 if n == 126 else 10
                if not self._recv_into_buffer(header):
                    return out
                n = int.from_bytes(self.buffer[2:header], "big")
            if not self._recv_into_buffer(header + n):
                return out
            opcode = self.buffer[0] & 0x0F
            payload, self.buffer = self.buffer[header : header + n], self.buffer[header + n :]
            if opcode in (0, 2):
                out.extend(self.framer.feed(payload))
            elif opcode == 8:
                out.append("close")
            elif opcode == 10:
                out.append("pong")
        return out


def frame(payload, opcode=2, fin=True):
    """A masked client frame."""
    mask = os.urandom(4)
    header = bytes(((0x80 if fin else 0) | opcode,))
    n = len(payload)
    length_bytes = 0 if n < 126 else 2 if n < 65536 else 8
    if length_bytes == 0:
        header += bytes((0x80 | n,))
    else:
        header += bytes((0x80 | (126 if length_bytes == 2 else 127),)) + n.to_bytes(length_bytes, "big")
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return header + mask + masked


def test_websocket_without_subprotocol_connects(gateway_with):
    ws = free_port()
    gateway_with("--ws", endpoint(ws))
    raw = RawWebSocket(ws)
    assert raw.response.startswith(b"HTTP/1.1 101")
    assert b"sec-websocket-protocol" not in raw.response.lower()
    raw.send_frame(P.Connect(client_id="bare").encode())
    assert raw.packets(1) == [P.Connack(0)]


@pytest.mark.parametrize("offered,chosen", [("mqtt", b"mqtt"), ("mqttv3.1", b"mqttv3.1"), ("foo, mqtt", b"mqtt")])
def test_websocket_subprotocol_is_negotiated(gateway_with, offered, chosen):
    ws = free_port()
    gateway_with("--ws", endpoint(ws))
    raw = RawWebSocket(ws, offered)
    assert b"Sec-WebSocket-Protocol: " + chosen in raw.response


def test_packets_may_span_frames_and_frames_may_hold_several(gateway_with):
    ws = free_port()
    gateway_with("--ws", endpoint(ws))
    raw = RawWebSocket(ws, "mqtt")
    connect = P.Connect(client_id="split").encode()
    raw.send_frame(connect[:3])
    raw.send_frame(connect[3:])
    raw.send_frame(P.Subscribe(1, [("s", 0)]).encode() + P.Publish("s", b"one").encode() + P.Publish("s", b"two").encode()[:4])
    raw.send_frame(P.Publish("s", b"two").encode()[4:])
    assert raw.packets(4) == [
        P.Connack(0),
        P.Suback(1, [0]),
        P.Publish("s", b"one"),
        P.Publish("s", b"two"),
    ]


def test_every_framing_a_client_may_use_in_one_stream_cut_anywhere(gateway_with):
    """
    Frames as browsers send them take a short path; everything else goes
    through the full WebSocket parser.  Mixed in one stream and cut at
    arbitrary points, every packet arrives once and in order.
    """
    ws = free_port()
    gateway_with("--ws", endpoint(ws))
    sub = RawWebSocket(ws, "mqtt")
    sub.send_frame(P.Connect(client_id="mixed-sub").encode())
    sub.send_frame(P.Subscribe(1, [("mixed/#", 0)]).encode())
    assert sub.packets(2) == [P.Connack(0), P.Suback(1, [0])]

    pub = RawWebSocket(ws, "mqtt")
    expected = []

    def publish(i, size=8):
        packet = P.Publish(f"mixed/{i}", bytes([i % 251]) * size)
        expected.append(packet)
        return packet.encode()

    stream = [frame(P.Connect(client_id="mixed-pub").encode())]
    stream += [frame(publish(i)) for i in range(300)]  # more than one turn's frames
    stream.append(frame(b"are you there", opcode=9))  # ping between data frames
    stream.append(frame(publish(300, 200)))  # 16-bit length
    stream.append(frame(publish(301, 70_000)))  # 64-bit length
    stream.append(frame(publish(302, 3000)))  # unmasked another way
    two = publish(303) + publish(304)
    stream.append(frame(two[:5], fin=False))  # one message in three frames
    stream.append(frame(two[5:20], opcode=0, fin=False))
    stream.append(frame(two[20:], opcode=0))
    stream += [frame(publish(i)) for i in range(305, 320)]
    data = b"".join(stream)
    rng = random.Random(7)
    at = 0
    pub.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while at < len(data):
        step = rng.choice((1, 3, 7, 50, 500, 4000))
        pub.sock.sendall(data[at : at + step])
        at += step
        if rng.random() < 0.05:
            # Paced on purpose: a pause now and then so the gateway reads
            # the stream in pieces, cut where the sends were.
            time.sleep(0.002)
    assert pub.packets(2) == [P.Connack(0), "pong"]
    assert sub.packets(len(expected)) == expected


@pytest.mark.parametrize(
    "bad",
    [
        b"\x82\x05hello",  # not masked
        b"\x82\xfe\x00\x05mask" + b"hello",  # a 16-bit length for 5 bytes
        b"\xb2\x85mask" + b"hello",  # reserved bits without an extension
    ],
    ids=["unmasked", "non-minimal-length", "reserved-bits"],
)
def test_a_frame_that_breaks_the_websocket_rules_closes_the_connection(gateway_with, bad):
    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws))
    raw = RawWebSocket(ws, "mqtt")
    raw.send_frame(P.Connect(client_id="rule-breaker").encode())
    assert raw.packets(1) == [P.Connack(0)]
    raw.sock.sendall(frame(P.Pingreq().encode()) + bad)
    # The PINGRESP of the same read may or may not make it out first, and
    # the close frame may be cut off by a reset.
    try:
        ending = raw.packets(2)[-1]
    except ConnectionResetError:
        ending = "reset"
    assert ending in ("close", "reset")
    gw.wait_for_log("client rule-breaker connection lost")
    assert "Traceback" not in gw.log() and "critical" not in gw.log()


def test_text_message_closes_the_connection(gateway_with):
    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws))
    raw = RawWebSocket(ws, "mqtt")
    raw.send_frame(P.Connect(client_id="texter").encode())
    assert raw.packets(1) == [P.Connack(0)]
    raw.send_frame(b"hello", opcode=1)
    gw.wait_for_log("MQTT needs binary messages")


def test_forwarded_for_is_used_only_from_a_trusted_proxy(gateway_with, tmp_path):
    ws = free_port()
    config = tmp_path / "proxy.toml"
    config.write_text('[websocket]\ntrusted_proxies = ["127.0.0.1"]\n')
    gw = gateway_with("--ws", endpoint(ws), "--config", str(config))
    raw = RawWebSocket(ws, "mqtt", ["X-Forwarded-For: 198.51.100.7, 203.0.113.9"])
    raw.send_frame(P.Connect(client_id="proxied").encode())
    assert raw.packets(1) == [P.Connack(0)]
    gw.wait_for_log("client proxied connected from 203.0.113.9")

    untrusted = gateway_with("--ws", endpoint(free_port2 := free_port()))
    raw = RawWebSocket(free_port2, "mqtt", ["X-Forwarded-For: 203.0.113.9"])
    raw.send_frame(P.Connect(client_id="direct").encode())
    assert raw.packets(1) == [P.Connack(0)]
    untrusted.wait_for_log("client direct connected from 127.0.0.1")


def test_websocket_message_over_the_size_limit_is_refused(gateway_with, tmp_path):
    ws = free_port()
    config = tmp_path / "small.toml"
    config.write_text("[websocket]\nmax_message_size = 1000\n")
    gw = gateway_with("--ws", endpoint(ws), "--config", str(config))
    raw = RawWebSocket(ws, "mqtt")
    raw.send_frame(P.Connect(client_id="big").encode())
    assert raw.packets(1) == [P.Connack(0)]
    raw.send_frame(P.Publish("t", b"x" * 5000).encode())
    assert raw.packets(1) == ["close"]
    gw.wait_for_log("client big connection lost")


def test_healthz_answers_on_the_websocket_port(gateway_with):
    ws = free_port()
    gateway_with("--ws", endpoint(ws))
    with urllib.request.urlopen(f"http://{LOCAL}:{ws}/healthz", timeout=10) as r:
        assert r.status == 200
        assert r.headers["content-type"] == "application/json"
        status = json.loads(r.read())
    assert status["status"] == "ok"
    assert {"connections", "sessions", "retained", "messages_received"} <= set(status)


# TLS


@pytest.mark.parametrize("version", ["mqttv31", "mqttv311"])
def test_mosquitto_clients_over_tls_with_cafile(gateway_with, pki, version):
    tls = free_port()
    gateway_with("--tls", endpoint(tls), "--cert", pki["cert"], "--key", pki["key"])
    sub = Sub(tls, version, "--cafile", pki["ca"], "-t", "tls/#", "-q", "1", "-i", "tls-sub")
    pub(tls, version, "tls/x", "--cafile", pki["ca"], "-m", "secret", "-q", "1", "-i", "tls-pub")
    assert sub.messages(1) == ["tls/x secret"]
    sub.stop()


def test_mosquitto_clients_with_a_required_client_certificate(gateway_with, pki):
    tls = free_port()
    gw = gateway_with(
        "--tls", endpoint(tls), "--cert", pki["cert"], "--key", pki["key"],
        "--ca", pki["ca"], "--require-client-cert", "--use-identity-as-username",
    )
    common = ["-h", LOCAL, "-p", str(tls), "--cafile", pki["ca"], "-t", "c", "-m", "x", "-i", "certified"]
    refused = subprocess.run(
        [require_program("mosquitto_pub"), *common], capture_output=True, text=True, timeout=10
    )
    assert refused.returncode != 0
    accepted = subprocess.run(
        [require_program("mosquitto_pub"), *common, "--cert", pki["client_cert"], "--key", pki["client_key"]],
        capture_output=True, text=True, timeout=10,
    )
    assert accepted.returncode == 0, accepted.stderr
    gw.wait_for_log("client certified connected from 127.0.0.1")
    gw.wait_for_log("user device-1)")


def test_listener_tables_take_the_tls_identity_only_where_there_is_a_certificate(gateway_with, pki, tmp_path):
    """
    With tls.use_identity_as_username, a [[listener]] tls table that leaves
    it out takes it (a certificate's name, nobody without one, and no
    "anonymous" warning), while a tcp table, with no certificate to read,
    logs clients in as the main TCP listener does.
    """
    tls, tcp = free_port(), free_port()
    config = tmp_path / "c.toml"
    config.write_text(
        f'[tls]\ncert = "{pki["cert"]}"\nkey = "{pki["key"]}"\nca = "{pki["ca"]}"\n'
        "require_client_cert = true\nuse_identity_as_username = true\n"
        f'[[listener]]\nkind = "tls"\naddress = "{endpoint(tls)}"\n'
        f'[[listener]]\nkind = "tcp"\naddress = "{endpoint(tcp)}"\n'
    )
    gw = gateway_with("--config", str(config))
    gw.wait_for_log(f"listener {endpoint(tcp)} (tcp) accepts anonymous clients")
    assert f"listener {endpoint(tls)} (tls) accepts anonymous" not in gw.log()
    common = ["-h", LOCAL, "-t", "c", "-m", "x"]
    certified = subprocess.run(
        [require_program("mosquitto_pub"), *common, "-p", str(tls), "-i", "certified", "--cafile", pki["ca"],
         "--cert", pki["client_cert"], "--key", pki["client_key"]],
        capture_output=True, text=True, timeout=10,
    )
    assert certified.returncode == 0, certified.stderr
    gw.wait_for_log("client certified connected from 127.0.0.1")
    gw.wait_for_log("user device-1)")
    plain = subprocess.run(
        [require_program("mosquitto_pub"), *common, "-p", str(tcp), "-i", "plain"],
        capture_output=True, text=True, timeout=10,
    )
    assert plain.returncode == 0, plain.stderr
    gw.wait_for_log("client plain connected from 127.0.0.1")


def test_tls_client_with_the_wrong_ca_is_refused(gateway_with, pki):
    tls = free_port()
    gateway_with("--tls", endpoint(tls), "--cert", pki["cert"], "--key", pki["key"])
    out = subprocess.run(
        [require_program("mosquitto_pub"), "-h", LOCAL, "-p", str(tls), "--cafile", pki["other_ca"], "-t", "x", "-m", "y"],
        capture_output=True, text=True, timeout=10,
    )
    assert out.returncode != 0


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_tls_below_1_2_is_refused(gateway_with, pki):
    tls = free_port()
    gateway_with("--tls", endpoint(tls), "--cert", pki["cert"], "--key", pki["key"])
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(pki["ca"])
    old.set_ciphers("ALL:@SECLEVEL=0")
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection((LOCAL, tls), timeout=10) as raw:
        with pytest.raises(ssl.SSLError):
            old.wrap_socket(raw, server_hostname=LOCAL).do_handshake()
    modern = ssl.create_default_context(cafile=pki["ca"])
    modern.minimum_version = modern.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection((LOCAL, tls), timeout=10) as raw:
        with modern.wrap_socket(raw, server_hostname=LOCAL) as s:
            assert s.version() == "TLSv1.2"


def test_wss_carries_mqtt_over_tls(gateway_with, pki):
    wss = free_port()
    gateway_with("--wss", endpoint(wss), "--cert", pki["cert"], "--key", pki["key"])
    c = PahoClient(wss, "wss-client", "MQTTv311", transport="websockets")
    c.client.tls_set(ca_certs=pki["ca"])
    c.connect()
    c.subscribe("secure", 1)
    c.publish("secure", b"over wss", 1)
    assert c.receive()[0].payload == b"over wss"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tls", "8883"], "TLS listeners need tls.cert and tls.key"),
        (["--tls", "8883", "--cert", "/nonexistent.pem", "--key", "/nonexistent.key"], "tls.cert /nonexistent.pem: cannot read"),
        (["--tls", "8883", "--cert", "{key}", "--key", "{key}"], "no PEM certificate"),
        (["--tls", "8883", "--cert", "{cert}", "--key", "{cert}"], "tls.key"),
        (["--tls", "8883", "--cert", "{cert}", "--key", "{client_key}"], "cannot be used together"),
        (["--tls", "8883", "--cert", "{cert}", "--key", "{key}", "--require-client-cert"], "needs tls.ca"),
    ],
)
def test_bad_certificate_files_stop_start_up_naming_the_file(tmp_path, pki, args, message):
    from tests.gateway import TWISTD, gateway_env

    args = [a.format(**pki) for a in args]
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw", *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=gateway_env(),
    )
    assert out.returncode != 0
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# Slow consumers, over real sockets


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_a_reader_that_stops_reading_is_paused_then_dropped_not_buffered(gateway_with, transport):
    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws), "--max-queued-messages", "50")
    if transport == "ws":
        reader = RawWebSocket(ws, "mqtt")
        reader.send_frame(P.Connect(client_id="stalled").encode() + P.Subscribe(1, [("flood", 0)]).encode())
        assert reader.packets(2) == [P.Connack(0), P.Suback(1, [0])]
        sock = reader.sock
    else:
        sock = socket.create_connection((LOCAL, gw.port), timeout=10)
        sock.sendall(P.Connect(client_id="stalled").encode() + P.Subscribe(1, [("flood", 0)]).encode())
        framer, got = Framer(), []
        while len(got) < 2:
            got.extend(framer.feed(sock.recv(4096)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    rss_before = _rss_kib(gw.process.pid)
    # The reader now reads nothing; a publisher sends far more than the
    # socket buffers and the queue can hold.
    publisher = socket.create_connection((LOCAL, gw.port), timeout=10)
    publisher.sendall(P.Connect(client_id="flooder").encode())
    chunk = P.Publish("flood", b"x" * 10_000).encode() * 100
    for _ in range(60):
        publisher.sendall(chunk)
    publisher.sendall(P.Pingreq().encode())
    framer, got = Framer(), []
    while P.Pingresp() not in got:
        got.extend(framer.feed(publisher.recv(65536)))
    gw.wait_for_log("client stalled queue full: dropped QoS 0 message")
    with urllib.request.urlopen(f"http://{LOCAL}:{ws}/healthz", timeout=10) as r:
        status = json.loads(r.read())
    # 60 MB went to a reader that took none of it: most was dropped and
    # counted, and the gateway did not grow by anything like 60 MB.
    assert status["messages_dropped"] > 4000
    assert _rss_kib(gw.process.pid) - rss_before < 30_000
    sock.close()


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def upgrade_status(port, origin=None, host=None):
    headers = [f"Origin: {origin}"] if origin else []
    sock = socket.create_connection((LOCAL, port), timeout=10)
    lines = [
        "GET /mqtt HTTP/1.1",
        f"Host: {host or f'{LOCAL}:{port}'}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: bXF0dGd3LWJlbmNobWFyaw==",
        "Sec-WebSocket-Version: 13",
        *headers,
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    response = sock.recv(4096)
    sock.close()
    return int(response.split()[1])


def test_websocket_origin_check_by_default_allows_only_the_gateways_own_pages(gateway_with):
    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws))
    assert upgrade_status(ws) == 101  # not a browser
    assert upgrade_status(ws, f"http://{LOCAL}:{ws}") == 101  # its own page
    assert upgrade_status(ws, "https://evil.example") == 403
    assert upgrade_status(ws, "null") == 403
    gw.wait_for_log("origin https://evil.example is not allowed")


def test_websocket_allowed_origins_are_configurable(gateway_with, tmp_path):
    ws = free_port()
    config = tmp_path / "origins.toml"
    config.write_text('[websocket]\nallowed_origins = ["https://dash.example"]\n')
    gateway_with("--ws", endpoint(ws), "--config", str(config))
    assert upgrade_status(ws, "https://dash.example") == 101
    assert upgrade_status(ws, "https://DASH.example/") == 101
    assert upgrade_status(ws, "https://evil.example") == 403
    any_port = free_port()
    gateway_with("--ws", endpoint(any_port), "--allowed-origin", "*")
    assert upgrade_status(any_port, "https://evil.example") == 101


def test_websocket_port_offers_the_sites_protocols_for_alpn():
    # Without it Chromium's TLS handshake with a wss listener failed.
    from twisted.internet.interfaces import IProtocolNegotiationFactory

    from mqttgw.testing import FakeBroker
    from mqttgw.transports.websocket import websocket_site

    broker = FakeBroker()
    guarded = websocket_site(broker.factory, broker.router, broker.clock, 1024)
    assert IProtocolNegotiationFactory.providedBy(guarded)
    assert b"http/1.1" in guarded.acceptableProtocols()


def test_sighup_renews_the_tls_certificate_for_new_handshakes(gateway_with, tmp_path):
    import signal

    def issue(name):
        ca = trustme.CA()
        cert = ca.issue_cert(LOCAL)
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
        cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
        ca.cert_pem.write_to_path(str(tmp_path / f"{name}-ca.pem"))
        return str(tmp_path / f"{name}-ca.pem")

    def handshake(port, cafile):
        context = ssl.create_default_context(cafile=cafile)
        sock = socket.create_connection((LOCAL, port), timeout=10)
        return context.wrap_socket(sock, server_hostname=LOCAL)

    old_ca = issue("old")
    tls_port = free_port()
    gw = gateway_with("--tls", endpoint(tls_port), "--cert", str(tmp_path / "server.pem"), "--key", str(tmp_path / "server.key"))
    before = handshake(tls_port, old_ca)
    before.sendall(P.Connect(client_id="kept").encode())
    assert before.recv(4) == P.Connack(0).encode()
    new_ca = issue("new")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("1 TLS certificate(s)")
    handshake(tls_port, new_ca).close()
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls_port, old_ca)
    # The connection made before the renewal goes on.
    before.sendall(P.Pingreq().encode())
    assert before.recv(2) == P.Pingresp().encode()
    before.close()
    # A broken file leaves the certificate in use.
    (tmp_path / "server.pem").write_text("not a certificate\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("reload failed, nothing changed")
    handshake(tls_port, new_ca).close()

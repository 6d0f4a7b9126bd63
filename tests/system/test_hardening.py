"""
What hostile probes of a running gateway found, each checked from the
outside with real sockets: bridge state topics spoofed by clients, a
client holding subscriptions without end, and WebSocket input that was
read or worked on past any bound.
"""

import json
import signal
import socket
import threading
import time

import pytest

from bench import hostile
from mqttgw.wire import packets as P
from tests.gateway_probes import MiB, Probe, rss_kib, start
from tests.network import free_port


def healthz(port):
    """The gateway's counters, asked over HTTP on its WebSocket port."""
    sock = hostile.connection(port)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    response = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        response += chunk
    sock.close()
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def retained_under(port, topic_filter, name):
    """
    The retained messages matching ``topic_filter``: subscribed together
    with a sentinel retained topic whose message comes after theirs.
    """
    pub, _ = hostile.mqtt_connect(port, f"{name}-sentinel")
    pub.sendall(P.Publish("sentinel/x", b"s", 1, retain=True, message_id=1).encode())
    assert hostile.recv_packets(pub, hostile.Framer(1 << 20), 1) == [P.Puback(1)]
    pub.close()
    sock, framer = hostile.mqtt_connect(port, name)
    sock.sendall(P.Subscribe(1, [(topic_filter, 0), ("sentinel/x", 0)]).encode())
    got = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for packet in hostile.recv_packets(sock, framer, 1):
            if isinstance(packet, P.Publish):
                if packet.topic == "sentinel/x":
                    sock.close()
                    return {p.topic: p.payload for p in got}
                got.append(packet)
    raise AssertionError(f"no sentinel: {got}")


def bridge_toml(path, *names, extra=""):
    """Bridges to an upstream that refuses connections."""
    dead = f"127.0.0.1:{free_port()}"
    tables = "".join(
        f'[[bridge]]\nname = "{name}"\naddresses = ["{dead}"]\nrules = ["x/# out 1"]\n'
        "reconnect_initial = 5.0\nreconnect_max = 10.0\n"
        for name in names
    )
    path.write_text(extra + tables)
    return str(path)


# 1. Bridge state topics belong to the gateway.


def test_bridge_state_of_any_name_cannot_be_written_by_a_client(gateway_with):
    gw = start(gateway_with)
    sock, framer = hostile.mqtt_connect(gw.port, "spoofer")
    for mid, topic in enumerate(("mqttgw/bridge/fake/state", "mqttgw/bridge/up/state"), 1):
        sock.sendall(P.Publish(topic, b"1", 1, retain=True, message_id=mid).encode())
        # Acknowledged (the client must not send it again), not kept.
        assert hostile.recv_packets(sock, framer, 1) == [P.Puback(mid)]
    assert retained_under(gw.port, "mqttgw/bridge/#", "watch") == {}
    gw.wait_for_log("client spoofer (user None) may not publish on mqttgw/bridge/fake/state")


def test_a_will_on_a_bridge_state_topic_is_refused_at_connect(gateway_with):
    gw = start(gateway_with)
    sock = hostile.connection(gw.port)
    framer = hostile.Framer(1 << 20)
    sock.sendall(
        P.Connect(client_id="will-spoofer", will_topic="mqttgw/bridge/x/state", will_message=b"1").encode()
    )
    [connack] = hostile.recv_packets(sock, framer, 1)
    assert connack.return_code == P.CONNACK_NOT_AUTHORIZED
    gw.wait_for_log("may not publish its will on 'mqttgw/bridge/x/state'")


def test_a_client_may_write_its_own_connection_state_and_no_other(gateway_with):
    gw = start(gateway_with)
    sock, framer = hostile.mqtt_connect(gw.port, "site-1")
    own = "$SYS/broker/connection/site-1/state"
    other = "$SYS/broker/connection/site-2/state"
    sock.sendall(P.Publish(own, b"1", 1, retain=True, message_id=1).encode())
    sock.sendall(P.Publish(other, b"1", 1, retain=True, message_id=2).encode())
    assert hostile.recv_packets(sock, framer, 2) == [P.Puback(1), P.Puback(2)]
    assert retained_under(gw.port, "$SYS/broker/connection/#", "watch") == {own: b"1"}
    gw.wait_for_log(f"may not publish on {other}")


def test_state_of_a_bridge_removed_while_stopped_is_cleared_at_start(gateway_with, tmp_path):
    data = tmp_path / "data"
    with_bridge = bridge_toml(tmp_path / "a.toml", "old", "kept")
    gw = start(gateway_with, "--config", with_bridge, "--data-dir", str(data))
    assert retained_under(gw.port, "mqttgw/bridge/#", "before") == {
        "mqttgw/bridge/old/state": b"0",
        "mqttgw/bridge/kept/state": b"0",
    }
    gw.stop()
    without = bridge_toml(tmp_path / "b.toml", "kept")
    gw = start(gateway_with, "--config", without, "--data-dir", str(data))
    gw.wait_for_log("cleared the retained state of bridges not configured: mqttgw/bridge/old/state")
    assert retained_under(gw.port, "mqttgw/bridge/#", "after") == {"mqttgw/bridge/kept/state": b"0"}


def test_state_of_a_bridge_removed_by_reload_is_cleared(gateway_with, tmp_path):
    config = tmp_path / "c.toml"
    bridge_toml(config, "gone")
    gw = start(gateway_with, "--config", str(config))
    sock, framer = hostile.mqtt_connect(gw.port, "watch")
    sock.sendall(P.Subscribe(1, [("mqttgw/bridge/gone/state", 0)]).encode())
    got = hostile.recv_packets(sock, framer, 2)
    assert [(p.payload, p.retain) for p in got if isinstance(p, P.Publish)] == [(b"0", True)]
    bridge_toml(config)
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("bridges -gone")
    # The subscriber sees the bridge stop, then its state cleared; a
    # newcomer finds none.
    stopped, cleared = hostile.recv_packets(sock, framer, 2)
    assert [(p.topic, p.payload) for p in (stopped, cleared)] == [
        ("mqttgw/bridge/gone/state", b"0"),
        ("mqttgw/bridge/gone/state", b""),
    ]
    assert retained_under(gw.port, "mqttgw/bridge/#", "newcomer") == {}


def test_a_bridge_into_a_central_mqttgw_reports_its_state_there(gateway_with, tmp_path):
    centre = start(gateway_with)
    config = tmp_path / "site.toml"
    config.write_text(
        f'[[bridge]]\nname = "up"\naddresses = ["127.0.0.1:{centre.port}"]\n'
        'rules = ["site/# out 1"]\nreconnect_initial = 0.2\nreconnect_max = 1.0\n'
    )
    watch, framer = hostile.mqtt_connect(centre.port, "watch")
    watch.sendall(P.Subscribe(1, [(f"$SYS/broker/connection/{socket.gethostname()}.up/state", 1)]).encode())
    hostile.recv_packets(watch, framer, 1)
    site = start(gateway_with, "--config", str(config))
    site.wait_for_log("bridge up: upstream accepted CONNECT")
    [up] = hostile.recv_packets(watch, framer, 1)
    assert up.payload == b"1"
    # Its will, accepted at CONNECT, tells the centre when the site dies.
    site.stop(signal.SIGKILL)
    [down] = hostile.recv_packets(watch, framer, 1, timeout=30)
    assert down.payload == b"0"


# 2. A bound on each client's subscriptions.


def subscribe_many(sock, framer, filters, per_packet=10_000):
    """SUBSCRIBE ``filters`` in packets of ``per_packet``: the granted codes."""
    codes = []
    for mid, start_at in enumerate(range(0, len(filters), per_packet), 1):
        chunk = filters[start_at : start_at + per_packet]
        sock.sendall(P.Subscribe(mid, [(f, 1) for f in chunk]).encode())
        [suback] = hostile.recv_packets(sock, framer, 1, timeout=30)
        assert suback.message_id == mid
        codes += suback.granted_qos
    return codes


def test_subscriptions_past_max_subscriptions_are_refused_counted_and_bounded(gateway_with):
    gw = start(gateway_with, "--no-persistence", ws=True)
    before = rss_kib(gw)
    sock, framer = hostile.mqtt_connect(gw.port, "hoarder")
    codes = subscribe_many(sock, framer, [f"hoard/{i}/level" for i in range(110_000)])
    assert codes == [1] * 10_000 + [P.SUBACK_FAILURE] * 100_000
    # 110,000 filters granted held +76 MB; the 10,000 kept stay well below.
    assert rss_kib(gw) - before < 20 * MiB
    assert healthz(gw.ws_port)["subscriptions_refused"] == 100_000
    # One line per refusing packet, not one per filter.
    gw.wait_for_log("SUBSCRIBE refused 10000 of 10000 filters: max_subscriptions (10000) reached")
    assert gw.log().count("SUBSCRIBE refused") == 10
    # A filter already held is granted again at the bound; one let go makes room.
    assert subscribe_many(sock, framer, ["hoard/0/level"]) == [1]
    sock.sendall(P.Unsubscribe(2, ["hoard/1/level"]).encode())
    assert hostile.recv_packets(sock, framer, 1) == [P.Unsuback(2)]
    assert subscribe_many(sock, framer, ["new/a", "new/b"]) == [1, P.SUBACK_FAILURE]


def test_subscriptions_past_max_subscription_bytes_are_refused(gateway_with, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[limits]\nmax_subscription_bytes = 1000\n")
    gw = start(gateway_with, "--config", str(config))
    sock, framer = hostile.mqtt_connect(gw.port, "long-filters")
    filters = [f"{i:03d}/" + "x" * 96 for i in range(12)]  # 100 bytes each
    assert subscribe_many(sock, framer, filters) == [1] * 10 + [P.SUBACK_FAILURE] * 2
    gw.wait_for_log("refused 2 of 12 filters: max_subscription_bytes (1000) reached")


def test_mqtt31_client_past_max_subscriptions_is_disconnected(gateway_with, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[limits]\nmax_subscriptions = 3\n")
    gw = start(gateway_with, "--config", str(config))
    sock, framer = hostile.mqtt_connect(gw.port, "old-client", version=P.MQTT_31)
    sock.sendall(P.Subscribe(1, [(f"t/{i}", 0) for i in range(4)]).encode())
    # 3.1 has no failure code in SUBACK: the connection is closed instead.
    assert hostile.closed_by_peer(sock, 5)
    gw.wait_for_log("SUBSCRIBE: max_subscriptions (3) reached")


# 3. WebSocket input.


def read_response(sock, timeout=5):
    sock.settimeout(timeout)
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(4096)
        if not chunk:
            break
        response += chunk
    return response


def test_request_body_to_the_websocket_port_is_refused_before_it_is_read(gateway_with):
    gw = start(gateway_with, ws=True)
    read_before = healthz(gw.ws_port)["bytes_received"]
    sock = hostile.connection(gw.ws_port)
    sock.sendall(b"POST /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 67108864\r\n\r\n")
    # Answered before a byte of the body was sent.
    assert read_response(sock).startswith(b"HTTP/1.1 413 ")
    sent = hostile.send_for(sock, bytes(256 * 1024), 2.0)
    sock.close()
    gw.wait_for_log("a request body of 67108864 bytes (at most 0)")
    read = healthz(gw.ws_port)["bytes_received"] - read_before
    # The request head, what came with it in one read, and the healthz
    # requests themselves: at most one 64 KiB read, however much was sent.
    assert read <= 64 * 1024 + 1024, (read, sent)


@pytest.mark.parametrize(
    "headers, status",
    [
        (b"Content-Length: 16385\r\n", b"413"),
        (b"Transfer-Encoding: chunked\r\n", b"411"),
        (b"Content-Length: many\r\n", b"400"),
    ],
    ids=["over-16KiB", "chunked", "malformed"],
)
def test_dashboard_port_takes_small_bodies_only(gateway_with, headers, status):
    gw = start(gateway_with, "--dashboard", ws=True)
    sock = hostile.connection(gw.ws_port)
    sock.sendall(b"POST /api/token HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
    assert read_response(sock).startswith(b"HTTP/1.1 " + status)
    assert hostile.closed_by_peer(sock, 5)
    # A sign-in's small body is still read and answered.
    sock = hostile.connection(gw.ws_port)
    body = b'{"username": "nobody", "password": "x"}'
    sock.sendall(
        b"POST /api/token HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    assert read_response(sock).startswith(b"HTTP/1.1 401 ")


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def round_trips_beside(port, name, work=None, limit=3000):
    """
    A probe's QoS 1 round trip times, back to back, while ``work`` runs in
    a thread (or for ``limit`` round trips without it).
    """
    probe = Probe(port, name)
    done = threading.Event()
    result = {}
    if work is not None:

        def run():
            try:
                result["value"] = work()
            finally:
                done.set()

        threading.Thread(target=run, daemon=True).start()
    times = []
    mid = 0
    while len(times) < 20_000 and not (done.is_set() if work else len(times) >= limit):
        mid = mid % 60000 + 1
        rt = probe.round_trip(mid)
        assert rt is not None, probe.failures
        times.append(rt)
    probe.sock.close()
    assert done.wait(60) if work else True
    return times, result.get("value")


@pytest.mark.parametrize("sender", ["ws_one_byte_messages", "ws_one_byte_fragments"])
def test_publish_dripped_in_one_byte_websocket_frames_leaves_others_round_trips_within_5x(
    gateway_with, sender
):
    gw = start(gateway_with, "--no-persistence", ws=True)
    sub, framer = hostile.mqtt_connect(gw.port, "drip-sub")
    sub.sendall(P.Subscribe(1, [("drip/#", 1)]).encode())
    hostile.recv_packets(sub, framer, 1)
    quiet, _ = round_trips_beside(gw.port, "quiet")
    send = getattr(hostile, sender)
    busy, got = round_trips_beside(gw.port, "busy", lambda: send(gw.ws_port, "drip", size=256 * 1024))
    assert got == [P.Puback(1)]
    [message] = hostile.recv_packets(sub, framer, 1, timeout=30)
    assert len(message.payload) == 256 * 1024
    # Several hundred round trips took place while the frames were read.
    assert len(busy) >= 200, len(busy)
    for fraction in (0.5, 0.9):
        assert percentile(busy, fraction) <= 5 * percentile(quiet, fraction), (
            fraction, percentile(busy, fraction), percentile(quiet, fraction)
        )


def test_frame_inside_a_fragmented_message_that_is_not_a_continuation_closes_the_connection(
    gateway_with,
):
    gw = start(gateway_with, ws=True)
    sock, rest = hostile.ws_mqtt_connect(gw.ws_port, "mixer")
    packet = P.Publish("mix/a", b"x", 0).encode()
    sock.sendall(hostile.ws_frame(packet[:2], fin=False) + hostile.ws_frame(packet[2:]))
    assert hostile.closed_by_peer(sock, 5)
    gw.wait_for_log("frame 0x82 inside a fragmented message")
    # A ping inside a fragmented message is answered, and the message completes.
    sub, framer = hostile.mqtt_connect(gw.port, "mix-sub")
    sub.sendall(P.Subscribe(1, [("mix/#", 0)]).encode())
    hostile.recv_packets(sub, framer, 1)
    sock, rest = hostile.ws_mqtt_connect(gw.ws_port, "pinger")
    sock.sendall(
        hostile.ws_frame(packet[:2], fin=False)
        + hostile.ws_frame(b"hello", opcode=9)
        + hostile.ws_frame(packet[2:], opcode=0)
    )
    [message] = hostile.recv_packets(sub, framer, 1)
    assert (message.topic, message.payload) == ("mix/a", b"x")
    sock.close()

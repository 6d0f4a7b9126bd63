"""
The fault proxy (bench/faultproxy.py) in front of a gateway on loopback:
what crosses it arrives whole and in order despite delay and jitter; a
reset closes the client's connection; a half-open link leaves it open but
dead, which the client's keepalive finds; a stall holds data, then lets it
through.
"""

import subprocess
import sys

import pytest

from tests.gateway import REPO, Gateway, gateway_env
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient


@pytest.fixture
def target(tmp_path):
    gw = Gateway(tmp_path, "--no-persistence")
    yield gw
    gw.stop()


@pytest.fixture
def proxy(target, tmp_path):
    started = []

    def start(*options):
        port = free_port()
        log = open(tmp_path / f"proxy-{len(started)}.log", "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.faultproxy", "--listen", f"127.0.0.1:{port}",
             "--target", f"127.0.0.1:{target.port}", *options],
            cwd=REPO, env=gateway_env(), stdout=log, stderr=subprocess.STDOUT,
        )
        process.port = port
        process.log_path = tmp_path / f"proxy-{len(started)}.log"
        started.append(process)
        _wait_for(lambda: "listening on" in process.log_path.read_text(), process)
        return process

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def _wait_for(condition, process=None, timeout=15.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the proxy exited: {process.log_path.read_text()}")
        time.sleep(0.05)
    raise AssertionError("not within the time allowed")


def through(proxy_process, client_id, keepalive=60):
    client = PahoClient(proxy_process.port, client_id, "MQTTv311")
    client.connect(keepalive=keepalive)
    return client


def test_delay_and_jitter_keep_every_message_in_order(proxy):
    p = proxy("--delay", "0.05", "--jitter", "0.04")
    sub = through(p, "sub")
    sub.subscribe("t", 1)
    pub = through(p, "pub")
    for i in range(200):
        pub.client.publish("t", str(i).encode(), 1)
    assert [int(m.payload) for m in sub.receive(200, timeout=30)] == list(range(200))


def test_a_reset_closes_the_clients_connection(proxy):
    import signal

    p = proxy()
    client = through(p, "reset-me")
    p.send_signal(signal.SIGUSR2)
    assert client.disconnected.wait(10)
    _wait_for(lambda: "reset 1 connection(s)" in p.log_path.read_text())


def test_a_half_open_link_is_found_by_the_keepalive(proxy, target):
    import signal

    p = proxy()
    client = through(p, "half-open", keepalive=2)
    p.send_signal(signal.SIGUSR1)
    _wait_for(lambda: "1 connection(s) half-open" in p.log_path.read_text())
    # Open, but nothing crosses: the client's pings go unanswered, and the
    # gateway hears nothing from it.
    assert client.disconnected.wait(15)
    target.wait_for_log("client half-open keepalive expired", timeout=15)


def test_a_stall_holds_data_then_lets_it_through(proxy):
    p = proxy("--stall-every", "1", "--stall-for", "0.8")
    sub = through(p, "sub-stall")
    sub.subscribe("t", 1)
    pub = through(p, "pub-stall")
    # Published while a stall is under way.
    _wait_for(lambda: "stall for 0.8 s" in p.log_path.read_text())
    for i in range(50):
        pub.client.publish("t", str(i).encode(), 1)
    assert [int(m.payload) for m in sub.receive(50, timeout=30)] == list(range(50))


def test_what_came_before_a_clean_close_is_delivered_before_it(proxy):
    # A CONNACK refusal is followed at once by the server's close: the
    # delayed CONNACK still reaches the client, then the close.
    import socket

    from mqttgw.wire import packets as P

    p = proxy("--delay", "0.3")
    sock = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    connect = P.Connect(client_id="odd").encode()
    # Protocol level 9: the gateway answers CONNACK 1 and closes.
    level_at = connect.index(b"MQTT") + 4
    sock.sendall(connect[:level_at] + b"\x09" + connect[level_at + 1:])
    got = b""
    while True:
        chunk = sock.recv(64)
        if not chunk:
            break
        got += chunk
    assert got == P.Connack(1).encode()

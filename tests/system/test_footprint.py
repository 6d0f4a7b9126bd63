"""
What a gateway loads is what its configuration asks for: a TCP-only
gateway, started as twistd starts it in a fresh interpreter, answers
CONNECT without TLS, WebSocket, JWT, the admin site, Prometheus, the
archive, protobuf or MQTT-SN loaded; a WebSocket listener loads autobahn,
an MQTT-SN listener MQTT-SN's modules.
"""

import json
import socket
import subprocess
import sys

from tests.gateway import gateway_env

# Started by twistd's own entry point; a thread waits for the reactor's
# first CONNACK and then writes what is loaded.
DRIVER = r"""
import json, socket, sys, threading, time

path, port = sys.argv[1], int(sys.argv[2])
CONNECT = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01f"

def report():
    connack = b""
    deadline = time.monotonic() + 60
    while not connack and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(CONNECT)
                connack = s.recv(4)
        except OSError:
            time.sleep(0.05)
    with open(path, "w") as f:
        json.dump({"connack": connack.hex(), "modules": sorted(sys.modules)}, f)
    reactor = sys.modules["twisted.internet.reactor"]
    reactor.callFromThread(reactor.stop)

threading.Thread(target=report, daemon=True).start()
from twisted.scripts.twistd import run
sys.argv = ["twistd", "-n", "--pidfile=", "--logfile=-", "mqttgw"] + sys.argv[3:]
run()
"""

# Top-level packages (and mqttgw modules) only a configuration that asks
# for them may load.
OPTIONAL = {
    "OpenSSL", "cryptography", "service_identity",  # TLS
    "autobahn", "txaio", "cbor2",  # WebSocket
    "jwt",  # token logins
    "prometheus_client",  # the admin listener's /metrics
    "pyarrow",  # the archive
    "sqlite3",  # the store (persistence)
    "opentelemetry",  # traces (otel.endpoint)
}
OPTIONAL_MODULES = {
    "twisted.web.server", "mqttgw.web.admin", "mqttgw.web.dashboard", "mqttgw.web.metrics",
    "mqttgw.transports.websocket", "mqttgw.transports.tls", "mqttgw.archive.segments",
    "mqttgw.broker.store", "mqttgw.wire.sparkplug.payload",
    # (The [mqttsn] rows, mqttgw.transports.mqttsn.keys, are read with every
    # section's; nothing they name is loaded.)
    "mqttgw.transports.mqttsn.listener", "mqttgw.transports.mqttsn.client", "mqttgw.wire.mqttsn",
    "mqttgw.security.mqttsn_clients",
    # protobuf, for Sparkplug payloads (its namespace package is looked in).
    "google.protobuf",
}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loaded(tmp_path, *args):
    """The modules loaded once a gateway started with ``args`` answered CONNECT."""
    port = _free_port()
    out = tmp_path / "loaded.json"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), str(port),
         "--tcp", f"tcp:{port}:interface=127.0.0.1", "--no-persistence", *args],
        cwd=tmp_path, env=gateway_env(), capture_output=True, timeout=120,
    )
    assert out.exists(), done.stdout.decode(errors="replace")[-3000:]
    report = json.loads(out.read_text())
    assert report["connack"] == "20020000", done.stdout.decode(errors="replace")[-3000:]
    return set(report["modules"])


def test_a_tcp_only_gateway_loads_no_tls_websocket_web_mqttsn_or_codecs(tmp_path):
    modules = loaded(tmp_path)
    top = {name.split(".")[0] for name in modules}
    assert top & OPTIONAL == set()
    assert modules & OPTIONAL_MODULES == set()
    # The Sparkplug observer is on by default; its codec waits for a message.
    assert "mqttgw.broker.sparkplug" in modules


def test_a_websocket_listener_loads_autobahn(tmp_path):
    modules = loaded(tmp_path, "--ws", f"tcp:{_free_port()}:interface=127.0.0.1")
    assert {"autobahn", "mqttgw.transports.websocket"} <= modules


def test_an_mqttsn_listener_loads_mqttsn(tmp_path):
    modules = loaded(tmp_path, "--mqttsn", f"127.0.0.1:{_free_port()}")
    assert {"mqttgw.transports.mqttsn.listener", "mqttgw.wire.mqttsn"} <= modules

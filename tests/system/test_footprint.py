"""
What a gateway loads is what its configuration asks for: a TCP-only
gateway, started as twistd starts it in a fresh interpreter, answers
CONNECT without TLS, WebSocket, JWT, the admin site, Prometheus, the
archive, protobuf or MQTT-SN loaded; a WebSocket listener loads autobahn,
an MQTT-SN listener MQTT-SN's modules.
"""

from tests.loaded_modules import loaded
from tests.network import free_port

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


def test_a_tcp_only_gateway_loads_no_tls_websocket_web_mqttsn_or_codecs(tmp_path):
    modules = loaded(tmp_path)
    top = {name.split(".")[0] for name in modules}
    assert top & OPTIONAL == set()
    assert modules & OPTIONAL_MODULES == set()
    # The Sparkplug observer is on by default; its codec waits for a message.
    assert "mqttgw.broker.sparkplug" in modules


def test_a_websocket_listener_loads_autobahn(tmp_path):
    modules = loaded(tmp_path, "--ws", f"tcp:{free_port()}:interface=127.0.0.1")
    assert {"autobahn", "mqttgw.transports.websocket"} <= modules


def test_an_mqttsn_listener_loads_mqttsn(tmp_path):
    modules = loaded(tmp_path, "--mqttsn", f"127.0.0.1:{free_port()}")
    assert {"mqttgw.transports.mqttsn.listener", "mqttgw.wire.mqttsn"} <= modules

"""
Sparkplug B against a running gateway, with clients nobody here wrote:
Eclipse Tahu's JavaScript edge node (``sparkplug-client`` from npm, run by
node) publishes births, data and deaths; ``pysparkplug`` (PyPI, in a venv
of its own under tests/.cache: it needs paho-mqtt < 2, the suite's paho is
2.x) reads $sparkplug/certificates/... as a host application and decodes
them.  The certificates are byte-identical to the births that passed.

Also the Sparkplug Compliant MQTT Server requirements (QoS 0 and 1, wills,
retained), with paho-mqtt.
"""

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.gateway import REPO
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient
from tests.tahu import TAHU

PYSPARKPLUG_VERSION = "0.6.1"
PYSPARKPLUG = REPO / "tests" / ".cache" / f"pysparkplug-{PYSPARKPLUG_VERSION}"

EDGE_SCRIPT = r"""
const sparkplug = require("sparkplug-client");
const [port] = process.argv.slice(2);
const client = sparkplug.newClient({
  serverUrl: "tcp://127.0.0.1:" + port, username: "", password: "",
  groupId: "plant1", edgeNode: "edge1", clientId: "tahu-edge1",
  publishDeath: true, version: "spBv1.0",
});
const now = () => Date.now();
client.on("birth", () => {
  client.publishNodeBirth({timestamp: now(), metrics: [
    {name: "Node Control/Rebirth", type: "Boolean", value: false},
    {name: "uptime", type: "Int64", value: 12345},
  ]});
  client.publishDeviceBirth("pump1", {timestamp: now(), metrics: [
    {name: "flow", type: "Double", value: 3.5},
    {name: "running", type: "Boolean", value: true},
    {name: "label", type: "String", value: "north"},
    {name: "level", type: "Int32", value: -7},
  ]});
  client.publishDeviceData("pump1", {timestamp: now(), metrics: [
    {name: "flow", type: "Double", value: 4.25},
  ]});
  client.publishDeviceDeath("pump1", {timestamp: now()});
  setTimeout(() => { client.stop(); }, 200);
});
client.on("close", () => process.exit(0));
setTimeout(() => { console.error("no birth"); process.exit(2); }, 20000);
"""

HOST_SCRIPT = r"""
import json, sys, time
import paho.mqtt.client as mqtt
import pysparkplug as sp

port, want = int(sys.argv[1]), int(sys.argv[2])
got = []
def on_message(client, userdata, message):
    kind = message.topic.split("/")[4]
    decoded = (sp.NBirth if kind == "NBIRTH" else sp.DBirth).decode(message.payload)
    got.append({
        "topic": message.topic, "retain": bool(message.retain), "payload": message.payload.hex(),
        "seq": decoded.seq,
        "metrics": {m.name: [m.datatype.name, m.value] for m in decoded.metrics},
    })
client = mqtt.Client(client_id="pysparkplug-host")
client.on_message = on_message
client.connect("127.0.0.1", port)
client.subscribe("$sparkplug/certificates/#", 1)
deadline = time.monotonic() + 20
while len(got) < want and time.monotonic() < deadline:
    client.loop(0.1)
client.disconnect()
print(json.dumps(got))
"""


@pytest.fixture(scope="module")
def pysparkplug():
    """A Python with pysparkplug (and its paho-mqtt 1.x), made once."""
    python = PYSPARKPLUG / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PYSPARKPLUG)], check=True, timeout=120)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"pysparkplug=={PYSPARKPLUG_VERSION}"],
            check=True, capture_output=True, timeout=300,
        )
    return python


def record(gw, topic_filter):
    watcher = PahoClient(gw.port, "recorder", "MQTTv311")
    watcher.connect()
    watcher.subscribe(topic_filter, 1)
    return watcher


def drain(client, count, timeout=20):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        try:
            got.append(client.messages.get(timeout=0.2))
        except Exception:
            pass
    return got


def api(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def test_tahu_edge_node_births_are_certificates_pysparkplug_reads(gateway_with, tahu, pysparkplug, tmp_path):
    http_port = free_port()
    gw = gateway_with("--http", str(http_port))
    watcher = record(gw, "spBv1.0/#")
    script = tmp_path / "edge.js"
    script.write_text(EDGE_SCRIPT)
    edge = subprocess.run(
        [tahu, str(script), str(gw.port)],
        cwd=TAHU, env={"NODE_PATH": str(TAHU / "node_modules"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )
    assert edge.returncode == 0, edge.stderr
    passed = {m.topic: m.payload for m in drain(watcher, 5)}
    assert set(passed) == {
        "spBv1.0/plant1/NBIRTH/edge1",
        "spBv1.0/plant1/DBIRTH/edge1/pump1",
        "spBv1.0/plant1/DDATA/edge1/pump1",
        "spBv1.0/plant1/DDEATH/edge1/pump1",
        "spBv1.0/plant1/NDEATH/edge1",
    }
    host = subprocess.run(
        [str(pysparkplug), "-c", HOST_SCRIPT, str(gw.port), "2"],
        capture_output=True, text=True, timeout=60,
    )
    assert host.returncode == 0, host.stderr
    certificates = {c["topic"]: c for c in json.loads(host.stdout)}
    for birth in ("spBv1.0/plant1/NBIRTH/edge1", "spBv1.0/plant1/DBIRTH/edge1/pump1"):
        certificate = certificates["$sparkplug/certificates/" + birth]
        assert bytes.fromhex(certificate["payload"]) == passed[birth]
        assert certificate["retain"]
    device = certificates["$sparkplug/certificates/spBv1.0/plant1/DBIRTH/edge1/pump1"]
    assert device["metrics"] == {
        "flow": ["DOUBLE", 3.5], "running": ["BOOLEAN", True],
        "label": ["STRING", "north"], "level": ["INT32", -7],
    }
    node = certificates["$sparkplug/certificates/spBv1.0/plant1/NBIRTH/edge1"]
    assert node["seq"] == 0 and node["metrics"]["bdSeq"][0] == "UINT64"
    # The edge state the admin API tells: born, then dead, in sequence.
    state = api(http_port, "/api/sparkplug")
    assert state["aware"]
    (edge_node,) = state["edge_nodes"]
    assert (edge_node["group"], edge_node["edge_node"], edge_node["online"]) == ("plant1", "edge1", False)
    assert edge_node["devices"] == [{"device": "pump1", "online": False}]
    assert state["stats"]["births"] == 1 and state["stats"]["deaths"] == 1
    assert state["stats"]["out_of_sequence"] == 0 and state["stats"]["malformed"] == 0
    watcher.disconnect()


# The Sparkplug Compliant MQTT Server, against the running gateway.


def test_tck_conformance_mqtt_qos0_and_qos1(gateway):
    """[tck-id-conformance-mqtt-qos0], [tck-id-conformance-mqtt-qos1]."""
    host = record(gateway, "spBv1.0/g/NDATA/#")
    edge = PahoClient(gateway.port, "edge", "MQTTv311")
    edge.connect()
    edge.publish("spBv1.0/g/NDATA/e", b"zero", 0)
    edge.publish("spBv1.0/g/NDATA/e", b"one", 1)
    got = [(m.payload, m.qos) for m in drain(host, 2)]
    assert got == [(b"zero", 0), (b"one", 1)]
    edge.disconnect()
    host.disconnect()


def test_tck_conformance_mqtt_will_messages(gateway):
    """[tck-id-conformance-mqtt-will-messages]: an NDEATH will, QoS 1, retained."""
    host = record(gateway, "spBv1.0/g/NDEATH/e")
    edge = PahoClient(gateway.port, "edge", "MQTTv311", will=("spBv1.0/g/NDEATH/e", b"death", 1, True))
    edge.connect()
    edge.drop()  # the link is lost: no DISCONNECT
    (will,) = drain(host, 1)
    assert (will.payload, will.qos) == (b"death", 1)
    late = record(gateway, "spBv1.0/g/NDEATH/e")
    (kept,) = drain(late, 1)
    assert (kept.payload, kept.retain) == (b"death", True)
    host.disconnect()
    late.disconnect()


def test_tck_conformance_mqtt_retained(gateway):
    """[tck-id-conformance-mqtt-retained]: kept, sent on subscribe, cleared by an empty one."""
    host = PahoClient(gateway.port, "host", "MQTTv311")
    host.connect()
    host.publish("spBv1.0/STATE/host", b'{"online":true}', 1, retain=True)
    reader = record(gateway, "spBv1.0/STATE/host")
    (kept,) = drain(reader, 1)
    assert (kept.payload, kept.retain) == (b'{"online":true}', True)
    host.publish("spBv1.0/STATE/host", b"", 1, retain=True)
    drain(reader, 1)
    again = record(gateway, "spBv1.0/STATE/host")
    assert again.nothing_more()
    for c in (host, reader, again):
        c.disconnect()


def test_certificates_survive_a_restart_and_are_not_client_writable(tmp_path):
    """Retained in the store; $sparkplug/ is the gateway's alone."""
    from mqttgw.wire.sparkplug import payload as S
    from tests.gateway import Gateway

    birth = S.Payload(timestamp=1, seq=0)
    birth.metrics.add(name="bdSeq", datatype=S.DataType.UInt64, long_value=0)
    birth = S.encode(birth)
    gw = Gateway(tmp_path)
    try:
        edge = PahoClient(gw.port, "edge", "MQTTv311")
        edge.connect()
        edge.publish("spBv1.0/g/NBIRTH/e", birth, 1)
        # A forged certificate is acknowledged and dropped, as a $SYS write is.
        edge.publish("$sparkplug/certificates/spBv1.0/g/NBIRTH/e", b"forged", 1, retain=True)
        edge.publish("$sparkplug/forged", b"forged", 1, retain=True)
        edge.disconnect()
    finally:
        gw.stop()
    gw = Gateway(tmp_path)
    try:
        host = record(gw, "$sparkplug/#")
        (kept,) = drain(host, 1)
        assert (kept.topic, kept.payload, kept.retain) == (
            "$sparkplug/certificates/spBv1.0/g/NBIRTH/e", birth, True
        )
        assert host.nothing_more()
        host.disconnect()
    finally:
        gw.stop()
    assert "Traceback" not in gw.log()

"""
MQTT.js (from npm) in headless Chromium, connected to the gateway over
ws://: the page subscribes, and what it receives it publishes back, so the
test reads what the page got.
"""

import contextlib
import json
import re
import shutil
import subprocess

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.conftest import require_program
from tests.gateway import REPO
from tests.network import endpoint, free_port
from tests.paho import PahoClient

MQTTJS_VERSION = "5.16.0"
CACHE = REPO / "tests" / ".cache" / f"mqttjs-{MQTTJS_VERSION}"

PAGE = """<!doctype html>
<html><body><pre id="log"></pre>
<script src="mqtt.min.js"></script>
<script>
const client = mqtt.connect("ws://127.0.0.1:%(port)d/mqtt", {
  clientId: "%(client_id)s", protocolId: "%(protocol_id)s",
  protocolVersion: %(level)d, reconnectPeriod: 0,
});
client.on("connect", () => {
  client.subscribe("browser/in/#", {qos: 1}, (err, granted) => {
    client.publish("browser/ready", JSON.stringify(granted), {qos: 1});
  });
});
client.on("message", (topic, payload, packet) => {
  client.publish("browser/out", topic + " " + packet.qos + " " + payload.toString(), {qos: 1});
});
client.on("error", (e) => client.publish("browser/error", String(e)));
</script></body></html>
"""


@contextlib.contextmanager
def open_in_chromium(chromium, profile, url, *flags):
    """Headless Chromium on ``url``, kept off the network but for loopback; ended after."""
    browser = subprocess.Popen(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", *flags, f"--user-data-dir={profile}", "--remote-debugging-port=0", url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield browser
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()


@pytest.fixture(scope="module")
def mqttjs():
    """MQTT.js's browser bundle, installed from npm once."""
    bundle = CACHE / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"
    if not bundle.exists():
        npm = require_program("npm")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", f"mqtt@{MQTTJS_VERSION}"],
            check=True,
            timeout=300,
        )
    return bundle


@pytest.mark.parametrize(
    "protocol_id,level", [("MQTT", 4), ("MQIsdp", 3)], ids=["3.1.1", "3.1"]
)
def test_mqttjs_in_chromium_subscribes_and_publishes_over_websocket(
    gateway_with, mqttjs, tmp_path, protocol_id, level
):
    chromium = require_program("chromium")
    ws = free_port()
    # The page is opened from a file, whose origin browsers send as "null".
    gw = gateway_with("--ws", endpoint(ws), "--allowed-origin", "null")
    watcher = PahoClient(gw.port, "watcher", "MQTTv311")
    watcher.connect()
    watcher.subscribe("browser/+", 1)

    page_dir = tmp_path / "page"
    page_dir.mkdir()
    shutil.copy(mqttjs, page_dir / "mqtt.min.js")
    client_id = f"browser{level}"
    page = page_dir / "index.html"
    page.write_text(
        PAGE % {"port": ws, "client_id": client_id, "protocol_id": protocol_id, "level": level}
    )
    with open_in_chromium(chromium, tmp_path / "profile", page.as_uri()):
        [ready] = watcher.receive(1, timeout=60)
        assert (ready.topic, ready.payload) == ("browser/ready", b"[{\"topic\":\"browser/in/#\",\"qos\":1}]")
        gw.wait_for_log(f"client {client_id} connected from 127.0.0.1")
        watcher.publish("browser/in/greeting", b"hello, page", 1)
        [echo] = watcher.receive(1, timeout=30)
        assert (echo.topic, echo.payload) == ("browser/out", b"browser/in/greeting 1 hello, page")


TOKEN_PAGE = """<!doctype html>
<html><body>
<script src="mqtt.min.js"></script>
<script>
const url = "wss://127.0.0.1:%(port)d/mqtt";
const options = (id, token) => ({
  clientId: id, username: "page", password: token, reconnectPeriod: 0, protocolVersion: 4,
});
// A second connection, allowed to write report/#, tells the test what the
// dashboard connection saw: that one may only read dashboard/#.
const reporter = mqtt.connect(url, options("reporter", "%(report_token)s"));
const report = (what, text) => reporter.publish("report/" + what, text, {qos: 1});
reporter.on("connect", () => {
  const dash = mqtt.connect(url, options("dash", "%(dash_token)s"));
  dash.on("connect", () => {
    dash.subscribe(["dashboard/#", "private/#"], {qos: 0}, (err, granted) => {
      report("granted", JSON.stringify((granted || []).map((g) => g.qos)));
      dash.publish("dashboard/forged", "from the page", {qos: 1});
    });
  });
  dash.on("message", (topic, payload) => report("got", topic + " " + payload.toString()));
  dash.on("close", () => report("closed", "dash"));
});
</script></body></html>
"""


def test_mqttjs_over_wss_with_a_read_only_token(gateway_with, mqttjs, tmp_path, pki):
    import time

    import jwt

    chromium = require_program("chromium")
    secret = tmp_path / "jwt-secret"
    secret.write_bytes(b"d" * 48)

    def token(lifetime, **claims):
        body = {"sub": "dashboard", "exp": time.time() + lifetime, **claims}
        return jwt.encode(body, b"d" * 48, algorithm="HS256")

    wss = free_port()
    gw = gateway_with(
        "--wss", endpoint(wss), "--cert", pki["cert"], "--key", pki["key"],
        "--jwt-secret-file", str(secret), "--allowed-origin", "null",
    )
    watcher = PahoClient(gw.port, "watcher", "MQTTv311")
    watcher.client.username_pw_set("watcher", token(600, sub="watcher"))
    watcher.connect()
    watcher.subscribe("report/#", 1)
    watcher.subscribe("dashboard/#", 1)

    page_dir = tmp_path / "page"
    page_dir.mkdir()
    shutil.copy(mqttjs, page_dir / "mqtt.min.js")
    page = page_dir / "index.html"
    page.write_text(
        TOKEN_PAGE
        % {
            "port": wss,
            "report_token": token(600, sub="reporter", mqtt_publish=["report/#"], mqtt_subscribe=[]),
            "dash_token": token(15, mqtt_subscribe=["dashboard/#"], mqtt_publish=[]),
        }
    )
    try:
        with open_in_chromium(chromium, tmp_path / "profile", page.as_uri(), "--ignore-certificate-errors"):
            check_the_dashboard_page(gw, watcher)
        # The same page, on a gateway that does not allow its origin.
        strict = gateway_with(
            "--wss", endpoint(other := free_port()), "--cert", pki["cert"], "--key", pki["key"],
            "--jwt-secret-file", str(secret),
        )
        page.write_text(page.read_text().replace(f":{wss}/", f":{other}/"))
        with open_in_chromium(chromium, tmp_path / "profile2", page.as_uri(), "--ignore-certificate-errors"):
            strict.wait_for_log("origin null is not allowed", timeout=60)
            assert "client reporter connected" not in strict.log()
    finally:
        watcher.disconnect()


def check_the_dashboard_page(gw, watcher):
    """What the page reports: dashboard/# read, private/# refused, its publish dropped, closed at expiry."""
    [granted] = watcher.receive(1, timeout=60)
    assert granted.topic == "report/granted"
    # dashboard/# granted, private/# refused with 0x80.
    gw.wait_for_log("client dash SUBSCRIBE refused 1 of 2 filters: not authorized for 'private/#'")
    watcher.publish("private/x", b"secret", 1)
    watcher.publish("dashboard/temp", b"21.5", 1)
    seen = []
    while ("report/closed", b"dash") not in seen:
        # Until the token expires (15 s) and the page sees it closed.
        [message] = watcher.receive(1, timeout=40)
        seen.append((message.topic, message.payload))
    # It read dashboard/#, and nothing of private/#.
    assert [p for t, p in seen if t == "report/got"] == [b"dashboard/temp 21.5"]
    # Its own publish on dashboard/forged was dropped.
    assert not [t for t, _ in seen if t == "dashboard/forged"]
    gw.wait_for_log("may not publish on dashboard/forged")
    gw.wait_for_log("client dash: its token expired: closing")


PAGE5 = """<!doctype html>
<html><body>
<script src="mqtt.min.js"></script>
<script>
const client = mqtt.connect("ws://127.0.0.1:%(port)d/mqtt", {
  clientId: "%(client_id)s", protocolVersion: 5, reconnectPeriod: 0,
  properties: {sessionExpiryInterval: 300, receiveMaximum: 20, topicAliasMaximum: 5},
});
const report = (what, value) => client.publish("browser5/" + what, JSON.stringify(value), {qos: 1});
client.on("connect", (connack) => {
  const options = {qos: 1, properties: {subscriptionIdentifier: 42}};
  client.subscribe("browser5/in/#", options, (err, granted) => {
    report("ready", {error: err ? String(err) : null, granted, connack: connack.properties || null});
  });
});
const aliasesIn = [];  // the topic alias of each message the page got, if any
client.on("message", (topic, payload, packet) => {
  const p = packet.properties || {};
  const got = {
    topic, payload: payload.toString(), qos: packet.qos, userProperties: p.userProperties,
    contentType: p.contentType, subscriptionIdentifier: p.subscriptionIdentifier,
  };
  aliasesIn.push(p.topicAlias === undefined ? null : p.topicAlias);
  // The echo twice: first setting topic alias 1, then on the alias alone.
  const echo = (to, n) => client.publish(
    to, JSON.stringify({...got, echo: n}),
    {qos: 1, properties: {topicAlias: 1, userProperties: {from: "page"}}},
    (err) => { if (err) report("error", String(err)); },
  );
  echo("browser5/out", 1);
  echo("", 2);
});
client.on("error", (e) => report("error", String(e)));
// What went on the wire for the echoes, after MQTT.js's alias handling.
const sent = [];
client.on("packetsend", (packet) => {
  if (packet.cmd === "publish" && packet.properties && packet.properties.userProperties) {
    sent.push({topic: packet.topic, topicAlias: packet.properties.topicAlias});
    if (sent.length === %(echoes)d) report("sent", {sent, aliasesIn});
  }
});
</script></body></html>
"""


class Paho5(PahoClient):
    """PahoClient speaking MQTT 5.0, publishing with properties."""

    def __init__(self, port, client_id):
        super().__init__(port, client_id, "MQTTv5")

    def publish5(self, topic, payload, qos, user_properties, content_type):
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = user_properties
        props.ContentType = content_type
        info = self.client.publish(topic, payload, qos, properties=props)
        info.wait_for_publish(10)
        assert info.is_published()


def test_mqttjs_v5_in_chromium_carries_properties_over_websocket(gateway_with, mqttjs, tmp_path):
    chromium = require_program("chromium")
    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws), "--allowed-origin", "null")
    watcher = Paho5(gw.port, "watcher5")
    watcher.connect()
    assert watcher.subscribe("browser5/+", 1) == [1]
    sender = Paho5(gw.port, "sender5")
    sender.connect()

    page_dir = tmp_path / "page"
    page_dir.mkdir()
    shutil.copy(mqttjs, page_dir / "mqtt.min.js")
    page = page_dir / "index.html"
    page.write_text(PAGE5 % {"port": ws, "client_id": "browser5", "echoes": 6})
    try:
        with open_in_chromium(chromium, tmp_path / "profile", page.as_uri()):
            [ready] = watcher.receive(1, timeout=60)
            assert ready.topic == "browser5/ready", (ready.topic, ready.payload)
            report = json.loads(ready.payload)
            assert report["error"] is None
            assert [(g["topic"], g["qos"]) for g in report["granted"]] == [("browser5/in/#", 1)]
            # The gateway lets the page use topic aliases (else MQTT.js refuses them).
            assert report["connack"]["topicAliasMaximum"] > 0
            gw.wait_for_log("client browser5 connected from 127.0.0.1")
            assert re.search(r"client browser5 connected from 127\.0\.0\.1:\d+ \(MQTT 5\.0,", gw.log())

            user_properties = [("source", "paho"), ("unit", "°C"), ("unit", "K")]
            # The same topic thrice, so the gateway may put it under an alias the
            # page asked for (topicAliasMaximum 5): MQTT.js gives the topic back.
            sender.publish5("browser5/in/temp", b"21.5", 1, user_properties, "text/plain")
            sender.publish5("browser5/in/temp", b"22.0", 0, user_properties, "text/plain")
            sender.publish5("browser5/in/temp", b"22.5", 0, user_properties, "text/plain")
            # Six echoes, and the page's report of the frames it sent for them.
            received = watcher.receive(7, timeout=30)
            [sent] = [json.loads(m.payload) for m in received if m.topic == "browser5/sent"]
            echoes = [m for m in received if m.topic != "browser5/sent"]
    finally:
        watcher.disconnect()
        sender.disconnect()

    got = [
        (m.topic, json.loads(m.payload), getattr(m.properties, "UserProperty", None))
        for m in echoes
    ]
    expected = [
        (
            "browser5/out",
            {
                "topic": "browser5/in/temp", "payload": payload, "qos": qos,
                "userProperties": {"source": "paho", "unit": ["°C", "K"]},
                "contentType": "text/plain", "subscriptionIdentifier": 42, "echo": n,
            },
            [("from", "page")],
        )
        for payload, qos in (("21.5", 1), ("22.0", 0), ("22.5", 0))
        for n in (1, 2)
    ]
    assert got == expected
    # The page sent each second echo on its alias alone, with an empty topic.
    assert sent["sent"] == [
        {"topic": "browser5/out", "topicAlias": 1}, {"topic": "", "topicAlias": 1},
    ] * 3
    # Any alias the gateway used towards the page is within its topicAliasMaximum [MQTT-3.3.2-10].
    assert all(a is None or 1 <= a <= 5 for a in sent["aliasesIn"]), sent["aliasesIn"]

"""
The dashboard's Sparkplug view: the edge state GET /api/sparkplug gives
(listed as far as the reader may read, per node and device), the page's
own Sparkplug B decoder (run by node against the project's codec, every
datatype, and against Eclipse Tahu's JavaScript encoder), and the view in
headless Chromium against a running gateway with an edge node publishing
births and data by alias.
"""

import json
import subprocess

import pytest

from mqttgw.broker.sparkplug import Sparkplug
from mqttgw.passwd import main as passwd
from mqttgw.security.portal import credentials_checker, make_portal
from mqttgw.testing import FakeBroker, ImmediateThreadPool, connected
from mqttgw.web.admin import Roles
from mqttgw.web.dashboard import STATIC
from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import payload as S
from mqttgw.wire.sparkplug.payload import DataType as T
from tests.admin_api import API, USERS
from tests.conftest import require_program
from tests.dashboard import DESKTOP, screenshots, show, sign_in
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient
from tests.tahu import TAHU


def birth_payload(seq, bd_seq=None, metrics=()):
    """A payload of ``metrics``: (name or None, alias or None, datatype, value)."""
    p = S.Payload(timestamp=1_700_000_000_000, seq=seq)
    if bd_seq is not None:
        p.metrics.add(name="bdSeq", datatype=T.UInt64, long_value=bd_seq)
    for name, alias, datatype, value in metrics:
        m = p.metrics.add(datatype=datatype)
        if name is not None:
            m.name = name
        if alias is not None:
            m.alias = alias
        S.set_value(m, datatype, value)
    return S.encode(p)


def born(broker, group, node, devices=(), client_id=None, **login):
    """An edge node of ``group`` born, with ``devices``, publishing through the fake broker."""
    edge = connected(broker, client_id or f"{group}-{node}", **login)
    edge.send(P.Publish(f"spBv1.0/{group}/NBIRTH/{node}", birth_payload(0, 0), 0, False))
    for seq, device in enumerate(devices, 1):
        edge.send(P.Publish(f"spBv1.0/{group}/DBIRTH/{node}/{device}", birth_payload(seq), 0, False))
    return edge


# The API


@pytest.fixture
def edge_site():
    """Two groups and an ACL: viewer reads plantA, pumps reads plantB's pump devices only."""
    broker = FakeBroker(
        passwords={**USERS, "pumps": "pumpspw"},
        acl=[
            "user root", "topic readwrite #", "topic read $SYS/#",
            "user viewer", "topic read spBv1.0/plantA/#",
            "user pumps", "topic read spBv1.0/plantB/+/+/pump1",
        ],
    )
    broker.router.sparkplug = Sparkplug(broker.router, broker.clock)
    login = {"username": "root", "password": b"rootpw"}
    born(broker, "plantA", "edge1", ["pump1"], **login)
    born(broker, "plantB", "edge2", ["pump1", "valve1"], **login)
    portal = make_portal(credentials_checker(broker.checker, None, broker.clock, ImmediateThreadPool()), False)
    roles = Roles(admin_users={"root"}, read_users={"viewer", "pumps"})
    return broker, API(broker, portal, roles)


def listed(api, user, password, path="/api/sparkplug"):
    status, body = api.json("GET", path, user=user, password=password)
    assert status == 200
    return {
        (n["group"], n["edge_node"]): [d["device"] for d in n["devices"]] for n in body["edge_nodes"]
    }


def test_the_sparkplug_edge_is_listed_as_far_as_the_reader_may_read_its_topics(edge_site):
    _, api = edge_site
    assert listed(api, "root", "rootpw") == {
        ("plantA", "edge1"): ["pump1"], ("plantB", "edge2"): ["pump1", "valve1"],
    }
    # A read-only user of the dashboard reads the edge as its ACL lets it.
    assert listed(api, "viewer", "viewpw") == {("plantA", "edge1"): ["pump1"]}
    # Only a device's topics readable: its node is listed for it, the other device not.
    assert listed(api, "pumps", "pumpspw") == {("plantB", "edge2"): ["pump1"]}
    # A user with no role is refused, as for the rest of the API.
    assert api.call("GET", "/api/sparkplug", "device", "devpw")[0] == 403
    # The counters, of every group, go to those who may read them under $SYS.
    assert api.json("GET", "/api/sparkplug", user="root", password="rootpw")[1]["stats"]["nodes_online"] == 2
    assert "stats" not in api.json("GET", "/api/sparkplug", user="viewer", password="viewpw")[1]


def test_the_sparkplug_edge_of_one_group(edge_site):
    _, api = edge_site
    assert listed(api, "root", "rootpw", "/api/sparkplug?group=plantB") == {("plantB", "edge2"): ["pump1", "valve1"]}
    assert listed(api, "viewer", "viewpw", "/api/sparkplug?group=plantB") == {}


def test_each_node_tells_its_bdseq_last_seq_and_gaps_in_its_seq(edge_site):
    broker, api = edge_site
    edge = broker.client(client_id="plantA-edge1", username="root", password=b"rootpw")
    edge.received()
    # seq 1 was the DBIRTH: 2 is next, then 5 skips two.
    for seq in (2, 5, 6):
        edge.send(P.Publish("spBv1.0/plantA/DDATA/edge1/pump1", birth_payload(seq), 0, False))
    _, body = api.json("GET", "/api/sparkplug", user="viewer", password="viewpw")
    (node,) = body["edge_nodes"]
    assert (node["online"], node["bdSeq"], node["seq"], node["out_of_sequence"]) == (True, 0, 6, 1)
    assert node["devices"] == [{"device": "pump1", "online": True}]
    assert not body["truncated"]
    _, body = api.json("GET", "/api/sparkplug", user="root", password="rootpw")
    assert body["stats"]["out_of_sequence"] == 1


def test_the_work_of_one_listing_is_bounded(edge_site, monkeypatch):
    from mqttgw.web import admin

    _, api = edge_site
    # plantA's node and device fit; plantB's node and its two devices do not.
    monkeypatch.setattr(admin, "MAX_LISTED", 4)
    _, body = api.json("GET", "/api/sparkplug", user="root", password="rootpw")
    assert [n["group"] for n in body["edge_nodes"]] == ["plantA"] and body["truncated"]


def test_on_loopback_the_edge_is_listed_as_an_anonymous_client_may_read_it():
    broker = FakeBroker(
        passwords=USERS, acl=["topic read spBv1.0/public/#", "user root", "topic readwrite #"], allow_anonymous=True
    )
    broker.router.sparkplug = Sparkplug(broker.router, broker.clock)
    born(broker, "public", "n1", username="root", password=b"rootpw")
    born(broker, "private", "n2", username="root", password=b"rootpw")
    open_ = API(broker, None, Roles(open=True))
    assert [n["group"] for n in open_.json("GET", "/api/sparkplug")[1]["edge_nodes"]] == ["public"]
    closed = API(broker, None, Roles(open=True), anonymous_reads=False)
    assert closed.call("GET", "/api/sparkplug")[0] == 401
    # The Unix socket: everything.
    assert len(API(broker, local=True).json("GET", "/api/sparkplug")[1]["edge_nodes"]) == 2


def test_with_awareness_off_the_api_says_so():
    api = API(FakeBroker(), local=True)
    assert api.json("GET", "/api/sparkplug") == (200, {"aware": False})


# The page's decoder, against the project's codec

DECODE = """
import { decode, valueOf, display } from %(module)s;
import { readFileSync } from "node:fs";
const out = [];
for (const hex of JSON.parse(readFileSync(0, "utf8"))) {
  try {
    const p = decode(Uint8Array.from(Buffer.from(hex, "hex")));
    out.push({seq: p.seq, metrics: p.metrics.map((m) => {
      const v = valueOf(m, m.datatype);
      return [m.name, m.alias ?? null, m.datatype, display(v, m.datatype),
              typeof v === "bigint" ? v.toString() : v instanceof Date ? v.getTime() : v instanceof Uint8Array ? [...v] : v];
    })});
  } catch (e) {
    out.push({error: e.constructor.name});
  }
}
process.stdout.write(JSON.stringify(out, (k, v) => typeof v === "bigint" ? v.toString() : v));
"""

EVERY_DATATYPE = [
    ("i8", T.Int8, -7, "-7"),
    ("i16", T.Int16, -300, "-300"),
    ("i32", T.Int32, -2**31, str(-2**31)),
    ("i64", T.Int64, -2**63, str(-2**63)),
    ("u8", T.UInt8, 255, "255"),
    ("u16", T.UInt16, 65535, "65535"),
    ("u32", T.UInt32, 2**32 - 1, str(2**32 - 1)),
    ("u64", T.UInt64, 2**64 - 1, str(2**64 - 1)),
    ("f", T.Float, 3.5, "3.5"),
    ("d", T.Double, -0.125, "-0.125"),
    ("b", T.Boolean, True, "true"),
    ("s", T.String, "grüße", "grüße"),
    ("t", T.DateTime, 1_700_000_000_000, "2023-11-14T22:13:20.000Z"),
    ("text", T.Text, "long text", "long text"),
    ("uuid", T.UUID, "0f8b2d1e-0000-4000-8000-000000000000", "0f8b2d1e-0000-4000-8000-000000000000"),
    ("bytes", T.Bytes, b"\x00\x01\xff", "3 bytes"),
    ("file", T.File, b"%PDF", "4 bytes"),
    ("i8a", T.Int8Array, [-1, 2], "[-1, 2]"),
    ("i16a", T.Int16Array, [-300, 300], "[-300, 300]"),
    ("i32a", T.Int32Array, [-5, 5], "[-5, 5]"),
    ("i64a", T.Int64Array, [-2**40, 7], f"[{-2**40}, 7]"),
    ("u8a", T.UInt8Array, [0, 255], "[0, 255]"),
    ("u16a", T.UInt16Array, [65535], "[65535]"),
    ("u32a", T.UInt32Array, [2**32 - 1], f"[{2**32 - 1}]"),
    ("u64a", T.UInt64Array, [2**64 - 1], f"[{2**64 - 1}]"),
    ("fa", T.FloatArray, [1.5, -2.25], "[1.5, -2.25]"),
    ("da", T.DoubleArray, [0.1, 1e300], "[0.1, 1e+300]"),
    ("ba", T.BooleanArray, [True, False, True, True, False, False, False, False, True], "[true, false, true, true, false, false, false, false, … (9)]"),
    ("sa", T.StringArray, ["a", "", "ç"], "[a, , ç]"),
    ("ta", T.DateTimeArray, [0], "[1970-01-01T00:00:00.000Z]"),
]


def test_the_pages_decoder_reads_every_datatype_as_the_codec_writes_it(tmp_path):
    node = require_program("node")
    metrics = [(name, alias, datatype, value) for alias, (name, datatype, value, _) in enumerate(EVERY_DATATYPE)]
    p = S.Payload(timestamp=1, seq=200)
    for name, alias, datatype, value in metrics:
        S.set_value(p.metrics.add(name=name, alias=alias, datatype=datatype), datatype, value)
    p.metrics.add(name="null", datatype=T.Double, is_null=True)
    S.set_value(p.metrics.add(name="ds", datatype=T.DataSet), T.DataSet, S.dataset(["x", "y"], [T.Int32, T.String], [[1, "a"], [-2, "b"]]))
    template = S.Template(template_ref="Pump", metrics=[S.Metric(name="rpm", datatype=T.Double, double_value=1.0)])
    S.set_value(p.metrics.add(name="tpl", datatype=T.Template), T.Template, template)
    # By alias only, as data after a birth.
    p.metrics.add(alias=7, double_value=2.0)
    payloads = [S.encode(p), b"\x0a\x05\x01", b"\xff\xff\xff"]
    script = tmp_path / "decode.mjs"
    script.write_text(DECODE % {"module": json.dumps((STATIC / "sparkplug.js").as_uri())})
    run = subprocess.run(
        [node, str(script)], input=json.dumps([x.hex() for x in payloads]), capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    good, truncated, garbage = json.loads(run.stdout)
    assert good["seq"] == 200
    shown = {m[0]: m[3] for m in good["metrics"]}
    for name, _, _, text in EVERY_DATATYPE:
        assert shown[name] == text, name
    assert [m[1] for m in good["metrics"][: len(metrics)]] == list(range(len(metrics)))
    assert shown["null"] == "null"
    assert shown["ds"] == "DataSet: 2 rows × 2 columns (x, y)"
    assert shown["tpl"] == "Template Pump: 1 metrics"
    assert good["metrics"][-1][:2] == [None, 7]
    # Exact values too, where JSON can carry them.
    values = {m[0]: m[4] for m in good["metrics"]}
    assert values["i64"] == str(-2**63) and values["u64"] == str(2**64 - 1) and values["u32"] == 2**32 - 1
    assert values["bytes"] == [0, 1, 255] and values["t"] == 1_700_000_000_000
    assert values["ba"] == [True, False, True, True, False, False, False, False, True]
    # A field running past the end and bytes that are no protobuf: refused, no other error.
    assert truncated == {"error": "Malformed"} and garbage == {"error": "Malformed"}


TAHU_ENCODES = """
import { createRequire } from "node:module";
import { decode, valueOf, display } from %(module)s;
const tahu = createRequire(%(tahu)s)("sparkplug-payload").get("spBv1.0");
const bytes = tahu.encodePayload({timestamp: 1700000000000, seq: 3, metrics: [
  {name: "i8", alias: 1, type: "Int8", value: -7},
  {name: "i16", alias: 2, type: "Int16", value: -300},
  {name: "i32", alias: 3, type: "Int32", value: -70000},
  {name: "i64", alias: 4, type: "Int64", value: -5000000000},
  {name: "u8", alias: 5, type: "UInt8", value: 200},
  {name: "u32", alias: 6, type: "UInt32", value: 4000000000},
  {name: "u64", alias: 7, type: "UInt64", value: 9007199254740991},
  {name: "f", alias: 8, type: "Float", value: 1.25},
  {name: "d", alias: 9, type: "Double", value: 2.5},
  {name: "b", alias: 10, type: "Boolean", value: true},
  {name: "s", alias: 11, type: "String", value: "north"},
  {name: "t", alias: 12, type: "DateTime", value: 1700000000000},
  {name: "bytes", alias: 13, type: "Bytes", value: new Uint8Array([1, 2, 3])},
  {name: "null", alias: 14, type: "Double", value: null, isNull: true},
  {name: "ds", alias: 15, type: "DataSet", value: {numOfColumns: 2, types: ["Int32", "String"],
   columns: ["x", "y"], rows: [[1, "a"], [2, "b"]]}},
  {alias: 9, type: "Double", value: 3.75},
]});
const p = decode(bytes);
process.stdout.write(JSON.stringify({seq: p.seq, timestamp: p.timestamp,
  metrics: p.metrics.map((m) => [m.name ?? null, m.alias, display(valueOf(m, m.datatype), m.datatype)])}));
"""


def test_the_pages_decoder_reads_what_tahus_javascript_writes(tahu, tmp_path):
    script = tmp_path / "tahu.mjs"
    script.write_text(TAHU_ENCODES % {
        "module": json.dumps((STATIC / "sparkplug.js").as_uri()),
        "tahu": json.dumps(str(TAHU / "node_modules") + "/"),
    })
    run = subprocess.run([tahu, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    decoded = json.loads(run.stdout)
    assert (decoded["seq"], decoded["timestamp"]) == (3, 1_700_000_000_000)
    assert decoded["metrics"] == [
        ["i8", 1, "-7"], ["i16", 2, "-300"], ["i32", 3, "-70000"], ["i64", 4, "-5000000000"],
        ["u8", 5, "200"], ["u32", 6, "4000000000"], ["u64", 7, "9007199254740991"],
        ["f", 8, "1.25"], ["d", 9, "2.5"], ["b", 10, "true"], ["s", 11, "north"],
        ["t", 12, "2023-11-14T22:13:20.000Z"], ["bytes", 13, "3 bytes"], ["null", 14, "null"],
        ["ds", 15, "DataSet: 2 rows × 2 columns (x, y)"], [None, 9, "3.75"],
    ]


# The view in Chromium

ACL = """
user root
topic readwrite #
topic read $SYS/#
user viewer
topic read spBv1.0/plantA/#
user edge
topic readwrite spBv1.0/#
"""


class EdgeNode:
    """A Sparkplug edge node over paho-mqtt, with the project's codec: births name metrics and give aliases, data uses the aliases."""

    def __init__(self, port, group, node):
        self.group, self.node, self.seq = group, node, 0
        death = birth_payload(0, bd_seq=0)
        self.client = PahoClient(
            port, f"{group}-{node}", "MQTTv311", will=(f"spBv1.0/{group}/NDEATH/{node}", death, 1, False)
        )
        self.client.client.username_pw_set("edge", "edgepw")
        self.client.connect()

    def send(self, kind, metrics, device=None, bd_seq=None):
        topic = f"spBv1.0/{self.group}/{kind}/{self.node}" + (f"/{device}" if device else "")
        self.client.publish(topic, birth_payload(self.seq, bd_seq, metrics), 1)
        self.seq = (self.seq + 1) % 256


def _metric_js(key, name):
    holder = "device" if key.count("/") == 2 else "node"
    selector = f'[data-{holder}="{key}"] > div.scroll tr[data-metric="{name}"] td.value'
    return f"(c => c && c.innerText)(document.querySelector({json.dumps(selector)}))"


def metric(page, key, name):
    """The text the page shows for metric ``name`` of the node or device ``key``, or None."""
    return page.evaluate(_metric_js(key, name))


def wait_metric(page, key, name, text, timeout=10):
    page.wait_for(f"{_metric_js(key, name)} === {json.dumps(text)}", timeout=timeout)


def test_the_sparkplug_view_shows_metrics_decoded_by_name_live_and_only_to_readers(gateway_with, browser, tmp_path):
    passwords = tmp_path / "passwd"
    passwd(["-c", "-b", str(passwords), "root", "rootpw"])
    for user, password in (("viewer", "viewpw"), ("edge", "edgepw")):
        passwd(["-b", str(passwords), user, password])
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    http_port = free_port()
    gw = gateway_with(
        "--http", f"0.0.0.0:{http_port}", "--password-file", str(passwords), "--acl-file", str(acl),
        "--admin-user", "root", "--read-user", "viewer",
    )
    url = f"http://127.0.0.1:{http_port}/"
    plant_a = EdgeNode(gw.port, "plantA", "edge1")
    plant_a.send("NBIRTH", [("uptime", 1, T.Int64, 12345), ("Node Control/Rebirth", 2, T.Boolean, False)], bd_seq=0)
    plant_a.send("DBIRTH", [("flow", 10, T.Double, 3.5), ("running", 11, T.Boolean, True), ("level", 12, T.Int32, -7)], "pump1")
    plant_b = EdgeNode(gw.port, "plantB", "edge2")
    plant_b.send("NBIRTH", [("uptime", 1, T.Int64, 5)], bd_seq=0)
    plant_b.send("DBIRTH", [("position", 5, T.Float, 42.0)], "valve1")
    # Before any page: not retained, so a page opened later starts from the births.
    plant_a.send("DDATA", [(None, 10, T.Double, 4.0)], "pump1")

    page = browser.page()
    page.viewport(*DESKTOP)
    sign_in(page, url, "root", "rootpw")
    show(page, "sparkplug")
    pump = "plantA/edge1/pump1"
    # Names and values from the births the gateway keeps ($sparkplug/certificates/).
    wait_metric(page, pump, "flow", "3.5")
    assert metric(page, pump, "level") == "-7" and metric(page, pump, "running") == "true"
    assert metric(page, "plantA/edge1", "uptime") == "12345"
    wait_metric(page, "plantB/edge2/valve1", "position", "42")
    # The gateway's state of the node: online, its bdSeq and last seq.
    node = "document.querySelector('[data-node=\"plantA/edge1\"]')"
    page.wait_for(f"{node}.dataset.state === 'online' && {node}.querySelector('[data-fact=seq] strong').innerText === '2'", timeout=10)
    assert page.evaluate(f"{node}.querySelector('[data-fact=bdseq] strong').innerText") == "0"
    assert page.evaluate("document.querySelector('#sparkplug-summary').innerText").startswith("2 edge nodes and 2 devices online")

    # Data by alias alone, live: shown under the birth's names.
    plant_a.send("DDATA", [(None, 10, T.Double, 5.75), (None, 12, T.Int32, -9)], "pump1")
    wait_metric(page, pump, "flow", "5.75")
    assert metric(page, pump, "level") == "-9" and metric(page, pump, "running") == "true"
    # A gap in seq is counted for the node.
    plant_a.seq += 3
    plant_a.send("DDATA", [(None, 10, T.Double, 6.5)], "pump1")
    wait_metric(page, pump, "flow", "6.5")
    page.wait_for(f"{node}.querySelector('[data-fact=out-of-sequence] strong').innerText === '1'", timeout=10)
    # A rebirth with other aliases: data is named through the latest birth.
    plant_a.seq = 0
    plant_a.send("NBIRTH", [("uptime", 1, T.Int64, 1)], bd_seq=1)
    plant_a.send("DBIRTH", [("flow", 20, T.Double, 0.5), ("level", 10, T.Int32, 3)], "pump1")
    plant_a.send("DDATA", [(None, 10, T.Int32, 4), (None, 20, T.Double, 7.25)], "pump1")
    wait_metric(page, pump, "flow", "7.25")
    assert metric(page, pump, "level") == "4" and metric(page, pump, "running") is None
    page.wait_for(f"{node}.querySelector('[data-fact=bdseq] strong').innerText === '1'", timeout=10)
    screenshots(page, "sparkplug", f"!!{node}")
    # Connected anew (a renewed token), the page gets the certificates
    # again: births it has applied already, which undo no later data.
    page.evaluate(
        "window.certificates = 0; mqttgw.mqtt.addEventListener('message', (e) => {"
        " if (e.detail.topic.startsWith('$sparkplug/')) window.certificates += 1; });"
        " mqttgw.mqtt.restart()"
    )
    page.wait_for("window.certificates === 4", timeout=10)
    # What the view holds (it draws a little later).
    assert page.evaluate(f"mqttgw.views.sparkplug.metrics.get({json.dumps(pump)}).values.get('flow').value") == 7.25
    # The filter: a device's name shows its node, and nothing else.
    page.evaluate(
        "(f => { f.value = 'valve'; f.dispatchEvent(new Event('input')); })(document.querySelector('#sparkplug-filter'))"
    )
    page.wait_for("!document.querySelector('[data-group=\"plantA\"]')")
    assert metric(page, "plantB/edge2/valve1", "position") == "42"
    assert page.console_errors() == []

    # A read-only user without rights on plantB: plantA only, live too.
    sign_in(page, url, "viewer", "viewpw")
    show(page, "sparkplug")
    # From the latest birth, kept by the gateway; the data before the page came is gone.
    wait_metric(page, pump, "flow", "0.5")
    plant_b.send("DDATA", [(None, 5, T.Float, 43.5)], "valve1")
    plant_a.send("DDATA", [(None, 20, T.Double, 8.0)], "pump1")
    wait_metric(page, pump, "flow", "8")
    page.wait_for("mqttgw.views.sparkplug.state !== null")
    assert not page.evaluate("!!document.querySelector('[data-group=\"plantB\"]')")
    # Nor the counters of every group: it may not read them under $SYS.
    assert not page.evaluate("!!document.querySelector('#sparkplug-summary')")
    assert "plantB" not in page.text() and "valve1" not in page.text()
    listing = page.evaluate("mqttgw.session.api('sparkplug')")
    assert [n["group"] for n in listing["edge_nodes"]] == ["plantA"]
    assert page.console_errors() == []
    for edge in (plant_a, plant_b):
        edge.client.disconnect()

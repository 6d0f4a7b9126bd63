"""
deploy/prometheus/ and deploy/grafana/ against the real things: Debian's
Prometheus runs the shipped scrape configuration and alert rules against
a gateway under load (paho clients, three bridges of which two have no
upstream, a client away with a full queue, a flood of refused
connections, a Sparkplug edge node); every query of the shipped Grafana
dashboard, its variables expanded as Grafana expands them, evaluates to
a result, and every alert rule to the state the manual gives for that
scene.  promtool accepts the files; the dashboard is a Grafana model.
"""

import json
import math
import re
import shutil
import socket
import subprocess
import threading
import time

from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import payload as S
from mqttgw.wire.sparkplug.payload import DataType
from tests.conftest import require_program
from tests.gateway import REPO
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient
from tests.prometheus_server import Prometheus

DASHBOARD = REPO / "deploy" / "grafana" / "mqttgw.json"
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
ALERT_RULES = REPO / "deploy" / "prometheus" / "mqttgw-alerts.yml"

SCRAPE_SECONDS = 1
# Grafana's $__interval for the dashboard's hour on a panel a thousand
# points wide (3.6 s, rounded as Grafana rounds it), and its
# $__rate_interval: max($__interval + the scrape interval, 4 scrape intervals).
INTERVAL_SECONDS = 5
RATE_INTERVAL_SECONDS = max(INTERVAL_SECONDS + SCRAPE_SECONDS, 4 * SCRAPE_SECONDS)
MACROS = {"__interval": f"{INTERVAL_SECONDS}s", "__rate_interval": f"{RATE_INTERVAL_SECONDS}s"}
DEADLINE = 90


def wait_for(what, check, timeout=DEADLINE):
    """``check()``'s first true value, asked every half second until ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last and last[0]:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what} not met within {timeout}s: {last}")


# Grafana's dashboard model, as far as importing it needs


def test_the_dashboard_is_a_grafana_dashboard_with_a_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"] and dashboard["time"]["from"].startswith("now-")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    sources = [v for v in variables.values() if v["type"] == "datasource"]
    assert [v["query"] for v in sources] == ["prometheus"]
    uses = {"type": "prometheus", "uid": "${%s}" % sources[0]["name"]}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == uses and variable["query"]["query"].startswith("label_values(")
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24 and position["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat", "state-timeline"), panel["title"]
        assert panel["datasource"] == uses and panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        for target in panel["targets"]:
            assert target["datasource"] == uses and target["expr"], panel["title"]
            named = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert named <= set(variables) | set(MACROS), (panel["title"], named)
    # Every family the gateway serves with a meaning a site watches has a panel.
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", ()))
    for family in ("mqttgw_clients_connected", "mqttgw_publish_received_total", "mqttgw_publish_sent_total",
                   "mqttgw_messages_stored", "mqttgw_publish_dropped_total", "mqttgw_store_commit_seconds_bucket",
                   "mqttgw_bridge_up", "mqttgw_bridge_queued", "mqttgw_connections_refused_total",
                   "mqttgw_sparkplug_nodes_online", "mqttgw_bridge_down_seconds",
                   "mqttgw_bridge_connect_failures_total", "mqttgw_bridge_clean_fallback"):
        assert family in exprs, family


def test_promtool_accepts_the_scrape_config_and_the_alert_rules():
    promtool = require_program("promtool")
    for command in (["check", "rules", str(ALERT_RULES)], ["check", "config", str(SCRAPE_CONFIG)]):
        result = subprocess.run([promtool, *command], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout


# Grafana's expansion of a query's variables


def regex_escape(value):
    """Grafana's escape of one value of a multi-value variable in a Prometheus query."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def variable_text(variable, values):
    """A variable as a Prometheus query of Grafana's carries it, with every value (All) chosen."""
    if not (variable["multi"] or variable["includeAll"]):
        (value,) = values[:1]
        return value.replace("\\", "\\\\").replace("'", "\\\\'")
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def expand(expr, chosen):
    def one(match):
        name = match.group(1) or match.group(2)
        return MACROS[name] if name in MACROS else chosen[name]

    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)
    assert "$" not in expanded, expanded
    return expanded


def refresh_variables(prometheus, dashboard):
    """Each query variable's values, in order, as Grafana asks for them; {name: text in a query}."""
    chosen, values = {}, {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
        selector, label = expand(found.group(1), chosen), found.group(2)
        values[variable["name"]] = prometheus.api(f"/api/v1/label/{label}/values", **{"match[]": selector})
        chosen[variable["name"]] = variable_text(variable, values[variable["name"]])
    return chosen, values


def has_a_number(result):
    samples = result["result"] if isinstance(result["result"], list) else [{"value": result["result"]}]
    return any(math.isfinite(float(s["value"][1])) for s in samples)


# The scene


def scrape_config(gateway_http, dead):
    """The shipped prometheus.yml, scraping this gateway and an address where none answers."""
    text = SCRAPE_CONFIG.read_text()
    for old, new in (
        ("scrape_interval: 15s", f"scrape_interval: {SCRAPE_SECONDS}s"),
        ("evaluation_interval: 15s", f"evaluation_interval: {SCRAPE_SECONDS}s"),
        ('targets: ["127.0.0.1:9883"]', f'targets: ["{gateway_http}", "{dead}"]'),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


class Load(threading.Thread):
    """Publishes about 500 QoS 0 and 50 QoS 1 messages a second until stopped."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.publisher = PahoClient(port, "load", "MQTTv311")
        self.publisher.connect()
        self.stopping = threading.Event()

    def run(self):
        deadline = time.monotonic() + 4 * DEADLINE
        while not self.stopping.is_set() and time.monotonic() < deadline:
            for _ in range(50):
                self.publisher.client.publish("load/q0", b"21.5", 0)
            for _ in range(5):
                self.publisher.client.publish("load/q1", b"21.5", 1)
            self.stopping.wait(0.1)

    def stop(self):
        self.stopping.set()
        self.join(10)
        self.publisher.disconnect()


def gateway_config(tmp_path, upstream_port):
    config = tmp_path / "mqttgw.toml"
    bridge = '[[bridge]]\nname = "{}"\naddresses = ["127.0.0.1:{}"]\nrules = ["load/q1 out 1"]\n'
    config.write_text(
        "[limits]\nmax_connections = 12\nmax_queued_messages = 100\n"
        '[persistence]\ndurability = "os"\n'
        + bridge.format("centre", upstream_port)
        # Two bridges whose upstream never answers: one keeps what it is
        # given, the other holds ten messages and drops the rest.
        + bridge.format("spare", free_port())
        + bridge.format("tiny", free_port()) + "max_queued_messages = 10\n"
    )
    return config


def an_edge_node_is_born(port):
    edge = PahoClient(port, "edge1", "MQTTv311")
    edge.connect()
    birth = S.Payload(timestamp=1000, seq=0)
    birth.metrics.add(name="bdSeq", datatype=DataType.UInt64, long_value=0)
    edge.publish("spBv1.0/plant1/NBIRTH/edge1", S.encode(birth), 0)
    return edge


def answer(sock, size):
    """What the gateway sends first on ``sock``: empty when it closed (or reset) it."""
    sock.settimeout(10)
    try:
        return sock.recv(size)
    except ConnectionResetError:
        return b""


def connections_are_refused(port, count):
    """Fill the gateway's connections, then ``count`` more, each closed as it is accepted."""
    held = []
    for i in range(20):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(P.Connect(client_id=f"held-{i}", keepalive=0).encode())
        if len(answer(sock, 4)) < 4:
            sock.close()
            break
        held.append(sock)
    else:
        raise AssertionError("limits.max_connections never refused a connection")
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert answer(sock, 1) == b""
    return held


def expected_alerts(gateway_http, dead):
    """Each rule's state in this scene, the label it alerts by, and on which values."""
    return {
        "MqttgwDown": ("pending", "instance", {dead}),
        "MqttgwListenerDown": ("inactive", None, set()),
        "MqttgwStoreFailing": ("inactive", None, set()),
        "MqttgwStoreCommitsSlow": ("inactive", None, set()),
        "MqttgwBridgeDisconnected": ("pending", "bridge", {"spare", "tiny"}),
        "MqttgwBridgeBacklogGrowing": ("pending", "bridge", {"spare"}),
        "MqttgwBridgeDropping": ("firing", "bridge", {"tiny"}),
        "MqttgwRefusalsSpiking": ("firing", "instance", {gateway_http}),
        "MqttgwQueueDrops": ("firing", "instance", {gateway_http}),
    }


def alerts_reach(prometheus, expected):
    rules = {
        rule["name"]: rule
        for group in prometheus.api("/api/v1/rules", type="alert")["groups"]
        for rule in group["rules"]
    }
    assert set(rules) == set(expected), "a rule without a state in this test, or a rule missing"
    states = {}
    for name, rule in rules.items():
        assert rule["health"] in ("ok", "unknown"), (name, rule.get("lastError"))
        state, label, on = expected[name]
        alerting = {a["labels"].get(label) for a in rule["alerts"]}
        # A backlog grows on both bridges with no upstream (on the one
        # that drops, up to its bound); the connected one may show a
        # passing queue.
        matched = on <= alerting if name == "MqttgwBridgeBacklogGrowing" else alerting == on
        states[name] = (rule["state"], sorted(map(str, alerting)), rule["health"])
        if rule["state"] != state or not matched or rule["health"] != "ok":
            return False, states
    return True, rules


def test_prometheus_evaluates_the_dashboard_and_the_alert_rules_on_a_gateway_under_load(
    tmp_path, gateway_with, start_mosquitto
):
    require_program("prometheus")
    upstream = start_mosquitto(tmp_path / "upstream")
    http_port = free_port()
    gw = gateway_with("--config", str(gateway_config(tmp_path, upstream.port)), "--http", str(http_port))
    gw.wait_for_log("bridge centre: upstream accepted CONNECT")
    gateway_http, dead = f"127.0.0.1:{http_port}", f"127.0.0.1:{free_port()}"
    home = tmp_path / "prometheus"
    home.mkdir()
    (home / "prometheus.yml").write_text(scrape_config(gateway_http, dead))
    shutil.copy(ALERT_RULES, home / ALERT_RULES.name)
    with Prometheus(home, home / "prometheus.yml") as prometheus:
        # Counters are watched from their first value on.
        wait_for("the gateway scraped", lambda: (prometheus.query(f'up{{instance="{gateway_http}"}} == 1')["result"],))
        clients, held, load = [], [], None
        try:
            # A device away with a persistent session: its queue fills and drops.
            away = PahoClient(gw.port, "away", "MQTTv311", clean_session=False)
            away.connect()
            away.subscribe("load/q1", 1)
            away.disconnect()
            watcher = PahoClient(gw.port, "watcher", "MQTTv311")
            watcher.client.on_message = lambda *_: None
            clients.append(watcher)
            watcher.connect()
            watcher.subscribe("load/#", 0)
            clients.append(an_edge_node_is_born(gw.port))
            load = Load(gw.port)
            load.start()
            held = connections_are_refused(gw.port, 100)
            expected = expected_alerts(gateway_http, dead)
            _, rules = wait_for("every alert rule in its state", lambda: alerts_reach(prometheus, expected))
            rules_evaluate_as_their_alerts(prometheus, rules, expected)
            dashboard_queries_evaluate(prometheus, gateway_http)
        finally:
            for sock in held:
                sock.close()
            if load is not None:
                load.stop()
            for client in clients:
                client.disconnect()
        assert "level=error" not in prometheus.log(), prometheus.log()


def rules_evaluate_as_their_alerts(prometheus, rules, expected):
    """Each rule's expression, through /api/v1/query: what it alerts on, or nothing; every series it names exists."""
    for name, rule in rules.items():
        state, label, on = expected[name]
        result = prometheus.query(rule["query"])["result"]
        if state == "inactive":
            assert result == [], (name, result)
        else:
            found = {sample["metric"].get(label) for sample in result}
            assert on <= found if name == "MqttgwBridgeBacklogGrowing" else found == on, (name, result)
        for series in set(re.findall(r"\b(mqttgw_\w+|up)\b", rule["query"])):
            assert prometheus.query(f"count({series})")["result"], (name, series)


def dashboard_queries_evaluate(prometheus, gateway_http):
    dashboard = json.loads(DASHBOARD.read_text())
    chosen, values = refresh_variables(prometheus, dashboard)
    assert values["job"] == ["mqttgw"]
    assert values["instance"] == [gateway_http]
    assert values["bridge"] == ["centre", "spare", "tiny"]
    answers = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            expr = expand(target["expr"], chosen)
            key = (panel["title"], target["legendFormat"])
            answers[key] = wait_for(
                f"{key}: {expr}", lambda: (has_a_number(r := prometheus.query(expr)), r)
            )[1]["result"]

    def value(title, legend):
        (sample,) = answers[(title, legend)]
        return float(sample["value"][1])

    assert value("Bridges connected", "connected") == 1 and value("Bridges connected", "bridges") == 3
    assert value("Store", "store") == 1
    assert value("Sparkplug edge nodes online", "nodes") == 1
    assert value("Clients connected", "clients") >= 3
    assert value("Gateways scraped", "up") == 1
    # The two bridges whose upstream never answers are down, and failing.
    down = {s["metric"]["bridge"]: float(s["value"][1])
            for s in answers[("Bridge links down and fallbacks", "{{bridge}} down for ({{instance}})")]}
    assert down["centre"] == 0 and down["spare"] > 0 and down["tiny"] > 0, down
    failing = answers[("Bridge connect failures", "{{bridge}} {{address}}: {{reason}} ({{instance}})")]
    assert {(s["metric"]["bridge"], s["metric"]["reason"]) for s in failing} >= {
        ("spare", "unreachable"), ("tiny", "unreachable"),
    }, failing


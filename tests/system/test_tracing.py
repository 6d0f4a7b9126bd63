"""
Distributed traces from outside: a gateway under twistd with ``[otel]``
exporting to an OTLP/HTTP receiver the test runs, a 5.0 bridge to a real
mosquitto, paho 5.0 clients on both sides; a collector that cannot be
reached; and nothing of OpenTelemetry loaded with tracing off.
"""

import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import cannot_run
from tests.gateway import Gateway
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient
from tests.loaded_modules import loaded

# The publisher's own trace: its trace id and span id.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PUBLISHER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PUBLISHER_SPAN}-01"


def trace_service():
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError:
        cannot_run("opentelemetry-proto is not installed (pip install 'mqttgw[test]')")
    return trace_service_pb2


class Receiver:
    """An OTLP/HTTP traces receiver on loopback: the spans it was sent, decoded."""

    def __init__(self):
        pb2 = trace_service()
        self.spans = []
        lock = self.lock = threading.Lock()
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                with lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            spans.extend(_span(s) for s in scope.spans)
                answer = pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, condition, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if condition(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans not exported within {timeout}s: {spans}")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _value(any_value):
    return getattr(any_value, any_value.WhichOneof("value"))


def _span(span):
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent": span.parent_span_id.hex(),
        "kind": span.kind,
        "attributes": {a.key: _value(a.value) for a in span.attributes},
    }


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


_started = []


@pytest.fixture(autouse=True)
def _no_tracebacks():
    yield
    for gw in _started:
        gw.stop()
        assert "Traceback" not in gw.log(), gw.log()
    _started.clear()


def start_gateway(tmp_path, otel, bridge_to=None, args=()):
    lines = []
    if bridge_to is not None:
        lines += [
            "[[bridge]]",
            'name = "up"',
            f'addresses = ["127.0.0.1:{bridge_to}"]',
            'rules = ["t/# out 1"]',
            'protocol = "mqttv5"',
            "reconnect_initial = 0.2",
            "reconnect_max = 1.0",
        ]
    lines.append("[otel]")
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in otel.items()]
    config = tmp_path / "gateway.toml"
    config.write_text("\n".join(lines) + "\n")
    gw = Gateway(tmp_path, "--config", str(config), "--data-dir", str(tmp_path / "data"), *args)
    _started.append(gw)
    gw.wait_for_log("tracing on: spans exported over OTLP/HTTP to")
    if bridge_to is not None:
        gw.wait_for_log("bridge up: upstream accepted CONNECT")
    return gw


def client5(port, client_id):
    c = PahoClient(port, client_id, "MQTTv5")
    c.connect()
    return c


def traceparent(message):
    """The (trace id, parent span id, flags) of a received message's traceparent."""
    pairs = dict(getattr(message.properties, "UserProperty", []))
    _, trace_id, parent, flags = pairs["traceparent"].split("-")
    return trace_id, parent, flags


def test_a_traced_publish_goes_on_as_one_trace_to_subscribers_and_upstream(
    tmp_path, receiver, start_mosquitto
):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    upstream = start_mosquitto(tmp_path / "mosquitto")
    # Ratio 0: only the publisher's sampled trace context makes a trace.
    gw = start_gateway(tmp_path, {"endpoint": receiver.url, "sample_ratio": 0.0}, upstream.port)
    central = client5(upstream.port, "central-sub")
    central.subscribe("t/#", 1)
    local = client5(gw.port, "local-sub")
    local.subscribe("t/#", 1)
    publisher = client5(gw.port, "field-pub")
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("site", "7"), ("traceparent", TRACEPARENT)]
    publisher.publish("t/reading", b"21.5", 1, properties=properties)
    # An untraced one, at ratio 0: no span, and no traceparent.
    publisher.publish("t/untraced", b"0", 1)

    [at_gateway, untraced_local] = local.receive(2)
    [at_centre, untraced_central] = central.receive(2)
    assert (at_gateway.payload, at_centre.payload) == (b"21.5", b"21.5")
    for untraced in (untraced_local, untraced_central):
        assert "traceparent" not in dict(getattr(untraced.properties, "UserProperty", []))
    # The other user properties travel as they came, one traceparent among them.
    for message in (at_gateway, at_centre):
        pairs = message.properties.UserProperty
        assert ("site", "7") in pairs and [n for n, _ in pairs].count("traceparent") == 1
    local_trace, local_parent, flags = traceparent(at_gateway)
    central_trace, central_parent, _ = traceparent(at_centre)
    assert local_trace == central_trace == TRACE_ID and flags == "01"
    assert local_parent == central_parent != PUBLISHER_SPAN

    spans = receiver.wait_for(lambda s: any(x["name"] == "upstream ack" for x in s))
    by_name = {}
    for span in spans:
        assert span["trace_id"] == TRACE_ID, span
        by_name.setdefault(span["name"], []).append(span)
    [received] = by_name["publish t/reading"]
    # The subscribers' parent is the gateway's span, a child of the publisher's.
    assert received["span_id"] == local_parent and received["parent"] == PUBLISHER_SPAN
    attributes = dict(received["attributes"])
    assert attributes.pop("messaging.message.id").isdigit()
    assert attributes == {
        "messaging.system": "mqtt",
        "messaging.destination.name": "t/reading",
        "messaging.operation.name": "publish",
        "messaging.operation.type": "receive",
        "messaging.client.id": "field-pub",
        "messaging.mqtt.qos": 1,
        "messaging.message.body.size": 4,
    }
    [store] = by_name["store"]
    [deliver] = by_name["deliver t/reading"]
    [forward] = by_name["bridge forward"]
    [ack] = by_name["upstream ack"]
    assert store["parent"] == deliver["parent"] == forward["parent"] == received["span_id"]
    assert ack["parent"] == forward["span_id"]
    assert deliver["attributes"]["messaging.client.id"] == "local-sub"
    assert deliver["attributes"]["messaging.operation.type"] == "send"
    assert forward["attributes"]["mqttgw.bridge"] == "up"
    assert forward["attributes"]["messaging.mqtt.qos"] == 1
    assert ack["attributes"]["messaging.operation.type"] == "settle"
    assert ack["attributes"]["messaging.operation.name"] == "puback"
    # Nothing of the untraced message.
    assert not [s for s in spans if s["attributes"].get("messaging.destination.name") == "t/untraced"]


def _metric(port, outcome):
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mqttgw_trace_spans_total" and sample.labels.get("outcome") == outcome:
                return sample.value
    raise KeyError(outcome)


def test_a_collector_that_cannot_be_reached_loses_no_message_and_counts_its_spans(tmp_path):
    trace_service()
    http = free_port()
    # Nothing listens on the endpoint's port.
    otel = {"endpoint": f"http://127.0.0.1:{free_port()}/v1/traces", "sample_ratio": 1.0, "max_queue_size": 100}
    gw = start_gateway(tmp_path, otel, args=("--http", str(http)))
    subscriber = PahoClient(gw.port, "sub", "MQTTv311")
    subscriber.connect()
    subscriber.subscribe("m/#", 1)
    publisher = PahoClient(gw.port, "pub", "MQTTv5")
    publisher.connect()
    count = 400
    for i in range(count):
        publisher.client.publish(f"m/{i}", str(i).encode(), 1)
    received = subscriber.receive(count)
    assert sorted(int(m.payload) for m in received) == list(range(count))
    # Two spans a message (received, delivered), past the queue's 100.
    deadline = time.monotonic() + 30
    while _metric(http, "failed") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(http, "failed") > 0
    assert _metric(http, "dropped") > 0
    assert _metric(http, "exported") == 0
    assert _metric(http, "failed") + _metric(http, "dropped") <= 2 * count
    # The exporter's complaints are the gateway's own warnings, rate-limited.
    log = gw.log()
    assert "[stderr#" not in log and "[mqttgw.service.tracing#warn] tracing: " in log, log


def test_with_tracing_off_nothing_of_opentelemetry_is_loaded(tmp_path):
    trace_service()
    off = loaded(tmp_path, "--http", str(free_port()))
    assert not {m for m in off if m.split(".")[0] == "opentelemetry"}
    assert "mqttgw.service.tracing" not in off and "mqttgw.web.metrics" in off
    on = loaded(tmp_path, "--otel-endpoint", f"http://127.0.0.1:{free_port()}/v1/traces")
    assert {"mqttgw.service.tracing", "opentelemetry.sdk.trace"} <= on

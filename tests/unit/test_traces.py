"""
The router's traces in-process (broker.traces with service.tracing's
Spans, spans caught by the SDK's in-memory exporter): parent-based
sampling, the trace context 5.0 and 3.1.1 subscribers see, a QoS 2 bridge
forward and its PUBCOMP or refusal, the bound on messages in progress,
and the export queue's bound.  tests/system/test_tracing.py runs it from outside.
"""

import threading
import time

import pytest

from tests.conftest import cannot_run
from tests.fake_network import Listener
from tests.mqtt5_bridge import connected, local5, published, start_bridge
from mqttgw.wire import packets as P

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def otel():
    try:
        from mqttgw.service import tracing
    except ImportError:
        cannot_run("OpenTelemetry is not installed (pip install 'mqttgw[test]')")
    return tracing


def traced(router, reactor, otel, ratio=1.0, **kwargs):
    """Tracing on ``router`` at ``ratio``, as the gateway sets it up: the exporter its ended spans go to."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from mqttgw.broker.traces import MessageTraces

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=otel.ROOT_SAMPLER)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    counts = otel.SpanCounts()
    spans = otel.Spans(provider.get_tracer("test"), counts)
    router.tracer = MessageTraces(router, spans, reactor, counts, ratio, **kwargs)
    return exporter


def publishes(client):
    return [p for p in client.received() if isinstance(p, P.Publish)]


def context_of(publish):
    return dict(publish.properties["user_property"])["traceparent"].split("-")


def test_a_trace_context_that_says_not_sampled_is_followed_and_sent_on_as_it_came(router, reactor, otel):
    exporter = traced(router, reactor, otel, ratio=1.0)
    sub = local5(router, reactor, "sub5")
    sub.send(P.Subscribe(1, [("t/#", 1)], {}))
    sub.received()
    pub = local5(router, reactor, "pub5")
    unsampled = f"00-{TRACE_ID}-00f067aa0ba902b7-00"
    pub.send(P.Publish("t/a", b"v", 1, message_id=1, properties={"user_property": [("traceparent", unsampled)]}))
    reactor.advance(0)
    [got] = publishes(sub)
    assert got.properties["user_property"] == [("traceparent", unsampled)]
    assert exporter.get_finished_spans() == ()


def test_a_sampled_3_1_1_publish_gives_5_0_subscribers_the_gateways_span_and_3_1_1_ones_nothing(
    router, reactor, otel
):
    exporter = traced(router, reactor, otel, ratio=1.0)
    sub5 = local5(router, reactor, "sub5")
    sub5.send(P.Subscribe(1, [("t/#", 1)], {}))
    listener = Listener.of(router, reactor)
    sub311 = listener.client("sub311")
    sub311.send(P.Subscribe(1, [("t/#", 0)]))
    sub5.received(), sub311.received()
    listener.client("pub311").send(P.Publish("t/a", b"21.5", 1, message_id=7))
    [got5] = publishes(sub5)
    [got311] = publishes(sub311)
    assert got311.properties is None and got311.payload == b"21.5"
    _, trace_id, parent, flags = context_of(got5)
    # Sampled (the random trace id flag of level 2 may be set too).
    assert int(flags, 16) & 1
    reactor.advance(0)
    spans = {s.name + " " + str(s.attributes.get("messaging.client.id")): s for s in exporter.get_finished_spans()}
    received = spans["publish t/a pub311"]
    assert format(received.context.trace_id, "032x") == trace_id
    assert format(received.context.span_id, "016x") == parent
    assert received.parent is None
    assert received.attributes["messaging.message.id"] == "7"
    for name, qos in (("deliver t/a sub5", 1), ("deliver t/a sub311", 0)):
        assert spans[name].parent.span_id == received.context.span_id
        assert spans[name].attributes["messaging.mqtt.qos"] == qos
    assert len(spans) == 3


def test_at_ratio_0_a_message_without_trace_context_is_routed_as_it_is(router, reactor, otel):
    exporter = traced(router, reactor, otel, ratio=0.0)
    sub = local5(router, reactor, "sub5")
    sub.send(P.Subscribe(1, [("t/#", 1)], {}))
    sub.received()
    local5(router, reactor, "pub5").send(
        P.Publish("t/a", b"v", 1, message_id=1, properties={"user_property": [("site", "7")]})
    )
    reactor.advance(0)
    [got] = publishes(sub)
    assert got.properties == {"user_property": [("site", "7")]}
    assert exporter.get_finished_spans() == ()


def test_a_message_without_trace_context_is_sampled_once_at_the_ratio_before_a_span_is_made(
    router, reactor, otel
):
    draws = iter([0.1, 0.3, 0.2, 0.9, 0.24])
    exporter = traced(router, reactor, otel, ratio=0.25, draw=lambda: next(draws))
    started = []
    spans = router.tracer.spans
    start = spans.start
    spans.start = lambda *args: started.append(args[0]) or start(*args)
    sub = local5(router, reactor, "sub5")
    sub.send(P.Subscribe(1, [("t/#", 0)], {}))
    sub.received()
    pub = local5(router, reactor, "pub5")
    for i in range(5):
        pub.send(P.Publish(f"t/{i}", b"v", 0, properties={}))
    reactor.advance(0)
    # Drawn below 0.25: the first, the third and the fifth.  The others were
    # routed without a span begun for them, and the SDK kept every root
    # it was given (it does not sample them again).
    assert started == ["publish t/0", "publish t/2", "publish t/4"]
    received = sorted(s.name for s in exporter.get_finished_spans() if s.name.startswith("publish"))
    assert received == ["publish t/0", "publish t/2", "publish t/4"]
    assert len(publishes(sub)) == 5
    # A sampled trace context is followed whatever the draw.
    sampled = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
    draws = iter([0.99])
    pub.send(P.Publish("t/p", b"v", 0, properties={"user_property": [("traceparent", sampled)]}))
    reactor.advance(0)
    assert started[-1] == "publish t/p"
    [span] = [s for s in exporter.get_finished_spans() if s.name == "publish t/p"]
    assert format(span.context.trace_id, "032x") == TRACE_ID


def _bridge_spans(exporter):
    spans = exporter.get_finished_spans()
    return [s for s in spans if s.name == "bridge forward"], [s for s in spans if s.name == "upstream ack"]


def test_a_qos_2_bridge_forward_ends_at_the_upstreams_pubcomp(router, reactor, otel):
    exporter = traced(router, reactor, otel)
    start_bridge(router, reactor, rules=["t/# out 2"])
    upstream = connected(reactor)
    Listener.of(router, reactor).client("pub").send(P.Publish("t/a", b"v", 2, message_id=1))
    reactor.advance(0)
    [sent] = published(upstream)
    assert context_of(sent)[1] != TRACE_ID
    upstream.send(P.Pubrec(sent.message_id))
    assert _bridge_spans(exporter) == ([], [])
    upstream.send(P.Pubcomp(sent.message_id))
    [forward], [ack] = _bridge_spans(exporter)
    assert ack.parent.span_id == forward.context.span_id
    assert ack.attributes["messaging.operation.name"] == "pubcomp"
    assert forward.attributes["mqttgw.bridge"] == "up" and forward.status.is_ok
    assert not router.tracer.pending


def test_a_refused_forward_ends_with_an_error(router, reactor, otel):
    exporter = traced(router, reactor, otel)
    start_bridge(router, reactor, rules=["t/# out 2"])
    upstream = connected(reactor)
    Listener.of(router, reactor).client("pub").send(P.Publish("t/a", b"v", 2, message_id=1))
    [sent] = published(upstream)
    upstream.send(P.Pubrec(sent.message_id, 0x87))
    [forward], [ack] = _bridge_spans(exporter)
    assert not forward.status.is_ok and not ack.status.is_ok
    assert ack.attributes["mqttgw.reason_code"] == 0x87
    assert not router.tracer.pending


def test_forwards_waiting_for_an_ack_are_bounded_and_those_cut_short_counted(router, reactor, otel):
    exporter = traced(router, reactor, otel)
    router.tracer.MAX_PENDING = 2
    start_bridge(router, reactor, rules=["t/# out 1"])
    upstream = connected(reactor)
    pub = Listener.of(router, reactor).client("pub")
    for mid in (1, 2, 3):
        pub.send(P.Publish(f"t/{mid}", b"v", 1, message_id=mid))
    assert len(published(upstream)) == 3
    assert len(router.tracer.pending) == 2
    [cut], _ = _bridge_spans(exporter)
    assert cut.attributes["messaging.destination.name"] == "t/1"
    assert cut.attributes["mqttgw.trace.cut_short"] is True
    assert router.tracer.counts.cut_short == 1


def test_spans_past_the_export_queue_are_dropped_and_counted(otel):
    handed = []
    batch = type("Batch", (), {"on_end": lambda self, span: handed.append(span)})()
    counts = otel.SpanCounts()
    processor = otel.BoundedProcessor(batch, 3, counts)
    for span in range(5):
        processor.on_end(span)
    assert (handed, counts.dropped) == ([0, 1, 2], 2)
    # An export (failed or not) makes room again.
    counts.failed += 3
    processor.on_end(5)
    assert (handed, counts.dropped) == ([0, 1, 2, 5], 2)


def test_no_delivery_span_for_a_no_local_subscriber_publishing_itself(router, reactor, otel):
    exporter = traced(router, reactor, otel)
    both = local5(router, reactor, "both")
    # QoS 1, no local.
    both.send(P.Subscribe(1, [("t/#", 1 | 0x04)], {}))
    other = local5(router, reactor, "other")
    other.send(P.Subscribe(1, [("t/#", 1)], {}))
    both.received(), other.received()
    both.send(P.Publish("t/a", b"v", 1, message_id=1))
    reactor.advance(0)
    assert publishes(both) == [] and len(publishes(other)) == 1
    delivered = [s.attributes["messaging.client.id"] for s in exporter.get_finished_spans() if s.name == "deliver t/a"]
    assert delivered == ["other"]


def _stopping(otel, shutdown):
    """A TracingService stopping on a clock, its provider's shutdown ``shutdown``."""
    from twisted.internet.testing import MemoryReactorClock

    class Reactor(MemoryReactorClock):
        def __init__(self):
            super().__init__()
            self.from_threads = []

        def callFromThread(self, f, *args):
            self.from_threads.append((f, args))

    reactor = Reactor()
    service = otel.TracingService(type("Provider", (), {"shutdown": shutdown})(), reactor)
    service.startService()
    return reactor, service.stopService()


def test_shutdown_waits_for_the_last_export(otel):
    reactor, stopped = _stopping(otel, lambda self: None)
    deadline = time.monotonic() + 10
    while not reactor.from_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not stopped.called
    [(f, args)] = reactor.from_threads
    f(*args)
    assert stopped.called and stopped.result is None


def test_shutdown_waits_for_the_last_export_a_bounded_time(otel):
    release = threading.Event()
    reactor, stopped = _stopping(otel, lambda self: release.wait(10))
    assert not stopped.called
    reactor.advance(otel.SHUTDOWN_WAIT)
    # Given up, the gateway's shutdown goes on.
    assert stopped.called and stopped.result is None
    release.set()


def test_the_message_timed_for_delivery_latency_keeps_its_properties_and_trace_context(router, reactor, otel):
    from mqttgw.web.metrics import Metrics

    metrics = Metrics(router)
    exporter = traced(router, reactor, otel)
    sub = local5(router, reactor, "sub5")
    sub.send(P.Subscribe(1, [("t/#", 1)], {}))
    # 3.1.1 deliveries are the ones timed.
    sub311 = Listener.of(router, reactor).client("sub311")
    sub311.send(P.Subscribe(1, [("t/#", 1)]))
    sub.received(), sub311.received()
    # The first message after Metrics is made is the one timed.
    local5(router, reactor, "pub5").send(
        P.Publish("t/a", b"v", 1, message_id=1, properties={"content_type": "text/plain"})
    )
    reactor.advance(0)
    [got] = publishes(sub)
    assert got.properties["content_type"] == "text/plain"
    assert context_of(got)[1] == format(exporter.get_finished_spans()[0].context.trace_id, "032x")
    [count] = [x.value for x in metrics.delivery_latency.collect()[0].samples if x.name.endswith("_count")]
    assert count == 1 and len(publishes(sub311)) == 1

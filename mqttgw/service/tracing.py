"""
OpenTelemetry's SDK set up for ``[otel]``: a tracer provider with
parent-based sampling, a batch processor whose queue is bounded and
whose drops are counted, and an OTLP/HTTP exporter counted by outcome;
and :class:`Spans`, what the broker's hooks (``broker.traces``) ask of it.
Imported only when ``otel.endpoint`` is set (the ``otel`` extra).
"""

import logging
import threading

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from twisted.application.service import Service
from twisted.internet.defer import Deferred, TimeoutError
from twisted.logger import Logger

from mqttgw.broker.traces import MessageTraces

log = Logger()

# Seconds one export (with the exporter's own retries) may take, and
# milliseconds between exports of a batch that is not full: a collector
# that is down holds the exporting thread this long, never the reactor.
EXPORT_TIMEOUT = 5.0
SCHEDULE_DELAY_MS = 1000
# Spans sent in one export request, at most.
MAX_EXPORT_BATCH = 512
# Seconds the gateway's shutdown waits for the last spans' export.
SHUTDOWN_WAIT = 5.0
# A message without a trace context reaches the SDK only once the router
# sampled it (MessageTraces, at otel.sample_ratio): the SDK samples such a
# root always, and one with a parent by the parent's flag.
ROOT_SAMPLER = ParentBased(ALWAYS_ON)


class SpanCounts:
    """
    Spans by outcome, for ``/metrics``.  Each count has one writer:
    ``handed`` and ``dropped`` the reactor thread (where spans end),
    ``exported`` and ``failed`` the exporting thread.
    """

    def __init__(self):
        self.handed = 0
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        # Spans of messages whose record was given up (see MessageTraces).
        self.cut_short = 0

    @property
    def outstanding(self):
        """Spans handed to the batch processor and not yet exported or failed."""
        return self.handed - self.exported - self.failed


class CountingExporter(SpanExporter):
    """An exporter whose batches are counted as exported or failed."""

    def __init__(self, exporter, counts):
        self.exporter = exporter
        self.counts = counts

    def export(self, spans):
        try:
            result = self.exporter.export(spans)
        except Exception:
            self.counts.failed += len(spans)
            raise
        if result is SpanExportResult.SUCCESS:
            self.counts.exported += len(spans)
        else:
            self.counts.failed += len(spans)
        return result

    def shutdown(self):
        self.exporter.shutdown()

    def force_flush(self, timeout_millis=30000):
        return self.exporter.force_flush(timeout_millis)


class BoundedProcessor(SpanProcessor):
    """
    The batch processor behind a bound of its own: at most ``max_queue``
    spans handed over and not yet exported (or failed), the rest dropped
    and counted here, so a collector that is down costs that many spans'
    memory and nothing else.
    """

    def __init__(self, batch, max_queue, counts):
        self.batch = batch
        self.max_queue = max_queue
        self.counts = counts

    def on_start(self, span, parent_context=None):
        pass

    def on_end(self, span):
        counts = self.counts
        if counts.outstanding >= self.max_queue:
            counts.dropped += 1
            return
        counts.handed += 1
        self.batch.on_end(span)

    def shutdown(self):
        self.batch.shutdown()

    def force_flush(self, timeout_millis=30000):
        return self.batch.force_flush(timeout_millis)


class Spans:
    """
    What the broker's hooks ask of OpenTelemetry: spans started from a
    message's W3C trace context, children, the context to send on.
    """

    CONSUMER = SpanKind.CONSUMER
    PRODUCER = SpanKind.PRODUCER
    INTERNAL = SpanKind.INTERNAL

    def __init__(self, tracer, counts):
        self.tracer = tracer
        self.counts = counts
        self.propagator = TraceContextTextMapPropagator()

    def start(self, name, carrier, attributes):
        """
        A CONSUMER span continuing the trace in ``carrier`` (a dict of
        ``traceparent``/``tracestate``, perhaps empty), or None when it is
        not sampled.
        """
        context = self.propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(name, context, SpanKind.CONSUMER, attributes)
        if not span.is_recording():
            span.end()
            return None
        return span

    def child(self, parent, name, kind, attributes=None):
        return self.tracer.start_span(name, trace.set_span_in_context(parent), kind, attributes)

    def context(self, span):
        """``[(name, value)]``: the W3C trace context naming ``span`` as parent."""
        carrier = {}
        self.propagator.inject(carrier, trace.set_span_in_context(span))
        return list(carrier.items())

    def failed(self, span, description):
        span.set_status(Status(StatusCode.ERROR, description))


class ExportWarnings(logging.Handler):
    """
    OpenTelemetry's own log records (a failed export, its retries), made
    in the exporting thread, as the gateway's warnings on the reactor
    thread: a collector down for hours writes a few lines a minute, not
    one per batch.
    """

    def __init__(self, reactor, limited):
        super().__init__(logging.WARNING)
        self.reactor = reactor
        self.limited = limited

    def emit(self, record):
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.reactor.callFromThread(self.limited.warn, "tracing: {message}", message=message)


class TracingService(Service):
    """
    At shutdown, exports what waits and stops the exporting thread, from
    a daemon thread of its own: a collector that is down holds the
    shutdown SHUTDOWN_WAIT seconds at most, then what was not exported is
    given up.
    """

    def __init__(self, provider, reactor):
        self.provider = provider
        self.reactor = reactor

    def stopService(self):
        super().stopService()
        done = Deferred()

        def shut_down():
            try:
                self.provider.shutdown()
            finally:
                self.reactor.callFromThread(done.callback, None)

        threading.Thread(target=shut_down, name="mqttgw tracing shutdown", daemon=True).start()
        done.addTimeout(SHUTDOWN_WAIT, self.reactor)
        done.addErrback(self._given_up)
        return done

    def _given_up(self, failure):
        failure.trap(TimeoutError)
        log.warn(
            "tracing: spans not exported within {wait:.0f}s of shutdown are lost", wait=SHUTDOWN_WAIT
        )


def start_tracing(router, settings, reactor):
    """
    ``router.tracer`` set from ``[otel]``; returns the service that stops
    the export at shutdown.
    """
    o = settings.otel
    counts = SpanCounts()
    resource = Resource.create({"service.name": o.service_name})
    provider = TracerProvider(resource=resource, sampler=ROOT_SAMPLER)
    exporter = CountingExporter(OTLPSpanExporter(endpoint=o.endpoint, timeout=EXPORT_TIMEOUT), counts)
    batch = BatchSpanProcessor(
        exporter,
        max_queue_size=o.max_queue_size,
        schedule_delay_millis=SCHEDULE_DELAY_MS,
        max_export_batch_size=min(MAX_EXPORT_BATCH, o.max_queue_size),
        export_timeout_millis=EXPORT_TIMEOUT * 1000,
    )
    provider.add_span_processor(BoundedProcessor(batch, o.max_queue_size, counts))
    sdk_log = logging.getLogger("opentelemetry")
    sdk_log.addHandler(ExportWarnings(reactor, router.limited("tracing export", log)))
    sdk_log.propagate = False
    spans = Spans(provider.get_tracer("mqttgw"), counts)
    router.tracer = MessageTraces(router, spans, reactor, counts, o.sample_ratio)
    log.info(
        "tracing on: spans exported over OTLP/HTTP to {endpoint}, sample ratio {ratio}"
        " (a publish whose traceparent says sampled is traced whatever it is),"
        " at most {queue} spans waiting",
        endpoint=o.endpoint,
        ratio=o.sample_ratio,
        queue=o.max_queue_size,
    )
    return TracingService(provider, reactor)

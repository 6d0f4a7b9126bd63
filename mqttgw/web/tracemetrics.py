"""
The ``/metrics`` family of distributed tracing: spans exported, failed
(the collector refused them or could not be reached) and dropped (the
export queue was full), read from the router's tracer when scraped.
"""

from prometheus_client.core import CounterMetricFamily

OUTCOMES = ("exported", "failed", "dropped", "cut_short")


class TraceSpans:
    """A prometheus_client collector of the tracer's span counts (all 0 with tracing off)."""

    def __init__(self, router):
        self.router = router

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily(
            "mqttgw_trace_spans",
            "spans by outcome: exported, failed to export, dropped at a full queue,"
            " cut_short (ended before the upstream ack, too many messages in progress)",
            labels=["outcome"],
        )
        tracer = self.router.tracer
        counts = tracer.counts if tracer is not None else None
        for outcome in OUTCOMES:
            family.add_metric([outcome], getattr(counts, outcome) if counts is not None else 0)
        yield family

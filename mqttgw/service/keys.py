"""
The ``[log]`` and ``[otel]`` sections' keys: what mqttgw.service.logs and
mqttgw.service.tracing are set up with (schema rows).
"""

from mqttgw.schema import CONNECTION_KEYS, Key

LOG_KEYS = [
    CONNECTION_KEYS["log.connection_messages"],
    Key(
        "log",
        "refusal_interval",
        float,
        10.0,
        "seconds over which the refused connections of one address are logged"
        " as one line with a count",
        0.1,
        doc=(
            "Refused CONNECTs, connections over limits.max_connection_rate "
            "and connections closed for sending no CONNECT in time: the "
            "first from an address in full, then one line with how many more"
            " and the last reason; never a line per connection.  Refusals at"
            " limits.max_connections are a warning of the whole gateway "
            "instead: at most 10 lines a minute, then one with how many were"
            " not logged."
        ),
    ),
    Key(
        "log",
        "level",
        str,
        "info",
        "lowest level logged",
        choices=("debug", "info", "warn", "error", "critical"),
        flag_name="log-level",
        doc="SIGHUP applies a change.",
    ),
    Key(
        "log",
        "format",
        str,
        "text",
        "text lines, or JSON lines with stable field names",
        choices=("text", "json"),
        flag_name="log-format",
        doc=(
            "``json``: one object per line with the fields time (UTC, ISO "
            "8601), level, namespace, message, traceback (failures) and the "
            "event's own fields (client_id, peer, topic...).  Warnings that "
            "can repeat many times a second (protocol errors from a flood of "
            "bad clients, refused connections) are logged 10 times a minute "
            "at most, then counted in one line."
        ),
    ),
]

OTEL_KEYS = [
    Key(
        "otel",
        "endpoint",
        str,
        "",
        "OTLP/HTTP traces URL spans are exported to (empty: tracing off)",
        flag_name="otel-endpoint",
        doc=(
            "E.g. ``http://127.0.0.1:4318/v1/traces`` (an OpenTelemetry "
            "Collector's or Jaeger's OTLP/HTTP receiver).  Needs the ``otel``"
            " extra (``pip install 'mqttgw[otel]'``); empty, nothing of "
            "OpenTelemetry is loaded.  Spans are exported in batches from a "
            "thread of their own; a collector that cannot be reached costs "
            "at most otel.max_queue_size spans, the rest dropped and counted "
            "(``mqttgw_trace_spans_total``).  See the tracing guide."
        ),
    ),
    Key(
        "otel",
        "sample_ratio",
        float,
        0.0,
        "share of messages without a sampled trace context that are traced",
        0.0,
        1.0,
        flag_name="otel-sample-ratio",
        doc=(
            "Parent-based: a 5.0 PUBLISH whose ``traceparent`` user property "
            "says sampled is traced whatever the ratio, one that says not "
            "sampled is not; others are traced at this ratio (0.0: only "
            "those that carry a sampled ``traceparent``)."
        ),
    ),
    Key(
        "otel", "service_name", str, "mqttgw", "the name the spans' resource gives the gateway (service.name)",
        flag_name="otel-service-name",
    ),
    Key(
        "otel",
        "max_queue_size",
        int,
        2048,
        "spans waiting for export, at most; more are dropped and counted",
        1,
        flag_name="otel-max-queue-size",
    ),
]

"""
Prometheus metrics.  Counters are read from the router's Stats when
scraped (the hot path only increments integers); two histograms are
observed as things happen: store commit latency (in the writer thread)
and publish-to-delivery latency, on one message in ``TRACE_EVERY``.
"""

import time

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from mqttgw.web.tracemetrics import TraceSpans
from mqttgw.wire.packets import WatchedPublish

# One PUBLISH in this many (the first among them) is traced from its
# arrival to each write of a copy to a subscriber's connection: at 100,000
# messages a second that is still a hundred samples a second, for a cost
# that does not show in throughput.
TRACE_EVERY = 1024

COUNTERS = [
    # (metric name, Stats attribute, help)
    ("mqttgw_packets_received", "packets_received", "MQTT packets received"),
    ("mqttgw_packets_sent", "packets_sent", "MQTT packets sent"),
    ("mqttgw_bytes_received", "bytes_received", "MQTT bytes received"),
    ("mqttgw_bytes_sent", "bytes_sent", "MQTT bytes sent"),
    ("mqttgw_publish_received", "messages_received", "PUBLISH packets received from clients"),
    ("mqttgw_publish_sent", "messages_delivered", "messages routed to subscribers"),
    ("mqttgw_publish_dropped", "messages_dropped", "messages dropped at a full queue"),
    ("mqttgw_publish_denied", "messages_denied", "PUBLISHes refused by the ACL"),
    ("mqttgw_publish_bytes_received", "publish_bytes_received", "PUBLISH payload bytes received"),
    ("mqttgw_publish_bytes_sent", "publish_bytes_sent", "payload bytes routed to subscribers"),
    ("mqttgw_protocol_errors", "protocol_errors", "connections closed for a protocol violation"),
    ("mqttgw_mqttsn_datagrams_dropped", "mqttsn_dropped",
     "MQTT-SN datagrams dropped: malformed, of an unknown type, or out of turn"),
    ("mqttgw_connections_accepted", "connections_accepted", "connections accepted"),
    ("mqttgw_connections_refused", "connections_refused", "connections or CONNECTs refused"),
    ("mqttgw_logins_refused", "logins_refused", "CONNECTs refused for their credentials"),
    ("mqttgw_clients_expired", "clients_expired", "persistent sessions expired"),
    ("mqttgw_retained_refused", "retained_refused", "retained messages not kept at the limit"),
    ("mqttgw_sessions_refused", "sessions_refused", "persistent sessions refused at the limit"),
    (
        "mqttgw_session_owner_refused",
        "session_owner_refused",
        "CONNECTs refused: the client id's session belongs to another identity",
    ),
    (
        "mqttgw_session_owner_replaced",
        "session_owner_replaced",
        "sessions discarded for another identity (auth.session_owner_mismatch)",
    ),
    (
        "mqttgw_publish_unreadable",
        "messages_unreadable",
        "waiting messages dropped: their reader may no longer read the topic",
    ),
    ("mqttgw_store_refused", "store_refused", "publishes refused while the store failed"),
    ("mqttgw_messages_expired", "messages_expired", "5.0 messages whose expiry interval ended before delivery"),
    (
        "mqttgw_messages_dropped_at_total_bound",
        "dropped_at_total_bound",
        "messages not queued: the gateway's queues held max_queued_bytes_total",
    ),
    (
        "mqttgw_messages_too_large",
        "messages_too_large",
        "messages not sent: larger than the 5.0 client's maximum packet size",
    ),
    (
        "mqttgw_subscriptions_refused",
        "subscriptions_refused",
        "topic filters refused at a client's max_subscriptions or max_subscription_bytes",
    ),
]


class Metrics:
    """The registry behind ``GET /metrics``."""

    def __init__(self, router, listeners=(), bridges=(), store=None, archive=None):
        self.router = router
        self.listeners = listeners
        self.bridges = bridges
        self.store = store
        self.archive = archive
        self.registry = CollectorRegistry()
        self.commit_latency = Histogram(
            "mqttgw_store_commit_seconds",
            "time to commit one batch to the store",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.delivery_latency = Histogram(
            "mqttgw_delivery_seconds",
            "time from a PUBLISH's arrival to a copy's write to a subscriber"
            f" (one message in {TRACE_EVERY})",
            buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=self.registry,
        )
        self.registry.register(self)
        self.registry.register(TraceSpans(router))
        if store is not None:
            store.on_commit = self.commit_latency.observe
        router.trace_deliveries(self.trace, TRACE_EVERY)

    def trace(self, message):
        """A copy of ``message`` whose deliveries are timed."""
        traced = WatchedPublish(
            message.topic, message.payload, message.qos, message.retain, message.dup, message.message_id,
            message.properties, message.expiry,
        )
        received_at = time.perf_counter()
        observe = self.delivery_latency.observe
        # Each copy framed for a subscriber (see WatchedPublish).
        traced.copied = lambda: observe(time.perf_counter() - received_at)
        return traced

    def text(self):
        return generate_latest(self.registry)

    # prometheus_client's collector interface: read when scraped.

    def describe(self):
        return []

    def _bridge_links(self):
        """Where each bridge's link is, since when it has none, and what its upstreams did."""
        down = GaugeMetricFamily(
            "mqttgw_bridge_down_seconds", "seconds since a bridge last had a working upstream link (0: it has one)",
            labels=["bridge"],
        )
        address = GaugeMetricFamily(
            "mqttgw_bridge_address", "1 for the upstream address a bridge is on or trying, 0 for its others",
            labels=["bridge", "address"],
        )
        failures = CounterMetricFamily(
            "mqttgw_bridge_connect_failures",
            "failed attempts to connect upstream, by address and what the upstream did",
            labels=["bridge", "address", "reason"],
        )
        fallbacks = GaugeMetricFamily(
            "mqttgw_bridge_fallback",
            "1 for each fallback in effect at an upstream address (try_private_off, mqttv311)",
            labels=["bridge", "address", "fallback"],
        )
        clean = GaugeMetricFamily(
            "mqttgw_bridge_clean_fallback", "1 while a bridge is on a clean session for want of its persistent one",
            labels=["bridge"],
        )
        for bridge in self.bridges:
            status = bridge.status()
            if "address" not in status:
                continue
            name = status["name"]
            down.add_metric([name], status["disconnected_s"] or 0)
            for one in status["addresses"]:
                address.add_metric([name, one], 1 if one == status["address"] else 0)
            for one, kinds in status["failures"].items():
                for kind, count in kinds.items():
                    failures.add_metric([name, one, kind], count)
            for one, names in status["fallbacks"].items():
                for fallback in names:
                    fallbacks.add_metric([name, one, fallback.replace(" ", "_")], 1)
            clean.add_metric([name], 1 if status["clean_fallback"] else 0)
        return [down, address, failures, fallbacks, clean]

    def collect(self):
        yield from self._router_metrics()
        yield from self._listener_metrics()
        store = self.store
        if store is not None:
            up = GaugeMetricFamily("mqttgw_store_up", "1 while the store commits, 0 when it fails")
            up.add_metric([], 1 if store.failed is None else 0)
            yield up
        yield from self._bridge_metrics()
        yield from self._bridge_links()
        archive = self.archive
        if archive is not None:
            written = CounterMetricFamily("mqttgw_archive_rows_written", "rows written to the archive")
            written.add_metric([], archive.written)
            yield written
            dropped = CounterMetricFamily("mqttgw_archive_rows_dropped", "rows the archive could not write")
            dropped.add_metric([], archive.dropped)
            yield dropped
        sparkplug = self.router.sparkplug
        if sparkplug is not None:
            yield from _sparkplug_metrics(sparkplug.stats)

    def _router_metrics(self):
        """The router's counters and gauges."""
        router = self.router
        stats = router.stats
        for name, attribute, text in COUNTERS:
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], getattr(stats, attribute))
            yield counter
        gauges = [
            ("mqttgw_clients_connected", "clients connected", stats.clients_connected),
            ("mqttgw_clients_maximum", "most clients connected at once", stats.clients_maximum),
            ("mqttgw_sessions", "sessions, persistent ones away included", len(router.sessions)),
            ("mqttgw_retained_messages", "retained messages", len(router.retained)),
            ("mqttgw_subscriptions", "subscriptions", router.subscriptions.count),
            ("mqttgw_messages_stored", "messages queued or in flight for sessions",
             stats.stored_messages),
            ("mqttgw_websocket_handshakes", "WebSocket connections not yet upgraded",
             stats.handshakes),
        ]
        for name, text, value in gauges:
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], value)
            yield gauge
        by_protocol = GaugeMetricFamily(
            "mqttgw_clients_by_protocol", "clients connected, by MQTT version", labels=["protocol"]
        )
        for version, attribute in (
            ("3.1", "clients_v31"), ("3.1.1", "clients_v311"), ("5.0", "clients_v5"), ("MQTT-SN 1.2", "clients_mqttsn")
        ):
            by_protocol.add_metric([version], getattr(stats, attribute))
        yield by_protocol

    def _listener_metrics(self):
        """Whether each listener is bound, and the connections open by listener kind."""
        per_listener = GaugeMetricFamily(
            "mqttgw_listener_up", "whether a listener is bound", labels=["kind", "address"]
        )
        for listener in self.listeners:
            per_listener.add_metric([listener.kind, listener.description], 1 if listener.port else 0)
        yield per_listener
        connections = GaugeMetricFamily(
            "mqttgw_listener_connections", "connections open, by listener kind", labels=["kind"]
        )
        by_kind = {}
        for listener in self.listeners:
            by_kind.setdefault(listener.kind, 0)
        for connection in _connections(self.router):
            kind = getattr(connection, "listener_kind", None)
            if kind is not None:
                by_kind[kind] = by_kind.get(kind, 0) + 1
        for kind, n in sorted(by_kind.items()):
            connections.add_metric([kind], n)
        yield connections

    def _bridge_metrics(self):
        """Each bridge's queue and counters, from its ``status()``."""
        bridge_metrics = {
            "state": GaugeMetricFamily("mqttgw_bridge_up", "1 while a bridge's upstream is connected", labels=["bridge"]),
            "queued": GaugeMetricFamily("mqttgw_bridge_queued", "messages waiting for the upstream", labels=["bridge"]),
            "dropped": CounterMetricFamily("mqttgw_bridge_dropped", "messages dropped at a full bridge queue", labels=["bridge"]),
            "sent": CounterMetricFamily("mqttgw_bridge_sent", "messages forwarded upstream", labels=["bridge"]),
            "received": CounterMetricFamily("mqttgw_bridge_received", "messages brought in from upstream", labels=["bridge"]),
            "refused": CounterMetricFamily("mqttgw_bridge_refused", "messages the upstream refused (5.0 reason codes)", labels=["bridge"]),
        }
        more = {
            "queued_bytes": GaugeMetricFamily("mqttgw_bridge_queued_bytes", "payload bytes waiting for the upstream", labels=["bridge"]),
            "oldest_queued_s": GaugeMetricFamily("mqttgw_bridge_oldest_queued_seconds", "age of the oldest message waiting for the upstream (0: none)", labels=["bridge"]),
            "drain_rate": GaugeMetricFamily("mqttgw_bridge_drain_rate", "messages sent upstream a second, over the last minute", labels=["bridge"]),
            "link_changes": CounterMetricFamily("mqttgw_bridge_link_changes", "times the upstream link came up or went down", labels=["bridge"]),
        }
        drops = CounterMetricFamily(
            "mqttgw_bridge_drops", "messages a bridge did not forward, by reason", labels=["bridge", "reason"]
        )
        reason_codes = CounterMetricFamily(
            "mqttgw_bridge_reason_codes",
            "5.0 reason codes other than success the upstream answered with",
            labels=["bridge", "packet", "reason"],
        )
        for bridge in self.bridges:
            status = bridge.status()
            labels = [status["name"]]
            bridge_metrics["state"].add_metric(labels, 1 if status["connected"] else 0)
            for key in ("queued", "dropped", "sent", "received"):
                bridge_metrics[key].add_metric(labels, status[key])
            bridge_metrics["refused"].add_metric(labels, status.get("refused", 0))
            for key, family in more.items():
                if key in status:
                    family.add_metric(labels, status[key] or 0)
            for reason, count in status.get("drops", {}).items():
                drops.add_metric([status["name"], reason], count)
            for name, count in status.get("reason_codes", {}).items():
                packet, reason = name.split(" ", 1)
                reason_codes.add_metric([status["name"], packet, reason], count)
        yield from bridge_metrics.values()
        yield from more.values()
        yield drops
        yield reason_codes


# Sparkplug: (attribute, metric, help); gauges first.
SPARKPLUG = [
    ("nodes_online", "mqttgw_sparkplug_nodes_online", "Sparkplug edge nodes online"),
    ("devices_online", "mqttgw_sparkplug_devices_online", "Sparkplug devices online"),
    ("births", "mqttgw_sparkplug_births", "NBIRTH messages seen"),
    ("deaths", "mqttgw_sparkplug_deaths", "NDEATH messages (wills included) that ended a birth"),
    ("out_of_sequence", "mqttgw_sparkplug_out_of_sequence",
     "Sparkplug messages whose seq did not follow their node's last"),
    ("bdseq_mismatches", "mqttgw_sparkplug_bdseq_mismatches",
     "NDEATH messages ignored: their bdSeq was not the current birth's"),
    ("malformed", "mqttgw_sparkplug_malformed", "Sparkplug messages whose payload could not be read"),
    ("certificates", "mqttgw_sparkplug_certificates", "births kept on $sparkplug/certificates/"),
    ("untracked", "mqttgw_sparkplug_untracked",
     "births past sparkplug.max_nodes or max_devices, not tracked"),
]


def _sparkplug_metrics(stats):
    for i, (attribute, name, text) in enumerate(SPARKPLUG):
        family = (GaugeMetricFamily if i < 2 else CounterMetricFamily)(name, text)
        family.add_metric([], getattr(stats, attribute))
        yield family


def _connections(router):
    for session in router.sessions.values():
        if session.connection is not None:
            yield session.connection

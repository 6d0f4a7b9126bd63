"""
Distributed traces of the messages the router carries: where a PUBLISH
enters, its spans (received, the store commit, each delivery, each bridge
forward and its upstream acknowledgement), and the W3C trace context it
goes on with.  It imports nothing of OpenTelemetry: it is given
``spans`` (``service.tracing.Spans``), which does.
"""

import random

from mqttgw.broker.session import INTERNAL_PREFIX
from mqttgw.broker.subscriptions import options_for
from mqttgw.wire.packets import WatchedPublish

BRIDGE_PREFIX = f"{INTERNAL_PREFIX}bridge/"
# The user properties of W3C Trace Context (MQTT 5.0 carries them so).
TRACE_CONTEXT = ("traceparent", "tracestate")


def trace_context(properties):
    """``{name: value}`` of the trace context among a message's user properties."""
    found = {}
    for name, value in properties.get("user_property", ()):
        if name in TRACE_CONTEXT:
            found[name] = value
    return found


def with_context(message, context):
    """
    A copy of ``message`` whose user properties carry ``context`` (a list
    of pairs) in place of any trace context it came with.
    """
    properties = dict(message.properties or {})
    kept = [p for p in properties.get("user_property", ()) if p[0] not in TRACE_CONTEXT]
    properties["user_property"] = kept + context
    copy = type(message)(
        message.topic, message.payload, message.qos, message.retain, message.dup,
        message.message_id, properties, message.expiry, message.topic_wire,
    )
    if isinstance(message, WatchedPublish):
        copy.copied = message.copied
    return copy


def _attributes(operation, kind, topic, client_id=None, qos=None):
    attributes = {
        "messaging.system": "mqtt",
        "messaging.destination.name": topic,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
    }
    if client_id is not None:
        attributes["messaging.client.id"] = client_id
    if qos is not None:
        attributes["messaging.mqtt.qos"] = qos
    return attributes


def _client_id(session):
    client_id = getattr(session, "client_id", None)
    if client_id is None:
        return None
    if client_id.startswith(INTERNAL_PREFIX):
        return client_id[len(INTERNAL_PREFIX):]
    return client_id


class MessageTraces:
    """
    The router's ``tracer``: decides whether a PUBLISH is traced, starts
    its spans and ends them as its routing, its store commit and its
    bridges' upstream acknowledgements finish.  Spans of one reactor turn
    that end with the routing end together, at the end of the turn.
    """

    # Messages whose bridge forwards wait for an upstream ack, at most;
    # past it the oldest one's spans end unfinished (counted cut_short).
    MAX_PENDING = 10_000

    def __init__(self, router, spans, clock, counts, ratio, draw=random.random):
        self.router = router
        self.spans = spans
        self.clock = clock
        self.counts = counts
        # A message without a trace context is sampled here, at ``ratio``,
        # before anything is built for it; the SDK's sampler (ROOT_SAMPLER)
        # decides only those that carry one, by their parent's flag.
        self.ratio = ratio
        self.draw = draw
        # id(message) -> (message, {bridge session: its forward span}).
        self.pending = {}
        self._ending = []
        self._end_call = None

    def publish(self, message, sender):
        """The message to route in place of ``message``: itself, or a traced copy."""
        properties = message.properties
        carrier = trace_context(properties) if properties else None
        if not carrier:
            ratio = self.ratio
            if ratio <= 0.0 or (ratio < 1.0 and self.draw() >= ratio):
                return message
        topic = message.topic
        spans = self.spans
        attributes = _attributes("publish", "receive", topic, _client_id(sender), message.qos)
        attributes["messaging.message.body.size"] = len(message.payload)
        if message.message_id is not None:
            attributes["messaging.message.id"] = str(message.message_id)
        span = spans.start(f"publish {topic}", carrier, attributes)
        if span is None:
            return message
        traced = with_context(message, spans.context(span))
        self._ending.append(span)
        if self.router.may_be_durable(traced):
            self._store(span, topic)
        self._deliveries(traced, span, sender)
        if self._end_call is None:
            self._end_call = self.clock.callLater(0, self._end_turn)
        return traced

    def _store(self, parent, topic):
        span = self.spans.child(parent, "store", self.spans.INTERNAL, {"messaging.destination.name": topic})

        def failed(error):
            self.spans.failed(span, "store commit failed")
            span.end()

        self.router.store.after_commit(span.end, failed=failed)

    def _deliveries(self, message, parent, sender):
        """A span per subscriber the router will hand ``message`` to."""
        spans = self.spans
        topic = message.topic
        for session, granted in self.router.subscriptions.match(topic):
            if session is sender and session.policy.no_local:
                continue
            may_read = session.may_read
            if may_read is not None and not may_read(topic):
                continue
            if session.options:
                # A 5.0 no local subscription of the publisher's own.
                granted = options_for(session, topic, granted, session is sender, message.retain)[0]
                if granted < 0:
                    continue
            qos = min(message.qos, granted)
            client_id = getattr(session, "client_id", "")
            if client_id.startswith(BRIDGE_PREFIX):
                self._forward(message, parent, session, qos)
                continue
            attributes = _attributes("deliver", "send", topic, _client_id(session), qos)
            name = getattr(session, "name", None)
            if name is not None and client_id == "":
                attributes["messaging.consumer.group.name"] = name
            self._ending.append(spans.child(parent, f"deliver {topic}", spans.PRODUCER, attributes))

    def _forward(self, message, parent, session, qos):
        """A bridge forward, which ends when the upstream acknowledges it (QoS 1/2)."""
        bridge = session.client_id[len(BRIDGE_PREFIX):]
        attributes = _attributes("forward", "send", message.topic, bridge, qos)
        attributes["mqttgw.bridge"] = bridge
        span = self.spans.child(parent, "bridge forward", self.spans.PRODUCER, attributes)
        if not qos:
            self._ending.append(span)
            return
        pending = self.pending
        record = pending.get(id(message))
        if record is None:
            if len(pending) >= self.MAX_PENDING:
                self._cut_short(next(iter(pending)))
            record = pending[id(message)] = (message, {})
        record[1][session] = span

    def _cut_short(self, key):
        message, forwards = self.pending.pop(key)
        for span in forwards.values():
            span.set_attribute("mqttgw.trace.cut_short", True)
            span.end()
            self.counts.cut_short += 1

    def upstream_ack(self, session, message_id, reason_code, packet_name):
        """A bridge's upstream acknowledged ``message_id`` (PUBACK or PUBCOMP)."""
        flight = session.inflight.get(message_id)
        if flight is None:
            return
        message = flight.message
        record = self.pending.get(id(message))
        if record is None or record[0] is not message:
            return
        span = record[1].pop(session, None)
        if not record[1]:
            del self.pending[id(message)]
        if span is None:
            return
        ack = self.spans.child(span, "upstream ack", self.spans.INTERNAL, {
            "messaging.system": "mqtt",
            "messaging.operation.name": packet_name.lower(),
            "messaging.operation.type": "settle",
            "mqttgw.reason_code": reason_code,
        })
        if reason_code >= 0x80:
            self.spans.failed(ack, f"upstream answered {packet_name} {reason_code:#04x}")
            self.spans.failed(span, "refused upstream")
        ack.end()
        span.end()

    def _end_turn(self):
        self._end_call = None
        ending, self._ending = self._ending, []
        for span in ending:
            span.end()

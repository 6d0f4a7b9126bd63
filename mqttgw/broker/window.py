"""
A session's in-flight window: the QoS 1/2 deliveries sent and not yet
acknowledged, under message ids of its own, completed by the client's
acknowledgements, sent again on retry or when a session resumes, handed
over to another member of a shared subscription when the client leaves.
What is counted, and the store rows, move through Deliveries.
"""

from mqttgw.broker.deliveries import AWAITING_ACK, AWAITING_PUBCOMP, Deliveries
from mqttgw.broker.delivery_policy import CLIENT
from mqttgw.broker.frames import PLAIN, TooLarge
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.packets import pubrel_bytes


class Window(Deliveries):
    """
    Deliveries in flight to the attached connection, which writes what
    ``frames`` makes of them.  Completing one moves what waits (``pump``,
    the Outbox's).
    """

    __slots__ = (
        "connection", "frames", "_publish", "policy", "window", "may_read", "_writable", "_gated",
        "_deferred", "_retry_call",
    )

    def __init__(self, client_id, clock, limits, stats, store):
        super().__init__(client_id, clock, limits, stats, store)
        self.connection = None
        # The attached connection's PUBLISH frames (see broker.frames),
        # and their publish(), called as it is: every copy goes through it.
        self.frames = PLAIN
        self._publish = PLAIN.publish
        # How it delivers where a bridge differs (see delivery_policy).
        self.policy = CLIENT
        # How many QoS 1/2 messages may be in flight to the client: ours,
        # or less if the client's receive maximum says so.
        self.window = limits.max_inflight_messages
        # Whether the client may read a topic (a cached ACL check), or
        # None: everything.  Asked when a message is routed, and again
        # when one that waited (queued, or in flight) goes out.
        self.may_read = None
        self._writable = False
        # Frames of this connection waiting for a commit before they go out.
        self._gated = 0
        # In-flight deliveries not sent again yet (see InFlight.deferred).
        self._deferred = 0
        self._retry_call = None

    def _write0(self, message, retain, group):
        publish = self._publish
        try:
            self.connection.write(publish(message, 0, None, retain, False, group))
        except TooLarge:
            self._too_large()

    def _write_after_commit(self, frame):
        self._gated += 1
        self.store.after_commit(self._write_if_still, self.connection, frame)

    def _write_if_still(self, connection, frame):
        # A connection that left meanwhile gets it again on the next attach.
        if self.connection is connection:
            self._gated -= 1
            connection.write(frame)

    def _resend(self, mid, flight):
        if flight.state != AWAITING_ACK:
            self.connection.write(pubrel_bytes(mid))
            return
        max_qos = self.policy.max_qos
        if flight.qos > max_qos:
            # The receiver takes less now: the flow starts again at its
            # maximum (a PUBREL, once sent, goes on as it was).
            if not max_qos:
                self._write0(flight.message, flight.retain, flight.group)
                del self.inflight[mid]
                self.discard(flight.seq)
                return
            flight.qos = max_qos
        message = flight.message
        may_read = self.may_read
        if may_read is not None and not may_read(message.topic):
            # Its reader's rights changed since it was sent (a PUBREL,
            # once due, goes on: it carries no payload).
            del self.inflight[mid]
            self._unreadable(message, flight.seq)
            return
        frames = self.frames
        if flight.qos == 1 and frames.expires and self.expired(message):
            # Not sent again once expired (a QoS 2 flow, once begun, is
            # finished whatever [MQTT-4.3.3-7]).
            frame = None
        else:
            publish = self._publish
            try:
                frame = publish(message, flight.qos, mid, flight.retain, True, flight.group)
            except TooLarge:
                # A client back with a smaller maximum.
                self._too_large()
                frame = None
        if frame is None:
            # It leaves the window, which it would otherwise hold for ever.
            del self.inflight[mid]
            self.discard(flight.seq)
            return
        self.connection.write(frame)

    def _hand_over_shared(self):
        """
        Messages that came by a shared subscription and were not yet
        acknowledged go to another member of its group, if one is
        connected: QoS 1 ones only, since a QoS 2 delivery is completed
        with the same client when it comes back, and goes to no other
        client if its session ends ([MQTT-4.8.2-4], [MQTT-4.8.2-5]).
        """
        for mid, flight in list(self.inflight.items()):
            group = flight.group
            if (
                group is not None
                and flight.state == AWAITING_ACK
                and flight.qos == 1
                and group.redeliver(flight.message, flight.qos, self, flight.held)
            ):
                del self.inflight[mid]
                self.discard(flight.seq)
        queue = self._queue
        if queue and any(entry[4] is not None for entry in queue):
            # Each entry once round, in order: those handed over leave it.
            for _ in range(len(queue)):
                message, qos, _, seq, group, held, _ = queue[0]
                if group is not None and qos == 1 and group.redeliver(message, qos, self, held):
                    self.pop(queue)
                    self.discard(seq)
                else:
                    queue.rotate(-1)

    # Acknowledgements from the client

    # An acknowledgement for an id not in flight is a late duplicate (its
    # message was completed after a retry, or before a restart without
    # persistence): ignored, or for PUBREC answered so the client can
    # finish.  One that does not fit the flow of an id in flight (PUBREC
    # for QoS 1, PUBACK for QoS 2, PUBCOMP before PUBREC) breaks the
    # protocol.

    def puback(self, mid):
        flight = self.inflight.get(mid)
        if flight is None:
            return
        if flight.qos != 1:
            raise ProtocolViolation(f"PUBACK for message {mid}, in flight at QoS 2", R.PROTOCOL_ERROR)
        # _complete, inline: PUBACK is the usual acknowledgement.
        del self.inflight[mid]
        if flight.held is not None:
            flight.held.delivered()
        self.discard(flight.seq)
        self.pump()

    def pubrec(self, mid, failed=False):
        """PUBREC; ``failed``: its 5.0 reason code says the message is refused,
        which ends its flow ([MQTT-4.3.3-4])."""
        flight = self.inflight.get(mid)
        if failed and (flight is None or flight.qos == 2):
            if flight is not None and flight.state == AWAITING_ACK:
                self._complete(mid, flight)
            return
        pubrel = pubrel_bytes(mid)
        if flight is not None and flight.qos == 1:
            raise ProtocolViolation(f"PUBREC for message {mid}, in flight at QoS 1", R.PROTOCOL_ERROR)
        if flight is not None:
            flight.state = AWAITING_PUBCOMP
            flight.attempts = 0
            flight.due = self.clock.seconds() + self.limits.retry_interval
            if flight.seq is not None:
                # Once PUBREL is out the PUBLISH must never be sent again,
                # not even after a crash: record the PUBREC first.
                self.store.update_delivery(self.client_id, flight.seq, mid, AWAITING_PUBCOMP)
                self._write_after_commit(pubrel)
                return
        # Answered even for an id we no longer know, so the client can finish.
        self.connection.write(pubrel)

    def pubcomp(self, mid):
        flight = self.inflight.get(mid)
        if flight is None:
            return
        if flight.state != AWAITING_PUBCOMP:
            raise ProtocolViolation(
                f"PUBCOMP for message {mid} before its PUBREC"
                if flight.qos == 2
                else f"PUBCOMP for message {mid}, in flight at QoS 1",
                R.PROTOCOL_ERROR,
            )
        self._complete(mid, flight)

    def _complete(self, mid, flight):
        del self.inflight[mid]
        if flight.held is not None:
            flight.held.delivered()
        self.discard(flight.seq)
        self.pump()

    def _send_deferred(self, window):
        """Deferred deliveries, in order, while the window has room."""
        flights = list(self.inflight.items())
        room = window - sum(1 for _, f in flights if not f.deferred)
        left = 0
        for mid, flight in flights:
            if flight.deferred:
                if room > 0:
                    flight.deferred = False
                    room -= 1
                    self._resend(mid, flight)
                else:
                    left += 1
        self._deferred = left

    # Retry of unacknowledged messages

    def _schedule_retry(self):
        if (
            not self.inflight
            or self.connection is None
            or self.limits.retry_interval <= 0
            # 5.0 re-sends only when a session resumes ([MQTT-4.4.0-1]).
            or not self.frames.retries
        ):
            self._retry_call = None
            return
        due = min(f.due for f in self.inflight.values())
        delay = max(0.0, due - self.clock.seconds())
        self._retry_call = self.clock.callLater(delay, self._retry)

    def _retry(self):
        self._retry_call = None
        if self.connection is None:
            return
        now = self.clock.seconds()
        limits = self.limits
        for mid, flight in list(self.inflight.items()):
            if flight.due <= now and mid in self.inflight and not flight.deferred:
                flight.attempts += 1
                flight.due = now + min(
                    limits.retry_interval * 2**flight.attempts,
                    limits.retry_max_interval,
                )
                self._resend(mid, flight)
        self._schedule_retry()

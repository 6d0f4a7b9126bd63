"""
A session's in-flight window: the QoS 1/2 deliveries sent and not yet
acknowledged, under message ids of its own, completed by the client's
acknowledgements, sent again on retry or when a session resumes.  What is
counted, and the store rows, move through the session's Deliveries; what
is written goes through its Outbox, to the carrier it attached.
"""

from mqttgw.broker.deliveries import AWAITING_ACK, AWAITING_PUBCOMP
from mqttgw.broker.deliveryframes import TooLarge
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.packets import pubrel_bytes


class Window:
    """
    The deliveries in flight to the session's carrier: how many may be at
    once (``size``), and their flows to completion.  Given the session's
    ``deliveries`` (the flights themselves, counted), its ``outbox`` (which
    writes what the window sends, as the carrier's frames make it and for
    the reader the outbox serves, and moves what waits when a flight
    completes: see :meth:`send_through`) and a ``clock`` for retries.
    """

    __slots__ = ("deliveries", "outbox", "clock", "size", "deferred", "retry_call")

    def __init__(self, deliveries, clock):
        self.deliveries = deliveries
        self.outbox = None
        self.clock = clock
        # How many QoS 1/2 messages may be in flight to the client: ours,
        # or less if the client's receive maximum says so.
        self.size = deliveries.limits.max_inflight_messages
        # In-flight deliveries not sent again yet (see InFlight.deferred).
        self.deferred = 0
        self.retry_call = None

    def send_through(self, outbox):
        """The Outbox that writes what the window sends, and that moves
        what waits once a flight completes."""
        self.outbox = outbox

    # Acknowledgements from the client

    # An acknowledgement for an id not in flight is a late duplicate (its
    # message was completed after a retry, or before a restart without
    # persistence): ignored, or for PUBREC answered so the client can
    # finish.  One that does not fit the flow of an id in flight (PUBREC
    # for QoS 1, PUBACK for QoS 2, PUBCOMP before PUBREC) breaks the
    # protocol.

    def puback(self, mid):
        deliveries = self.deliveries
        inflight = deliveries.inflight
        flight = inflight.get(mid)
        if flight is None:
            return
        if flight.qos != 1:
            raise ProtocolViolation(f"PUBACK for message {mid}, in flight at QoS 2", R.PROTOCOL_ERROR)
        # complete, inline: PUBACK is the usual acknowledgement.
        del inflight[mid]
        if flight.held is not None:
            flight.held.delivered()
        deliveries.discard(flight.seq)
        self.outbox.pump()

    def pubrec(self, mid, failed=False):
        """PUBREC; ``failed``: its 5.0 reason code says the message is refused,
        which ends its flow ([MQTT-4.3.3-4])."""
        deliveries = self.deliveries
        flight = deliveries.inflight.get(mid)
        if failed and (flight is None or flight.qos == 2):
            if flight is not None and flight.state == AWAITING_ACK:
                self.complete(mid, flight)
            return
        pubrel = pubrel_bytes(mid)
        if flight is not None and flight.qos == 1:
            raise ProtocolViolation(f"PUBREC for message {mid}, in flight at QoS 1", R.PROTOCOL_ERROR)
        if flight is not None:
            flight.state = AWAITING_PUBCOMP
            flight.attempts = 0
            flight.due = self.clock.seconds() + deliveries.limits.retry_interval
            if flight.seq is not None:
                # Once PUBREL is out the PUBLISH must never be sent again,
                # not even after a crash: record the PUBREC first.
                deliveries.store.update_delivery(deliveries.client_id, flight.seq, mid, AWAITING_PUBCOMP)
                self.outbox.write_after_commit(pubrel)
                return
        # Answered even for an id we no longer know, so the client can finish.
        self.outbox.connection.write(pubrel)

    def pubcomp(self, mid):
        flight = self.deliveries.inflight.get(mid)
        if flight is None:
            return
        if flight.state != AWAITING_PUBCOMP:
            raise ProtocolViolation(
                f"PUBCOMP for message {mid} before its PUBREC"
                if flight.qos == 2
                else f"PUBCOMP for message {mid}, in flight at QoS 1",
                R.PROTOCOL_ERROR,
            )
        self.complete(mid, flight)

    def complete(self, mid, flight):
        """The flow of ``flight`` under ``mid`` is done: what waits may move."""
        del self.deliveries.inflight[mid]
        if flight.held is not None:
            flight.held.delivered()
        self.deliveries.discard(flight.seq)
        self.outbox.pump()

    # Sending again

    def forget_released(self):
        """
        The receiver's session is new (a bridge's upstream answered
        without it): the flows it had past PUBREC went with that session,
        the message too where the receiver releases it only on PUBREL (as
        mosquitto does), so they start again from PUBLISH.  A receiver that
        had already passed it on gets it twice, which is better than never.
        """
        deliveries = self.deliveries
        for mid, flight in deliveries.inflight.items():
            if flight.state == AWAITING_PUBCOMP:
                flight.state = AWAITING_ACK
                if flight.seq is not None:
                    deliveries.store.update_delivery(deliveries.client_id, flight.seq, mid, AWAITING_ACK)

    def resume_flights(self, now):
        """A carrier is attached: in-flight deliveries go again in their
        order, as many as the window takes; the rest as earlier ones
        complete ([MQTT-3.3.4-7])."""
        due = now + self.deliveries.limits.retry_interval
        size = self.size
        sent = 0
        self.deferred = 0
        for mid, flight in list(self.deliveries.inflight.items()):
            flight.due = due
            flight.attempts = 0
            if sent < size:
                sent += 1
                flight.deferred = False
                self.send_again(mid, flight)
            else:
                flight.deferred = True
                self.deferred += 1

    def send_deferred(self):
        """Deferred deliveries, in order, while the window has room."""
        flights = list(self.deliveries.inflight.items())
        room = self.size - sum(1 for _, f in flights if not f.deferred)
        left = 0
        for mid, flight in flights:
            if flight.deferred:
                if room > 0:
                    flight.deferred = False
                    room -= 1
                    self.send_again(mid, flight)
                else:
                    left += 1
        self.deferred = left

    def send_again(self, mid, flight):
        """An in-flight delivery goes again: its PUBREL, or its PUBLISH
        marked DUP (or, no longer for this receiver, it leaves the window)."""
        outbox = self.outbox
        if flight.state != AWAITING_ACK:
            outbox.connection.write(pubrel_bytes(mid))
            return
        deliveries = self.deliveries
        max_qos = outbox.subscriber.policy.max_qos
        if flight.qos > max_qos:
            # The receiver takes less now: the flow starts again at its
            # maximum (a PUBREL, once sent, goes on as it was).
            if not max_qos:
                outbox.write0(flight.message, flight.retain, flight.group)
                del deliveries.inflight[mid]
                deliveries.discard(flight.seq)
                return
            flight.qos = max_qos
        message = flight.message
        may_read = outbox.subscriber.may_read
        if may_read is not None and not may_read(message.topic):
            # Its reader's rights changed since it was sent (a PUBREL,
            # once due, goes on: it carries no payload).
            del deliveries.inflight[mid]
            deliveries.drop_unreadable(message, flight.seq)
            return
        frames = outbox.frames
        if flight.qos == 1 and frames.expires and deliveries.expired(message):
            # Not sent again once expired (a QoS 2 flow, once begun, is
            # finished whatever [MQTT-4.3.3-7]).
            frame = None
        else:
            try:
                frame = frames.publish(message, flight.qos, mid, flight.retain, True, flight.group)
            except TooLarge:
                # A client back with a smaller maximum.
                deliveries.drop_too_large()
                frame = None
        if frame is None:
            # It leaves the window, which it would otherwise hold for ever.
            del deliveries.inflight[mid]
            deliveries.discard(flight.seq)
            return
        outbox.connection.write(frame)

    # Retry of unacknowledged messages

    def schedule_retry(self):
        inflight = self.deliveries.inflight
        outbox = self.outbox
        if (
            not inflight
            or outbox.connection is None
            or self.deliveries.limits.retry_interval <= 0
            # 5.0 re-sends only when a session resumes ([MQTT-4.4.0-1]).
            or not outbox.frames.retries
        ):
            self.retry_call = None
            return
        due = min(f.due for f in inflight.values())
        delay = max(0.0, due - self.clock.seconds())
        self.retry_call = self.clock.callLater(delay, self._retry)

    def _retry(self):
        self.retry_call = None
        if self.outbox.connection is None:
            return
        now = self.clock.seconds()
        limits = self.deliveries.limits
        inflight = self.deliveries.inflight
        for mid, flight in list(inflight.items()):
            if flight.due <= now and mid in inflight and not flight.deferred:
                flight.attempts += 1
                flight.due = now + min(
                    limits.retry_interval * 2**flight.attempts,
                    limits.retry_max_interval,
                )
                self.send_again(mid, flight)
        self.schedule_retry()

    def stop_retry(self):
        """The carrier left: no retry is pending."""
        call = self.retry_call
        if call is not None:
            if call.active():
                call.cancel()
            self.retry_call = None

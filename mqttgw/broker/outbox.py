"""
A session's outbound flow: messages to its client sent now or queued, and
the queues moved to the wire as the socket, the in-flight window and a
bridge's pacer allow; then the retained messages a SUBSCRIBE asked for,
drawn from the retained tree only as fast as the connection takes them, so
no number of them can swell the queue or stall the reactor.  Frames come
from the attached connection's frames object (see broker.frames); what is
counted, and the store rows, move through Deliveries.
"""

from collections import deque

from twisted.logger import Logger

from mqttgw.broker.deliveries import AWAITING_ACK, EMPTY, InFlight
from mqttgw.broker.frames import TooLarge
from mqttgw.broker.window import Window
from mqttgw.wire.printable import printable

log = Logger()


class Outbox(Window):
    """Deliveries to the client of one session, in order."""

    __slots__ = ("_retained", "_retained_call")

    def __init__(self, client_id, clock, limits, stats, store):
        super().__init__(client_id, clock, limits, stats, store)
        # Walks of the retained tree still to be delivered, oldest first.
        self._retained = EMPTY
        self._retained_call = None

    def pause(self):
        """The connection's socket is full: hold further messages here."""
        self._writable = False

    def resume(self):
        if self.connection is not None:
            self._writable = True
            self.pump()

    def deliver(self, message, qos, retain=False, held=None, group=None):
        """
        Send ``message`` at ``qos`` now, or queue it within the limits.
        Returns True when the delivery was written to the store, so that
        its publisher is acknowledged only once that write is committed.
        ``held``: that acknowledgement (acks.Held), when it may wait for
        the store; ``group``: the shared subscription it came by.  (A
        message is not expired when routed; where it waits, its expiry is
        checked.)
        """
        if qos == 0:
            if self._writable and not self._queue0:
                publish = self._publish  # called from a local: faster than a slot's method call
                try:
                    self.connection.write(publish(message, 0, None, retain, False, group))
                except TooLarge:
                    self._too_large()
                return False
            limits = self.limits
            if self.connection is None:
                if limits.store_qos0_messages and self.store is not None:
                    return self._store_qos0(message, retain, group, held)
                if not limits.queue_qos0_messages:
                    return False
            if not self._queue0:
                self._queue0 = deque()
            self.push(self._queue0, message, qos, retain, None, group)
            return False
        seq = None
        if self.store is not None:
            if self._full(message) and not self._make_room(message):
                self._drop(message, qos)
                return False
            self._seq = seq = self._seq + 1
        if self._writable and not self._queue and len(self.inflight) < self.window:
            self._send(message, qos, retain, seq, False, group, held)
        else:
            if seq is not None:
                self.store.add_delivery(self.client_id, seq, message, qos, retain)
                if held is not None:
                    # Counted now, as if in flight: when it is sent and
                    # acknowledged, its publisher's ack need wait no more.
                    held.pending += 1
            if not self._queue:
                self._queue = deque()
            self.push(self._queue, message, qos, retain, seq, group, held)
        return seq is not None

    def _store_qos0(self, message, retain, group, held):
        """A QoS 0 message kept in the store while the receiver is away, in
        order with its QoS 1/2 ones; sent at QoS 0 when it is back."""
        if self._full(message) and not self._make_room(message):
            self._drop(message, 0)
            return False
        self._seq = seq = self._seq + 1
        self.store.add_delivery(self.client_id, seq, message, 0, retain)
        if held is not None:
            held.blocked = True
        if not self._queue:
            self._queue = deque()
        self.push(self._queue, message, 0, retain, seq, group, held)
        return True

    def _send(self, message, qos, retain, seq, stored, group=None, held=None, queued_at=None):
        """
        Send a delivery now.  ``stored``: it was queued (counted, and in
        the store already if persistent, without its id), at ``queued_at``.
        """
        max_qos = self.policy.max_qos
        if qos > max_qos:
            qos = max_qos
        if not qos:
            # A stored QoS 0 message, or a receiver of QoS 0 only: sent
            # once, and done with.
            if stored:
                self.discard(seq)
            self._write0(message, retain, group)
            return
        flight = InFlight(message, qos, retain, seq, self.clock.seconds() + self.limits.retry_interval,
                          AWAITING_ACK, group, None, queued_at)
        mid = self.fly(flight, stored)
        dup = stored and seq is not None and seq <= self._dup_through and qos == 1
        publish = self._publish  # called from a local: faster than a slot's method call
        try:
            frame = publish(message, qos, mid, retain, dup, group)
        except TooLarge:
            # Not sent: it leaves the window (its row, if stored, too).
            del self.inflight[mid]
            self._too_large()
            self.discard(seq if stored else None)
            return
        if seq is None:
            self.connection.write(frame)
        else:
            self._send_stored(message, qos, retain, seq, stored, mid, flight, frame, held)
        if self._retry_call is None:
            self._schedule_retry()

    def _send_stored(self, message, qos, retain, seq, stored, mid, flight, frame, held):
        if held is not None:
            flight.held = held
            if not stored:
                held.pending += 1
        if stored and qos == 1:
            # At least once needs no id on disk: after a restart it goes
            # again, under a new id, marked DUP.
            self.store.sent(self.client_id, seq)
        elif stored:
            # The message id is on disk before the client can see it, so
            # a restart re-sends it under the same id: exactly once holds.
            self.store.update_delivery(self.client_id, seq, mid, AWAITING_ACK)
        else:
            self.store.add_delivery(self.client_id, seq, message, qos, retain, mid, AWAITING_ACK)
        if qos == 1 and not self._gated:
            # At least once needs no wait: a copy that goes out before
            # its commit is, after a crash, sent again (from the store,
            # or by its publisher, whose PUBACK waits for the commit),
            # never lost.  Behind a frame that waits, it waits too, to
            # stay in order.
            self.connection.write(frame)
        else:
            self._write_after_commit(frame)

    # Moving what waits

    def pump(self):
        """Move queued messages to the wire as the socket and window allow."""
        queue0 = self._queue0
        if queue0 is not EMPTY:
            self._drain0(queue0)
        window = self.window
        if self._deferred and self._writable:
            self._send_deferred(window)
        queue = self._queue
        if queue:
            self._drain(queue, window, None)
            if queue:
                # The window or the socket is full, so what comes after the
                # queue (the paced queue, retained messages) cannot move either:
                # under load, the usual end of a PUBACK's pump.
                return
            if self._queue is queue:
                self._queue = EMPTY
        paced = self._paced_queue
        if paced and self._writable:
            self._drain(paced, window, self.policy.pacer)
            if not paced and self._paced_queue is paced:
                self._paced_queue = EMPTY
        if self._retained and self._writable and not self._queue0:
            self._pump_retained()

    def _drain0(self, queue0):
        """QoS 0 messages held while the socket was full, as it takes them."""
        may_read = self.may_read
        while queue0 and self._writable:
            message, _, retain, _, group, _, _ = self.pop(queue0)
            if message.expiry is not None and self._expired(message):
                self.discard(None)
            elif may_read is not None and not may_read(message.topic):
                self._unreadable(message, None)
            else:
                # Sent once, and done with.
                self.discard(None)
                self._write0(message, retain, group)
        # Drained queues are let go, so an idle client holds no deque.
        if not queue0 and self._queue0 is queue0:
            self._queue0 = EMPTY

    def _drain(self, queue, window, pacer):
        """
        QoS 1/2 deliveries from ``queue`` (still stored) into the in-flight
        window, in order, as the socket, the window and ``pacer`` (the
        paced queue's, or None) allow.
        """
        # What waited is read as the reader may read now.
        may_read = self.may_read
        while queue and self._writable and len(self.inflight) < window:
            if pacer is not None:
                wait = pacer.take(len(queue[0][0].payload), self.clock.seconds())
                if wait:
                    if pacer.call is None or not pacer.call.active():
                        pacer.call = self.clock.callLater(wait, self._paced)
                    return
            message, qos, retain, seq, group, held, queued_at = self.pop(queue)
            if message.expiry is not None and self._expired(message):
                self.discard(seq)
                continue
            if may_read is not None and not may_read(message.topic):
                self._unreadable(message, seq)
                continue
            self._send(message, qos, retain, seq, True, group, held, queued_at)

    def _paced(self):
        self.policy.pacer.call = None
        if self.connection is not None:
            self.pump()

    # Retained messages on SUBSCRIBE

    # SUBSCRIBEs whose retained messages are still to be delivered.
    MAX_PENDING_WALKS = 100

    # Work per reactor turn on retained messages (a message sent, or a
    # step of the walk), so one large walk cannot hold up other connections.
    RETAINED_BUDGET = 256
    _WALK_STEP_COST = 16

    def send_retained(self, walk):
        """
        Deliver what ``walk`` (:meth:`RetainedTree.walk`) yields, as the
        connection and the in-flight window take it.
        """
        retained = self._retained
        if not retained:
            retained = self._retained = deque()
        if len(retained) >= self.MAX_PENDING_WALKS:
            # A client that keeps subscribing (across reconnections of a
            # persistent session) without reading: the oldest walk goes, as
            # a full queue drops messages.
            retained.popleft()
            self.dropped += 1
            self._stats.messages_dropped += 1
            log.warn(
                "client {client_id}: {n} SUBSCRIBEs' retained messages not yet"
                " taken; dropping the oldest",
                client_id=printable(self.client_id),
                n=self.MAX_PENDING_WALKS,
            )
        retained.append(walk)
        self.pump()

    def _pump_retained(self):
        retained = self._retained
        budget = self.RETAINED_BUDGET
        while retained and self._writable and not self._queue:
            if budget <= 0:
                if self._retained_call is None:
                    self._retained_call = self.clock.callLater(0, self._retained_turn)
                return
            item = next(retained[0], False)
            if item is False:
                retained.popleft()
                if not retained and self._retained is retained:
                    self._retained = EMPTY
            elif item is None:
                budget -= self._WALK_STEP_COST
            else:
                message, granted = item
                budget -= 1
                # Retained messages are the state a subscriber starts
                # from: never held back by a delivery budget.
                may_read = self.may_read
                if may_read is None or may_read(message.topic):
                    self.deliver(message, min(message.qos, granted), retain=True)

    def _retained_turn(self):
        self._retained_call = None
        self.pump()

    def stop_retained(self, forget):
        """The connection left: no turn is pending; ``forget``: nor any walk."""
        if self._retained_call is not None:
            self._retained_call.cancel()
            self._retained_call = None
        if forget:
            self._retained = EMPTY

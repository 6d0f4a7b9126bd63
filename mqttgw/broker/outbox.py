"""
A session's outbound flow: messages to its client sent now or queued, and
the queues moved to the wire as the socket, the in-flight window and a
bridge's pacer allow; then the retained messages a SUBSCRIBE asked for,
drawn from the retained tree only as fast as the connection takes them, so
no number of them can swell the queue or stall the reactor.  Frames come
from the attached carrier's frames object (see broker.deliveryframes); what is
counted, and the store rows, move through the session's Deliveries.
"""

from collections import deque

from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.deliveries import AWAITING_ACK, EMPTY, InFlight
from mqttgw.broker.deliveryframes import PLAIN, TooLarge
from mqttgw.broker.interfaces import IOutbox
from mqttgw.wire.printable import printable

log = Logger()


@implementer(IOutbox)
class Outbox:
    """
    Deliveries to the client of one session, in order, written to the
    attached ``connection`` (an ISessionCarrier) as its ``frames`` make
    them.  Given the session's ``deliveries`` (queued and in flight,
    counted), its ``window`` (how many may be in flight, and their
    retries), the ``subscriber`` whose reading rights (``may_read``) and
    delivery policy it follows (the session: routing asks the same of it),
    and a ``clock``.
    """

    __slots__ = (
        "deliveries", "window", "subscriber", "clock", "connection", "frames", "_publish", "writable",
        "gated", "_retained", "_retained_call",
    )

    def __init__(self, deliveries, window, subscriber, clock):
        self.deliveries = deliveries
        self.window = window
        self.subscriber = subscriber
        self.clock = clock
        self.connection = None
        # The attached connection's PUBLISH frames (see broker.deliveryframes),
        # and their publish(), called as it is: every copy goes through it.
        self.frames = PLAIN
        self._publish = PLAIN.publish
        # Whether the connection's socket takes more now.
        self.writable = False
        # Frames of this connection waiting for a commit before they go out.
        self.gated = 0
        # Walks of the retained tree still to be delivered, oldest first.
        self._retained = EMPTY
        self._retained_call = None

    def attach(self, connection, frames):
        """``connection`` carries the session now, writing what ``frames`` make."""
        self.frames = frames
        self._publish = frames.publish
        self.connection = connection
        self.writable = True
        self.gated = 0

    def detach(self):
        self.connection = None
        self.writable = False

    def pause(self):
        """The connection's socket is full: hold further messages here."""
        self.writable = False

    def resume(self):
        if self.connection is not None:
            self.writable = True
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
            if self.writable and not self.deliveries.queue0:
                publish = self._publish  # called from a local: faster than a slot's method call
                try:
                    self.connection.write(publish(message, 0, None, retain, False, group))
                except TooLarge:
                    self.deliveries.drop_too_large()
                return False
            deliveries = self.deliveries
            limits = deliveries.limits
            if self.connection is None:
                if limits.store_qos0_messages and deliveries.store is not None:
                    return self._store_qos0(message, retain, group, held)
                if not limits.queue_qos0_messages:
                    return False
            if not deliveries.queue0:
                deliveries.queue0 = deque()
            deliveries.push(deliveries.queue0, message, qos, retain, None, group)
            return False
        deliveries = self.deliveries
        seq = None
        if deliveries.store is not None:
            if deliveries.full(message) and not deliveries.make_room(message):
                deliveries.drop(message, qos)
                return False
            seq = deliveries.next_seq()
        if self.writable and not deliveries.queue and len(deliveries.inflight) < self.window.size:
            self._send(message, qos, retain, seq, False, group, held)
        else:
            if seq is not None:
                deliveries.store.add_delivery(deliveries.client_id, seq, message, qos, retain)
                if held is not None:
                    # Counted now, as if in flight: when it is sent and
                    # acknowledged, its publisher's ack need wait no more.
                    held.pending += 1
            if not deliveries.queue:
                deliveries.queue = deque()
            deliveries.push(deliveries.queue, message, qos, retain, seq, group, held)
        return seq is not None

    def _store_qos0(self, message, retain, group, held):
        """A QoS 0 message kept in the store while the receiver is away, in
        order with its QoS 1/2 ones; sent at QoS 0 when it is back."""
        deliveries = self.deliveries
        if deliveries.full(message) and not deliveries.make_room(message):
            deliveries.drop(message, 0)
            return False
        seq = deliveries.next_seq()
        deliveries.store.add_delivery(deliveries.client_id, seq, message, 0, retain)
        if held is not None:
            held.blocked = True
        if not deliveries.queue:
            deliveries.queue = deque()
        deliveries.push(deliveries.queue, message, 0, retain, seq, group, held)
        return True

    def _send(self, message, qos, retain, seq, stored, group=None, held=None, queued_at=None):
        """
        Send a delivery now.  ``stored``: it was queued (counted, and in
        the store already if persistent, without its id), at ``queued_at``.
        """
        deliveries = self.deliveries
        max_qos = self.subscriber.policy.max_qos
        if qos > max_qos:
            qos = max_qos
        if not qos:
            # A stored QoS 0 message, or a receiver of QoS 0 only: sent
            # once, and done with.
            if stored:
                deliveries.discard(seq)
            self.write0(message, retain, group)
            return
        flight = InFlight(message, qos, retain, seq, self.clock.seconds() + deliveries.limits.retry_interval,
                          AWAITING_ACK, group, None, queued_at)
        mid = deliveries.fly(flight, stored)
        dup = stored and seq is not None and seq <= deliveries.dup_through and qos == 1
        publish = self._publish  # called from a local: faster than a slot's method call
        try:
            frame = publish(message, qos, mid, retain, dup, group)
        except TooLarge:
            # Not sent: it leaves the window (its row, if stored, too).
            del deliveries.inflight[mid]
            deliveries.drop_too_large()
            deliveries.discard(seq if stored else None)
            return
        if seq is None:
            self.connection.write(frame)
        else:
            self._send_stored(message, qos, retain, seq, stored, mid, flight, frame, held)
        window = self.window
        if window.retry_call is None:
            window.schedule_retry()

    def _send_stored(self, message, qos, retain, seq, stored, mid, flight, frame, held):
        deliveries = self.deliveries
        store = deliveries.store
        if held is not None:
            flight.held = held
            if not stored:
                held.pending += 1
        if stored and qos == 1:
            # At least once needs no id on disk: after a restart it goes
            # again, under a new id, marked DUP.
            store.sent(deliveries.client_id, seq)
        elif stored:
            # The message id is on disk before the client can see it, so
            # a restart re-sends it under the same id: exactly once holds.
            store.update_delivery(deliveries.client_id, seq, mid, AWAITING_ACK)
        else:
            store.add_delivery(deliveries.client_id, seq, message, qos, retain, mid, AWAITING_ACK)
        if qos == 1 and not self.gated:
            # At least once needs no wait: a copy that goes out before
            # its commit is, after a crash, sent again (from the store,
            # or by its publisher, whose PUBACK waits for the commit),
            # never lost.  Behind a frame that waits, it waits too, to
            # stay in order.
            self.connection.write(frame)
        else:
            self.write_after_commit(frame)

    def write0(self, message, retain, group):
        """``message`` at QoS 0 now (counted if too large for the receiver)."""
        publish = self._publish
        try:
            self.connection.write(publish(message, 0, None, retain, False, group))
        except TooLarge:
            self.deliveries.drop_too_large()

    def write_after_commit(self, frame):
        """``frame`` once what the store holds of it is committed, in order."""
        self.gated += 1
        self.deliveries.store.after_commit(self._write_if_still, self.connection, frame)

    def _write_if_still(self, connection, frame):
        # A connection that left meanwhile gets it again on the next attach.
        if self.connection is connection:
            self.gated -= 1
            connection.write(frame)

    # Moving what waits

    def pump(self):
        """Move queued messages to the wire as the socket and window allow."""
        deliveries = self.deliveries
        queue0 = deliveries.queue0
        if queue0 is not EMPTY:
            self._drain0(queue0)
        window = self.window
        if window.deferred and self.writable:
            window.send_deferred()
        queue = deliveries.queue
        if queue:
            self._drain(queue, window.size, None)
            if queue:
                # The window or the socket is full, so what comes after the
                # queue (the paced queue, retained messages) cannot move either:
                # under load, the usual end of a PUBACK's pump.
                return
            if deliveries.queue is queue:
                deliveries.queue = EMPTY
        paced = deliveries.paced
        if paced and self.writable:
            self._drain(paced, window.size, self.subscriber.policy.pacer)
            if not paced and deliveries.paced is paced:
                deliveries.paced = EMPTY
        if self._retained and self.writable and not deliveries.queue0:
            self._pump_retained()

    def _drain0(self, queue0):
        """QoS 0 messages held while the socket was full, as it takes them."""
        deliveries = self.deliveries
        may_read = self.subscriber.may_read
        while queue0 and self.writable:
            message, _, retain, _, group, _, _ = deliveries.pop(queue0)
            if message.expiry is not None and deliveries.expired(message):
                deliveries.discard(None)
            elif may_read is not None and not may_read(message.topic):
                deliveries.drop_unreadable(message, None)
            else:
                # Sent once, and done with.
                deliveries.discard(None)
                self.write0(message, retain, group)
        # Drained queues are let go, so an idle client holds no deque.
        if not queue0 and deliveries.queue0 is queue0:
            deliveries.queue0 = EMPTY

    def _drain(self, queue, size, pacer):
        """
        QoS 1/2 deliveries from ``queue`` (still stored) into the in-flight
        window of ``size``, in order, as the socket, the window and
        ``pacer`` (the paced queue's, or None) allow.
        """
        deliveries = self.deliveries
        # What waited is read as the reader may read now.
        may_read = self.subscriber.may_read
        while queue and self.writable and len(deliveries.inflight) < size:
            if pacer is not None:
                wait = pacer.take(len(queue[0][0].payload), self.clock.seconds())
                if wait:
                    if pacer.call is None or not pacer.call.active():
                        pacer.call = self.clock.callLater(wait, self._paced)
                    return
            message, qos, retain, seq, group, held, queued_at = deliveries.pop(queue)
            if message.expiry is not None and deliveries.expired(message):
                deliveries.discard(seq)
                continue
            if may_read is not None and not may_read(message.topic):
                deliveries.drop_unreadable(message, seq)
                continue
            self._send(message, qos, retain, seq, True, group, held, queued_at)

    def _paced(self):
        self.subscriber.policy.pacer.call = None
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
            deliveries = self.deliveries
            deliveries.dropped += 1
            deliveries.stats.messages_dropped += 1
            log.warn(
                "client {client_id}: {n} SUBSCRIBEs' retained messages not yet"
                " taken; dropping the oldest",
                client_id=printable(deliveries.client_id),
                n=self.MAX_PENDING_WALKS,
            )
        retained.append(walk)
        self.pump()

    def _pump_retained(self):
        retained = self._retained
        deliveries = self.deliveries
        budget = self.RETAINED_BUDGET
        while retained and self.writable and not deliveries.queue:
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
                may_read = self.subscriber.may_read
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

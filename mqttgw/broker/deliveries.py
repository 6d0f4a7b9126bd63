"""
A session's delivery bookkeeping: the queues of messages waiting for its
client, the deliveries in flight, and what the gateway counts of them.  A
delivery's queue place, the counters (``stats.stored_messages``,
``queued_bytes``) and its store row change together, here and nowhere
else, as mosquitto keeps its queue accounting in
``db__msg_add/remove_*_stats``.
"""

from collections import deque
from types import MappingProxyType

from twisted.logger import Logger

from mqttgw.broker.logsummary import RateLimited
from mqttgw.wire.packets import Publish
from mqttgw.wire.printable import printable

log = Logger()
# A reload that takes rights away may drop many waiting messages at once.
_unreadable_log = RateLimited(log)

# An empty queue until a message must wait: an idle client keeps no deque
# (three of them were 2.2 KiB of its memory).
EMPTY = ()
# No message in flight, shared (read-only) until there is one.
NO_FLIGHTS = MappingProxyType({})

# Outbound in-flight states.
AWAITING_ACK = 1  # PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAITING_PUBCOMP = 2  # PUBREL sent; waiting for PUBCOMP


class InFlight:
    """A delivery in flight: what the broker tracks of it until its flow completes."""

    __slots__ = (
        "message", "qos", "retain", "seq", "state", "due", "attempts", "group", "deferred",
        "held", "queued_at",
    )

    def __init__(self, message, qos, retain, seq, due, state=AWAITING_ACK, group=None, held=None,
                 queued_at=None):
        self.message = message
        # The shared subscription it came by, if any.
        self.group = group
        self.qos = qos
        self.retain = retain
        # The delivery's key in the store (persistent sessions only).
        self.seq = seq
        self.state = state
        self.due = due
        self.attempts = 0
        # Not sent again yet after a reconnection: past the receiver's
        # receive maximum, it waits for an earlier one to complete.
        self.deferred = False
        # The publisher's acknowledgement that waits for this delivery or
        # its commit (acks.Held), if any.
        self.held = held
        # When it was queued for the receiver (clock time), if it waited
        # before it went out.
        self.queued_at = queued_at


class Deliveries:
    """
    What a session holds for its client, and its counts.  A queue entry is
    ``(message, qos, retain, seq, group, held, queued_at)``: ``seq`` its
    store key (None: in memory only), ``group`` the shared subscription it
    came by, ``held`` the publisher's acknowledgement that waits for it
    (acks.Held, or None), ``queued_at`` when it was queued (clock time).

    - :meth:`push` queues (counted: one stored message, its payload bytes);
    - :meth:`pop` takes the head of a queue (its bytes no longer queued:
      it goes in flight, or is discarded);
    - :meth:`fly` puts a delivery in flight (counted unless it was queued);
    - :meth:`discard` ends a delivery that was counted (sent, completed,
      or dropped): the stored count and its store row go.
    """

    __slots__ = (
        "client_id", "clock", "limits", "store", "stats", "seq", "dup_through", "_last_mid",
        "inflight", "queue0", "queue", "paced", "queued_bytes",
        "dropped", "dropped_too_large", "dropped_expired", "unreadable",
    )

    def __init__(self, client_id, clock, limits, stats, store):
        self.client_id = client_id
        self.clock = clock
        self.limits = limits
        # Persistent sessions keep their deliveries in the store, if there is one.
        self.store = store
        # The router's counters, where drops, connected clients and stored
        # messages are totalled for operators.
        self.stats = stats
        # The store key of the last delivery written (see next_seq).
        self.seq = 0
        # Restored queued QoS 1 deliveries up to this seq may have gone out
        # before a restart: they go again marked DUP.
        self.dup_through = 0
        # The message id given last (the next is the first free after it).
        self._last_mid = 0
        self.inflight = NO_FLIGHTS
        # QoS 0 messages held while the connection's socket is full.
        self.queue0 = EMPTY
        # QoS 1/2 messages waiting for the in-flight window or the client.
        self.queue = EMPTY
        # A bridge's messages that waited while its link was down, drained
        # at its pacer's rate while what comes meanwhile goes first.
        self.paced = EMPTY
        self.queued_bytes = 0
        self.dropped = 0
        # Of the messages dropped, those too large for the receiver, and
        # (not counted in ``dropped``) those that expired waiting.
        self.dropped_too_large = 0
        self.dropped_expired = 0
        # Messages that waited and were dropped, not sent: the reader may
        # no longer read their topic (not counted in ``dropped``).
        self.unreadable = 0

    @property
    def queued(self):
        """Messages waiting in the queues."""
        return len(self.queue0) + len(self.queue) + len(self.paced)

    def next_seq(self):
        """The store key of a delivery about to be written."""
        self.seq += 1
        return self.seq

    # The counted moves

    def push(self, queue, message, qos, retain, seq, group=None, held=None):
        """Queue a delivery at the end of ``queue`` (one of this session's
        deques), within the limits; one stored (``seq``) has made room."""
        if seq is None and self.full(message) and not self.make_room(message):
            self.drop(message, qos)
            return
        size = len(message.payload)
        self.queued_bytes += size
        stats = self.stats
        stats.queued_bytes += size
        stats.stored_messages += 1
        queue.append((message, qos, retain, seq, group, held, self.clock.seconds()))

    def pop(self, queue):
        """The entry at the head of ``queue``, its bytes no longer queued."""
        entry = queue.popleft()
        size = len(entry[0].payload)
        self.queued_bytes -= size
        self.stats.queued_bytes -= size
        return entry

    def fly(self, flight, counted, mid=None):
        """
        ``flight`` in flight under ``mid``, or the next message id free;
        returns the id.  ``counted``: it was queued, and counted then.
        """
        inflight = self.inflight
        if inflight is NO_FLIGHTS:
            inflight = self.inflight = {}
        if mid is None:
            mid = self._last_mid
            while True:
                mid = mid % 65535 + 1
                if mid not in inflight:
                    break
        self._last_mid = mid
        inflight[mid] = flight
        if not counted:
            self.stats.stored_messages += 1
        return mid

    def discard(self, seq):
        """A counted delivery ends: it is no longer stored, nor its row."""
        self.stats.stored_messages -= 1
        if seq is not None:
            self.store.delete_delivery(self.client_id, seq)

    def release(self):
        """The session ends: what it holds is no longer counted (its rows
        go with the store's session)."""
        stats = self.stats
        stats.stored_messages -= self.queued + len(self.inflight)
        stats.queued_bytes -= self.queued_bytes

    def drop_queue0(self):
        """QoS 0 messages held for a connection that left go."""
        queue0 = self.queue0
        while queue0:
            self.discard(self.pop(queue0)[3])
        self.queue0 = EMPTY

    def leave_store(self):
        """
        The session no longer outlives its connection (a 5.0 client
        resumed it, or ended it, with a Session Expiry Interval of 0): what
        it holds stays in memory only, to be delivered while the
        connection lasts, and its rows go with the store's session.
        """
        self.store = None
        self.dup_through = 0
        for flight in self.inflight.values():
            flight.seq = None
        for name in ("queue", "paced"):
            queue = getattr(self, name)
            if queue:
                setattr(self, name, deque((m, q, r, None, g, h, t) for m, q, r, _, g, h, t in queue))

    def hand_over_shared(self, leaving):
        """
        The session ``leaving`` lost its carrier: messages that came by a
        shared subscription and were not yet acknowledged go to another
        member of its group, if one is connected: QoS 1 ones only, since a
        QoS 2 delivery is completed with the same client when it comes
        back, and goes to no other client if its session ends
        ([MQTT-4.8.2-4], [MQTT-4.8.2-5]).
        """
        for mid, flight in list(self.inflight.items()):
            group = flight.group
            if (
                group is not None
                and flight.state == AWAITING_ACK
                and flight.qos == 1
                and group.redeliver(flight.message, flight.qos, leaving, flight.held)
            ):
                del self.inflight[mid]
                self.discard(flight.seq)
        queue = self.queue
        if queue and any(entry[4] is not None for entry in queue):
            # Each entry once round, in order: those handed over leave it.
            for _ in range(len(queue)):
                message, qos, _, seq, group, held, _ = queue[0]
                if group is not None and qos == 1 and group.redeliver(message, qos, leaving, held):
                    self.pop(queue)
                    self.discard(seq)
                else:
                    queue.rotate(-1)

    def restore_deliveries(self, stored):
        """Queued and in-flight deliveries as the store had them, in order."""
        now = self.clock.seconds()
        for d in stored.deliveries:
            message = Publish(d.topic, d.payload, d.qos, d.retain, properties=d.properties, expiry=d.expiry)
            self.seq = max(self.seq, d.seq)
            # Either waits since the restart at least.
            if d.message_id is None:
                if not self.queue:
                    self.queue = deque()
                self.push(self.queue, message, d.qos, d.retain, d.seq)
            else:
                flight = InFlight(message, d.qos, d.retain, d.seq, now, d.state, queued_at=now)
                self.fly(flight, False, d.message_id)
        if stored.sent_seq:
            self.dup_through = stored.sent_seq
            self.seq = max(self.seq, stored.sent_seq)

    # Bounds

    def full(self, message):
        """Whether ``message`` would pass this session's bounds, or the gateway's."""
        limits = self.limits
        size = len(message.payload)
        # self.queued, without a property's call: every queued message asks.
        queued = len(self.queue0) + len(self.queue) + len(self.paced)
        if queued >= limits.max_queued_messages or self.queued_bytes + size > limits.max_queued_bytes:
            return True
        stats = self.stats
        bound = stats.max_queued_bytes_total
        return bound and stats.queued_bytes + size > bound

    def _over_total(self, size):
        """Whether ``size`` more bytes queued would pass the gateway's bound."""
        stats = self.stats
        bound = stats.max_queued_bytes_total
        return bound and stats.queued_bytes + size > bound

    def make_room(self, message):
        """With drop_oldest: evict queued messages until ``message`` fits."""
        if not self.limits.drop_oldest:
            return False
        while self.full(message) and (self.queue0 or self.paced or self.queue):
            old, qos, _, seq = self.pop(self.queue0 or self.paced or self.queue)[:4]
            self.discard(seq)
            self.drop(old, qos)
        return not self.full(message)

    def drop(self, message, qos):
        """``message`` finds no room: dropped, counted, and (now and then) logged."""
        self.dropped += 1
        stats = self.stats
        stats.messages_dropped += 1
        if self._over_total(len(message.payload)):
            stats.dropped_at_total_bound += 1
            if stats.dropped_at_total_bound == 1 or stats.dropped_at_total_bound % 1000 == 0:
                log.warn(
                    "the gateway's queues hold max_queued_bytes_total ({bound} bytes):"
                    " dropped a QoS {qos} message for {client_id}"
                    " ({dropped} dropped at that bound so far)",
                    bound=stats.max_queued_bytes_total,
                    qos=qos,
                    client_id=printable(self.client_id),
                    dropped=stats.dropped_at_total_bound,
                )
            return
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warn(
                "client {client_id} queue full: dropped QoS {qos} message"
                " on {topic} ({dropped} dropped so far)",
                client_id=printable(self.client_id),
                qos=qos,
                topic=printable(message.topic),
                dropped=self.dropped,
            )

    def drop_too_large(self):
        """A delivery larger than the receiver accepts: dropped, and counted
        ([MQTT-3.1.2-25])."""
        self.dropped += 1
        self.dropped_too_large += 1
        self.stats.messages_dropped += 1
        self.stats.messages_too_large += 1

    def drop_unreadable(self, message, seq):
        """
        ``message`` waited (queued, or in flight) and its reader may no
        longer read its topic (an ACL reload, or a login with fewer
        rights): dropped, its store row with it, and counted.
        """
        self.unreadable += 1
        self.stats.messages_unreadable += 1
        self.discard(seq)
        _unreadable_log.warn(
            "client {client_id}: dropped a message on {topic} that waited for it:"
            " it may no longer read that topic",
            client_id=printable(self.client_id),
            topic=printable(message.topic),
        )

    # Expiry and age

    def expired(self, message):
        """Whether ``message`` has expired (counted when it has)."""
        if message.expiry is not None and message.expiry <= self.clock.seconds():
            self.stats.messages_expired += 1
            self.dropped_expired += 1
            return True
        return False

    def oldest_waiting(self):
        """When the oldest message waiting for the receiver was queued, or None."""
        oldest = None
        for queue in (self.queue0, self.paced, self.queue):
            if queue:
                at = queue[0][6]
                if oldest is None or at < oldest:
                    oldest = at
        for flight in self.inflight.values():
            at = flight.queued_at
            if at is not None and (oldest is None or at < oldest):
                oldest = at
        return oldest

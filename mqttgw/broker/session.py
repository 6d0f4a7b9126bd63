"""
Per-client session state: subscriptions, outbound message ids, the in-flight
window with its retries, the queue behind it, and inbound QoS 2 ids awaiting
PUBREL.  Knows nothing of transports: it writes bytes to whatever connection
is attached, and time comes from an injected clock.
"""

from collections import deque
from types import MappingProxyType

import attr
from twisted.logger import Logger

from mqttgw.broker.ratelimited import RateLimited
from mqttgw.broker.stats import Stats
from mqttgw.broker.subscriptions import subscription_ids
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.packets import Publish, pubrel_bytes
from mqttgw.wire.printable import printable

log = Logger()
# A reload that takes rights away may drop many waiting messages at once.
_unreadable_log = RateLimited(log)

# An empty queue until a message must wait: an idle client keeps no deque
# (three of them were 2.2 KiB of its memory).
_EMPTY = ()
# No message in flight, shared (read-only) until there is one.
_NO_FLIGHTS = MappingProxyType({})

# The first character of the client id of a session the gateway keeps for
# itself (a bridge's): no MQTT client can have it (CONNECT refuses a client
# id with U+0000), and it is kept in the store with the rest of the id, so
# the session is known for what it is after a restart too.
INTERNAL_PREFIX = "\x00"

# Outbound in-flight states.
AWAITING_ACK = 1  # PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAITING_PUBCOMP = 2  # PUBREL sent; waiting for PUBCOMP


@attr.s(frozen=True, slots=True)
class SessionLimits:
    """Per-session bounds; see ``[limits]`` in the configuration."""

    max_inflight_messages = attr.ib(default=20)
    max_queued_messages = attr.ib(default=1000)
    max_queued_bytes = attr.ib(default=16 * 1024 * 1024)
    # Whether QoS 0 messages are queued for an offline persistent session,
    # and (bridges) whether in the store, in order with QoS 1/2, rather
    # than in memory.
    queue_qos0_messages = attr.ib(default=False)
    store_qos0_messages = attr.ib(default=False)
    # When the queue is full, drop its oldest message (bridges) rather
    # than the new one.
    drop_oldest = attr.ib(default=False)
    # First retry of an unacknowledged message (s); doubles up to the maximum.
    retry_interval = attr.ib(default=20.0)
    retry_max_interval = attr.ib(default=300.0)
    # Topic filters a client may hold, and their UTF-8 bytes in all.
    max_subscriptions = attr.ib(default=10_000)
    max_subscription_bytes = attr.ib(default=1024 * 1024)


class Pacer:
    """
    A token bucket for draining a backlog: at most ``messages`` messages and
    ``payload_bytes`` payload bytes a second (0: that one unbounded), a
    second's worth at once.
    """

    __slots__ = ("messages", "payload_bytes", "_m", "_b", "_at", "call")

    def __init__(self, messages=0, payload_bytes=0):
        self.messages = messages
        self.payload_bytes = payload_bytes
        self._m = float(messages)
        self._b = float(payload_bytes)
        self._at = None
        # The pump it has scheduled, while it makes the backlog wait.
        self.call = None

    def take(self, size, now):
        """0 when a message of ``size`` bytes may go now (and is counted),
        else the seconds until it may."""
        if self._at is not None:
            elapsed = now - self._at
            if self.messages:
                self._m = min(float(self.messages), self._m + elapsed * self.messages)
            if self.payload_bytes:
                self._b = min(float(max(self.payload_bytes, size)), self._b + elapsed * self.payload_bytes)
        self._at = now
        wait = 0.0
        if self.messages and self._m < 1.0:
            wait = (1.0 - self._m) / self.messages
        if self.payload_bytes and self._b < size:
            wait = max(wait, (size - self._b) / self.payload_bytes)
        if wait:
            return wait
        if self.messages:
            self._m -= 1.0
        if self.payload_bytes:
            self._b -= size
        return 0.0


class _InFlight:
    __slots__ = (
        "message", "qos", "retain", "seq", "state", "due", "attempts", "group", "deferred",
        "held",
    )

    def __init__(self, message, qos, retain, seq, due, state=AWAITING_ACK, group=None):
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
        # its commit (store.Held), if any.
        self.held = None


class Session:
    """
    The broker's view of one client id.  A connection attaches to it with
    :meth:`attach` and leaves with :meth:`detach`; a persistent session
    outlives its connections.
    """

    # Slots: ten thousand idle clients hold ten thousand of these.
    __slots__ = (
        "client_id", "clean_session", "clock", "limits", "store", "_seq",
        "subscriptions", "will", "awaiting_pubrel", "connection", "inflight",
        "_queue0", "_queue", "queued_bytes", "dropped", "_stats", "_writable",
        "_last_mid", "_retry_call", "_retained", "_retained_call", "last_seen",
        "connected_since", "no_local", "retain_as_published", "may_read",
        "_gated", "filter_bytes", "internal", "encoder", "options", "window",
        "expiry_interval", "expiry_call", "will_call", "will_delay",
        "max_qos", "_deferred", "dropped_too_large", "dropped_expired",
        "pacer", "_backlog", "_dup_through", "owner", "unreadable",
    )

    def __init__(
        self, client_id, clean_session, clock, limits=SessionLimits(), stats=None, store=None
    ):
        # Bridges: not sent their own messages back, and given the RETAIN
        # flag as it was published.
        self.no_local = False
        self.retain_as_published = False
        # Whether the client may read a topic (a cached ACL check), or
        # None: everything.  Asked when a message is routed, and again
        # when one that waited (queued, or in flight) goes out.
        self.may_read = None
        # The identity that made the session (a user name; "" for an
        # anonymous client), or None: not known (the gateway's own
        # sessions, or one stored before owners were).  Another identity
        # never resumes it (see Router.owner_refusal).
        self.owner = None
        # Frames of this connection waiting for a commit before they go out.
        self._gated = 0
        self.client_id = client_id
        # The gateway's own session, not a client's: not listed or counted
        # as one, never expired, and its traffic is a bridge's.
        self.internal = client_id.startswith(INTERNAL_PREFIX)
        # Whether the session ends with its connection: 3.1.1's Clean
        # Session, or a 5.0 Session Expiry Interval of 0 (whatever its
        # Clean Start said, which only decides whether a session resumes).
        self.clean_session = clean_session
        self.clock = clock
        self.limits = limits
        # Persistent sessions keep their state in the store, if there is one.
        self.store = None if clean_session else store
        self._seq = 0
        # Restored queued QoS 1 deliveries up to this seq may have gone out
        # before a restart: they go again marked DUP.
        self._dup_through = 0
        # topic filter -> granted QoS, and the filters' UTF-8 bytes in all.
        self.subscriptions = {}
        self.filter_bytes = 0
        self.will = None
        # Inbound QoS 2 message ids whose PUBREL has not arrived yet (a set
        # once there is one).
        self.awaiting_pubrel = _EMPTY
        self.connection = None
        self.inflight = _NO_FLIGHTS
        # QoS 0 messages held while the connection's socket is full.
        self._queue0 = _EMPTY
        # QoS 1/2 messages waiting for the in-flight window or the client.
        self._queue = _EMPTY
        self.queued_bytes = 0
        self.dropped = 0
        # The router's counters, where drops, connected clients and stored
        # messages are totalled for operators.
        self._stats = stats if stats is not None else Stats()
        self._writable = False
        self._last_mid = 0
        self._retry_call = None
        # Walks of the retained tree still to be delivered, oldest first.
        self._retained = _EMPTY
        self._retained_call = None
        # When its last connection ended (reactor time), for expiry.
        self.last_seen = None
        self.connected_since = None
        # A 5.0 connection's framing of PUBLISH (see transports.mqtt5), or
        # None: 3.1.1's.
        self.encoder = None
        # 5.0 subscription options, by filter, where any differs from
        # 3.1.1's (None until then).
        self.options = None
        # How many QoS 1/2 messages may be in flight to the client: ours,
        # or less if the client's receive maximum says so.
        self.window = limits.max_inflight_messages
        # 5.0's session expiry interval (s), or None: 3.1.1's persistent
        # session, kept for persistent_client_expiration.
        self.expiry_interval = None
        # The session's own expiry, and its will's delay, while pending.
        self.expiry_call = None
        self.will_call = None
        # 5.0's will delay interval (s).
        self.will_delay = 0
        # The highest QoS the receiver takes (a bridge's upstream, 5.0).
        self.max_qos = 2
        # In-flight deliveries not sent again yet (see _InFlight.deferred).
        self._deferred = 0
        # A bridge's drain pacing (Pacer), or None; and what waited while
        # its link was down, drained at the pacer's rate while what comes
        # meanwhile goes first.
        self.pacer = None
        self._backlog = _EMPTY
        # Of the messages dropped, those too large for the receiver, and
        # (not counted in ``dropped``) those that expired waiting.
        self.dropped_too_large = 0
        self.dropped_expired = 0
        # Messages that waited and were dropped, not sent: the reader may
        # no longer read their topic (not counted in ``dropped``).
        self.unreadable = 0

    def __repr__(self):
        return f"<Session {self.client_id!r}>"

    @property
    def queued(self):
        return len(self._queue0) + len(self._queue) + len(self._backlog)

    # Connection life

    def attach(self, connection, encoder=None, receive_maximum=None):
        """
        A connection takes this session.  Unacknowledged deliveries are sent
        again, with DUP set, in their original order; then the queue drains.
        A 5.0 connection gives its ``encoder`` and the client's
        ``receive_maximum``.
        """
        self.encoder = encoder
        window = self.limits.max_inflight_messages
        if receive_maximum is not None and receive_maximum < window:
            window = receive_maximum
        self.window = window
        if self.connection is None and not self.internal:
            stats = self._stats
            stats.clients_connected += 1
            if not self.clean_session:
                stats.clients_disconnected -= 1
        self.connection = connection
        self._writable = True
        self._gated = 0
        if self.pacer is not None and self._queue:
            # What waited is the backlog now; what comes from here on
            # does not wait behind it.
            if not self._backlog:
                self._backlog = deque()
            self._backlog.extend(self._queue)
            self._queue = _EMPTY
        now = self.connected_since = self.clock.seconds()
        # Sent again in their order, as many as the window takes; the
        # rest as earlier ones complete ([MQTT-3.3.4-7]).
        sent = 0
        self._deferred = 0
        for mid, flight in list(self.inflight.items()):
            flight.due = now + self.limits.retry_interval
            flight.attempts = 0
            if sent < window:
                sent += 1
                flight.deferred = False
                self._resend(mid, flight)
            else:
                flight.deferred = True
                self._deferred += 1
        self._schedule_retry()
        self.pump()

    def detach(self):
        if self.connection is not None and not self.internal:
            stats = self._stats
            stats.clients_connected -= 1
            if not self.clean_session:
                stats.clients_disconnected += 1
        self.connection = None
        self._writable = False
        if self._retry_call is not None:
            if self._retry_call.active():
                self._retry_call.cancel()
            self._retry_call = None
        if self._retained_call is not None:
            self._retained_call.cancel()
            self._retained_call = None
        if self.clean_session:
            self._retained = _EMPTY
        self._hand_over_shared()
        if not self.limits.queue_qos0_messages:
            size = 0
            for message, _, _, _, _ in self._queue0:
                size += len(message.payload)
            self.queued_bytes -= size
            self._stats.queued_bytes -= size
            self._stats.stored_messages -= len(self._queue0)
            self._queue0 = _EMPTY

    def leave_store(self):
        """
        The session no longer outlives its connection (a 5.0 client
        resumed it, or ended it, with a Session Expiry Interval of 0): what
        it holds stays in memory only, to be delivered while the
        connection lasts, and its rows go with the store's session.
        """
        self.store = None
        self._dup_through = 0
        for flight in self.inflight.values():
            flight.seq = None
        for name in ("_queue", "_backlog"):
            queue = getattr(self, name)
            if queue:
                setattr(self, name, deque((m, q, r, None, g) for m, q, r, _, g in queue))

    def cancel_timers(self):
        """Its expiry and its will's delay stop (it is back, or it ends)."""
        for name in ("expiry_call", "will_call"):
            call = getattr(self, name)
            if call is not None:
                if call.active():
                    call.cancel()
                setattr(self, name, None)

    def _hand_over_shared(self):
        """
        Messages that came by a shared subscription and were not yet
        acknowledged go to another member of its group, if one is
        connected: QoS 1 ones only, since a QoS 2 delivery is completed
        with the same client when it comes back, and goes to no other
        client if its session ends ([MQTT-4.8.2-4], [MQTT-4.8.2-5]).
        """
        stats = self._stats
        for mid, flight in list(self.inflight.items()):
            group = flight.group
            if (
                group is not None
                and flight.state == AWAITING_ACK
                and flight.qos == 1
                and group.redeliver(flight.message, flight.qos, self)
            ):
                del self.inflight[mid]
                stats.stored_messages -= 1
                if flight.seq is not None:
                    self.store.delete_delivery(self.client_id, flight.seq)
        queue = self._queue
        if queue and any(entry[4] is not None for entry in queue):
            kept = deque()
            for entry in queue:
                message, qos, _, seq, group = entry
                if group is not None and qos == 1 and group.redeliver(message, qos, self):
                    self._unqueue(message, seq)
                else:
                    kept.append(entry)
            self._queue = kept

    def _unqueue(self, message, seq):
        size = len(message.payload)
        self.queued_bytes -= size
        self._stats.queued_bytes -= size
        self._stats.stored_messages -= 1
        if seq is not None:
            self.store.delete_delivery(self.client_id, seq)

    def pause(self):
        """The connection's socket is full: hold further messages here."""
        self._writable = False

    def resume(self):
        if self.connection is not None:
            self._writable = True
            self.pump()

    # Outbound delivery

    def deliver(self, message, qos, retain=False, group=None):
        """
        Send ``message`` at ``qos`` now, or queue it within the limits.
        Returns True when the delivery was written to the store, so that
        its publisher is acknowledged only once that write is committed.
        ``group``: the shared subscription it came by.  (A message is
        not expired when routed; where it waits, its expiry is checked.)
        """
        if qos == 0:
            if self._writable and not self._queue0:
                if self.encoder is None:
                    self.connection.write(message.frame(0, None, retain))
                else:
                    self._write5(message, 0, None, retain, False, group)
                return False
            limits = self.limits
            if self.connection is None:
                if limits.store_qos0_messages and self.store is not None:
                    return self._store_qos0(message, retain, group)
                if not limits.queue_qos0_messages:
                    return False
            if not self._queue0:
                self._queue0 = deque()
            self._enqueue(self._queue0, message, qos, retain, None, group)
            return False
        seq = None
        if self.store is not None:
            if self._full(message) and not self._make_room(message):
                self._drop(message, qos)
                return False
            self._seq = seq = self._seq + 1
        if self._writable and not self._queue and len(self.inflight) < self.window:
            # Counted here rather than in _send: a message the queue moves
            # in flight was counted when it was queued.
            self._stats.stored_messages += 1
            self._send(message, qos, retain, seq, False, group)
        else:
            if seq is not None:
                self.store.add_delivery(self.client_id, seq, message, qos, retain)
                if message.held is not None:
                    # Counted now, as if in flight: when it is sent and
                    # acknowledged, its publisher's ack need wait no more.
                    message.held.pending += 1
            if not self._queue:
                self._queue = deque()
            self._enqueue(self._queue, message, qos, retain, seq, group)
        return seq is not None

    def _store_qos0(self, message, retain, group):
        """A QoS 0 message kept in the store while the receiver is away, in
        order with its QoS 1/2 ones; sent at QoS 0 when it is back."""
        if self._full(message) and not self._make_room(message):
            self._drop(message, 0)
            return False
        self._seq = seq = self._seq + 1
        self.store.add_delivery(self.client_id, seq, message, 0, retain)
        if message.held is not None:
            message.held.blocked = True
        if not self._queue:
            self._queue = deque()
        self._enqueue(self._queue, message, 0, retain, seq, group)
        return True

    def _frame5(self, message, qos, mid, retain, dup, group):
        """
        A PUBLISH for a 5.0 client, or None when larger than the client
        accepts: then it is dropped, and counted ([MQTT-3.1.2-25]).
        """
        ids = subscription_ids(self, message.topic, group) if self.options else None
        frame = self.encoder.frame(message, qos, mid, retain, dup, ids)
        if frame is None:
            self.dropped += 1
            self.dropped_too_large += 1
            self._stats.messages_dropped += 1
            self._stats.messages_too_large += 1
        return frame

    def _write5(self, message, qos, mid, retain, dup, group):
        frame = self._frame5(message, qos, mid, retain, dup, group)
        if frame is not None:
            self.connection.write(frame)

    def expired(self, message):
        """Whether ``message`` has expired (counted when it has)."""
        return message.expiry is not None and self._expired(message)

    def _expired(self, message):
        if message.expiry is not None and message.expiry <= self.clock.seconds():
            self._stats.messages_expired += 1
            self.dropped_expired += 1
            return True
        return False

    def oldest_waiting(self):
        """When the oldest message waiting for the receiver was queued, or None."""
        oldest = None
        for queue in (self._queue0, self._backlog, self._queue):
            if queue:
                at = queue[0][0].queued_at
                if at is not None and (oldest is None or at < oldest):
                    oldest = at
        for flight in self.inflight.values():
            at = flight.message.queued_at
            if at is not None and (oldest is None or at < oldest):
                oldest = at
        return oldest

    def _full(self, message):
        limits = self.limits
        size = len(message.payload)
        # self.queued, without a property's call: every queued message asks.
        queued = len(self._queue0) + len(self._queue) + len(self._backlog)
        if queued >= limits.max_queued_messages or self.queued_bytes + size > limits.max_queued_bytes:
            return True
        stats = self._stats
        bound = stats.max_queued_bytes_total
        return bound and stats.queued_bytes + size > bound

    def _over_total(self, size):
        """Whether ``size`` more bytes queued would pass the gateway's bound."""
        stats = self._stats
        bound = stats.max_queued_bytes_total
        return bound and stats.queued_bytes + size > bound

    def _drop(self, message, qos):
        self.dropped += 1
        stats = self._stats
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

    def _make_room(self, message):
        """With drop_oldest: evict queued messages until ``message`` fits."""
        if not self.limits.drop_oldest:
            return False
        stats = self._stats
        while self._full(message) and (self._queue0 or self._backlog or self._queue):
            old, qos, _, seq, _ = (self._queue0 or self._backlog or self._queue).popleft()
            size = len(old.payload)
            self.queued_bytes -= size
            stats.queued_bytes -= size
            stats.stored_messages -= 1
            if seq is not None:
                self.store.delete_delivery(self.client_id, seq)
            self._drop(old, qos)
        return not self._full(message)

    def _enqueue(self, queue, message, qos, retain, seq, group=None):
        if seq is None and self._full(message) and not self._make_room(message):
            self._drop(message, qos)
            return
        size = len(message.payload)
        self.queued_bytes += size
        stats = self._stats
        stats.queued_bytes += size
        stats.stored_messages += 1
        if message.queued_at is None:
            message.queued_at = self.clock.seconds()
        queue.append((message, qos, retain, seq, group))

    def pump(self):
        """Move queued messages to the wire as the socket and window allow."""
        stats = self._stats
        queue0 = self._queue0
        may_read = self._reader() if queue0 else None
        while queue0 and self._writable:
            message, _, retain, _, group = queue0.popleft()
            size = len(message.payload)
            self.queued_bytes -= size
            stats.queued_bytes -= size
            stats.stored_messages -= 1
            if message.expiry is not None and self._expired(message):
                continue
            if may_read is not None and not may_read(message.topic):
                self._unreadable(message, None)
                continue
            if self.encoder is None:
                self.connection.write(message.frame(0, None, retain))
            else:
                self._write5(message, 0, None, retain, False, group)
        # Drained queues are let go, so an idle client holds no deque.
        if not queue0 and self._queue0 is queue0:
            self._queue0 = _EMPTY
        window = self.window
        if self._deferred and self._writable:
            self._send_deferred(window)
        queue = self._queue
        if queue:
            self._drain(queue, window, None)
            if queue:
                # The window or the socket is full, so what comes after the
                # queue (the backlog, retained messages) cannot move either:
                # under load, the usual end of a PUBACK's pump.
                return
            if self._queue is queue:
                self._queue = _EMPTY
        backlog = self._backlog
        if backlog and self._writable:
            self._drain(backlog, window, self.pacer)
            if not backlog and self._backlog is backlog:
                self._backlog = _EMPTY
        if self._retained and self._writable and not queue0:
            self._pump_retained()

    # Retained messages on SUBSCRIBE

    def send_retained(self, walk):
        """
        Deliver what ``walk`` (:meth:`RetainedTree.walk`) yields, drawn only
        as fast as the connection and the in-flight window take it, so no
        number of retained messages can swell the queue or stall the reactor.
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

    # SUBSCRIBEs whose retained messages are still to be delivered.
    MAX_PENDING_WALKS = 100

    # Work per reactor turn on retained messages (a message sent, or a
    # step of the walk), so one large walk cannot hold up other connections.
    RETAINED_BUDGET = 256
    _WALK_STEP_COST = 16

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
                    self._retained = _EMPTY
            elif item is None:
                budget -= self._WALK_STEP_COST
            else:
                message, granted = item
                budget -= 1
                # Retained messages are the state a subscriber starts
                # from: never held back (see broker.delivery_budget).
                may_read = getattr(self.may_read, "__wrapped__", self.may_read)
                if may_read is None or may_read(message.topic):
                    self.deliver(message, min(message.qos, granted), retain=True)

    def _retained_turn(self):
        self._retained_call = None
        self.pump()

    def _drain(self, queue, window, pacer):
        """
        QoS 1/2 deliveries from ``queue`` (still stored) into the in-flight
        window, in order, as the socket, the window and ``pacer`` (the
        backlog's, or None) allow.
        """
        stats = self._stats
        # What waited is read as the reader may read now (see _reader).
        may_read = self.may_read
        if may_read is not None:
            may_read = getattr(may_read, "__wrapped__", may_read)
        while queue and self._writable and len(self.inflight) < window:
            if pacer is not None:
                wait = pacer.take(len(queue[0][0].payload), self.clock.seconds())
                if wait:
                    if pacer.call is None or not pacer.call.active():
                        pacer.call = self.clock.callLater(wait, self._paced)
                    return
            message, qos, retain, seq, group = queue.popleft()
            size = len(message.payload)
            self.queued_bytes -= size
            stats.queued_bytes -= size
            if message.expiry is not None and self._expired(message):
                stats.stored_messages -= 1
                if seq is not None:
                    self.store.delete_delivery(self.client_id, seq)
                continue
            if may_read is not None and not may_read(message.topic):
                stats.stored_messages -= 1
                self._unreadable(message, seq)
                continue
            self._send(message, qos, retain, seq, True, group)

    def _reader(self):
        """
        The read check a message that waited is held to when it goes out,
        or None: everything.  A dashboard's delivery budget counts what is
        routed, not this.
        """
        may_read = self.may_read
        return getattr(may_read, "__wrapped__", may_read)

    def _unreadable(self, message, seq):
        """
        ``message`` waited (queued, or in flight) and its reader may no
        longer read its topic (an ACL reload, or a login with fewer
        rights): dropped, its store row with it, and counted.
        """
        self.unreadable += 1
        self._stats.messages_unreadable += 1
        if seq is not None:
            self.store.delete_delivery(self.client_id, seq)
        _unreadable_log.warn(
            "client {client_id}: dropped a message on {topic} that waited for it:"
            " it may no longer read that topic",
            client_id=printable(self.client_id),
            topic=printable(message.topic),
        )

    def _paced(self):
        self.pacer.call = None
        if self.connection is not None:
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

    def _next_message_id(self):
        mid = self._last_mid
        inflight = self.inflight
        while True:
            mid = mid % 65535 + 1
            if mid not in inflight:
                self._last_mid = mid
                return mid

    def _send(self, message, qos, retain, seq, stored, group=None):
        """``stored``: the delivery is in the store already, without its id."""
        if qos > self.max_qos:
            qos = self.max_qos
        if not qos:
            # A stored QoS 0 message, or a receiver of QoS 0 only: sent
            # once, and done with.
            self._stats.stored_messages -= 1
            if seq is not None and stored:
                self.store.delete_delivery(self.client_id, seq)
            if self.encoder is None:
                self.connection.write(message.frame(0, None, retain))
            else:
                self._write5(message, 0, None, retain, False, group)
            return
        mid = self._next_message_id()
        dup = stored and seq is not None and seq <= self._dup_through and qos == 1
        if self.encoder is None:
            frame = message.frame(qos, mid, retain, dup)
        else:
            frame = self._frame5(message, qos, mid, retain, dup, group)
            if frame is None:
                self._stats.stored_messages -= 1
                if seq is not None and stored:
                    self.store.delete_delivery(self.client_id, seq)
                return
        if self.inflight is _NO_FLIGHTS:
            self.inflight = {}
        self.inflight[mid] = flight = _InFlight(
            message, qos, retain, seq, self.clock.seconds() + self.limits.retry_interval,
            AWAITING_ACK, group,
        )
        held = message.held
        if held is not None and seq is not None:
            flight.held = held
            if not stored:
                held.pending += 1
        if seq is None:
            self.connection.write(frame)
        else:
            if stored and qos == 1:
                # At least once needs no id on disk: after a restart it goes
                # again, under a new id, marked DUP.
                self.store.sent(self.client_id, seq)
            elif stored:
                # The message id is on disk before the client can see it, so
                # a restart re-sends it under the same id: exactly once holds.
                self.store.update_delivery(self.client_id, seq, mid, AWAITING_ACK)
            else:
                self.store.add_delivery(
                    self.client_id, seq, message, qos, retain, mid, AWAITING_ACK
                )
            if qos == 1 and not self._gated:
                # At least once needs no wait: a copy that goes out before
                # its commit is, after a crash, sent again (from the store,
                # or by its publisher, whose PUBACK waits for the commit),
                # never lost.  Behind a frame that waits, it waits too, to
                # stay in order.
                self.connection.write(frame)
            else:
                self._write_after_commit(frame)
        if self._retry_call is None:
            self._schedule_retry()

    def _write_after_commit(self, frame):
        self._gated += 1
        self.store.after_commit(self._write_if_still, self.connection, frame)

    def _write_if_still(self, connection, frame):
        # A connection that left meanwhile gets it again on the next attach.
        if self.connection is connection:
            self._gated -= 1
            connection.write(frame)

    def _resend(self, mid, flight):
        if flight.state == AWAITING_ACK and flight.qos > self.max_qos:
            # The receiver takes less now: the flow starts again at its
            # maximum (a PUBREL, once sent, goes on as it was).
            if not self.max_qos:
                message = flight.message
                if self.encoder is None:
                    self.connection.write(message.frame(0, None, flight.retain))
                else:
                    self._write5(message, 0, None, flight.retain, False, flight.group)
                del self.inflight[mid]
                self._stats.stored_messages -= 1
                if flight.seq is not None:
                    self.store.delete_delivery(self.client_id, flight.seq)
                return
            flight.qos = self.max_qos
        if flight.state == AWAITING_ACK:
            message = flight.message
            may_read = self._reader()
            if may_read is not None and not may_read(message.topic):
                # Its reader's rights changed since it was sent (a PUBREL,
                # once due, goes on: it carries no payload).
                del self.inflight[mid]
                self._stats.stored_messages -= 1
                self._unreadable(message, flight.seq)
                return
            if self.encoder is None:
                frame = message.frame(flight.qos, mid, flight.retain, dup=True)
            elif flight.qos == 1 and self.expired(message):
                # Not sent again once expired (a QoS 2 flow, once begun, is
                # finished whatever [MQTT-4.3.3-7]).
                frame = None
            else:
                # None when too large: a client back with a smaller maximum.
                frame = self._frame5(message, flight.qos, mid, flight.retain, True, flight.group)
            if frame is None:
                # It leaves the window, which it would otherwise hold for ever.
                del self.inflight[mid]
                self._stats.stored_messages -= 1
                if flight.seq is not None:
                    self.store.delete_delivery(self.client_id, flight.seq)
                return
        else:
            frame = pubrel_bytes(mid)
        self.connection.write(frame)

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
        self._complete(mid, flight)

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
        self._stats.stored_messages -= 1
        if flight.held is not None:
            flight.held.delivered()
        if flight.seq is not None:
            self.store.delete_delivery(self.client_id, flight.seq)
        self.pump()

    # Restoring from the store

    def restore(self, stored):
        """Queued and in-flight deliveries as the store had them, in order."""
        now = self.clock.seconds()
        stats = self._stats
        stored_before = self.queued + len(self.inflight)
        queued_bytes_before = self.queued_bytes
        for d in stored.deliveries:
            message = Publish(d.topic, d.payload, d.qos, d.retain, properties=d.properties, expiry=d.expiry)
            # Waiting since the restart at least.
            message.queued_at = now
            self._seq = max(self._seq, d.seq)
            if d.message_id is None:
                self.queued_bytes += len(d.payload)
                if not self._queue:
                    self._queue = deque()
                self._queue.append((message, d.qos, d.retain, d.seq, None))
            else:
                if self.inflight is _NO_FLIGHTS:
                    self.inflight = {}
                self.inflight[d.message_id] = _InFlight(
                    message, d.qos, d.retain, d.seq, now, d.state
                )
                self._last_mid = d.message_id
        stats.stored_messages += self.queued + len(self.inflight) - stored_before
        stats.queued_bytes += self.queued_bytes - queued_bytes_before
        self.awaiting_pubrel = set(stored.awaiting_pubrel)
        if stored.sent_seq:
            self._dup_through = stored.sent_seq
            self._seq = max(self._seq, stored.sent_seq)

    # Inbound QoS 2, from this session's client

    def qos2_received(self, mid):
        """
        A QoS 2 PUBLISH came in: True the first time, when it is to be
        routed; False for a re-send before its PUBREL (exactly once).
        """
        if not self.awaiting_pubrel:
            self.awaiting_pubrel = set()
        elif mid in self.awaiting_pubrel:
            return False
        self.awaiting_pubrel.add(mid)
        if self.store is not None:
            self.store.add_awaiting_pubrel(self.client_id, mid)
        return True

    def qos2_released(self, mid):
        """
        PUBREL: the id is free again.  True when that was written to the
        store: until it is committed the id may not be reused, or a crash
        would leave it marked as seen and swallow the next message with it.
        """
        if mid not in self.awaiting_pubrel:
            return False
        self.awaiting_pubrel.discard(mid)
        if self.store is None:
            return False
        self.store.delete_awaiting_pubrel(self.client_id, mid)
        return True

    def forget_inbound_qos2(self):
        """The sender's session is new: its unreleased QoS 2 ids are free."""
        for mid in list(self.awaiting_pubrel):
            self.qos2_released(mid)

    # Retry of unacknowledged messages

    def _schedule_retry(self):
        if (
            not self.inflight
            or self.connection is None
            or self.limits.retry_interval <= 0
            # 5.0 re-sends only when a session resumes ([MQTT-4.4.0-1]).
            or self.encoder is not None
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

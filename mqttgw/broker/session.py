"""
Per-client session state: who it belongs to, its subscriptions, its will
and expiry, inbound QoS 2 ids awaiting PUBREL, and the parts that deliver
to its client: its Deliveries (what it holds, counted), Window (what is
in flight) and Outbox (what goes out, in order).  Knows nothing of
transports: it writes what the attached carrier's frames make of its
messages, and time comes from an injected clock.
"""

from collections import deque
from types import MappingProxyType

import attr
from zope.interface import implementer

from mqttgw.broker.deliveries import EMPTY, NO_FLIGHTS, Deliveries
from mqttgw.broker.delivery_policy import CLIENT
from mqttgw.broker.deliveryframes import PLAIN
from mqttgw.broker.interfaces import ISession
from mqttgw.broker.outbox import Outbox
from mqttgw.broker.stats import Stats
from mqttgw.broker.topics import filter_size
from mqttgw.broker.window import Window
from mqttgw.schema import default

__all__ = ["INTERNAL_PREFIX", "NEVER_EXPIRES", "Session", "SessionLimits"]

# The first character of the client id of a session the gateway keeps for
# itself (a bridge's): no MQTT client can have it (CONNECT refuses a client
# id with U+0000), and it is kept in the store with the rest of the id, so
# the session is known for what it is after a restart too.
INTERNAL_PREFIX = "\x00"

# A session expiry interval that means "never" (5.0's 0xFFFFFFFF; a 3.1.1
# session without Clean Session), but for persistent_client_expiration.
# An interval of 0 means the session ends with its connection (a 5.0
# client's 0, or 3.1.1's Clean Session), as mosquitto keeps both.
NEVER_EXPIRES = 0xFFFFFFFF

# A session's subscriptions until it has one, shared (read-only): an
# idle client that subscribes to nothing keeps no dictionary (64 bytes).
NO_SUBSCRIPTIONS = MappingProxyType({})


@attr.s(frozen=True, slots=True)
class SessionLimits:
    """Per-session bounds; see ``[limits]`` in the configuration, whose defaults they take."""

    max_inflight_messages = attr.ib(default=default("limits.max_inflight_messages"))
    max_queued_messages = attr.ib(default=default("limits.max_queued_messages"))
    max_queued_bytes = attr.ib(default=default("limits.max_queued_bytes"))
    # Whether QoS 0 messages are queued for an offline persistent session,
    # and (bridges) whether in the store, in order with QoS 1/2, rather
    # than in memory.
    queue_qos0_messages = attr.ib(default=default("mqtt.queue_qos0_messages"))
    store_qos0_messages = attr.ib(default=False)
    # When the queue is full, drop its oldest message (bridges) rather
    # than the new one.
    drop_oldest = attr.ib(default=False)
    # First retry of an unacknowledged message (s); doubles up to the maximum.
    retry_interval = attr.ib(default=default("mqtt.retry_interval"))
    retry_max_interval = attr.ib(default=default("mqtt.retry_max_interval"))
    # Topic filters a client may hold, and their UTF-8 bytes in all.
    max_subscriptions = attr.ib(default=default("limits.max_subscriptions"))
    max_subscription_bytes = attr.ib(default=default("limits.max_subscription_bytes"))


def _everything(topic):
    return True


# The parts that deliver to the client, made on first use (see _make_parts).
_PARTS = ("deliveries", "window", "outbox")


def made(session, part):
    """The session's ``part`` if it was made, else None (it is not made by asking)."""
    try:
        return _SLOTS[part].__get__(session, Session)
    except AttributeError:
        return None


def _part(part, name, empty, doc):
    """What a part of the session holds, read as the session's own (``empty`` until it is made)."""

    def read(self):
        made_part = made(self, part)
        return empty if made_part is None else getattr(made_part, name)

    return property(read, doc=doc)


@implementer(ISession)
class Session:
    """
    The broker's view of one client id.  A carrier attaches to it with
    :meth:`attach` and leaves with :meth:`detach`; a persistent session
    outlives its connections.  Routed copies go to its ``outbox``, the
    receiver's acknowledgements to its ``window`` (its own :meth:`puback`,
    :meth:`pubrec` and :meth:`pubcomp` pass them on: on the hot path, call
    the window's, one call fewer).  Its parts are made when first asked
    for (see :func:`_make_parts`): a client sent nothing holds none.
    """

    # Slots: ten thousand idle clients hold ten thousand of these.
    __slots__ = (
        "client_id", "clock", "store", "deliveries", "window", "outbox", "policy", "may_read",
        "subscriptions", "filter_bytes", "options", "will", "awaiting_pubrel", "last_seen",
        "connected_since", "budget", "internal", "expiry_interval", "_expiry_call", "_will_call",
        "pending_will", "will_delay", "owner", "connection", "frames", "limits", "_stats", "listener_kind",
    )

    def __init__(
        self, client_id, expiry_interval, clock, limits=SessionLimits(), stats=None, store=None
    ):
        self.client_id = client_id
        self.clock = clock
        # Persistent sessions keep their state in the store, if there is one.
        self.store = store if expiry_interval else None
        self.limits = limits
        self._stats = stats if stats is not None else Stats()
        # The carrier attached (an ISessionCarrier) and its frames.
        self.connection = None
        self.frames = PLAIN
        # How it delivers where a bridge differs (see delivery_policy).
        self.policy = CLIENT
        # Whether the client may read a topic (a cached ACL check), or
        # None: everything.  Asked when a message is routed, and again
        # when one that waited (queued, or in flight) goes out.
        self.may_read = None
        # A dashboard page's DeliveryBudget, asked after may_read when a
        # message is routed (not when one that waited goes out), or None.
        # Set before attach, which gives a session with one a may_read.
        self.budget = None
        # The identity that made the session (a user name; "" for an
        # anonymous client), or None: not known (the gateway's own
        # sessions, or one stored before owners were).  Another identity
        # never resumes it (see Router.owner_refusal).
        self.owner = None
        # The gateway's own session, not a client's: not listed or counted
        # as one, never expired, and its traffic is a bridge's.
        self.internal = client_id.startswith(INTERNAL_PREFIX)
        # The kind of listener of its last carrier (see ISession), for the archive's rows.
        self.listener_kind = "bridge" if self.internal else ""
        # topic filter -> granted QoS (a dict once there is one), and the
        # filters' UTF-8 bytes in all.
        self.subscriptions = NO_SUBSCRIPTIONS
        self.filter_bytes = 0
        # 5.0 subscription options, by filter, where any differs from
        # 3.1.1's (None until then).
        self.options = None
        self.will = None
        # Inbound QoS 2 message ids whose PUBREL has not arrived yet (a set
        # once there is one).
        self.awaiting_pubrel = EMPTY
        # When its last connection ended (reactor time), for expiry.
        self.last_seen = None
        self.connected_since = None
        # How long (s) it outlives its connection: 0, not at all (it ends
        # with it); NEVER_EXPIRES, for ever (but for
        # persistent_client_expiration).  Whatever a Clean Start said, which
        # only decides whether a session resumes.
        self.expiry_interval = expiry_interval
        # The session's own expiry, and its will's delay, while pending
        # (see expire_in and delay_will); the will that waits for its delay.
        self._expiry_call = None
        self._will_call = None
        self.pending_will = None
        # 5.0's will delay interval (s).
        self.will_delay = 0
        if type(self) is Session:
            self.__class__ = _PartsToMake

    def __repr__(self):
        return f"<Session {self.client_id!r}>"

    @property
    def ends_with_connection(self):
        """Whether the session ends with its connection (an expiry interval of 0)."""
        return self.expiry_interval == 0

    inflight = _part("deliveries", "inflight", NO_FLIGHTS, "Deliveries in flight, by message id.")
    queued = _part("deliveries", "queued", 0, "Messages waiting in its queues.")
    queued_bytes = _part("deliveries", "queued_bytes", 0, "Their payload bytes.")
    dropped = _part("deliveries", "dropped", 0, "Messages dropped, not delivered.")
    dropped_too_large = _part("deliveries", "dropped_too_large", 0, "Of those, too large for the receiver.")
    dropped_expired = _part("deliveries", "dropped_expired", 0, "Messages that expired waiting.")

    def oldest_waiting(self):
        """When the oldest message waiting for the receiver was queued, or None."""
        return None if made(self, "deliveries") is None else self.deliveries.oldest_waiting()

    def deliver_as(self, policy, limits=None):
        """
        A bridge's delivery policy (broker.delivery_policy.DeliveryPolicy:
        no local, retain as published, the pacer of what waited, the
        upstream's maximum QoS), and its limits if given, in place of a
        client's.
        """
        self.policy = policy
        if limits is not None:
            self.limits = limits
            if made(self, "deliveries") is not None:
                self.deliveries.limits = limits

    # Connection life

    def attach(self, connection, frames=PLAIN, receive_maximum=None):
        """
        ``connection`` (an ISessionCarrier) takes this session.
        Unacknowledged deliveries are sent again, with DUP set, in their
        original order; then the queue drains.  ``frames``: what makes the
        connection's PUBLISH frames, as its dialect gives them (see
        broker.deliveryframes); ``receive_maximum``: the client's, if it gave one.
        """
        size = self.limits.max_inflight_messages
        if receive_maximum is not None and receive_maximum < size:
            size = receive_maximum
        if self.budget is not None and self.may_read is None:
            # Routing asks the budget behind the read check only.
            self.may_read = _everything
        if self.connection is None and not self.internal:
            stats = self._stats
            stats.clients_connected += 1
            if self.expiry_interval:
                stats.clients_disconnected -= 1
        self.connection, self.frames = connection, frames
        self.listener_kind = getattr(connection, "listener_kind", self.listener_kind)
        self.connected_since = self.clock.seconds()
        if made(self, "outbox") is None and size == self.limits.max_inflight_messages:
            # Nothing waits or flies, and the window is the limits': the
            # parts come with the first message.
            return
        outbox = self.outbox
        deliveries, window = self.deliveries, self.window
        window.size = size
        outbox.attach(connection, frames)
        if self.policy.pacer is not None and deliveries.queue:
            # What waited goes at the pacer's rate now; what comes from here on
            # does not wait behind it.
            if not deliveries.paced:
                deliveries.paced = deque()
            deliveries.paced.extend(deliveries.queue)
            deliveries.queue = EMPTY
        window.resume_flights(self.connected_since)
        window.schedule_retry()
        outbox.pump()

    def detach(self):
        if self.connection is not None and not self.internal:
            stats = self._stats
            stats.clients_connected -= 1
            if self.expiry_interval:
                stats.clients_disconnected += 1
        self.connection = None
        outbox = made(self, "outbox")
        if outbox is None:
            return
        outbox.detach()
        self.window.stop_retry()
        outbox.stop_retained(not self.expiry_interval)
        self.deliveries.hand_over_shared(self)
        if not self.deliveries.limits.queue_qos0_messages:
            self.deliveries.drop_queue0()

    def puback(self, mid):
        """The receiver's PUBACK (see Window)."""
        self.window.puback(mid)

    def pubrec(self, mid, failed=False):
        """The receiver's PUBREC (see Window)."""
        self.window.pubrec(mid, failed)

    def pubcomp(self, mid):
        """The receiver's PUBCOMP (see Window)."""
        self.window.pubcomp(mid)

    def pause(self):
        """The carrier's socket is full: further messages wait in the session."""
        self.outbox.pause()

    def resume(self):
        """The carrier takes more again: what waited goes."""
        if made(self, "outbox") is not None:
            self.outbox.resume()

    def send_retained(self, walk):
        """Deliver what a walk of the retained tree yields, as the carrier takes it."""
        self.outbox.send_retained(walk)

    def release(self):
        """The session ends: what it holds is no longer counted."""
        if made(self, "deliveries") is not None:
            self.deliveries.release()

    def left(self, now):
        """Its connection ended at ``now``: detached, and its will (if
        any) handed to the caller."""
        self.detach()
        self.last_seen = now
        if self.store is not None:
            self.store.touch_session(self.client_id, now)
        will, self.will = self.will, None
        return will

    # What the session is

    def start(self, owner, expiry_interval):
        """A new session, made by ``owner``, stored if persistent."""
        self.owner = owner
        if self.store is not None:
            self.store.add_session(self.client_id, expiry_interval, owner)

    def claim(self, owner):
        """One stored without an owner: ``owner`` owns it now."""
        self.owner = owner
        if self.store is not None:
            self.store.set_session_owner(self.client_id, owner)

    def renew(self, expiry_interval, will, will_delay):
        """What a CONNECT that takes the session says of its future."""
        self.expiry_interval = expiry_interval
        self.will = will
        self.will_delay = will_delay

    def set_expiry(self, expiry_interval):
        """A new Session Expiry Interval (5.0), stored if persistent."""
        if self.store is not None:
            self.store.set_session_expiry(self.client_id, expiry_interval)
        self.expiry_interval = expiry_interval

    def forget(self):
        """It ends with its connection from now on; its rows go."""
        if self.store is not None:
            self.store.delete_session(self.client_id)
            self.store = None
            if made(self, "deliveries") is not None:
                self.deliveries.leave_store()
        self.expiry_interval = 0

    def expire_in(self, seconds, expired):
        """Its expiry: ``expired(session)`` in ``seconds``, unless
        :meth:`cancel_timers` comes first."""
        self._expiry_call = self.clock.callLater(seconds, self._expiry_due, expired)

    def _expiry_due(self, expired):
        self._expiry_call = None
        expired(self)

    def delay_will(self, will, seconds, publish):
        """Its will waits ``seconds`` (5.0's Will Delay Interval) as
        ``pending_will``, then goes as ``publish(session, will)``, unless
        :meth:`cancel_timers` comes first."""
        self.pending_will = will
        self._will_call = self.clock.callLater(seconds, self._will_due, publish)

    def _will_due(self, publish):
        will, self.pending_will, self._will_call = self.pending_will, None, None
        publish(self, will)

    def cancel_timers(self):
        """Its expiry and its will's delay stop (it is back, or it ends);
        the will that waited is no longer pending."""
        for call in (self._expiry_call, self._will_call):
            if call is not None and call.active():
                call.cancel()
        self._expiry_call = self._will_call = self.pending_will = None

    # Subscriptions

    def subscribe(self, topic_filter, qos, options=None):
        """Hold ``topic_filter`` at ``qos`` granted, with its 5.0
        SubscriptionOptions if any (the router routes it)."""
        subscriptions = self.subscriptions
        if subscriptions is NO_SUBSCRIPTIONS:
            subscriptions = self.subscriptions = {}
        if topic_filter not in subscriptions:
            self.filter_bytes += filter_size(topic_filter)
        subscriptions[topic_filter] = qos
        if options is not None and not options.plain:
            if self.options is None:
                self.options = {}
            self.options[topic_filter] = options
        elif self.options:
            self.options.pop(topic_filter, None)
        if self.store is not None:
            self.store.subscribe(
                self.client_id, topic_filter, options.stored(qos) if options is not None else qos
            )

    def unsubscribe(self, topic_filter):
        """Let ``topic_filter`` go; False when the session did not hold it."""
        subscriptions = self.subscriptions
        if topic_filter not in subscriptions:
            return False
        del subscriptions[topic_filter]
        if not subscriptions:
            self.subscriptions = NO_SUBSCRIPTIONS
        self.filter_bytes -= filter_size(topic_filter)
        if self.options:
            self.options.pop(topic_filter, None)
        if self.store is not None:
            self.store.unsubscribe(self.client_id, topic_filter)
        return True

    def end(self):
        """
        The session ends: its timers, its subscriptions (the router has
        taken them out) and its store rows go.
        """
        self.cancel_timers()
        self.subscriptions = NO_SUBSCRIPTIONS
        self.options = None
        self.filter_bytes = 0
        if self.store is not None:
            self.store.delete_session(self.client_id)

    # Restoring from the store

    def restore(self, stored, now, from_stored):
        """
        The session as the store had it: its owner, expiry, subscriptions
        (``from_stored`` reads a stored value as QoS and options) and
        deliveries in order.  Sessions stored before last_seen was recorded
        start counting ``now``.
        """
        self.last_seen = stored.last_seen if stored.last_seen is not None else now
        # Rows written before the expiry was the one notion of persistence
        # kept none for a 3.1.1 session.
        expiry = stored.expiry_interval
        self.expiry_interval = NEVER_EXPIRES if expiry is None else expiry
        self.owner = stored.owner
        if stored.subscriptions and self.subscriptions is NO_SUBSCRIPTIONS:
            self.subscriptions = {}
        for topic_filter, value in stored.subscriptions.items():
            qos, options = from_stored(topic_filter, value)
            self.subscriptions[topic_filter] = qos
            self.filter_bytes += filter_size(topic_filter)
            if options is not None and not options.plain:
                if self.options is None:
                    self.options = {}
                self.options[topic_filter] = options
        if stored.deliveries or stored.sent_seq:
            self.deliveries.restore_deliveries(stored)
        self.awaiting_pubrel = set(stored.awaiting_pubrel)

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


# The parts' own slots, read without making them.
_SLOTS = {part: vars(Session)[part] for part in _PARTS}


class _PartsToMake(Session):
    """
    A Session whose parts are not made yet (see :func:`_make_parts`).  Not
    a ``__getattr__`` on Session: a class that has one loses CPython's
    specialised slot reads for every attribute, which cost fan-out 13% and
    QoS 1 2.4% more instructions a message (bench.hotpath, callgrind).
    """

    __slots__ = ()

    deliveries = property(lambda self: _make_parts(self).deliveries)
    window = property(lambda self: _make_parts(self).window)
    outbox = property(lambda self: _make_parts(self).outbox)


def _make_parts(session):
    """
    The parts that deliver to ``session``'s client, made as the session
    stands now: the first time one of them is asked for, which a session
    whose client subscribes to nothing (and has nothing stored) never
    does.  Until then it is a _PartsToMake, whose properties of those
    names make them; then a plain Session again, whose slots are read
    the fast way, as routing reads them.
    """
    session.__class__ = Session
    clock = session.clock
    session.deliveries = deliveries = Deliveries(
        session.client_id, clock, session.limits, session._stats, session.store
    )
    session.window = window = Window(deliveries, clock)
    session.outbox = outbox = Outbox(deliveries, window, session, clock)
    window.send_through(outbox)
    if session.connection is not None:
        outbox.attach(session.connection, session.frames)
    return session

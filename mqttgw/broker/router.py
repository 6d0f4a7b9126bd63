"""
The router: one per process, shared by every listener (and later every
bridge).  It owns the sessions by client id, the subscription trie and the
retained messages, and fans each PUBLISH out to its subscribers.  It never
learns which transport a session came from.
"""

import heapq

from twisted.logger import Logger

from mqttgw.broker.access import Access
from mqttgw.broker.ratelimited import RateLimited
from mqttgw.broker.session import Session, SessionLimits
from mqttgw.broker.stats import Stats
from mqttgw.broker.store import Held
from mqttgw.broker.subscriptions import (
    SharedGroup,
    from_stored,
    is_shared,
    options_for,
    shared_filter,
)
from mqttgw.broker.topics import RetainedTree, SubscriptionTrie, filter_size
from mqttgw.wire.packets import Publish
from mqttgw.wire.printable import printable

log = Logger()

# A 5.0 session expiry interval that means "never".
NEVER_EXPIRES = 0xFFFFFFFF


def owner_name(owner):
    """A session owner as the log names it."""
    return "anonymous" if owner == "" else repr(printable(owner))


class Router:
    # Bounds of the whole broker (0: none); see [limits].
    max_persistent_sessions = 0
    max_retained_messages = 0
    # Shared subscription groups at once, and members of one group.
    max_shared_groups = 10_000
    max_shared_group_members = 1_000
    # Seconds a persistent session may go unused, or None: for ever.
    persistent_client_expiration = None
    # What a CONNECT gets whose client id's session belongs to another
    # identity (see owner_refusal): "refuse", or "new_session" (the old
    # session is discarded, never resumed).
    session_owner_mismatch = "refuse"
    # Sampling of messages for the delivery latency metric (see
    # trace_deliveries): off until something asks for it.
    trace = None
    trace_every = 0
    _until_trace = -1

    def __init__(self, clock, limits=SessionLimits(), max_qos=2, store=None):
        self.clock = clock
        self.limits = limits
        self.max_qos = max_qos
        # The durable store, or None to keep everything in memory.
        self.store = store
        # The archive (anything with published()), or None.
        self.recorder = None
        # The Sparkplug observer (broker/sparkplug.py), or None: awareness off.
        self.sparkplug = None
        self.sessions = {}
        self.subscriptions = SubscriptionTrie()
        # Shared subscriptions' groups by (share name, filter).
        self.shared = {}
        # (expiry, n, message) of retained messages that expire, soonest first.
        self._retained_expiries = []
        self._expiry_seq = 0
        self.retained = RetainedTree()
        # Who may write and read what (the ACL, reserved topics).
        self.access = Access()
        self.stats = Stats()
        self._limited = {}
        # $SYS topics with a retained value (not counted against the limit).
        self.sys_topics = set()

    def limited(self, name, logger=log):
        """The rate-limited warning ``name`` of this broker (see RateLimited)."""
        limited = self._limited.get(name)
        if limited is None:
            limited = self._limited[name] = RateLimited(logger)
        return limited

    # Sessions

    def owner_refusal(self, client_id, owner):
        """
        Why the identity ``owner`` may not connect as ``client_id``, or
        None.  An identity owns its session: another one never resumes it
        nor takes it over from its connected owner; it may only replace a
        session left unconnected, and only with ``session_owner_mismatch``
        set to "new_session".  Refusals are counted; the caller logs them.
        """
        session = self.sessions.get(client_id)
        if session is None or session.owner is None or session.owner == owner:
            return None
        if session.connection is None and self.session_owner_mismatch == "new_session":
            return None
        self.stats.session_owner_refused += 1
        # The same words whether its owner is connected or not: the
        # refused client learns nothing of the owner's presence.
        return "its session belongs to another identity"

    def connect(
        self, client_id, clean_session, will=None, expiry_interval=None, will_delay=0, owner=None
    ):
        """
        Claim the session for ``client_id``, taking it over from any
        connection that holds it (that connection is closed, and its will
        published, before this returns).  Returns ``(session,
        session_present)``; the caller sends CONNACK, then attaches.

        ``clean_session`` is 3.1.1's Clean Session, or with an
        ``expiry_interval`` (5.0) its Clean Start: then the session
        outlives the connection for that many seconds.

        ``owner``: the identity connecting (a user name, "" for anonymous;
        None for the gateway's own sessions), which :meth:`owner_refusal`
        has let through.  A session another identity owns ends here, as
        with a clean start; one without an owner (stored before owners
        were) becomes this one's.
        """
        if expiry_interval is not None:
            clean_start, clean_session = clean_session, expiry_interval == 0
        else:
            clean_start = clean_session
        session = self.sessions.get(client_id)
        if session is not None and owner is not None and session.owner != owner:
            if session.owner is None:
                if not clean_start:
                    self._claim(session, owner)
            elif session.connection is None:
                # Two identities taking turns could repeat it at any rate.
                self.limited("session owner replaced").warn(
                    "discarding the session of client {client_id} (owned by {old}):"
                    " {new} connected with its client id (auth.session_owner_mismatch)",
                    client_id=printable(client_id),
                    old=owner_name(session.owner),
                    new=owner_name(owner),
                )
                self.stats.session_owner_replaced += 1
                self._end_session(session)
                session = None
        if session is not None and session.connection is not None:
            old = session.connection
            log.info(
                "client {client_id} taken over by a new connection",
                client_id=printable(client_id),
            )
            # A persistent session resumed by its own client is a
            # reconnection, not a failure: its will is published only when
            # a clean session is involved on either side, and never when
            # it has a delay, which this new connection comes within.
            old.taken_over(
                publish_will=not session.will_delay and (clean_start or session.clean_session)
            )
            session = self.sessions.get(client_id)
        present = False
        if session is not None:
            # A new connection for the client id within its will's delay:
            # the will is not sent, whether or not this connection resumes
            # the session ([MQTT-3.1.2-8]); nor does the session expire.
            session.cancel_timers()
            if clean_start or session.clean_session:
                self._discard(session)
                session = None
            else:
                present = True
                if clean_session:
                    # Resumed by a 5.0 client that keeps it no longer.
                    self._forget(session)
                elif session.expiry_interval != expiry_interval and session.store is not None:
                    session.store.set_session_expiry(client_id, expiry_interval)
        if session is None:
            session = self._new_session(client_id, clean_session)
            session.owner = owner
            if session.store is not None:
                session.store.add_session(client_id, expiry_interval, owner)
        session.expiry_interval = expiry_interval
        session.will = will
        session.will_delay = will_delay
        return session, present

    def _claim(self, session, owner):
        """A session restored from a store without owners: its first login owns it."""
        session.owner = owner
        if session.store is not None:
            session.store.set_session_owner(session.client_id, owner)
        log.warn(
            "session of client {client_id} was stored without an owner: now owned by {owner},"
            " its first login",
            client_id=printable(session.client_id),
            owner=owner_name(owner),
        )

    def set_session_expiry(self, session, expiry_interval):
        """A 5.0 DISCONNECT changed the session's expiry interval."""
        if expiry_interval == 0 and not session.clean_session:
            self._forget(session)
        elif session.store is not None:
            session.store.set_session_expiry(session.client_id, expiry_interval)
        session.expiry_interval = expiry_interval

    def _forget(self, session):
        """A persistent session becomes one that ends with its connection."""
        if session.store is not None:
            session.store.delete_session(session.client_id)
            session.leave_store()
        session.clean_session = True
        stats = self.stats
        stats.persistent_sessions -= 1
        if not session.internal and session.connection is None:
            stats.clients_disconnected -= 1

    def may_start_session(self, client_id, clean_session):
        """
        Whether a CONNECT may go on: False when it would create one more
        persistent session than ``max_persistent_sessions`` allows.
        """
        limit = self.max_persistent_sessions
        if clean_session or not limit:
            return True
        existing = self.sessions.get(client_id)
        if existing is not None and not existing.clean_session:
            return True
        if self.stats.persistent_sessions < limit:
            return True
        self.stats.sessions_refused += 1
        return False

    def expire_sessions(self):
        """
        Remove persistent sessions whose client has been away longer than
        ``persistent_client_expiration``, their queues with them (bridges'
        own sessions never expire).  Returns how many went.
        """
        expiration = self.persistent_client_expiration
        if expiration is None:
            return 0
        cutoff = self.clock.seconds() - expiration
        expired = [
            s
            for s in self.sessions.values()
            if s.connection is None
            and not s.clean_session
            and not s.internal
            and s.last_seen is not None
            and s.last_seen < cutoff
            and s.expiry_interval in (None, NEVER_EXPIRES)
        ]
        for session in expired:
            log.info(
                "expiring persistent session of client {client_id}: away {away:.0f}s",
                client_id=printable(session.client_id),
                away=self.clock.seconds() - session.last_seen,
            )
            self._end_session(session)
        self.stats.clients_expired += len(expired)
        return len(expired)

    def _expired(self, session):
        """A 5.0 session's expiry interval ran out."""
        session.expiry_call = None
        if self.sessions.get(session.client_id) is not session or session.connection is not None:
            return
        log.info(
            "session of client {client_id} expired ({interval}s)",
            client_id=printable(session.client_id),
            interval=session.expiry_interval,
        )
        self.stats.clients_expired += 1
        self._end_session(session)

    def _end_session(self, session):
        """The session ends: a will still waiting for its delay goes now."""
        will = None
        if session.will_call is not None:
            will = session.will_call.args[1]
        session.cancel_timers()
        self._discard(session)
        if will is not None:
            self._publish_will(session, will)

    def delete_session(self, client_id):
        """The admin API's delete: a session not in use, and its store rows."""
        session = self.sessions.get(client_id)
        if session is None or session.connection is not None:
            return False
        self._discard(session)
        return True

    def disconnect(self, session, publish_will):
        """The connection holding ``session`` ended."""
        session.detach()
        session.last_seen = self.clock.seconds()
        if session.store is not None:
            session.store.touch_session(session.client_id, session.last_seen)
        will, session.will = session.will, None
        if session.clean_session:
            self._discard(session)
        elif session.expiry_interval not in (None, NEVER_EXPIRES):
            session.expiry_call = self.clock.callLater(
                session.expiry_interval, self._expired, session
            )
        if publish_will and will is not None:
            if session.will_delay and not session.clean_session:
                # Sent when the delay ends, or the session does if sooner.
                session.will_call = self.clock.callLater(
                    session.will_delay, self._publish_will, session, will
                )
            else:
                self._publish_will(session, will)

    def _publish_will(self, session, will):
        session.will_call = None
        log.info(
            "publishing will of {client_id} on {topic}",
            client_id=printable(session.client_id),
            topic=printable(will.topic),
        )
        if will.properties and "message_expiry_interval" in will.properties:
            will.expiry = self.clock.seconds() + will.properties["message_expiry_interval"]
        self.publish(will, sender=session)

    def _new_session(self, client_id, clean_session):
        session = Session(
            client_id, clean_session, self.clock, self.limits, self.stats, self.store
        )
        self.sessions[client_id] = session
        if not clean_session:
            stats = self.stats
            stats.persistent_sessions += 1
            if not session.internal:
                stats.clients_disconnected += 1
        return session

    def _discard(self, session):
        session.cancel_timers()
        for topic_filter in session.subscriptions:
            self._unroute(session, topic_filter)
        session.subscriptions.clear()
        session.options = None
        session.filter_bytes = 0
        if session.store is not None:
            session.store.delete_session(session.client_id)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            # What it held goes with it (a clean session's queue, say).
            stats = self.stats
            stats.stored_messages -= session.queued + len(session.inflight)
            stats.queued_bytes -= session.queued_bytes
            if not session.clean_session:
                stats.persistent_sessions -= 1
                if not session.internal and session.connection is None:
                    stats.clients_disconnected -= 1

    def restore(self, retained, sessions):
        """Retained messages and persistent sessions loaded from the store."""
        for topic, payload, qos, properties, expiry in retained:
            self.retained.set(
                topic, Publish(topic, payload, qos, True, properties=properties, expiry=expiry)
            )
            if expiry is not None:
                self._expiring(self.retained.get(topic))
        now = self.clock.seconds()
        for stored in sessions:
            session = self._new_session(stored.client_id, False)
            # Sessions stored before last_seen was recorded start counting now.
            session.last_seen = stored.last_seen if stored.last_seen is not None else now
            session.expiry_interval = stored.expiry_interval
            session.owner = stored.owner
            for topic_filter, value in stored.subscriptions.items():
                qos, options = from_stored(topic_filter, value)
                session.subscriptions[topic_filter] = qos
                session.filter_bytes += filter_size(topic_filter)
                if options is not None and not options.plain:
                    if session.options is None:
                        session.options = {}
                    session.options[topic_filter] = options
                self._route(session, topic_filter, qos)
            session.restore(stored)
            if stored.expiry_interval not in (None, NEVER_EXPIRES):
                left = session.last_seen + stored.expiry_interval - now
                session.expiry_call = self.clock.callLater(max(0.0, left), self._expired, session)

    # Publish

    def trace_deliveries(self, trace, every):
        """
        From the next message on, route one message in ``every`` as
        ``trace(message)`` returns it: a copy whose deliveries are timed.
        """
        self.trace = trace
        self.trace_every = every
        self._until_trace = 1

    def may_be_durable(self, message):
        """
        Whether routing ``message`` may write it to the store: only then
        must its publisher's acknowledgement wait, and so come after the
        routed copies.
        """
        if self.store is None:
            return False
        if message.retain:
            return True
        for session, granted in self.subscriptions.match(message.topic):
            if session.store is not None and granted:
                return True
        return False

    def publish(self, message, sender=None):
        """
        Route an application message (a Publish) to every subscriber;
        ``sender`` is the session it came from, for bridges.
        Returns True when it was written to the store (retained, or queued
        for a persistent session): its publisher is acknowledged only once
        that is committed.
        """
        # Without metrics the countdown never reaches zero.
        self._until_trace -= 1
        if not self._until_trace:
            self._until_trace = self.trace_every
            message = self.trace(message)
        if self.sparkplug is not None and message.topic.startswith("spBv1.0/"):
            message = self.sparkplug.published(message)
        durable = False
        retain = message.retain
        if retain:
            durable = self._retain(message)
            if durable and message.held is not None:
                message.held.blocked = True
        subscribers = self.subscriptions.match(message.topic)
        if self.recorder is not None:
            self.recorder.published(message, sender, subscribers)
        qos = message.qos
        topic = message.topic
        for session, granted in subscribers:
            # A bridge is not sent back what it brought in: that would loop.
            if session is sender and session.no_local:
                continue
            may_read = session.may_read
            if may_read is not None and not may_read(topic):
                continue
            if session.options:
                # 5.0 subscription options: no local, retain as published.
                granted, keep_retain = options_for(
                    session, topic, granted, session is sender, retain
                )
                if granted < 0:
                    continue
                keep_retain = retain and (keep_retain or session.retain_as_published)
            else:
                keep_retain = retain and session.retain_as_published
            if session.deliver(message, qos if qos < granted else granted, keep_retain):
                durable = True
        stats = self.stats
        stats.messages_delivered += len(subscribers)
        stats.publish_bytes_sent += len(message.payload) * len(subscribers)
        return durable

    def publish_held(self, message, sender=None):
        """
        :meth:`publish` for a message whose publisher waits for its ack:
        the store.Held that ack waits on when a copy was written to the
        store (it may go once every such copy is acknowledged, or at the
        commit), else None.
        """
        if self.store is None:
            self.publish(message, sender)
            return None
        message.held = held = Held()
        return held if self.publish(message, sender) else None

    def publish_sys(self, message):
        """
        A $SYS update: kept as the topic's retained value in memory only
        (the store is for clients' data) and sent to its subscribers.
        """
        self.retained.set(message.topic, message)
        self.sys_topics.add(message.topic)
        for session, granted in self.subscriptions.match(message.topic):
            session.deliver(message, 0)

    def _retain(self, message):
        store = self.store
        if message.payload:
            limit = self.max_retained_messages
            if (
                limit
                and len(self.retained) - len(self.sys_topics) >= limit
                and self.retained.get(message.topic) is None
            ):
                self.stats.retained_refused += 1
                self.limited("retained").warn(
                    "not retaining {topic}: max_retained_messages ({limit}) reached",
                    topic=printable(message.topic),
                    limit=limit,
                )
                return False
            self.retained.set(message.topic, message)
            if message.expiry is not None:
                self._expiring(message)
            if store is not None:
                store.set_retained(message)
        else:
            # A zero-length retained publish clears the topic's value.
            self.retained.delete(message.topic)
            if store is not None:
                store.delete_retained(message.topic)
        return store is not None

    # Subscriptions

    def subscribe(self, session, requests):
        """
        Add ``[(valid topic filter, requested QoS)]`` to ``session``, each
        perhaps with its 5.0 :class:`SubscriptionOptions` as a third item;
        returns the granted QoS for each.
        """
        granted = []
        for request in requests:
            topic_filter, qos = request[0], request[1]
            options = request[2] if len(request) > 2 else None
            qos = min(qos, self.max_qos)
            if topic_filter not in session.subscriptions:
                session.filter_bytes += filter_size(topic_filter)
            session.subscriptions[topic_filter] = qos
            if options is not None and not options.plain:
                if session.options is None:
                    session.options = {}
                session.options[topic_filter] = options
            elif session.options:
                session.options.pop(topic_filter, None)
            self._route(session, topic_filter, qos)
            if session.store is not None:
                session.store.subscribe(
                    session.client_id,
                    topic_filter,
                    options.stored(qos) if options is not None else qos,
                )
            granted.append(qos)
        return granted

    def shared_refusal(self, topic_filter, new_groups=0):
        """
        Why a subscription to the shared ``topic_filter`` would pass a
        bound, or None; ``new_groups``: groups the same SUBSCRIBE makes
        before it.
        """
        group = self.shared.get(shared_filter(topic_filter))
        if group is None:
            if len(self.shared) + new_groups >= self.max_shared_groups:
                return f"max_shared_groups ({self.max_shared_groups}) reached"
        elif len(group.members) >= self.max_shared_group_members:
            return f"max_shared_group_members ({self.max_shared_group_members}) reached"
        return None

    def _route(self, session, topic_filter, qos):
        """Put one of ``session``'s filters in the trie (or in its group)."""
        if is_shared(topic_filter):
            name, inner = shared_filter(topic_filter)
            group = self.shared.get((name, inner))
            if group is None:
                group = self.shared[(name, inner)] = SharedGroup(name, inner, self.store)
                self.subscriptions.add(inner, group, 2)
            group.add(session, qos)
        else:
            self.subscriptions.add(topic_filter, session, qos)

    def _unroute(self, session, topic_filter):
        if is_shared(topic_filter):
            key = shared_filter(topic_filter)
            group = self.shared.get(key)
            if group is not None:
                group.remove(session)
                if not group.members:
                    del self.shared[key]
                    self.subscriptions.remove(key[1], group)
        else:
            self.subscriptions.remove(topic_filter, session)

    def send_retained(self, session, topic_filters):
        """
        After SUBACK: the retained messages matching the new filters, each
        topic once at the highest QoS granted for it.  The session draws
        them from the tree as its connection takes them.
        """
        granted = session.subscriptions
        # A shared subscription is sent no retained messages (as mosquitto);
        # a filter named many times is walked once.
        filters = {f: granted[f] for f in topic_filters if f in granted and not is_shared(f)}
        if filters and len(self.retained):
            session.send_retained(self._unexpired(self.retained.walk(filters.items())))

    def _unexpired(self, walk):
        """A walk of the retained tree without expired messages (removed)."""
        for item in walk:
            if item is not None:
                message = item[0]
                if message.expiry is not None and message.expiry <= self.clock.seconds():
                    self._drop_retained(message)
                    continue
            yield item

    def _drop_retained(self, message):
        if self.retained.get(message.topic) is message:
            self.retained.delete(message.topic)
            self.stats.messages_expired += 1
            if self.store is not None:
                self.store.delete_retained(message.topic)

    def _expiring(self, message):
        """A retained message with a 5.0 expiry, for expire_retained."""
        heap = self._retained_expiries
        self._expiry_seq += 1
        heapq.heappush(heap, (message.expiry, self._expiry_seq, message))
        if len(heap) > 2 * len(self.retained) + 1024:
            # Entries of messages since replaced wait for their own expiry;
            # past this many, the heap is made again from what is retained.
            heap[:] = [e for e in heap if self.retained.get(e[2].topic) is e[2]]
            heapq.heapify(heap)

    def expire_retained(self):
        """Remove retained messages whose expiry interval has ended."""
        heap = self._retained_expiries
        now = self.clock.seconds()
        expired = 0
        while heap and heap[0][0] <= now:
            message = heapq.heappop(heap)[2]
            if self.retained.get(message.topic) is message:
                self._drop_retained(message)
                expired += 1
        return expired

    def stop_routing(self, session):
        """Take ``session``'s filters out of the trie: nothing is routed to it."""
        for topic_filter in session.subscriptions:
            self._unroute(session, topic_filter)

    def resume_routing(self, session):
        """
        Put ``session``'s filters back while the session lives, connected
        or not (a persistent one queues while away).
        """
        if self.sessions.get(session.client_id) is not session:
            return
        for topic_filter, qos in session.subscriptions.items():
            self._route(session, topic_filter, qos)

    def unsubscribe(self, session, topic_filters):
        for topic_filter in topic_filters:
            if session.subscriptions.pop(topic_filter, None) is not None:
                session.filter_bytes -= filter_size(topic_filter)
                if session.options:
                    session.options.pop(topic_filter, None)
                self._unroute(session, topic_filter)
                if session.store is not None:
                    session.store.unsubscribe(session.client_id, topic_filter)

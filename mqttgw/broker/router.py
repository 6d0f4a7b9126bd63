"""
The router: one per process, shared by every listener and every bridge.
It holds the sessions by client id (a SessionTable), the subscription
trie and the retained messages, and fans each PUBLISH out to its
subscribers.  It never learns which transport a session came from.
"""

import heapq

from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.access import Access
from mqttgw.broker.interfaces import IRouter
from mqttgw.broker.logsummary import RateLimited
from mqttgw.broker.session import SessionLimits
from mqttgw.broker.sessions import SessionTable
from mqttgw.broker.stats import Stats
from mqttgw.broker.acks import Held
from mqttgw.broker.subscriptions import (
    SharedGroup,
    from_stored,
    is_shared,
    options_for,
    shared_filter,
)
from mqttgw.broker.topics import RetainedTree, SubscriptionTrie
from mqttgw.schema import default
from mqttgw.wire.packets import Publish
from mqttgw.wire.printable import printable

log = Logger()


def _table_setting(name, doc):
    """A setting of the session table, read and set through the router."""
    return property(
        lambda self: getattr(self.sessions, name), lambda self, value: setattr(self.sessions, name, value),
        doc=doc,
    )


@implementer(IRouter)
class Router:
    # The session table's settings (see SessionTable).
    limits = _table_setting("limits", "The limits a new session is given.")
    max_persistent_sessions = _table_setting("max_persistent_sessions", "See [limits].")
    persistent_client_expiration = _table_setting(
        "persistent_client_expiration", "Seconds a persistent session may go unused, or None: for ever."
    )
    session_owner_mismatch = _table_setting("session_owner_mismatch", "See [auth].")
    # Bounds of the whole broker (0: none); see [limits].
    max_retained_messages = default("limits.max_retained_messages")
    # Shared subscription groups at once, and members of one group.
    max_shared_groups = default("limits.max_shared_groups")
    max_shared_group_members = default("limits.max_shared_group_members")
    # Sampling of messages for the delivery latency metric (see
    # trace_deliveries): off until something asks for it.
    trace = None
    trace_every = 0
    _until_trace = -1
    # Distributed traces (broker.traces.MessageTraces), or None: off.
    tracer = None

    def __init__(self, clock, limits=SessionLimits(), max_qos=default("mqtt.max_qos"), store=None):
        self.clock = clock
        self.max_qos = max_qos
        # The durable store, or None to keep everything in memory.
        self.store = store
        # The archive (anything with published()), or None.
        self.recorder = None
        # The Sparkplug observer (broker/sparkplug.py), or None: awareness off.
        self.sparkplug = None
        self.stats = Stats()
        self._limited = {}
        self.sessions = SessionTable(
            clock, limits, self.stats, store, self._unroute, self.publish, self.limited
        )
        self.subscriptions = SubscriptionTrie()
        # Shared subscriptions' groups by (share name, filter).
        self.shared = {}
        # (expiry, n, message) of retained messages that expire, soonest first.
        self._retained_expiries = []
        self._expiry_seq = 0
        self.retained = RetainedTree()
        # Who may write and read what (the ACL, reserved topics).
        self.access = Access()
        # $SYS topics with a retained value (not counted against the limit).
        self.sys_topics = set()

    def limited(self, name, logger=log):
        """The rate-limited warning ``name`` of this broker (see RateLimited)."""
        limited = self._limited.get(name)
        if limited is None:
            limited = self._limited[name] = RateLimited(logger)
        return limited

    def restore(self, retained, sessions):
        """Retained messages and persistent sessions loaded from the store."""
        for topic, payload, qos, properties, expiry in retained:
            self.retained.set(
                topic, Publish(topic, payload, qos, True, properties=properties, expiry=expiry)
            )
            if expiry is not None:
                self._expiring(self.retained.get(topic))
        for session in self.sessions.restore(sessions, from_stored):
            for topic_filter, qos in session.subscriptions.items():
                self._route(session, topic_filter, qos)

    # Sessions: the table's, as connections and bridges ask for them

    def owner_refusal(self, client_id, owner):
        """Why ``owner`` may not connect as ``client_id``, or None (see SessionTable)."""
        return self.sessions.owner_refusal(client_id, owner)

    def resumes_session(self, client_id, clean_start, owner):
        """Whether a CONNECT would resume a persistent session ``owner`` owns."""
        return self.sessions.resumes_session(client_id, clean_start, owner)

    def may_start_session(self, client_id, ends_with_connection=False):
        """Whether a CONNECT may go on within max_persistent_sessions."""
        return self.sessions.may_start_session(client_id, ends_with_connection)

    def connect(self, client_id, clean_start, will=None, expiry_interval=0, will_delay=0, owner=None):
        """The session for a CONNECT, and whether it was present (see SessionTable.connect)."""
        return self.sessions.connect(client_id, clean_start, will, expiry_interval, will_delay, owner)

    def set_session_expiry(self, session, expiry_interval):
        """A 5.0 DISCONNECT changed the session's expiry interval."""
        self.sessions.set_session_expiry(session, expiry_interval)

    def disconnect(self, session, publish_will):
        """The connection holding ``session`` ended."""
        self.sessions.disconnect(session, publish_will)

    def delete_session(self, client_id):
        """The admin API's delete: a session not in use, and its store rows."""
        return self.sessions.delete_session(client_id)

    def expire_sessions(self):
        """Persistent sessions away past persistent_client_expiration end; how many."""
        return self.sessions.expire_sessions()

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

    def publish(self, message, sender=None, held=None):
        """
        Route an application message (a Publish) to every subscriber;
        ``sender`` is the session it came from, for bridges; ``held``, the
        acknowledgement its publisher holds back (see publish_held).
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
        if self.tracer is not None:
            message = self.tracer.publish(message, sender)
        durable = False
        retain = message.retain
        if retain:
            durable = self._retain(message)
            if durable and held is not None:
                held.blocked = True
        subscribers = self.subscriptions.match(message.topic)
        if self.recorder is not None:
            self.recorder.published(message, sender, subscribers)
        qos = message.qos
        topic = message.topic
        for session, granted in subscribers:
            # A bridge is not sent back what it brought in: that would loop.
            if session is sender and session.policy.no_local:
                continue
            may_read = session.may_read
            if may_read is not None:
                if not may_read(topic):
                    continue
                # A session with a budget has a read check (see
                # Session.attach): others pay nothing for it.
                budget = session.budget
                if budget is not None and not budget():
                    continue
            if session.options:
                # 5.0 subscription options: no local, retain as published.
                granted, keep_retain = options_for(
                    session, topic, granted, session is sender, retain
                )
                if granted < 0:
                    continue
                keep_retain = retain and (keep_retain or session.policy.retain_as_published)
            else:
                keep_retain = retain and session.policy.retain_as_published
            if session.outbox.deliver(message, qos if qos < granted else granted, keep_retain, held):
                durable = True
        stats = self.stats
        stats.messages_delivered += len(subscribers)
        stats.publish_bytes_sent += len(message.payload) * len(subscribers)
        return durable

    def publish_held(self, message, sender=None):
        """
        :meth:`publish` for a message whose publisher waits for its ack:
        the acks.Held that ack waits on when a copy was written to the
        store (it may go once every such copy is acknowledged, or at the
        commit), else None.
        """
        if self.store is None:
            self.publish(message, sender)
            return None
        held = Held()
        return held if self.publish(message, sender, held) else None

    def publish_sys(self, message):
        """
        A $SYS update: kept as the topic's retained value in memory only
        (the store is for clients' data) and sent to its subscribers.
        """
        self.retained.set(message.topic, message)
        self.sys_topics.add(message.topic)
        for session, granted in self.subscriptions.match(message.topic):
            session.outbox.deliver(message, 0)

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
            session.subscribe(topic_filter, qos, options)
            self._route(session, topic_filter, qos)
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
            if session.unsubscribe(topic_filter):
                self._unroute(session, topic_filter)

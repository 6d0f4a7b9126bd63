"""
What a subscription is beyond its filter and QoS: MQTT 5.0's subscription
options and identifier, and shared subscriptions (``$share/GROUP/FILTER``),
whose group is one subscriber in the trie that hands each message to one
of its members.
"""

import attr
from zope.interface import implementer

from mqttgw.broker.delivery_policy import CLIENT
from mqttgw.broker.interfaces import IOutbox, ISubscriber
from mqttgw.broker.topics import InvalidTopic, matches, validate_topic_filter

SHARE_PREFIX = "$share/"

# Retain handling (SUBSCRIBE options bits 4-5).
SEND_RETAINED, SEND_RETAINED_IF_NEW, NO_RETAINED = 0, 1, 2


@attr.s(frozen=True, slots=True)
class SubscriptionOptions:
    """
    A 5.0 subscription's options, kept for a filter only when one differs
    from 3.1.1's behaviour.  ``topic_filter`` is what topics are matched
    against (without a ``$share/GROUP/`` prefix).
    """

    topic_filter = attr.ib()
    no_local = attr.ib(default=False)
    retain_as_published = attr.ib(default=False)
    retain_handling = attr.ib(default=SEND_RETAINED)
    identifier = attr.ib(default=None)

    @property
    def plain(self):
        """Whether these options change nothing of 3.1.1's delivery."""
        return not (self.no_local or self.retain_as_published or self.identifier)

    def stored(self, qos):
        """One integer for the store's QoS column: QoS and options below
        bit 8, the identifier above (a 3.1.1 subscription is its QoS)."""
        flags = qos | (4 if self.no_local else 0) | (8 if self.retain_as_published else 0)
        return flags | (self.retain_handling << 4) | ((self.identifier or 0) << 8)


def from_stored(topic_filter, value):
    """``(qos, options or None)`` from the store's QoS column."""
    qos = value & 3
    if value < 4:
        return qos, None
    options = SubscriptionOptions(
        shared_filter(topic_filter)[1] if topic_filter.startswith(SHARE_PREFIX) else topic_filter,
        bool(value & 4),
        bool(value & 8),
        (value >> 4) & 3,
        (value >> 8) or None,
    )
    return qos, options


def shared_filter(topic_filter):
    """
    ``(group, filter)`` of a ``$share/GROUP/FILTER``; raises InvalidTopic
    for a malformed one ([MQTT-4.8.2-1], [MQTT-4.8.2-2]).
    """
    rest = topic_filter[len(SHARE_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not sep or not group:
        raise InvalidTopic(f"shared subscription {topic_filter!r} needs $share/GROUP/FILTER")
    if "+" in group or "#" in group:
        raise InvalidTopic(f"share name {group!r} contains a wildcard")
    validate_topic_filter(inner)
    return group, inner


def is_shared(topic_filter):
    return topic_filter.startswith(SHARE_PREFIX)


@implementer(ISubscriber, IOutbox)
class SharedGroup:
    """
    The members of one shared subscription, standing in the trie as one
    subscriber.  Each message goes to one member, round robin among those
    connected (or, with none connected, to a persistent member's queue):
    routed copies come to the group itself (its own ``outbox``), which
    hands each to one member's.
    """

    # Read by the router as of any subscriber.
    policy = CLIENT
    may_read = None
    budget = None
    options = None
    internal = False

    def __init__(self, name, topic_filter, store):
        self.outbox = self
        self.name = name
        self.topic_filter = topic_filter
        # The filter its members subscribed with.
        self.shared_filter = f"{SHARE_PREFIX}{name}/{topic_filter}"
        # Set while a member is persistent: a routed message may be stored.
        self.store = None
        self._store = store
        # member session -> granted QoS, in the order they joined; the
        # same sessions as a list, for the round robin.
        self.members = {}
        self._order = []
        self._turn = 0

    def __repr__(self):
        return f"<SharedGroup {self.name!r} {self.topic_filter!r}>"

    @property
    def key(self):
        return (self.name, self.topic_filter)

    def add(self, session, qos):
        if session not in self.members:
            self._order.append(session)
        self.members[session] = qos
        self._members_changed()

    def remove(self, session):
        if self.members.pop(session, None) is not None:
            self._order.remove(session)
        self._members_changed()

    def _members_changed(self):
        persistent = any(s.store is not None for s in self._order)
        self.store = self._store if persistent else None

    def pick(self, topic, exclude=None):
        """
        The member the next message goes to, or None: the next connected
        one that may read ``topic``, in turn; the first that may, of
        those looked at, is usually it.
        """
        members = self._order
        n = len(members)
        fallback = None
        for i in range(n):
            session = members[(self._turn + i) % n]
            if session is exclude:
                continue
            may_read = session.may_read
            if may_read is not None:
                if not may_read(topic):
                    continue
                budget = session.budget
                if budget is not None and not budget():
                    continue
            if session.connection is not None:
                self._turn = (self._turn + i + 1) % n
                return session
            if fallback is None and session.store is not None:
                fallback = session
        return fallback

    def deliver(self, message, qos, retain=False, held=None):
        member = self.pick(message.topic)
        if member is None:
            return False
        granted = self.members[member]
        return member.outbox.deliver(message, qos if qos < granted else granted, False, held, self)

    def redeliver(self, message, qos, leaving, held=None):
        """
        A message the member ``leaving`` will not acknowledge: to another
        (True), or, expired, to none (True too: it is done with).  ``held``:
        its publisher's acknowledgement that waits for it, if any.
        """
        if leaving.deliveries.expired(message):
            return True
        member = self.pick(message.topic, exclude=leaving)
        if member is None or member.connection is None:
            return False
        granted = self.members[member]
        member.outbox.deliver(message, qos if qos < granted else granted, False, held, self)
        return True


def options_for(session, topic, granted, own, retain):
    """
    The QoS and retain flag a message on ``topic`` goes to ``session``
    with, under its 5.0 subscription options; a QoS of -1 when no
    subscription that matches lets it have the message (no local, and
    ``own``: it published the message).
    """
    options = session.options
    keep_retain = False
    if retain:
        for f, o in options.items():
            if o.retain_as_published and not is_shared(f) and matches(o.topic_filter, topic):
                keep_retain = True
                break
    if own and any(o.no_local for o in options.values()):
        best = -1
        for f, qos in session.subscriptions.items():
            if is_shared(f) or not matches(f, topic):
                continue
            o = options.get(f)
            if o is not None and o.no_local:
                continue
            if qos > best:
                best = qos
        return best, keep_retain
    return granted, keep_retain


def subscription_ids(session, topic, group=None):
    """
    The identifiers of ``session``'s subscriptions that match ``topic``:
    its own, or those of the shared subscription ``group`` it came by.
    """
    ids = []
    for f, o in session.options.items():
        if not o.identifier:
            continue
        if group is None:
            if not is_shared(f) and matches(f, topic):
                ids.append(o.identifier)
        elif f == group.shared_filter:
            ids.append(o.identifier)
    return ids

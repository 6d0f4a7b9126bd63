"""
What a client may touch, as the broker asks it: the rules in force (an ACL
from the security layer, or none), the topics only the gateway writes, and
per-session caches of the answers.  A reload bumps a generation number, so
the caches of :class:`CachedCheck` notice without anyone walking the
sessions.
"""

from mqttgw.broker.topics import filters_intersect, matches
from mqttgw.wire.sparkplug.topics import source_topic

READ, WRITE, DENY = 1, 2, 4


# Topics only the gateway itself writes: $SYS, the Sparkplug births it
# keeps ($sparkplug/certificates/...), and the state of every bridge,
# whether or not a bridge of that name is configured now (a retained
# spoof would otherwise outlive the bridge it names, or wait for one to
# be added).
BRIDGE_STATE_PREFIX = "mqttgw/bridge/"
RESERVED_PREFIXES = ("$SYS/", "$sparkplug/", BRIDGE_STATE_PREFIX)
ANALYTICS_PREFIX = "$analytics/"


def notification_topic(client_id):
    """
    Where a bridge connected as ``client_id`` says whether it is connected,
    on the broker it connects to (mosquitto's default notification topic).
    A client may write its own, and only its own.
    """
    return f"$SYS/broker/connection/{client_id}/state"


class Access:
    """
    The rules in force for every connection: the ACL (or None: everything
    allowed), the reserved topics (``RESERVED_PREFIXES``, and state topics
    bridges are configured with outside them), and who may write
    ``$analytics/...``.
    """

    def __init__(self, acl=None, analytics_writers=()):
        self.acl = acl
        self.analytics_writers = frozenset(analytics_writers)
        self.reserved_topics = set()
        self.generation = 0

    def replace(self, acl):
        """A reloaded ACL: cached answers are dropped from the next check on."""
        self.acl = acl
        self.generation += 1

    def may_publish(self, username, client_id, topic, limit=None):
        """``limit``: the filters a token allows, or None."""
        if topic.startswith(RESERVED_PREFIXES) or topic == "$SYS" or topic in self.reserved_topics:
            # Only a client's own connection state: it tells of no one else.
            return topic == notification_topic(client_id)
        if limit is not None and not any(matches(f, topic) for f in limit):
            return False
        if topic.startswith(ANALYTICS_PREFIX) and username not in self.analytics_writers:
            return False
        acl = self.acl
        return acl is None or acl.allows(username, client_id, topic, WRITE)

    def may_subscribe(self, username, client_id, topic_filter, limit=None):
        """``limit``: the filters a token allows, or None."""
        # A Sparkplug certificate may be read by whoever may read its birth.
        topic_filter = source_topic(topic_filter) or topic_filter
        if limit is not None and not any(filters_intersect(f, topic_filter) for f in limit):
            return False
        acl = self.acl
        return acl is None or acl.may_subscribe(username, client_id, topic_filter)

    def checker(self, username, client_id, kind, limit=None):
        """
        A cached check of one client's right to ``kind`` (READ or WRITE)
        topics, within ``limit`` (a token's topic filters) if given; for
        reading with neither an ACL nor a limit, None: everything.
        """
        if self.acl is None and limit is None:
            if kind == READ:
                return None
            # Only the reserved topics to check: cheaper than a cache.
            return lambda topic: self.may_publish(username, client_id, topic)
        return CachedCheck(self, username, client_id, kind, limit)

    def _allows(self, username, client_id, topic, kind, limit):
        if kind == WRITE:
            return self.may_publish(username, client_id, topic, limit)
        topic = source_topic(topic) or topic
        if limit is not None and not any(matches(f, topic) for f in limit):
            return False
        acl = self.acl
        return acl is None or acl.allows(username, client_id, topic, READ)


class CachedCheck:
    """
    Whether one client may read (or write) a topic, answered from a small
    cache of its own: the hot path is one dict lookup.  A reload (a new
    generation) empties it.
    """

    __slots__ = ("access", "username", "client_id", "kind", "limit", "cache", "cached", "generation")
    # Characters of topic names kept per cache: one client's distinct
    # topics, however long, cannot grow it further.
    CACHE_CHARS = 64 * 1024

    def __init__(self, access, username, client_id, kind, limit=None):
        self.access = access
        self.username = username
        self.client_id = client_id
        self.kind = kind
        self.limit = limit
        self.cache = {}
        self.cached = 0
        self.generation = access.generation

    def __call__(self, topic):
        cache = self.cache
        allowed = cache.get(topic)
        if allowed is not None and self.generation == self.access.generation:
            return allowed
        access = self.access
        if self.generation != access.generation:
            cache.clear()
            self.cached = 0
            self.generation = access.generation
        allowed = access._allows(self.username, self.client_id, topic, self.kind, self.limit)
        size = len(topic)
        if size * 16 <= self.CACHE_CHARS:
            if self.cached + size > self.CACHE_CHARS:
                cache.clear()
                self.cached = 0
            cache[topic] = allowed
            self.cached += size
        return allowed

"""
What a client may touch: an access control list in mosquitto's
``acl_file`` format, and the reserved topics no client may write.  A
parsed :class:`ACL` is immutable; :class:`Access` holds the one in force
and a generation number that a reload bumps, so the per-session caches of
:class:`CachedCheck` notice without anyone walking the sessions.
"""

import attr

from mqttgw.auth import AuthConfigError, read_lines
from mqttgw.topics import InvalidTopic, matches, validate_topic_filter

READ, WRITE, DENY = 1, 2, 4
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}


def filters_intersect(a, b):
    """Whether some topic name matches both filters ``a`` and ``b``."""
    if a[:1] == "$" or b[:1] == "$":
        # A leading wildcard never matches a "$" topic.
        if a[:1] in ("+", "#") or b[:1] in ("+", "#"):
            return False
    return _intersect(a.split("/"), b.split("/"))


def _intersect(a, b):
    i = 0
    while True:
        if i < len(a) and a[i] == "#" or i < len(b) and b[i] == "#":
            return True
        if i == len(a) or i == len(b):
            return i == len(a) == len(b)
        if a[i] != b[i] and a[i] != "+" and b[i] != "+":
            return False
        i += 1


@attr.s(frozen=True, slots=True)
class Rule:
    access = attr.ib()
    topic = attr.ib()
    # A pattern line: %u and %c stand for the user name and client id.
    pattern = attr.ib(default=False)

    def filter_for(self, username, client_id):
        """The rule's topic filter for this client, or None if it cannot apply."""
        if not self.pattern:
            return self.topic
        topic = self.topic
        if "%u" in topic:
            # A name holding wildcards or "/" would widen the rule.
            if username is None or any(c in username for c in "+#/"):
                return None
            topic = topic.replace("%u", username)
        if "%c" in topic:
            if any(c in client_id for c in "+#/"):
                return None
            topic = topic.replace("%c", client_id)
        return topic


@attr.s(frozen=True, slots=True)
class ACL:
    """
    mosquitto's rules: ``topic`` lines before the first ``user`` line are for
    anonymous clients, those after a ``user`` line for that user, and
    ``pattern`` lines for every client.  Access is granted by a matching
    ``read``, ``write`` or ``readwrite`` rule, and a matching ``deny`` rule
    takes it away whatever else grants it.
    """

    anonymous = attr.ib()
    users = attr.ib()
    patterns = attr.ib()

    @classmethod
    def from_file(cls, path):
        return cls.parse(read_lines(path), path)

    @classmethod
    def parse(cls, lines, where="acl"):
        anonymous, users, patterns = [], {}, []
        current = anonymous
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            rest = rest.strip()
            if keyword == "user":
                if not rest:
                    raise AuthConfigError(f"{where}:{number}: 'user' needs a user name")
                current = users.setdefault(rest, [])
                continue
            if keyword not in ("topic", "pattern"):
                raise AuthConfigError(f"{where}:{number}: unknown keyword {keyword!r}")
            access_word, _, topic = rest.partition(" ")
            if access_word in _ACCESS and topic.strip():
                access, topic = _ACCESS[access_word], topic.strip()
            else:
                # No access word: read and write, as in mosquitto.
                access, topic = READ | WRITE, rest
            try:
                validate_topic_filter(topic)
            except InvalidTopic as e:
                raise AuthConfigError(f"{where}:{number}: {e}") from None
            rule = Rule(access, topic, keyword == "pattern")
            (patterns if keyword == "pattern" else current).append(rule)
        return cls(tuple(anonymous), {u: tuple(r) for u, r in users.items()}, tuple(patterns))

    def _rules(self, username, client_id):
        own = self.anonymous if username is None else self.users.get(username, ())
        for rule in own:
            yield rule.topic, rule.access
        for rule in self.patterns:
            topic = rule.filter_for(username, client_id)
            if topic is not None:
                yield topic, rule.access

    def allows(self, username, client_id, topic, access):
        granted = False
        for rule_filter, rule_access in self._rules(username, client_id):
            if matches(rule_filter, topic):
                if rule_access & DENY:
                    return False
                if rule_access & access:
                    granted = True
        return granted

    def may_subscribe(self, username, client_id, topic_filter):
        """Whether ``topic_filter`` can match any topic the client may read."""
        for rule_filter, rule_access in self._rules(username, client_id):
            if rule_access & READ and filters_intersect(rule_filter, topic_filter):
                return True
        return False


# Topics only the gateway itself writes: $SYS, and the state of every
# bridge, whether or not a bridge of that name is configured now (a
# retained spoof would otherwise outlive the bridge it names, or wait for
# one to be added).
BRIDGE_STATE_PREFIX = "mqttgw/bridge/"
RESERVED_PREFIXES = ("$SYS/", BRIDGE_STATE_PREFIX)
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

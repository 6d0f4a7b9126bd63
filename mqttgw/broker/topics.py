"""
Topic names and topic filters (spec Appendix A): validation, matching, and
the subscription trie the router looks subscribers up in.
"""


class InvalidTopic(ValueError):
    """A topic name or filter that breaks the rules of Appendix A."""


def validate_topic_name(name):
    """A PUBLISH topic: not empty, no wildcards, no U+0000."""
    if not name:
        raise InvalidTopic("topic name is empty")
    if "+" in name or "#" in name:
        raise InvalidTopic(f"topic name {name!r} contains a wildcard")
    if "\x00" in name:
        raise InvalidTopic("topic name contains U+0000")


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


def filter_size(topic_filter):
    """A topic filter's size as a client's subscription bounds count it."""
    return len(topic_filter.encode("utf-8", "surrogatepass"))


def validate_topic_filter(topic_filter):
    """A SUBSCRIBE filter: ``#`` only as the whole last level, ``+`` alone."""
    if not topic_filter:
        raise InvalidTopic("topic filter is empty")
    if "\x00" in topic_filter:
        raise InvalidTopic("topic filter contains U+0000")
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            raise InvalidTopic(
                f"filter {topic_filter!r}: '#' must be the whole last level"
            )
        if "+" in level and level != "+":
            raise InvalidTopic(f"filter {topic_filter!r}: '+' must be a whole level")


def is_wildcard(topic_filter):
    return "+" in topic_filter or "#" in topic_filter


def matches(topic_filter, topic):
    """Whether ``topic`` (a name) matches ``topic_filter``."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


class _Node:
    __slots__ = ("children", "subscribers")

    def __init__(self):
        self.children = {}
        # subscriber -> granted QoS
        self.subscribers = {}


# What one cached match costs beyond its topic: the entry and, per
# subscriber, a (session, QoS) pair.
_CACHE_ENTRY_COST = 100
_CACHE_PAIR_COST = 64


class SubscriptionTrie:
    """
    Topic filters arranged by level.  ``match(topic)`` gives each matching
    subscriber once, at the highest QoS among its matching filters; results
    are cached per topic until the subscriptions change.  The cache is
    bounded by an estimate of its bytes, so long topics or long subscriber
    lists cannot grow it past ``cache_bytes``.
    """

    def __init__(self, cache_bytes=16 * 1024 * 1024):
        self._root = _Node()
        self._cache = {}
        self._cache_bytes = cache_bytes
        self._cached_bytes = 0
        self.count = 0

    def add(self, topic_filter, subscriber, qos):
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if subscriber not in node.subscribers:
            self.count += 1
        node.subscribers[subscriber] = qos
        self._clear_cache()

    def remove(self, topic_filter, subscriber):
        path = [self._root]
        levels = topic_filter.split("/")
        for level in levels:
            node = path[-1].children.get(level)
            if node is None:
                return False
            path.append(node)
        if path[-1].subscribers.pop(subscriber, None) is None:
            return False
        self.count -= 1
        self._clear_cache()
        # Prune empty branches so churn does not grow the trie.
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.children or node.subscribers:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def match(self, topic):
        """A tuple of (subscriber, granted QoS) pairs for ``topic``."""
        found = self._cache.get(topic)
        if found is not None:
            return found
        result = {}
        levels = topic.split("/")
        self._collect(self._root, levels, 0, len(levels), result, topic[:1] == "$")
        found = tuple(result.items())
        cost = _CACHE_ENTRY_COST + len(topic) + _CACHE_PAIR_COST * len(found)
        if cost * 16 <= self._cache_bytes:
            if self._cached_bytes + cost > self._cache_bytes:
                self._clear_cache()
            self._cache[topic] = found
            self._cached_bytes += cost
        return found

    def _clear_cache(self):
        self._cache.clear()
        self._cached_bytes = 0

    def _collect(self, node, levels, i, n, result, dollar):
        children = node.children
        if i == n:
            self._merge(node.subscribers, result)
            # "finance/#" also matches "finance" itself.
            multi = children.get("#")
            if multi is not None:
                self._merge(multi.subscribers, result)
            return
        # Wildcards at the first level do not match "$" topics.
        if not (dollar and i == 0):
            multi = children.get("#")
            if multi is not None:
                self._merge(multi.subscribers, result)
            single = children.get("+")
            if single is not None:
                self._collect(single, levels, i + 1, n, result, dollar)
        exact = children.get(levels[i])
        if exact is not None:
            self._collect(exact, levels, i + 1, n, result, dollar)

    @staticmethod
    def _merge(subscribers, result):
        for subscriber, qos in subscribers.items():
            if result.get(subscriber, -1) < qos:
                result[subscriber] = qos


class _RetainedNode:
    __slots__ = ("children", "message")

    def __init__(self):
        self.children = {}
        self.message = None


class RetainedTree:
    """
    Retained messages arranged by topic level, like subscriptions, so that
    a filter visits only the branches it can match.  :meth:`walk` yields
    matches parent first (``a`` before ``a/b`` before ``a/b/c``).
    """

    def __init__(self):
        self._root = _RetainedNode()
        self._count = 0

    def __len__(self):
        return self._count

    def __contains__(self, topic):
        return self.get(topic) is not None

    def get(self, topic):
        node = self._root
        for level in topic.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.message

    def set(self, topic, message):
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _RetainedNode()
            node = child
        if node.message is None:
            self._count += 1
        node.message = message

    def delete(self, topic):
        levels = topic.split("/")
        path = [self._root]
        for level in levels:
            node = path[-1].children.get(level)
            if node is None:
                return
            path.append(node)
        if path[-1].message is None:
            return
        path[-1].message = None
        self._count -= 1
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.children or node.message is not None:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def __iter__(self):
        """Every retained message, parent first."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.message is not None:
                yield node.message
            stack.extend(reversed(node.children.values()))

    def walk(self, filters, step=256):
        """
        The retained messages matching any of ``filters`` (``[(filter,
        granted QoS)]``), each once, as ``(message, highest granted QoS)``,
        parent first.  After every ``step`` units of work (a filter's visit
        to a node) it also yields None, so a caller can spread a large walk
        over several reactor turns.
        """
        # A filter's progress through the tree: (levels, index, QoS).
        states = [(f.split("/"), 0, qos) for f, qos in filters]
        stack = [(self._root, states, True)]
        work = 0
        while stack:
            node, states, at_root = stack.pop()
            work += len(states)
            if work >= step:
                work = 0
                yield None
            if not at_root and node.message is not None:
                best = -1
                for levels, i, qos in states:
                    n = len(levels)
                    if (i == n or (i == n - 1 and levels[i] == "#")) and qos > best:
                        best = qos
                if best >= 0:
                    yield node.message, best
            if not (children := node.children):
                continue
            # Filters with levels left: by the literal level they need next, or wild.
            literal = {}
            wild = []
            for state in states:
                levels, i, _ = state
                if i < len(levels):
                    level = levels[i]
                    (wild if level == "+" or level == "#" else literal.setdefault(level, [])).append(state)
            if wild:
                pushes = []
                for name, child in children.items():
                    # Wildcards at the first level do not match "$" topics.
                    next_states = [] if at_root and name[:1] == "$" else [
                        (levels, i if levels[i] == "#" else i + 1, qos) for levels, i, qos in wild
                    ]
                    for levels, i, qos in literal.get(name, ()):
                        next_states.append((levels, i + 1, qos))
                    if next_states:
                        pushes.append((child, next_states, False))
                        # Many wildcard filters over many children: the
                        # expansion itself is work to spread over turns.
                        work += len(next_states)
                        if work >= step:
                            work = 0
                            yield None
            else:
                pushes = [
                    (children[name], [(lv, i + 1, q) for lv, i, q in group], False)
                    for name, group in literal.items() if name in children
                ]
            # Reversed onto the stack, so children come out in order.
            stack.extend(reversed(pushes))

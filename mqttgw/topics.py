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


class SubscriptionTrie:
    """
    Topic filters arranged by level.  ``match(topic)`` gives each matching
    subscriber once, at the highest QoS among its matching filters; results
    are cached per topic until the subscriptions change.
    """

    def __init__(self, cache_size=65536):
        self._root = _Node()
        self._cache = {}
        self._cache_size = cache_size
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
        self._cache.clear()

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
        self._cache.clear()
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
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[topic] = found
        return found

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

"""
An access control list in mosquitto's ``acl_file`` format.  A parsed
:class:`ACL` is immutable; the broker's ``Access`` holds the one in force.
"""

import attr

from mqttgw.broker.access import DENY, READ, WRITE
from mqttgw.broker.topics import (
    InvalidTopic,
    filters_intersect,
    matches,
    validate_topic_filter,
)
from mqttgw.security.files import AuthConfigError, read_lines

_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}


@attr.s(frozen=True, slots=True)
class AclRule:
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
            rule = AclRule(access, topic, keyword == "pattern")
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

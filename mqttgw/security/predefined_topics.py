"""
MQTT-SN pre-defined topic ids, from a file in the Paho MQTT-SN Gateway's
``predefinedTopic.conf`` format, one a line: ``ClientId, TopicName,
TopicId``, where the client id ``*`` stands for every client.  A parsed
:class:`PredefinedTopics` is immutable; a reload builds a new one.
"""

import re

import attr

from mqttgw.broker.topics import InvalidTopic, validate_topic_name
from mqttgw.security.files import AuthConfigError, read_lines

EVERY_CLIENT = "*"

# TopicId 0x0000 and 0xFFFF are reserved (MQTT-SN 1.2, section 5.3.11).
FIRST_TOPIC_ID = 0x0001
LAST_TOPIC_ID = 0xFFFE

_DECIMAL = re.compile(r"[0-9]{1,5}")


@attr.s(frozen=True, slots=True)
class TopicTable:
    """One client's (or every client's) pre-defined ids, both ways."""

    names = attr.ib(factory=dict)  # topic id -> topic name
    ids = attr.ib(factory=dict)  # topic name -> topic id


@attr.s(frozen=True, slots=True)
class PredefinedTopics:
    """
    The ids every client may use, and those of named clients.  A client's
    own line wins over a ``*`` line for the same id or the same name.
    """

    common = attr.ib(factory=TopicTable)
    by_client = attr.ib(factory=dict)  # client id -> TopicTable

    @classmethod
    def from_file(cls, path):
        return cls.parse(read_lines(path), path)

    @classmethod
    def parse(cls, lines, where="predefined topics"):
        tables = {}
        lines_of = {}  # (client id, "id" or "name", key) -> line number
        for number, raw in enumerate(lines, 1):
            line = raw.strip().lstrip("\ufeff")
            if not line or line.startswith("#"):
                continue
            here = f"{where}:{number}"
            client_id, topic_name, topic_id = _parse_line(line, here)
            table = tables.setdefault(client_id, TopicTable())
            for kind, key in (("id", topic_id), ("name", topic_name)):
                earlier = lines_of.setdefault((client_id, kind, key), number)
                if earlier != number:
                    raise AuthConfigError(
                        f"{here}: {_whose(client_id)} topic {kind} {key!r} is already "
                        f"on line {earlier}"
                    )
            table.names[topic_id] = topic_name
            table.ids[topic_name] = topic_id
        common = tables.pop(EVERY_CLIENT, TopicTable())
        return cls(common, tables)

    def topic_name(self, client_id, topic_id):
        """The topic a client's pre-defined id stands for, or None."""
        own = self.by_client.get(client_id)
        if own is not None and topic_id in own.names:
            return own.names[topic_id]
        return self.common.names.get(topic_id)

    def topic_id(self, client_id, topic_name):
        """The pre-defined id a client knows a topic by, or None."""
        own = self.by_client.get(client_id)
        if own is not None and topic_name in own.ids:
            return own.ids[topic_name]
        return self.common.ids.get(topic_name)


def _whose(client_id):
    return "every client's" if client_id == EVERY_CLIENT else f"{client_id!r}'s"


def _parse_line(line, where):
    client_id, comma, rest = line.partition(",")
    # A topic name may hold commas; the id is after the last one.
    topic_name, comma2, topic_id = rest.rpartition(",")
    if not comma or not comma2:
        raise AuthConfigError(f"{where}: expected ClientId, TopicName, TopicId")
    client_id, topic_name, topic_id = client_id.strip(), topic_name.strip(), topic_id.strip()
    if not client_id:
        raise AuthConfigError(f"{where}: no client id (or *) before the first comma")
    for what, text in (("client id", client_id), ("topic name", topic_name)):
        # The Paho gateway deletes white space anywhere in the line: what
        # it would have read differently is named, not guessed.
        if any(c.isspace() for c in text):
            raise AuthConfigError(f"{where}: {what} {text!r} holds white space")
    try:
        validate_topic_name(topic_name)
    except InvalidTopic as e:
        raise AuthConfigError(f"{where}: {e}") from None
    if not _DECIMAL.fullmatch(topic_id) or not FIRST_TOPIC_ID <= int(topic_id) <= LAST_TOPIC_ID:
        raise AuthConfigError(
            f"{where}: topic id {topic_id!r} is not a number "
            f"from {FIRST_TOPIC_ID} to {LAST_TOPIC_ID}"
        )
    return client_id, topic_name, int(topic_id)

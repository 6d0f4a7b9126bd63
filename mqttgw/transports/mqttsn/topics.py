"""
One MQTT-SN client's topic ids: the normal ids it registered (REGISTER)
or the gateway registered with it before a delivery, its pre-defined ids
(the predefined topics file) and two-octet short topic names, both ways,
within a bound of names and bytes.
"""

import functools
from types import MappingProxyType

from mqttgw.wire.mqttsn import constants as C
from mqttgw.wire.mqttsn import MalformedDatagram, short_topic_id, short_topic_name

# Normal ids count up from 1 and stay below 0x8000: clients that read ids
# as signed 16-bit numbers (mqtt-sn-12 does) break above it.
FIRST_TOPIC_ID = 1
LAST_TOPIC_ID = 0x7FFF
# Names one client may register, and their UTF-8 bytes in all.
MAX_TOPICS = 1000
MAX_TOPIC_BYTES = 64 * 1024
# ``pending`` of a registry with none: shared, read-only (most clients
# never wait for a REGACK).
_NONE_PENDING = MappingProxyType({})


@functools.lru_cache(maxsize=1024)
def _short_name(topic_id):
    """A short topic name, or None: not UTF-8 (most clients use a few, on every PUBLISH)."""
    try:
        return short_topic_name(topic_id)
    except MalformedDatagram:
        return None


class TopicRegistry:
    """
    The normal topic ids of one client id, idempotent by name (a client
    that REGISTERs before every PUBLISH gets the same id each time), with
    the gateway's registrations that wait for the client's REGACK.
    """

    __slots__ = ("client_id", "predefined", "names", "ids", "size", "next_id", "pending")

    def __init__(self, client_id, predefined=None):
        self.client_id = client_id
        # mqttgw.security.predefined_topics.PredefinedTopics, or None.
        self.predefined = predefined
        self.names = {}  # topic id -> topic name
        self.ids = {}  # topic name -> topic id
        self.size = 0
        self.next_id = FIRST_TOPIC_ID
        # Ids the gateway sent a REGISTER for: topic id -> clock time sent.
        self.pending = _NONE_PENDING

    def __len__(self):
        return len(self.names)

    def register(self, name):
        """The normal id of ``name``, new if need be; None when the bounds are reached."""
        topic_id = self.ids.get(name)
        if topic_id is not None:
            return topic_id
        size = len(name.encode("utf-8"))
        if len(self.names) >= MAX_TOPICS or self.size + size > MAX_TOPIC_BYTES:
            return None
        topic_id = self._free_id()
        if topic_id is None:
            return None
        self.names[topic_id] = name
        self.ids[name] = topic_id
        self.size += size
        return topic_id

    def restore(self, names):
        """
        Registrations ``{topic id: name}`` as the store held them, within
        the bounds (those past them are registered again when used).
        """
        for topic_id, name in sorted(names.items()):
            if not FIRST_TOPIC_ID <= topic_id <= LAST_TOPIC_ID or name in self.ids:
                continue
            size = len(name.encode("utf-8"))
            if len(self.names) >= MAX_TOPICS or self.size + size > MAX_TOPIC_BYTES:
                break
            self.names[topic_id] = name
            self.ids[name] = topic_id
            self.size += size
            self.next_id = topic_id + 1 if topic_id < LAST_TOPIC_ID else FIRST_TOPIC_ID

    def _free_id(self):
        """The next normal id not in use, wrapping within the range."""
        span = LAST_TOPIC_ID - FIRST_TOPIC_ID + 1
        for _ in range(span):
            topic_id = self.next_id
            self.next_id = topic_id + 1 if topic_id < LAST_TOPIC_ID else FIRST_TOPIC_ID
            if topic_id not in self.names:
                return topic_id
        return None

    def forget(self, topic_id):
        """A registration the client refused (REGACK with a return code)."""
        name = self.names.pop(topic_id, None)
        self.acknowledged(topic_id)
        if name is not None:
            del self.ids[name]
            self.size -= len(name.encode("utf-8"))

    def registering(self, topic_id, when):
        """The gateway sent a REGISTER of ``topic_id`` at ``when`` (clock time)."""
        if self.pending is _NONE_PENDING:
            self.pending = {}
        self.pending[topic_id] = when

    def acknowledged(self, topic_id):
        """Its REGACK came (or it was given up)."""
        if topic_id in self.pending:
            del self.pending[topic_id]
            if not self.pending:
                self.pending = _NONE_PENDING

    def predefined_name(self, topic_id):
        if self.predefined is None:
            return None
        return self.predefined.topic_name(self.client_id, topic_id)

    def topic_name(self, topic_id_type, topic_id):
        """The topic name a PUBLISH's TopicIdType and TopicId stand for, or None."""
        if topic_id_type == C.NORMAL_TOPIC_ID:
            return self.names.get(topic_id)
        if topic_id_type == C.PREDEFINED_TOPIC_ID:
            return self.predefined_name(topic_id)
        if topic_id_type == C.SHORT_TOPIC_NAME:
            return _short_name(topic_id)
        return None

    def outbound(self, name):
        """
        (TopicIdType, TopicId) to deliver ``name`` with, or None: the
        client knows no id for it yet.  A pre-defined id first, then a
        short name, then a registered id.
        """
        if self.predefined is not None:
            topic_id = self.predefined.topic_id(self.client_id, name)
            if topic_id is not None:
                return C.PREDEFINED_TOPIC_ID, topic_id
        if len(name) <= 2 and len(name.encode("utf-8")) == 2:
            return C.SHORT_TOPIC_NAME, short_topic_id(name)
        topic_id = self.ids.get(name)
        if topic_id is not None:
            return C.NORMAL_TOPIC_ID, topic_id
        return None

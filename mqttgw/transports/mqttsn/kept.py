"""
The topic registrations of MQTT-SN clients with persistent sessions:
recorded in the store as they are made and forgotten, so that they outlive
a restart, and kept (within a bound) while their client is away, to be
given back when it connects with its session present.
"""

from collections import OrderedDict

from mqttgw.transports.mqttsn.topics import TopicRegistry


def _recorded(session):
    """Whether ``session``'s registrations are in the store: it is persistent, and there is one."""
    return session is not None and not session.ends_with_connection


class KeptTopics:
    """
    The registries (TopicRegistry) of persistent sessions whose clients
    are away, at most ``bound`` of them, the oldest let go first (its
    store rows with it); ``store`` (or None) records every persistent
    session's registrations.  One is shared by a gateway's MQTT-SN
    listeners: a client may come back on any of them.
    """

    def __init__(self, store, bound, predefined=None):
        self.store = store
        self.bound = bound
        self.predefined = predefined
        self.registries = OrderedDict()  # client id -> TopicRegistry, of sessions away

    @classmethod
    def restored(cls, store, options, stored_sessions):
        """One for listeners with ``options`` (MqttSnOptions), holding what the store held."""
        kept = cls(store, options.max_kept_registries, options.predefined)
        kept.restore(stored_sessions)
        return kept

    def restore(self, stored_sessions):
        """The registrations the store held at start-up (StoredSession.topic_ids)."""
        for stored in stored_sessions:
            if stored.topic_ids:
                registry = TopicRegistry(stored.client_id, self.predefined)
                registry.restore(stored.topic_ids)
                self.keep(registry)

    def keep(self, registry):
        """A persistent session's client went: its registrations wait for it."""
        registries = self.registries
        registries.pop(registry.client_id, None)
        registries[registry.client_id] = registry
        while len(registries) > self.bound:
            client_id, _ = registries.popitem(last=False)
            # Its client registers again: the store holds no more than is kept.
            if self.store is not None:
                self.store.delete_topic_ids(client_id)

    def take(self, client_id, session, present):
        """
        The registry of a client that connects with ``session``: the one
        kept for it if that session was present, else a new one.
        """
        kept = self.registries.pop(client_id, None)
        if present and kept is not None:
            for topic_id in list(kept.pending):
                # The REGISTER it did not answer is taken as known, as before it went.
                kept.acknowledged(topic_id)
                self.added(session, client_id, topic_id, kept.names[topic_id])
            return kept
        return TopicRegistry(client_id, self.predefined)

    def added(self, session, client_id, topic_id, name):
        """``session``'s client knows ``name`` as ``topic_id`` (it registered it, or acknowledged it)."""
        if self.store is not None and _recorded(session):
            self.store.add_topic_id(client_id, topic_id, name)

    def removed(self, session, client_id, topic_id):
        """``session``'s client no longer knows ``topic_id``."""
        if self.store is not None and _recorded(session):
            self.store.delete_topic_id(client_id, topic_id)

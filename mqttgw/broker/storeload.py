"""
What the store gives back at start-up, read once before the reactor
runs: retained messages, and persistent sessions with their
subscriptions, queued and in-flight deliveries, inbound QoS 2 ids and
topic ids.
"""

import sqlite3

import attr

from mqttgw.broker import sql
from mqttgw.broker.storefile import StoreError
from mqttgw.wire.properties import PUBLISH, decode_properties


@attr.s(slots=True)
class StoredDelivery:
    seq = attr.ib()
    topic = attr.ib()
    payload = attr.ib()
    qos = attr.ib()
    retain = attr.ib()
    message_id = attr.ib()
    state = attr.ib()
    properties = attr.ib(default=None)
    expiry = attr.ib(default=None)


@attr.s(slots=True)
class StoredSession:
    client_id = attr.ib()
    last_seen = attr.ib(default=None)
    # MQTT 5.0's session expiry interval, or None (3.1.1).
    expiry_interval = attr.ib(default=None)
    # Queued QoS 1 deliveries up to this seq may have been sent.
    sent_seq = attr.ib(default=None)
    # The identity that made it (see Session.owner), or None: stored
    # before owners were.
    owner = attr.ib(default=None)
    subscriptions = attr.ib(factory=dict)
    deliveries = attr.ib(factory=list)
    awaiting_pubrel = attr.ib(factory=set)
    # MQTT-SN's registrations: topic id -> topic name.
    topic_ids = attr.ib(factory=dict)


def load(db, path):
    """
    Everything stored in ``db`` (the database at ``path``):
    ``(retained [(topic, payload, qos, properties, expiry)], sessions)``.
    """
    try:
        retained = db.execute(sql.RETAINED_ALL).fetchall()
        sessions = {
            cid: StoredSession(cid, last_seen, expiry_interval, sent_seq, owner)
            for (cid, last_seen, expiry_interval, sent_seq, owner) in db.execute(sql.SESSIONS_ALL)
        }
        for cid, topic_filter, qos in db.execute(sql.SUBSCRIPTIONS_ALL):
            sessions[cid].subscriptions[topic_filter] = qos
        for row in db.execute(sql.DELIVERIES_ALL):
            sessions[row[0]].deliveries.append(
                StoredDelivery(
                    row[1], row[2], bytes(row[3]), row[4], bool(row[5]), row[6], row[7],
                    _properties(row[8]), row[9],
                )
            )
        for cid, mid in db.execute(sql.PUBRELS_ALL):
            sessions[cid].awaiting_pubrel.add(mid)
        # (A version 5 store read for reading only has no such table.)
        topic_ids = db.execute(sql.TABLE_EXISTS, ("topic_ids",)).fetchone() is not None
        for cid, topic_id, topic in db.execute(sql.TOPIC_IDS_ALL) if topic_ids else ():
            # Only ids: one left of a session gone is of no use, and no harm.
            stored = sessions.get(cid)
            if stored is not None:
                stored.topic_ids[topic_id] = topic
    except (sqlite3.Error, KeyError) as e:
        raise StoreError(f"store {path}: cannot be read: {e!r}") from None
    return (
        [(t, bytes(p), q, _properties(props), e) for t, p, q, props, e in retained],
        list(sessions.values()),
    )


def _properties(blob):
    if blob is None:
        return None
    blob = bytes(blob)
    return decode_properties(blob, 0, len(blob), PUBLISH)[0]

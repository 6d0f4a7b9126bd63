"""
The running gateway as operators see it: its listeners, store, archive and
bridges beside the router, with the questions the admin API, ``$SYS`` and
readiness ask of them, and the periodic work that answers some (the store
probe, the session expiry sweep).
"""

import time
from collections import deque

from twisted.internet.task import LoopingCall

from mqttgw.broker.access import BRIDGE_STATE_PREFIX
from mqttgw.wire import packets as P

# Seconds between store probes; the store is unready once no commit has
# completed for STALE_AFTER (a disk that hangs rather than fails).
PROBE_INTERVAL = 5.0
STALE_AFTER = 15.0
# Message rates kept for the dashboard's chart: every HISTORY_INTERVAL
# seconds over the last 15 minutes.
HISTORY_INTERVAL = 5.0
HISTORY_POINTS = 180


class Gateway:
    def __init__(self, router, clock, store=None, archive=None):
        self.router = router
        self.clock = clock
        self.store = store
        self.archive = archive
        self.listeners = []
        self.bridges = []
        self.started = time.time()
        self._probe = None
        self._sweep = None
        self._sample = None
        # (epoch s, messages received, messages delivered) per interval.
        self.history = deque(maxlen=HISTORY_POINTS + 1)

    # Periodic work

    def start(self):
        if self.store is not None:
            self._probe = LoopingCall(self.store.probe)
            self._probe.clock = self.clock
            self._probe.start(PROBE_INTERVAL, now=True)
        self._sample = LoopingCall(self.sample)
        self._sample.clock = self.clock
        self._sample.start(HISTORY_INTERVAL, now=True)
        self.schedule_sweep()

    def stop(self):
        for loop in (self._probe, self._sweep, self._sample):
            if loop is not None and loop.running:
                loop.stop()
        self._probe = self._sweep = self._sample = None

    def sample(self):
        stats = self.router.stats
        self.history.append((time.time(), stats.messages_received, stats.messages_delivered))

    def rates(self):
        """Messages in and out per second over each interval kept: [[epoch s, in, out]...]."""
        points = list(self.history)
        return [
            [round(t1, 1), round((r1 - r0) / (t1 - t0), 1), round((d1 - d0) / (t1 - t0), 1)]
            for (t0, r0, d0), (t1, r1, d1) in zip(points, points[1:])
            if t1 > t0
        ]

    def schedule_sweep(self):
        """Sweep for expired sessions at a tenth of the expiry, 1 s to 60 s."""
        if self._sweep is not None and self._sweep.running:
            self._sweep.stop()
        self._sweep = None
        expiration = self.router.persistent_client_expiration
        if expiration is None:
            return
        self._sweep = LoopingCall(self.router.expire_sessions)
        self._sweep.clock = self.clock
        self._sweep.start(min(60.0, max(1.0, expiration / 10)), now=True)

    # Readiness

    def not_ready(self):
        """Why the gateway should not be sent traffic: [] when it may."""
        reasons = []
        for listener in self.listeners:
            if listener.port is None:
                reasons.append(f"{listener.kind} listener {listener.description} is not bound")
        store = self.store
        if store is not None:
            if store.failed is not None:
                reasons.append(f"store cannot be written: {store.failed}")
            elif (
                store.last_commit_at is not None
                and time.monotonic() - store.last_commit_at > STALE_AFTER
            ):
                reasons.append(
                    f"store has not committed for {time.monotonic() - store.last_commit_at:.0f}s"
                )
        archive = self.archive
        if archive is not None and archive.failing:
            reasons.append(f"archive {archive.directory} cannot be written")
        return reasons

    # What the admin API lists

    def clients(self):
        listed = []
        for session in self.router.sessions.values():
            connection = session.connection
            if connection is None or session.internal:
                continue
            listed.append(
                {
                    "client_id": session.client_id,
                    "address": connection.peer,
                    "listener": getattr(connection, "listener_kind", None),
                    "protocol": "3.1.1" if connection.protocol_level == P.MQTT_311 else "3.1",
                    "username": connection.username,
                    "keepalive": connection.keepalive,
                    "clean_session": session.clean_session,
                    "subscriptions": len(session.subscriptions),
                    "queued": session.queued,
                    "inflight": len(session.inflight),
                    "dropped": session.dropped,
                    "connected_since": session.connected_since,
                }
            )
        listed.sort(key=lambda c: c["client_id"])
        return listed

    def kick(self, client_id):
        session = self.router.sessions.get(client_id)
        if session is None or session.connection is None or session.internal:
            return False
        session.connection.kick()
        return True

    def sessions(self):
        listed = []
        for session in self.router.sessions.values():
            if session.clean_session or session.internal:
                continue
            listed.append(
                {
                    "client_id": session.client_id,
                    "connected": session.connection is not None,
                    "subscriptions": sorted(session.subscriptions),
                    "queued": session.queued,
                    "inflight": len(session.inflight),
                    "last_seen": session.last_seen,
                }
            )
        listed.sort(key=lambda s: s["client_id"])
        return listed

    def clear_bridge_states(self, removed=()):
        """
        Clear the retained state of bridges that are not configured now:
        the ``removed`` state topics, and whatever lies under the bridge
        state prefix that no running bridge owns (a bridge removed while
        the gateway was down, or a spoof kept before the prefix was
        reserved).  Returns the topics cleared.
        """
        owned = {b.settings.state_topic for b in self.bridges if hasattr(b, "settings")}
        stale = {topic for topic in removed if topic not in owned}
        stale.update(
            m.topic for m in self.retained(BRIDGE_STATE_PREFIX + "#") if m.topic not in owned
        )
        for topic in sorted(stale):
            self.router.publish(P.Publish(topic, b"", 0, True))
        return sorted(stale)

    def retained(self, topic_filter):
        """Retained messages matching ``topic_filter``, parents first."""
        for item in self.router.retained.walk([(topic_filter, 0)]):
            if item is not None:
                yield item[0]

    def overview(self):
        router = self.router
        store = self.store
        return {
            "uptime": round(time.time() - self.started, 1),
            "listeners": [listener.as_dict() for listener in self.listeners],
            "clients": router.stats.clients_connected,
            "sessions": len(router.sessions),
            "subscriptions": router.subscriptions.count,
            "retained": len(router.retained),
            "stored_messages": router.stats.stored_messages,
            "stored_bytes": router.stats.queued_bytes,
            "stats": router.stats.as_dict(),
            "store": None
            if store is None
            else {"state": store.state, "commit_seconds": store.last_commit_seconds},
            "bridges": [b.status() for b in self.bridges],
            "ready": not self.not_ready(),
            "rates": self.rates(),
            "time": round(time.time(), 1),
        }

"""
The running gateway, one service: its listeners, store, archive and
bridges beside the router as children; the questions the admin API,
``$SYS`` and readiness ask of them; and the periodic work that answers
some (the store probe, the session expiry sweep, the rate history).
"""

import platform
import time
from collections import deque

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.logger import Logger

from mqttgw import __version__
from mqttgw.broker.access import BRIDGE_STATE_PREFIX
from mqttgw.broker.interfaces import IClientConnection
from mqttgw.service.runtime_bridges import RuntimeBridges
from mqttgw.wire import packets as P

# Seconds between store probes, and between them while the store cannot
# be written (a probe is then one failing write, and the store takes
# writes again soon after the disk does); the store is unready once no
# commit has completed for STALE_AFTER (a disk that hangs rather than fails).
PROBE_INTERVAL = 5.0
RETRY_INTERVAL = 0.5
STALE_AFTER = 15.0
# Message rates kept for the dashboard's chart: every HISTORY_INTERVAL
# seconds over the last 15 minutes.
HISTORY_INTERVAL = 5.0
HISTORY_POINTS = 180
RETAINED_SWEEP_INTERVAL = 60.0


log = Logger()


class Gateway(MultiService):
    def __init__(self, router, clock, store=None, archive=None):
        super().__init__()
        self.router = router
        self.clock = clock
        self.store = store
        self.archive = archive
        self.listeners = []
        self.bridges = []
        # What a reload renews, set as the gateway is put together: the MQTT
        # factories, the credentials checker and its thread pool, $SYS, and
        # whether password files and token keys were configured.
        self.factories = []
        self.pool = self.checker = self.sys_topics = None
        # The login throttle every listener shares (and the admin listener's
        # Basic authentication may use), set by the tap.
        self.throttle = None
        self.had_passwords = self.had_tokens = None
        # The settings it runs with and what the store gave back, for the
        # start-up summary.
        self.settings = None
        # Bridges changed at runtime (RuntimeBridges), and what applies a
        # change (the ReloadService), once the tap has made them.
        self.runtime_bridges = RuntimeBridges()
        self.reloader = None
        self.restored = ((), ())
        self.started = time.time()
        # (epoch s, messages received, messages delivered) per interval.
        self.history = deque(maxlen=HISTORY_POINTS + 1)
        self._probed_at = None
        if store is not None:
            self._every(RETRY_INTERVAL, self.probe_store)
        self._every(HISTORY_INTERVAL, self.sample)
        # Retained messages whose 5.0 expiry interval ended leave storage.
        self._every(RETAINED_SWEEP_INTERVAL, router.expire_retained)
        self._sweep = None
        self.schedule_sweep()

    def _every(self, seconds, work):
        timer = TimerService(seconds, work)
        timer.clock = self.clock
        timer.setServiceParent(self)
        return timer

    def startService(self):
        # The listeners are bound first: the summary names their ports.
        super().startService()
        cleared = self.clear_bridge_states()
        if cleared:
            log.info("cleared the retained state of bridges not configured: {topics}", topics=", ".join(cleared))
        if self.sys_topics is not None:
            self.sys_topics.start()
        if self.settings is not None:
            self.summary()

    def stopService(self):
        if self.sys_topics is not None:
            self.sys_topics.stop()
        # 5.0 clients are told why the connection ends ([MQTT-4.13.2-1]).
        for session in list(self.router.sessions.values()):
            connection = session.connection
            if not session.internal and IClientConnection.providedBy(connection):
                connection.shutting_down()
        return super().stopService()

    def probe_store(self):
        """A store probe every PROBE_INTERVAL, or RETRY_INTERVAL while it is failed."""
        now = self.clock.seconds()
        if (
            self.store.failed is None
            and self._probed_at is not None
            and now - self._probed_at < PROBE_INTERVAL
        ):
            return
        self._probed_at = now
        self.store.probe()

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
        if self._sweep is not None:
            self._sweep.disownServiceParent()
            self._sweep = None
        expiration = self.router.persistent_client_expiration
        if expiration is not None:
            self._sweep = self._every(min(60.0, max(1.0, expiration / 10)), self.router.expire_sessions)

    def summary(self):
        settings = self.settings
        listeners = ", ".join(
            f"{l.kind} {l.address}"
            + (" TLS" if l.secure else "")
            + (" anonymous" if l.anonymous else "")
            for l in self.listeners
        )
        persistence = settings.persistence
        if self.store is not None:
            store = f"data dir {persistence.data_dir} (durability {persistence.durability})"
        else:
            store = "no persistence (memory only)"
        retained, sessions = self.restored
        queued = sum(len(s.deliveries) for s in sessions)
        log.info(
            "mqttgw {version} (Python {python}) running: listeners {listeners}; {store}; restored {sessions}"
            " persistent session(s) with {queued} queued message(s) and {retained} retained"
            " message(s); bridges {bridges}; archive {archive}; $SYS every {sys}s; log level {log_level_name}",
            version=__version__,
            python=platform.python_version(),
            listeners=listeners,
            store=store,
            sessions=len(sessions),
            queued=queued,
            retained=len(retained),
            bridges=", ".join(b.settings.name for b in self.bridges) or "none",
            archive=settings.archive.directory or "off",
            sys=settings.mqtt.sys_interval,
            log_level_name=settings.log.level,
        )

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
                    # An MQTT-SN client's dialect names itself.
                    "protocol": getattr(connection.dialect, "name", None)
                    or P.VERSION_NAMES[connection.dialect.level],
                    "username": connection.username,
                    "keepalive": connection.keepalive,
                    "clean_session": session.ends_with_connection,
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
            if session.ends_with_connection or session.internal:
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

    def sparkplug(self, may_read=None, group=None, limit=None):
        """
        Sparkplug awareness: on or off, counters, edge nodes and devices
        (those ``may_read`` lets through, see Sparkplug.visible).
        """
        sparkplug = self.router.sparkplug
        if sparkplug is None:
            return {"aware": False}
        nodes, truncated = sparkplug.visible(may_read, group, limit)
        return {
            "aware": True,
            "stats": sparkplug.stats.as_dict(),
            "edge_nodes": nodes,
            "truncated": truncated,
        }

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

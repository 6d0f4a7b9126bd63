"""
The ``$SYS`` topics: the broker's counters published every
``sys_interval`` seconds, retained, with mosquitto's names and meanings
for the ones both have, and mqttgw's own for bridges and the store.  A
value is published only when it changed, as mosquitto does.
"""

import math
import time

from twisted.internet.task import LoopingCall

from mqttgw import __version__
from mqttgw.wire.packets import Publish

# Load averages: exponentially damped rates per minute over 1, 5 and 15
# minutes, computed as mosquitto's sys_tree.c does.
LOAD_PERIODS = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))

# Counters with a load average, by their name under $SYS/broker/load/.
LOADS = {
    "messages/received": "packets_received",
    "messages/sent": "packets_sent",
    "publish/received": "messages_received",
    "publish/sent": "messages_delivered",
    "publish/dropped": "messages_dropped",
    "bytes/received": "bytes_received",
    "bytes/sent": "bytes_sent",
    "connections": "connections_accepted",
    "sockets": "connections_accepted",
}

# Topics that mosquitto publishes too (every one of them is checked
# against a real mosquitto by the tests).
SHARED = [
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/clients/disconnected",
    "$SYS/broker/clients/total",
    "$SYS/broker/clients/maximum",
    "$SYS/broker/clients/expired",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/messages/stored",
    "$SYS/broker/publish/messages/received",
    "$SYS/broker/publish/messages/sent",
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/publish/bytes/received",
    "$SYS/broker/publish/bytes/sent",
    "$SYS/broker/bytes/received",
    "$SYS/broker/bytes/sent",
    "$SYS/broker/retained messages/count",
    "$SYS/broker/subscriptions/count",
    "$SYS/broker/store/messages/count",
    "$SYS/broker/store/messages/bytes",
] + [
    f"$SYS/broker/load/{name}/{period}" for name in LOADS for period, _ in LOAD_PERIODS
]


# What each topic means, for the manual (docs/reference/metrics.rst is
# generated from this and from what values() publishes): BRIDGE is a
# bridge's name, PERIOD one of LOAD_PERIODS' names.
MEANINGS = {
    "version": "the gateway's name and version",
    "uptime": "seconds since start-up",
    "clients/connected": "clients connected now",
    "clients/disconnected": "persistent sessions whose client is away",
    "clients/total": "connected clients plus persistent sessions away",
    "clients/maximum": "most clients connected at once since start-up",
    "clients/expired": "persistent sessions expired since start-up",
    "clients/protocol/3.1": "clients connected with MQTT 3.1 (shown once any is not 3.1.1)",
    "clients/protocol/3.1.1": "clients connected with MQTT 3.1.1",
    "clients/protocol/5.0": "clients connected with MQTT 5.0",
    "clients/protocol/mqtt-sn": "MQTT-SN clients connected, asleep ones too (shown once there was one)",
    "mqtt-sn/datagrams/dropped": "MQTT-SN datagrams dropped: malformed, of an unknown type, or out of turn (shown once one was)",
    "messages/received": "MQTT packets received, of every type",
    "messages/sent": "MQTT packets sent, of every type",
    "messages/stored": "messages queued or in flight for sessions",
    "publish/messages/received": "PUBLISH packets received from clients",
    "publish/messages/sent": "messages routed to subscribers",
    "publish/messages/dropped": "messages dropped at a full queue",
    "publish/messages/expired": "5.0 messages whose expiry interval ended before delivery",
    "publish/bytes/received": "PUBLISH payload bytes received",
    "publish/bytes/sent": "payload bytes routed to subscribers",
    "bytes/received": "MQTT bytes received",
    "bytes/sent": "MQTT bytes sent",
    "retained messages/count": "retained messages held",
    "subscriptions/count": "subscriptions held",
    "store/messages/count": "messages queued or in flight for sessions (as messages/stored)",
    "store/messages/bytes": "payload bytes queued for sessions",
    "store/state": "the store's state: ok, or why it stopped committing",
    "store/commit/latency": "seconds the store's last commit took",
    "bridge/BRIDGE/state": "1 while the bridge's upstream is connected, else 0",
    "bridge/BRIDGE/queued": "messages waiting for the upstream",
    "bridge/BRIDGE/queued/bytes": "payload bytes waiting for the upstream",
    "bridge/BRIDGE/queued/oldest": "seconds the oldest waiting message has waited (0: none)",
    "bridge/BRIDGE/dropped": "messages dropped at the bridge's full queue",
    "bridge/BRIDGE/dropped/queue_full": "messages dropped at the full queue",
    "bridge/BRIDGE/dropped/too_large": "messages larger than the upstream's maximum packet size",
    "bridge/BRIDGE/dropped/expired": "5.0 messages that expired while waiting",
    "bridge/BRIDGE/dropped/refused": "messages the upstream refused",
    "bridge/BRIDGE/sent": "messages forwarded upstream",
    "bridge/BRIDGE/received": "messages brought in from upstream",
    "bridge/BRIDGE/refused": "messages the upstream refused with a 5.0 reason code (shown once any is)",
    "bridge/BRIDGE/link/changes": "times the upstream link came up or went down",
    "bridge/BRIDGE/drain/rate": "messages sent upstream a second, over the last minute",
    "bridge/BRIDGE/link/address": "the upstream address the bridge is on, or trying",
    "bridge/BRIDGE/link/down": "seconds since the bridge last had a working upstream link (0: it has one)",
    "bridge/BRIDGE/link/failure": "the last failed attempt: ADDRESS: what the upstream did (none: none yet)",
    "bridge/BRIDGE/link/fallbacks": "fallbacks in effect, ADDRESS: try_private off, mqttv311; ... (none: none)",
    "bridge/BRIDGE/link/clean_fallback": "1 while on a clean session for want of the persistent one, else 0",
    "sparkplug/nodes_online": "Sparkplug edge nodes online",
    "sparkplug/devices_online": "Sparkplug devices online",
    "sparkplug/births": "NBIRTH messages seen",
    "sparkplug/deaths": "NDEATH messages (wills included) that ended a birth",
    "sparkplug/out_of_sequence": "Sparkplug messages whose seq did not follow their node's last",
    "sparkplug/bdseq_mismatches": "NDEATH messages ignored: their bdSeq was not the current birth's",
    "sparkplug/malformed": "Sparkplug messages whose payload could not be read",
    "sparkplug/certificates": "births kept on $sparkplug/certificates/",
    "sparkplug/untracked": "births past sparkplug.max_nodes or max_devices, not tracked",
}


def _link_values(prefix, status):
    """A bridge's link: where it is, since when it has none, what the upstream last did."""
    failure = status["last_failure"]
    down = status["disconnected_s"]
    fallbacks = "; ".join(f"{address}: {', '.join(names)}" for address, names in status["fallbacks"].items())
    return {
        prefix + "link/address": status["address"],
        prefix + "link/down": 0 if down is None else f"{down:.0f}",
        prefix + "link/failure": "none" if failure is None else f"{failure['address']}: {failure['reason']}",
        prefix + "link/fallbacks": fallbacks or "none",
        prefix + "link/clean_fallback": 1 if status["clean_fallback"] else 0,
    }


def _store_values(store):
    """The store's state, and its last commit's latency once it has made one."""
    values = {"$SYS/broker/store/state": store.state}
    if store.last_commit_seconds is not None:
        values["$SYS/broker/store/commit/latency"] = f"{store.last_commit_seconds:.6f}"
    return values


def known(pattern):
    """Whether MEANINGS (or the load averages) say what ``pattern`` holds."""
    name = pattern.removeprefix("$SYS/broker/")
    return name in MEANINGS or (name.startswith("load/") and name.endswith("/PERIOD"))


def meaning(pattern):
    """What the ``$SYS`` topic ``pattern`` holds; KeyError for an unknown one."""
    name = pattern.removeprefix("$SYS/broker/")
    if name.startswith("load/") and name.endswith("/PERIOD"):
        counter = name[len("load/"):-len("/PERIOD")]
        return (
            f"{LOADS[counter].replace('_', ' ')} a minute, damped over PERIOD"
            f" ({', '.join(p for p, _ in LOAD_PERIODS)}), as mosquitto computes it"
        )
    return MEANINGS[name]


class SysTopics:
    """
    Publishes the ``$SYS`` tree through ``router.publish_sys`` every
    ``interval`` seconds; ``bridges`` and ``store`` (optional) add
    mqttgw's own topics.
    """

    def __init__(self, router, clock, interval, bridges=(), store=None):
        self.router = router
        self.clock = clock
        self.interval = interval
        self.bridges = bridges
        self.store = store
        self.started = clock.seconds()
        self._last = {}
        self._loads = {}
        self._previous = None
        self._loop = None

    def start(self):
        self.stop()
        if self.interval > 0:
            self._loop = LoopingCall(self.update)
            self._loop.clock = self.clock
            self._loop.start(self.interval, now=True)

    def stop(self):
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def values(self):
        """``{topic: text}`` as of now."""
        router = self.router
        values = self._broker_values(router.stats)
        values.update(self._load_values(router.stats))
        if self.store is not None:
            values.update(_store_values(self.store))
        for bridge in self.bridges:
            values.update(self._bridge_values(bridge.status()))
        if router.sparkplug is not None:
            for name, count in router.sparkplug.stats.as_dict().items():
                values[f"$SYS/broker/sparkplug/{name}"] = count
        return values

    def _broker_values(self, stats):
        """The router's counters: mosquitto's topics, then mqttgw's own."""
        router = self.router
        connected = stats.clients_connected
        persistent_away = stats.clients_disconnected
        broker = "$SYS/broker/"
        values = {
            broker + "version": f"mqttgw version {__version__}",
            broker + "uptime": f"{int(self.clock.seconds() - self.started)} seconds",
            broker + "clients/connected": connected,
            broker + "clients/disconnected": persistent_away,
            broker + "clients/total": connected + persistent_away,
            broker + "clients/maximum": stats.clients_maximum,
            broker + "clients/expired": stats.clients_expired,
            broker + "messages/received": stats.packets_received,
            broker + "messages/sent": stats.packets_sent,
            broker + "messages/stored": stats.stored_messages,
            broker + "publish/messages/received": stats.messages_received,
            broker + "publish/messages/sent": stats.messages_delivered,
            broker + "publish/messages/dropped": stats.messages_dropped,
            broker + "publish/bytes/received": stats.publish_bytes_received,
            broker + "publish/bytes/sent": stats.publish_bytes_sent,
            broker + "bytes/received": stats.bytes_received,
            broker + "bytes/sent": stats.bytes_sent,
            broker + "retained messages/count": len(router.retained),
            broker + "subscriptions/count": router.subscriptions.count,
            broker + "store/messages/count": stats.stored_messages,
            broker + "store/messages/bytes": stats.queued_bytes,
        }
        # mqttgw's own topics, once they have something to tell (as the
        # store's and the bridges' when those are configured): clients by
        # protocol version when any is not 3.1.1, expired 5.0 messages.
        if stats.clients_v31 or stats.clients_v5 or broker + "clients/protocol/5.0" in self._last:
            values[broker + "clients/protocol/3.1"] = stats.clients_v31
            values[broker + "clients/protocol/3.1.1"] = stats.clients_v311
            values[broker + "clients/protocol/5.0"] = stats.clients_v5
        if stats.clients_mqttsn or broker + "clients/protocol/mqtt-sn" in self._last:
            values[broker + "clients/protocol/mqtt-sn"] = stats.clients_mqttsn
        if stats.mqttsn_dropped or broker + "mqtt-sn/datagrams/dropped" in self._last:
            values[broker + "mqtt-sn/datagrams/dropped"] = stats.mqttsn_dropped
        if stats.messages_expired or broker + "publish/messages/expired" in self._last:
            values[broker + "publish/messages/expired"] = stats.messages_expired
        return values

    def _bridge_values(self, status):
        """A bridge's topics, from its ``status()``."""
        prefix = f"$SYS/broker/bridge/{status['name']}/"
        values = {prefix + "state": 1 if status["connected"] else 0}
        for name in ("queued", "dropped", "sent", "received"):
            values[prefix + name] = status[name]
        if status.get("refused") or prefix + "refused" in self._last:
            values[prefix + "refused"] = status["refused"]
        for name in ("queued_bytes", "link_changes", "drain_rate"):
            if name in status:
                values[prefix + name.replace("_", "/", 1)] = status[name]
        if "oldest_queued_s" in status:
            oldest = status["oldest_queued_s"]
            values[prefix + "queued/oldest"] = 0 if oldest is None else f"{oldest:.0f}"
        for reason, count in status.get("drops", {}).items():
            values[f"{prefix}dropped/{reason}"] = count
        if "address" in status:
            values.update(_link_values(prefix, status))
        return values

    def _load_values(self, stats):
        now = time.monotonic()
        counts = {name: getattr(stats, attr) for name, attr in LOADS.items()}
        previous, self._previous = self._previous, (now, counts)
        if previous is None:
            return {}
        elapsed = now - previous[0]
        if elapsed <= 0:
            return {}
        values = {}
        for name, count in counts.items():
            per_minute = (count - previous[1][name]) * 60.0 / elapsed
            for period, seconds in LOAD_PERIODS:
                key = (name, period)
                exponent = math.exp(-elapsed / seconds)
                current = self._loads.get(key, 0.0)
                current = per_minute + exponent * (current - per_minute)
                self._loads[key] = current
                values[f"$SYS/broker/load/{name}/{period}"] = f"{current:.2f}"
        return values

    def update(self):
        for topic, value in self.values().items():
            payload = str(value).encode()
            if self._last.get(topic) != payload:
                self._last[topic] = payload
                self.router.publish_sys(Publish(topic, payload, 0, True))

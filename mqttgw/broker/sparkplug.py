"""
Sparkplug awareness (Sparkplug 3.0, "Sparkplug Aware MQTT Server"): an
observer the router shows each PUBLISH under ``spBv1.0/`` before it routes
it.  It keeps every NBIRTH and DBIRTH, byte for byte, as the retained
message of ``$sparkplug/certificates/<birth topic>`` (so they outlive a
restart with the store), and knows each edge node and device it has seen:
online from its BIRTH, offline from its DEATH (an NDEATH will included)
when the NDEATH's bdSeq is the birth's, with gaps in ``seq`` counted.

Payloads are read here only, never for other topics: NBIRTH and NDEATH
decoded whole (bdSeq is a metric), the others' ``seq`` read alone
(wire/sparkplug/seq.py), their metrics skipped unbuilt.  One that cannot be read is
counted and carried on as it came.
"""

import collections

from twisted.logger import Logger

from mqttgw.wire.packets import Publish
from mqttgw.wire.printable import printable
from mqttgw.wire.sparkplug import topics

log = Logger()

# Messages from the edge that carry the node's seq (NBIRTH starts it at 0).
_SEQUENCED = frozenset({"NDATA", "DBIRTH", "DDATA", "DDEATH"})
# The topics of a node and of a device whose readers may see their state.
_NODE_TOPICS = ("NBIRTH", "NDATA", "NDEATH")
_DEVICE_TOPICS = ("DBIRTH", "DDATA", "DDEATH")


class SparkplugStats:
    """Counters of the edge the gateway has seen ($SYS, /metrics, admin API)."""

    __slots__ = (
        "nodes_online",
        "devices_online",
        "births",
        "deaths",
        # seq not one more than the last (mod 256) from the same node.
        "out_of_sequence",
        # NDEATHs whose bdSeq was not their node's current birth's: ignored.
        "bdseq_mismatches",
        # Payloads that are not Sparkplug B: carried on, not read.
        "malformed",
        # Certificates kept as retained messages.
        "certificates",
        # Births of nodes or devices beyond max_nodes/max_devices: carried
        # and kept as certificates, not tracked.
        "untracked",
    )

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


class EdgeNode:
    __slots__ = ("group", "node", "online", "bd_seq", "seq", "since", "devices", "out_of_sequence")

    def __init__(self, group, node):
        self.group = group
        self.node = node
        self.online = False
        self.bd_seq = None
        self.seq = None
        # Clock time of its last birth or death.
        self.since = None
        # device id -> online
        self.devices = {}
        # Its share of SparkplugStats.out_of_sequence.
        self.out_of_sequence = 0

    def as_dict(self, devices=None):
        """``devices``: the ones to list (all by default)."""
        if devices is None:
            devices = self.devices
        return {
            "group": self.group,
            "edge_node": self.node,
            "online": self.online,
            "bdSeq": self.bd_seq,
            "seq": self.seq,
            "out_of_sequence": self.out_of_sequence,
            "since": self.since,
            "devices": [{"device": d, "online": self.devices[d]} for d in devices],
        }


class Sparkplug:
    """The observer; ``router.sparkplug`` while awareness is on."""

    def __init__(self, router, clock, max_nodes=10_000, max_devices=100_000, ndeath_timestamp=False):
        self.router = router
        self.clock = clock
        self.max_nodes = max_nodes
        self.max_devices = max_devices
        # Replace an NDEATH's timestamp with the time it is delivered.
        self.ndeath_timestamp = ndeath_timestamp
        self.stats = SparkplugStats()
        # (group, edge node) -> EdgeNode, and those offline, oldest first:
        # the first to go when the table is full.
        self.nodes = {}
        self._offline = collections.OrderedDict()
        self.devices = 0
        # The codec needs protobuf (about 4 MB): imported with the first
        # Sparkplug message, not by a gateway that never sees one.
        self._codec = None
        self._seq_reader = None

    @property
    def codec(self):
        if self._codec is None:
            from mqttgw.wire.sparkplug import payload

            self._codec = payload
        return self._codec

    @property
    def seq_reader(self):
        if self._seq_reader is None:
            from mqttgw.wire.sparkplug import seq

            self._seq_reader = seq
        return self._seq_reader

    def published(self, message):
        """``message`` (under spBv1.0/) as it is to be routed."""
        parsed = topics.parse(message.topic)
        if parsed is None:
            return message
        group, kind, node_id, device = parsed
        if kind in ("NCMD", "DCMD"):
            return message
        if kind in ("NBIRTH", "DBIRTH") and message.payload:
            self._keep(message)
        key = (group, node_id)
        if kind in ("NBIRTH", "NDEATH"):
            # bdSeq is a metric: these few are decoded whole.
            codec = self.codec
            payload = self._read(codec.decode, codec.MalformedPayload, kind, message)
            if payload is None:
                return message
            if kind == "NBIRTH":
                self._node_birth(key, payload)
            else:
                message = self._node_death(key, payload, message, codec)
            return message
        # The data and device messages: their seq is all that is followed.
        reader = self.seq_reader
        seq = self._read(reader.seq_of, reader.MalformedSeq, kind, message)
        node = self.nodes.get(key)
        if seq is not False and node is not None and node.online:
            self._sequence(node, seq)
            if kind == "DBIRTH":
                self._device(node, device, True)
            elif kind == "DDEATH":
                self._device(node, device, False)
        return message

    def _read(self, read, malformed, kind, message):
        """``read(payload)``; None for NBIRTH/NDEATH and False for others if unreadable (counted, logged)."""
        try:
            return read(message.payload)
        except malformed as e:
            self.stats.malformed += 1
            self.router.limited("sparkplug").warn(
                "Sparkplug {kind} on {topic} carried unread: {reason}",
                kind=kind,
                topic=printable(message.topic),
                reason=str(e),
            )
            return None if kind in ("NBIRTH", "NDEATH") else False

    def _keep(self, message):
        """A birth's certificate: its bytes, retained, written by the gateway."""
        self.stats.certificates += 1
        self.router.publish(Publish(topics.certificate_topic(message.topic), message.payload, 1, True))

    def _node_birth(self, key, payload):
        stats = self.stats
        stats.births += 1
        node = self.nodes.get(key)
        if node is None:
            if len(self.nodes) >= self.max_nodes:
                if not self._offline:
                    stats.untracked += 1
                    return
                self._forget(self._offline.popitem(last=False)[0])
            node = self.nodes[key] = EdgeNode(*key)
        if not node.online:
            node.online = True
            stats.nodes_online += 1
            self._offline.pop(key, None)
        # A new birth: its devices are born again after it.
        self._devices_offline(node)
        node.bd_seq = self._bd_seq(payload)
        node.seq = payload.seq if payload.HasField("seq") else 0
        node.since = self.clock.seconds()

    def _node_death(self, key, payload, message, codec):
        stats = self.stats
        node = self.nodes.get(key)
        bd_seq = self._bd_seq(payload)
        if node is not None and node.online:
            if bd_seq is not None and node.bd_seq is not None and bd_seq != node.bd_seq:
                # The will of a connection older than the current birth.
                stats.bdseq_mismatches += 1
            else:
                stats.deaths += 1
                node.online = False
                stats.nodes_online -= 1
                self._devices_offline(node)
                node.since = self.clock.seconds()
                self._offline[key] = True
        if self.ndeath_timestamp:
            payload.timestamp = int(self.clock.seconds() * 1000)
            message = Publish(
                message.topic,
                codec.encode(payload),
                message.qos,
                message.retain,
                properties=message.properties,
                expiry=message.expiry,
            )
        return message

    def _bd_seq(self, payload):
        metric = self.codec.metric_named(payload, "bdSeq")
        if metric is None:
            return None
        if metric.HasField("long_value"):
            return metric.long_value
        if metric.HasField("int_value"):
            return metric.int_value
        return None

    def _sequence(self, node, seq):
        if seq is None:
            return
        if node.seq is not None and seq != (node.seq + 1) % 256:
            self.stats.out_of_sequence += 1
            node.out_of_sequence += 1
        node.seq = seq

    def _device(self, node, device, online):
        devices = node.devices
        was = devices.get(device)
        if was is None:
            if not online:
                return
            if self.devices >= self.max_devices:
                self.stats.untracked += 1
                return
            self.devices += 1
        elif was == online:
            return
        devices[device] = online
        self.stats.devices_online += 1 if online else -1

    def _devices_offline(self, node):
        for device, online in node.devices.items():
            if online:
                node.devices[device] = False
                self.stats.devices_online -= 1

    def _forget(self, key):
        node = self.nodes.pop(key)
        self.devices -= len(node.devices)

    def edge(self):
        """Every edge node tracked, with its devices."""
        return self.visible()[0]

    def visible(self, may_read=None, group=None, limit=None):
        """
        The edge nodes tracked, with their devices (for the admin API and
        the dashboard), and whether the list was cut short.
        ``may_read(topic)``: a node or device is listed when one of its
        topics (birth, data, death) may be read (None: all are); ``group``:
        that group's nodes only; ``limit``: nodes and devices looked at,
        at most, so one request's work is bounded.
        """
        listed = []
        left = limit if limit is not None else len(self.nodes) + self.devices
        for node in self.nodes.values():
            if group is not None and node.group != group:
                continue
            if left < 1 + len(node.devices):
                return listed, True
            left -= 1 + len(node.devices)
            if may_read is None:
                listed.append(node.as_dict())
                continue
            prefix = f"{topics.PREFIX}{node.group}/"
            devices = [
                d for d in node.devices
                if any(may_read(f"{prefix}{kind}/{node.node}/{d}") for kind in _DEVICE_TOPICS)
            ]
            if devices or any(may_read(f"{prefix}{kind}/{node.node}") for kind in _NODE_TOPICS):
                listed.append(node.as_dict(devices))
        return listed, False

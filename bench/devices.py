"""
A field site's devices: one MQTT connection each (paho, MQTT 3.1.1,
persistent sessions), each publishing a reading every ``--interval``
seconds at its own QoS (device ``k`` at QoS ``k % 3``) and subscribed at
QoS 1 to ``commands/DEVICE``.  A device whose broker goes away keeps its
readings, reconnects by itself and resends what was not acknowledged
before it sends anything new (paho would otherwise send a new reading
between the CONNECT and the CONNACK, ahead of the ones it resends after
the CONNACK), so each device's readings leave it in order.

What each device published, which of those the broker acknowledged and
which commands it received are written to ``--out`` as JSON every second
(and at the end), for the topology tests and benchmarks to read.  After
``--duration`` seconds the devices stop publishing and go on receiving
until SIGTERM.

    python -m bench.devices --host 10.78.1.2 --site 1 --devices 100 --out s1.json

Beside them, ``EdgeNode`` is a Sparkplug B edge node (Sparkplug 3.0)
with devices of its own, through the project's codec: its NDEATH (with
its bdSeq) registered as the will, NBIRTH and a DBIRTH per device giving
each metric a name and an alias, then NDATA and DDATA by alias with
``seq`` counting 0 to 255 and round again, all at QoS 0 as the
specification has them.  ``--edge-nodes N`` runs N of them beside the
devices (group ``siteS``, one device each), an NDATA or DDATA each round
of readings, what each published written to ``--out`` under ``edge_nodes``.
"""

import argparse
import json
import os
import random
import signal
import threading
import time
from collections import deque

import paho.mqtt.client as mqtt


class Device:
    def __init__(self, host, port, site, index, interval):
        self.name = f"s{site}d{index:03d}"
        self.qos = index % 3
        self.interval = interval
        self.sent = []  # [seq, qos, unix time]
        # Message ids, unique over a run (under 65,535 readings a device):
        # paho may call on_publish before publish() returns.
        self._acked_mids = []
        self._acked_set = set()
        self._mids = {}
        self.commands = []
        self.ready = threading.Event()
        # Readings not yet handed to paho; what paho resends first.
        self.backlog = deque()
        self.connected = False
        self._resending = set()
        c = self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=self.name, clean_session=False,
            protocol=mqtt.MQTTv311,
        )
        c.max_inflight_messages_set(20)
        c.reconnect_delay_set(0.5, 4)
        c.on_connect = self._connected
        c.on_publish = self._acked
        c.on_message = self._command
        c.on_subscribe = lambda *_: self.ready.set()
        c.on_disconnect = self._disconnected
        c.connect_async(host, port, 30)
        c.loop_start()

    def _connected(self, client, userdata, flags, reason, properties):
        if reason.is_failure:
            return
        if self.qos:
            self._resending = {m for m in list(self._mids) if m not in self._acked_set}
        self.connected = True
        if flags.session_present:
            self.ready.set()
        else:
            client.subscribe(f"commands/{self.name}", 1)

    def _disconnected(self, *_):
        self.connected = False

    def _acked(self, client, userdata, mid, reason, properties):
        self._acked_mids.append(mid)
        self._acked_set.add(mid)

    def _command(self, client, userdata, message):
        self.commands.append(int(message.payload))

    def read(self, seq):
        """A reading taken now, sent when the link allows."""
        now = time.time()
        payload = json.dumps({"d": self.name, "n": seq, "t": now, "q": self.qos, "v": random.random()})
        self.backlog.append((seq, payload))
        self.sent.append([seq, self.qos, now])
        self.flush()

    def flush(self):
        if not self.connected or not self._resending <= self._acked_set:
            return
        while self.backlog:
            seq, payload = self.backlog.popleft()
            info = self.client.publish(f"sensors/{self.name}", payload, self.qos)
            self._mids[info.mid] = seq

    def report(self):
        acked = [self._mids[m] for m in list(self._acked_mids) if m in self._mids] if self.qos else []
        return {"qos": self.qos, "sent": list(self.sent), "acked": acked, "commands": list(self.commands)}

    def stop(self):
        self.client.disconnect()
        self.client.loop_stop()


class EdgeNode:
    """A Sparkplug edge node ``group``/``node`` with ``devices`` devices, over one paho connection."""

    METRICS = 3

    def __init__(self, host, port, group, node, devices=1, bd_seq=0, keepalive=30):
        from mqttgw.wire.sparkplug import payload as S

        self.codec = S
        self.group, self.node, self.bd_seq = group, node, bd_seq
        self.devices = [f"{node}-d{k}" for k in range(devices)]
        self.seq = 0
        # [kind, device or None, seq or None] in the order published.
        self.sent = []
        self.topic = f"spBv1.0/{group}/{{}}/{node}"
        c = self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"{group}.{node}", clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        death = S.Payload(timestamp=int(time.time() * 1000))
        death.metrics.add(name="bdSeq", datatype=S.DataType.UInt64, long_value=bd_seq)
        # Sparkplug: NDEATH as will at QoS 1, not retained.
        c.will_set(self.topic.format("NDEATH"), S.encode(death), 1, False)
        self.connected = threading.Event()
        c.on_connect = lambda *_: self.connected.set()
        c.connect(host, port, keepalive)
        c.loop_start()
        if not self.connected.wait(30):
            raise RuntimeError(f"edge node {group}/{node} did not connect")

    def _publish(self, kind, device, payload):
        topic = self.topic.format(kind) + (f"/{device}" if device else "")
        self.sent.append([kind, device, payload.seq if payload.HasField("seq") else None])
        return self.client.publish(topic, self.codec.encode(payload), 0, False)

    def _payload(self):
        payload = self.codec.Payload(timestamp=int(time.time() * 1000), seq=self.seq)
        self.seq = (self.seq + 1) % 256
        return payload

    def birth(self):
        """NBIRTH (seq 0, bdSeq) and each device's DBIRTH: metrics by name and alias."""
        T = self.codec.DataType
        self.seq = 0
        payload = self._payload()
        payload.metrics.add(name="bdSeq", datatype=T.UInt64, long_value=self.bd_seq)
        payload.metrics.add(name="Node Control/Rebirth", datatype=T.Boolean, boolean_value=False)
        self._publish("NBIRTH", None, payload)
        for device in self.devices:
            payload = self._payload()
            for i in range(self.METRICS):
                payload.metrics.add(name=f"sensor{i}", alias=i + 1, datatype=T.Double, double_value=0.0)
            self._publish("DBIRTH", device, payload)

    def data(self, device=None):
        """An NDATA (or a device's DDATA), its metrics by alias only."""
        payload = self._payload()
        for i in range(self.METRICS):
            payload.metrics.add(alias=i + 1, datatype=self.codec.DataType.Double, double_value=random.random())
        return self._publish("DDATA" if device else "NDATA", device, payload)

    def drop(self):
        """Its link to the broker breaks (no DISCONNECT): the broker publishes its NDEATH."""
        self.client.loop_stop()
        self.client.socket().close()

    def stop(self):
        self.client.disconnect()
        self.client.loop_stop()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.devices", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--site", type=int, required=True)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between a device's readings")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of publishing")
    parser.add_argument("--edge-nodes", type=int, default=0,
                        help="Sparkplug edge nodes beside the devices: an NDATA or DDATA each a reading")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    devices = [Device(args.host, args.port, args.site, k, args.interval) for k in range(args.devices)]
    nodes = [EdgeNode(args.host, args.port, f"site{args.site}", f"node{k}") for k in range(args.edge_nodes)]

    started = None

    def write():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({
                "started": started,
                "devices": {d.name: d.report() for d in devices},
                # What each edge node published, in order: [kind, device, seq].
                "edge_nodes": {n.node: list(n.sent) for n in nodes},
            }, f)
        os.replace(tmp, args.out)

    # Every device connected and subscribed before the first reading.
    deadline = time.monotonic() + 60
    for d in devices:
        if not d.ready.wait(max(0.0, deadline - time.monotonic())):
            raise SystemExit(f"bench.devices: {d.name} did not connect and subscribe within 60 s")
    started = time.time()
    for n in nodes:
        n.birth()
    # Readings spread evenly over the interval, device after device.
    start = time.monotonic()
    step = args.interval / len(devices)
    # Whole rounds: every device takes the same number of readings.
    total = round(args.duration / args.interval) * len(devices)
    seq = 0
    last_write = start
    tick = 0
    while not stopping.is_set():
        now = time.monotonic()
        publishing = tick < total
        if publishing:
            devices[tick % len(devices)].read(seq)
            tick += 1
            if tick % len(devices) == 0:
                seq += 1
                for n in nodes:
                    n.data(n.devices[0] if seq % 2 else None)
        if now - last_write >= 1.0:
            for d in devices:
                d.flush()
            write()
            last_write = now
        if publishing:
            stopping.wait(max(0.0, start + tick * step - time.monotonic()))
        else:
            stopping.wait(0.2)
    write()
    for d in devices:
        d.stop()
    for n in nodes:
        n.stop()
    write()


if __name__ == "__main__":
    main()

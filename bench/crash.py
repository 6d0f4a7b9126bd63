"""
Crash test: QoS 1 and QoS 2 publishers toward persistent subscribers (some
connected, one offline until the end), while the gateway is killed with
SIGKILL at random moments and started again on the same store.  Then:

- every PUBACKed QoS 1 message reached every persistent subscriber at
  least once;
- every PUBCOMPed QoS 2 message reached each of them exactly once;
- each retained topic holds the last acknowledged retained publish.

    python -m bench.crash --cycles 20
"""

import argparse
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer

REPO = Path(__file__).resolve().parent.parent
TOPIC = "crash"


class Gateway:
    """The gateway under twistd, on a fixed port and data directory."""

    def __init__(self, workdir, port, durability="fsync"):
        self.workdir = Path(workdir)
        self.port = port
        self.durability = durability
        self.process = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(self.workdir / f"gateway-{self.starts}.log", "wb")
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "twistd"), "-n", "--pidfile=",
                "--logfile=-", "mqttgw",
                "--tcp", f"tcp:{self.port}:interface=127.0.0.1",
                "--data-dir", str(self.workdir / "data"),
                "--durability", self.durability,
                "--max-queued-messages", "1000000",
                "--max-queued-bytes", "1000000000",
                "--retry-interval", "2",
            ],
            cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited: see {log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("gateway did not start")

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


class Client(threading.Thread):
    """
    A raw-socket MQTT client with a persistent session that reconnects
    whenever the gateway goes away and completes its flows by the book.
    """

    def __init__(self, port, client_id, stop):
        super().__init__(daemon=True, name=client_id)
        self.port = port
        self.client_id = client_id
        self.stop_event = stop
        self.sock = None
        self.framer = None
        self.lock = threading.Lock()
        self.connections = 0

    def _connect(self):
        while not self.stop_event.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                sock.sendall(P.Connect(client_id=self.client_id, clean_session=False, keepalive=0).encode())
                framer = Framer()
                packets = []
                while not packets:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError
                    packets = list(framer.feed(data))
                if packets[0] != P.Connack(0, packets[0].session_present):
                    raise ConnectionError(packets[0])
                sock.settimeout(None)
                self.sock, self.framer = sock, framer
                self.connections += 1
                self.connected(packets[0].session_present)
                for packet in packets[1:]:
                    self.handle(packet)
                return True
            except (OSError, ConnectionError):
                time.sleep(0.05)
        return False

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (OSError, AttributeError):
            pass

    def run(self):
        while not self.stop_event.is_set():
            if self.sock is None and not self._connect():
                return
            try:
                self.step()
                readable, _, _ = select.select([self.sock], [], [], 0.01)
                if readable:
                    data = self.sock.recv(65536)
                    if not data:
                        raise ConnectionError
                    for packet in self.framer.feed(data):
                        self.handle(packet)
            except (OSError, ConnectionError):
                self.sock.close()
                self.sock = None
        if self.sock is not None:
            self.send(P.Disconnect().encode())
            self.sock.close()

    def connected(self, session_present):
        pass

    def step(self):
        pass


class Subscriber(Client):
    """Counts what the application receives; QoS 2 released on PUBREL."""

    def __init__(self, port, client_id, stop):
        super().__init__(port, client_id, stop)
        self.received = Counter()
        # QoS 2 messages held until their PUBREL (the receiver's method A).
        self.held = {}
        self.subscribed = False

    def connected(self, session_present):
        if not self.subscribed:
            self.send(P.Subscribe(1, [(f"{TOPIC}/data/#", 2)]).encode())

    def handle(self, packet):
        if isinstance(packet, P.Suback):
            self.subscribed = True
        elif isinstance(packet, P.Publish):
            if packet.qos == 1:
                with self.lock:
                    self.received[packet.payload] += 1
                self.send(P.Puback(packet.message_id).encode())
            elif packet.qos == 2:
                self.held[packet.message_id] = packet.payload
                self.send(P.Pubrec(packet.message_id).encode())
        elif isinstance(packet, P.Pubrel):
            payload = self.held.pop(packet.message_id, None)
            if payload is not None:
                with self.lock:
                    self.received[payload] += 1
            self.send(P.Pubcomp(packet.message_id).encode())


class Publisher(Client):
    """
    Publishes numbered messages at ``qos`` with up to ``window`` in flight,
    re-sending what is unacknowledged after every reconnect.
    """

    def __init__(self, port, client_id, stop, qos, topic, window=10, retained_topics=0):
        super().__init__(port, client_id, stop)
        self.qos = qos
        self.topic = topic
        self.window = window
        self.retained_topics = retained_topics
        self.next = 0
        self.inflight = {}  # mid -> [payload, topic, pubrec received]
        self.acked = []  # (topic, payload) in acknowledgement order
        self.finishing = threading.Event()

    def _packet(self, mid, dup):
        payload, topic, _ = self.inflight[mid]
        return P.Publish(topic, payload, self.qos, bool(self.retained_topics), dup, mid).encode()

    def connected(self, session_present):
        for mid, (payload, topic, released) in list(self.inflight.items()):
            self.send(P.Pubrel(mid).encode() if released else self._packet(mid, True))

    def step(self):
        while not self.finishing.is_set() and len(self.inflight) < self.window:
            self.next += 1
            mid = (self.next - 1) % 65535 + 1
            if self.retained_topics:
                topic = f"{TOPIC}/retained/{self.next % self.retained_topics}"
            else:
                topic = self.topic
            self.inflight[mid] = [f"{self.client_id}-{self.next}".encode(), topic, False]
            self.send(self._packet(mid, False))

    def handle(self, packet):
        if isinstance(packet, P.Puback) and self.qos == 1:
            self._acked(packet.message_id)
        elif isinstance(packet, P.Pubrec) and self.qos == 2:
            if packet.message_id in self.inflight:
                self.inflight[packet.message_id][2] = True
            self.send(P.Pubrel(packet.message_id).encode())
        elif isinstance(packet, P.Pubcomp) and self.qos == 2:
            self._acked(packet.message_id)

    def _acked(self, mid):
        entry = self.inflight.pop(mid, None)
        if entry is not None:
            with self.lock:
                self.acked.append((entry[1], entry[0]))


def _retained(port, timeout=10):
    """What a new subscriber to the retained topics is given."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(
        P.Connect(client_id="crash-check", keepalive=0).encode()
        + P.Subscribe(1, [(f"{TOPIC}/retained/#", 1)]).encode()
        + P.Pingreq().encode()
    )
    framer, found, done = Framer(), {}, False
    while not done:
        for packet in framer.feed(sock.recv(65536)):
            if isinstance(packet, P.Publish):
                found[packet.topic] = packet.payload
                if packet.qos:
                    sock.sendall(P.Puback(packet.message_id).encode())
            done = done or isinstance(packet, P.Pingresp)
    sock.close()
    return found


def run(cycles=3, seed=None, workdir=None, durability="fsync", min_gap=0.3, max_gap=1.5, log=print):
    """Run the crash test; returns its figures and the problems found."""
    rng = random.Random(seed)
    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="mqttgw-crash-") if own_dir else workdir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = Gateway(workdir, port, durability)
    gateway.start()
    stop = threading.Event()
    online = [Subscriber(port, f"crash-sub-{i}", stop) for i in range(2)]
    # The offline subscriber subscribes once, then stays away until the end.
    offline_stop = threading.Event()
    offline = Subscriber(port, "crash-sub-offline", offline_stop)
    offline.start()
    deadline = time.monotonic() + 10
    while not offline.subscribed and time.monotonic() < deadline:
        time.sleep(0.01)
    offline_stop.set()
    offline.join()
    for s in online:
        s.start()
    while not all(s.subscribed for s in online):
        time.sleep(0.01)
    publishers = [
        Publisher(port, "crash-pub-q1", stop, 1, f"{TOPIC}/data/q1"),
        Publisher(port, "crash-pub-q2", stop, 2, f"{TOPIC}/data/q2"),
        Publisher(port, "crash-pub-retained", stop, 1, None, window=4, retained_topics=5),
    ]
    for p in publishers:
        p.start()
    started = time.monotonic()
    for cycle in range(cycles):
        time.sleep(rng.uniform(min_gap, max_gap))
        gateway.kill()
        log(f"cycle {cycle + 1}/{cycles}: killed with SIGKILL; restarting")
        gateway.start()
    # Stop publishing; let every flow complete.
    for p in publishers:
        p.finishing.set()
    deadline = time.monotonic() + 60
    while any(p.inflight for p in publishers) and time.monotonic() < deadline:
        time.sleep(0.05)
    acked = {p.qos if not p.retained_topics else "retained": list(p.acked) for p in publishers}
    expected = {payload for _, payload in acked[1]} | {payload for _, payload in acked[2]}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with_all = all(expected <= set(s.received) for s in online)
        if with_all:
            break
        time.sleep(0.05)
    # The offline subscriber comes back now and takes its queue.
    late = Subscriber(port, "crash-sub-offline", stop)
    late.subscribed = True
    late.start()
    deadline = time.monotonic() + 60
    while not expected <= set(late.received) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # let any duplicate arrive before counting
    retained = _retained(port)
    stop.set()
    for c in online + [late] + publishers:
        c.join(10)
    gateway.stop()

    problems = []
    for sub in online + [late]:
        for _, payload in acked[1]:
            if sub.received[payload] < 1:
                problems.append(f"{sub.client_id}: acknowledged QoS 1 {payload!r} never arrived")
        for _, payload in acked[2]:
            if sub.received[payload] != 1:
                problems.append(
                    f"{sub.client_id}: acknowledged QoS 2 {payload!r} arrived"
                    f" {sub.received[payload]} times"
                )
    last = {}
    for topic, payload in acked["retained"]:
        last[topic] = payload
    if retained != last:
        problems.append(f"retained values {retained} are not the last acknowledged {last}")
    figures = {
        "cycles": cycles,
        "seconds": round(time.monotonic() - started, 1),
        "qos1_acknowledged": len(acked[1]),
        "qos2_acknowledged": len(acked[2]),
        "retained_acknowledged": len(acked["retained"]),
        "subscribers": len(online) + 1,
        "qos1_duplicates": sum(
            max(0, s.received[p] - 1) for s in online + [late] for _, p in acked[1]
        ),
        "problems": len(problems),
    }
    return figures, problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.crash", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--durability", choices=["fsync", "os"], default="fsync")
    args = parser.parse_args(argv)
    figures, problems = run(args.cycles, args.seed, durability=args.durability)
    for problem in problems[:50]:
        print("PROBLEM:", problem)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

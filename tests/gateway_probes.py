"""
Watching a gateway under twistd while a test is hard on it: its resident
memory and its sockets, read from /proc, and a well-behaved client's QoS 1
round trips (Probe); ``start`` runs one, with a WebSocket listener if asked.
"""

import os
import threading
import time

from bench import hostile
from mqttgw.wire import packets as P
from tests.network import endpoint, free_port

MiB = 1024


def rss_kib(gw):
    with open(f"/proc/{gw.process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def sockets_held(gw):
    """How many sockets the gateway's process has open."""
    fds = f"/proc/{gw.process.pid}/fd"
    held = 0
    for fd in os.listdir(fds):
        try:
            held += os.readlink(os.path.join(fds, fd)).startswith("socket:")
        except FileNotFoundError:  # closed meanwhile
            pass
    return held


def wait_for_sockets(gw, count, timeout=10.0):
    """Until the gateway has ``count`` sockets open."""
    deadline = time.monotonic() + timeout
    while (held := sockets_held(gw)) != count:
        assert time.monotonic() < deadline, f"the gateway holds {held} sockets, not {count}"
        time.sleep(0.01)


class Probe:
    """
    A well-behaved client doing QoS 1 round trips to itself in a thread
    while something else happens; every round trip must be answered.
    """

    TIMEOUT = 5.0

    def __init__(self, port, name="probe"):
        self.sock, self.framer = hostile.mqtt_connect(port, name)
        self.topic = f"{name}/rt"
        self.sock.sendall(P.Subscribe(1, [(self.topic, 1)]).encode())
        assert isinstance(hostile.recv_packets(self.sock, self.framer, 1)[0], P.Suback)
        self.round_trips = []
        self.failures = []
        self._stop = threading.Event()
        self._thread = None
        self._ended = False
        # Notified at each round trip, and when the probe ends.
        self._progress = threading.Condition()

    def round_trip(self, mid):
        started = time.monotonic()
        self.sock.sendall(P.Publish(self.topic, b"ping", 1, message_id=mid).encode())
        got = hostile.recv_packets(self.sock, self.framer, 2, timeout=self.TIMEOUT)
        for packet in got:
            if isinstance(packet, P.Publish):
                self.sock.sendall(P.Puback(packet.message_id).encode())
        kinds = sorted(type(p).__name__ for p in got)
        if kinds != ["Puback", "Publish"]:
            self.failures.append(f"round trip {mid}: got {kinds}")
            return None
        return time.monotonic() - started

    def _run(self):
        mid = 0
        try:
            while not self._stop.is_set():
                mid = mid % 60000 + 1
                rt = self.round_trip(mid)
                if rt is None:
                    return
                self.round_trips.append(rt)
                with self._progress:
                    self._progress.notify_all()
                # Paced on purpose: a well-behaved client's round trip every
                # 20 ms or so, not a load of its own.
                time.sleep(0.02)
        finally:
            with self._progress:
                self._ended = True
                self._progress.notify_all()

    def wait_for(self, round_trips, timeout=TIMEOUT * 2):
        """Until ``round_trips`` round trips are done, one failed, or ``timeout``."""
        with self._progress:
            self._progress.wait_for(
                lambda: len(self.round_trips) >= round_trips or self._ended, timeout
            )

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(self.TIMEOUT * 2)
        self.sock.close()

    def check(self):
        assert not self.failures, self.failures
        assert self.round_trips, "no round trip completed"


def start(gateway_with, *args, ws=False):
    ws_port = free_port() if ws else None
    extra = ("--ws", endpoint(ws_port)) if ws else ()
    gw = gateway_with(*extra, *args)
    gw.ws_port = ws_port
    return gw

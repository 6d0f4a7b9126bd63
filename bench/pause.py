"""
A paused broker and its idle clients: ``--clients`` clients (half MQTT
3.1.1, half 5.0) with a keepalive of ``--keepalive`` seconds and a will
each send PINGREQ on time, as client libraries do; one more client with a
will stays silent.  After one keepalive interval the broker is stopped
(SIGSTOP) for ``--pause`` seconds and then continued (SIGCONT), while the
clients go on pinging into their sockets.  Counted, for mqttgw and
mosquitto in one run: healthy clients kept (still connected, their
PINGREQs answered after the pause), false wills (published for healthy
clients), and whether the silent client was dropped and its will
published, as it must be.

    python -m bench.pause
    python -m bench.pause --clients 5 --keepalive 2 --pause 6
"""

import argparse
import json
import os
import select
import signal
import tempfile
import time

from bench import hostile
from bench.brokers import BROKERS
from mqttgw.wire import packets as P

WILLS = "pause/will/"
SILENT = "pause-silent"


def _types(buffer):
    """The types of the whole packets at the start of ``buffer``, and the rest."""
    types = []
    while len(buffer) >= 2:
        length, multiplier, at = 0, 1, 1
        while True:
            if at >= len(buffer):
                return types, buffer
            byte = buffer[at]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            at += 1
            if not byte & 0x80:
                break
        if len(buffer) < at + length:
            break
        types.append(buffer[0] >> 4)
        buffer = buffer[at + length :]
    return types, buffer


class Client:
    """One idle client with a will, on a raw socket."""

    def __init__(self, port, name, keepalive, level):
        self.name = name
        self.sock = hostile.connection(port)
        v5 = level == P.MQTT_5
        self.sock.sendall(
            P.Connect(
                client_id=name, keepalive=keepalive, protocol_level=level,
                will_topic=WILLS + name, will_message=b"gone",
                properties={} if v5 else None, will_properties={} if v5 else None,
            ).encode()
        )
        self._buffer = b""
        self.closed = False
        self.answers = 0
        deadline = time.monotonic() + 10
        while self.answers == 0 and not self.closed and time.monotonic() < deadline:
            self.read()
        if self.answers == 0:
            raise RuntimeError(f"{name}: no CONNACK")
        self.answers = 0
        self.sock.setblocking(False)

    def fileno(self):
        return self.sock.fileno()

    def ping(self):
        try:
            self.sock.send(P.Pingreq().encode())
        except OSError:
            self.closed = True

    def read(self):
        """What has arrived: answers (CONNACK, PINGRESP) counted, the end noticed."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, TimeoutError):
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        types, self._buffer = _types(self._buffer + data)
        self.answers += sum(t in (P.CONNACK, P.PINGRESP) for t in types)


class Watcher:
    """A client without keepalive, subscribed to the wills."""

    def __init__(self, port):
        self.sock, self.framer = hostile.mqtt_connect(port, "pause-watcher")
        self.sock.sendall(P.Subscribe(1, [(WILLS + "#", 0)]).encode())
        [suback] = hostile.recv_packets(self.sock, self.framer, 1)
        assert isinstance(suback, P.Suback), suback
        self.sock.setblocking(False)
        self.wills = []
        self.closed = False

    def fileno(self):
        return self.sock.fileno()

    def read(self):
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        for packet in self.framer.feed(data):
            if isinstance(packet, P.Publish):
                self.wills.append(packet.topic[len(WILLS) :])


def run(port, pid, clients=20, keepalive=10, pause=30.0, after=None):
    """
    The scenario against the broker on ``port`` (process ``pid``); its
    counts.  ``after``: seconds watched after the pause (by default two
    and a half keepalive intervals: time for the silent client to be
    dropped and for every healthy one to ping again).
    """
    after = 2.5 * keepalive if after is None else after
    watcher = Watcher(port)
    healthy = [
        Client(port, f"pause-{i}", keepalive, P.MQTT_5 if i % 2 else P.MQTT_311)
        for i in range(clients)
    ]
    silent = Client(port, SILENT, keepalive, P.MQTT_311)
    start = time.monotonic()
    # Pings spread over the interval, as independent clients' are.
    due = [start + keepalive * (i + 1) / (clients + 1) for i in range(clients)]
    stop_at = start + keepalive
    resume_at = stop_at + pause
    end_at = resume_at + after
    stopped = resumed = False
    readers = [watcher, silent] + healthy
    try:
        while True:
            now = time.monotonic()
            if now >= end_at:
                break
            if not stopped and now >= stop_at:
                os.kill(pid, signal.SIGSTOP)
                stopped = True
            if stopped and not resumed and now >= resume_at:
                # What the clients sent meanwhile is answered from here on.
                for client in healthy:
                    client.answers = 0
                os.kill(pid, signal.SIGCONT)
                resumed = True
            for i, client in enumerate(healthy):
                if now >= due[i]:
                    if not client.closed:
                        client.ping()
                    due[i] += keepalive
            open_readers = [r for r in readers if not r.closed]
            ready, _, _ = select.select(open_readers, [], [], 0.05)
            for reader in ready:
                reader.read()
    finally:
        if stopped and not resumed:
            os.kill(pid, signal.SIGCONT)
    names = {c.name for c in healthy}
    kept = sum(not c.closed and c.answers > 0 for c in healthy)
    for reader in readers:
        reader.sock.close()
    return {
        "clients": clients,
        "keepalive": keepalive,
        "pause": pause,
        "kept": kept,
        "false_wills": sum(name in names for name in watcher.wills),
        "silent_dropped": silent.closed,
        "silent_will": SILENT in watcher.wills,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.pause", description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", nargs="+", default=["mqttgw", "mosquitto"], choices=sorted(BROKERS))
    parser.add_argument("--clients", type=int, default=20, help="healthy idle clients")
    parser.add_argument("--keepalive", type=int, default=10, help="their keepalive, seconds")
    parser.add_argument("--pause", type=float, default=30.0, help="seconds the broker is stopped")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as workdir:
        for name in args.brokers:
            broker = BROKERS[name](workdir).start()
            try:
                results[name] = run(broker.port, broker.process.pid, args.clients, args.keepalive, args.pause)
            finally:
                broker.stop()
    print(f"{args.clients} idle clients, keepalive {args.keepalive} s, broker stopped {args.pause:g} s")
    print(f"{'broker':<12}{'kept':>6}{'false wills':>13}  silent client dropped, its will published")
    for name, r in results.items():
        print(
            f"{name:<12}{r['kept']:>6}{r['false_wills']:>13}  "
            f"{'yes' if r['silent_dropped'] else 'no'}, {'yes' if r['silent_will'] else 'no'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()

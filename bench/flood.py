"""
A connection flood from one address: 10,000 anonymous CONNECTs from
127.0.0.2 against a broker that wants a password, while a logged-in
neighbour on 127.0.0.1 sends PINGREQs.  Reported for mqttgw and mosquitto
in the same run, each with its default logging: log bytes written per
flooding connection, the neighbour's PINGREQ round trips (p50/p99) during
the flood, what the flood was answered, and the time until a good login
from the flooding address succeeds afterwards.

    python -m bench.flood                      # 10,000 CONNECTs each
    python -m bench.flood --connections 2000 --brokers mqttgw
"""

import argparse
import json
import os
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import hostile
from bench.brokers import Mosquitto, Mqttgw, ensure_mosquitto
from bench.percentile import nearest_rank
from mqttgw.security.passwords import hash_password
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer

FLOODER = "127.0.0.2"
PASSWORD = "bench-password"
# Seconds past mqttgw's log.refusal_interval (10 s by default).
SETTLE = 11.0


def flood(port, count, connect=None, source=FLOODER, concurrency=100, patience=1.0, timeout=120.0):
    """
    ``count`` connections from ``source``, at most ``concurrency`` at once,
    each sending ``connect`` (default: an anonymous CONNECT) and waiting up
    to ``patience`` seconds for an answer before closing.  What they got:
    ``{"connack N": n, "closed": n (no CONNACK), "unanswered": n, "seconds": s}``.
    """
    data = (connect or P.Connect(client_id="")).encode()
    sel = selectors.DefaultSelector()
    results = {}
    open_ = {}
    started = time.monotonic()
    deadline = started + timeout
    made = 0

    def finish(sock, outcome):
        results[outcome] = results.get(outcome, 0) + 1
        sel.unregister(sock)
        del open_[sock]
        sock.close()

    while (made < count or open_) and time.monotonic() < deadline:
        while made < count and len(open_) < concurrency:
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((source, 0))
            sock.connect_ex((hostile.HOST, port))
            open_[sock] = [time.monotonic() + patience, bytearray()]
            sel.register(sock, selectors.EVENT_WRITE)
            made += 1
        for key, events in sel.select(0.05):
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:
                try:
                    sock.send(data)
                except OSError:
                    finish(sock, "closed")
                    continue
                sel.modify(sock, selectors.EVENT_READ)
                continue
            try:
                chunk = sock.recv(64)
            except OSError:
                chunk = b""
            buffer = open_[sock][1]
            buffer += chunk
            if len(buffer) >= 4 and buffer[0] == 0x20:
                # 3.1.1: the return code is the fourth byte.
                finish(sock, f"connack {buffer[3]}")
            elif not chunk:
                finish(sock, "closed")
        now = time.monotonic()
        for sock in [s for s, (due, _) in open_.items() if due <= now]:
            finish(sock, "unanswered")
    for sock in list(open_):
        finish(sock, "unanswered")
    results["seconds"] = round(time.monotonic() - started, 3)
    return results


def login(port, username, password, source=FLOODER, timeout=10.0):
    """One login's CONNACK return code, or None (closed, or no answer in ``timeout``)."""
    sock = socket.socket()
    try:
        sock.bind((source, 0))
        sock.settimeout(timeout)
        sock.connect((hostile.HOST, port))
        sock.sendall(P.Connect(client_id="", username=username, password=password.encode()).encode())
        packets = hostile.recv_packets(sock, Framer(1024), 1, timeout)
        return packets[0].return_code if packets else None
    except OSError:
        return None
    finally:
        sock.close()


def time_to_login(port, username, password, source=FLOODER, timeout=60.0, pause=0.05):
    """Seconds until a good login from ``source`` gets CONNACK 0 (retrying), and the tries."""
    started = time.monotonic()
    deadline = started + timeout
    tries = 0
    while time.monotonic() < deadline:
        tries += 1
        if login(port, username, password, source, max(0.1, deadline - time.monotonic())) == 0:
            return time.monotonic() - started, tries
        time.sleep(pause)
    return None, tries


class Neighbour:
    """A logged-in client on 127.0.0.1 sending PINGREQ every ``interval``: its round trips."""

    def __init__(self, port, username, password, interval=0.002):
        self.sock = hostile.connection(port)
        self.framer = Framer(1024)
        self.sock.sendall(
            P.Connect(client_id="neighbour", username=username, password=password.encode(), keepalive=60).encode()
        )
        [connack] = hostile.recv_packets(self.sock, self.framer, 1)
        if connack.return_code != 0:
            raise RuntimeError(f"neighbour refused: CONNACK {connack.return_code}")
        self.interval = interval
        self.rtts = []
        self.missed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            started = time.perf_counter()
            self.sock.sendall(P.Pingreq().encode())
            if hostile.recv_packets(self.sock, self.framer, 1, timeout=10):
                self.rtts.append(time.perf_counter() - started)
            else:
                self.missed += 1
            self._stop.wait(self.interval)

    def mark(self):
        return len(self.rtts)

    def since(self, mark):
        return sorted(self.rtts[mark:])

    def stop(self):
        self._stop.set()
        self._thread.join(15)
        self.sock.close()


def percentile(values, share):
    """Of sorted round trips in seconds, in ms."""
    figure = nearest_rank(values, share)
    return None if figure is None else figure * 1000


class FloodedMqttgw(Mqttgw):
    """mqttgw as installed: default logging and throttle, a password file, no anonymous clients."""

    log_name = "broker-twistd.log"

    def __init__(self, workdir, password_file):
        super().__init__(workdir, auth={"password_file": password_file})
        self.ws_port = self.port

    def command(self):
        return [
            str(Path(sys.executable).parent / "twistd"),
            "-n", "--pidfile=", f"--logfile={self.log_name}", "mqttgw",
            "--tcp", f"tcp:{self.port}:interface=127.0.0.1",
            "--password-file", self.auth["password_file"],
            "--max-connections", "50000",
            "--no-persistence",
        ]


class FloodedMosquitto(Mosquitto):
    """mosquitto with its default log types, a password file, no anonymous clients."""

    log_name = "broker.log"

    def __init__(self, workdir, password_file):
        super().__init__(workdir, auth={"password_file": password_file})
        self.ws_port = self.port

    def command(self):
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous false\n"
            f"password_file {self.auth['password_file']}\n"
            "persistence false\n"
            "max_connections -1\n"
            "log_dest stdout\n"
            + ("user root\n" if os.geteuid() == 0 else "")
        )
        return [ensure_mosquitto(), "-c", str(conf)]


BROKERS = {"mqttgw": FloodedMqttgw, "mosquitto": FloodedMosquitto}


def run(broker, connections, concurrency=100, patience=1.0, settle=SETTLE):
    """
    The flood against a started ``broker``: its figures.  The log is
    measured ``settle`` seconds after the flood, once mqttgw has written
    the lines that count its refusals (log.refusal_interval).
    """
    log = broker.workdir / broker.log_name
    neighbour = Neighbour(broker.port, "neighbour", PASSWORD)
    try:
        # A quiet second: the neighbour's round trips without the flood.
        time.sleep(0.5)
        mark = neighbour.mark()
        time.sleep(1.0)
        calm = neighbour.since(mark)
        mark = neighbour.mark()
        before = log.stat().st_size
        answered = flood(broker.port, connections, concurrency=concurrency, patience=patience)
        during = neighbour.since(mark)
        after, tries = time_to_login(broker.port, "good", PASSWORD)
        # Lines summing up an interval are written at its end: counted too.
        time.sleep(settle)
        written = log.stat().st_size - before
    finally:
        neighbour.stop()
    text = log.read_text(errors="replace")
    return {
        "connections": connections,
        "flood_seconds": answered.pop("seconds"),
        "answers": answered,
        "log_bytes": written,
        "log_bytes_per_connection": written / connections,
        "tracebacks": text.count("Traceback"),
        "calm_p99_ms": percentile(calm, 0.99),
        "flood_p50_ms": percentile(during, 0.5),
        "flood_p99_ms": percentile(during, 0.99),
        "flood_round_trips": len(during),
        "missed_pings": neighbour.missed,
        "good_login_after_s": after,
        "good_login_tries": tries,
    }


def write_password_file(directory):
    entry = hash_password(PASSWORD)
    path = Path(directory) / "passwd"
    path.write_text(f"neighbour:{entry}\ngood:{entry}\n")
    return str(path)


def median_run(runs):
    """Each figure's median over ``runs`` (the first run's answers), and every run."""
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[0], runs=runs)
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            values = [r[key] for r in runs if r[key] is not None]
            merged[key] = statistics.median(values) if values else None
    return merged


def table(results):
    rows = [
        ("log bytes per connection", "log_bytes_per_connection", "{:.2f}"),
        ("tracebacks", "tracebacks", "{}"),
        ("neighbour PINGREQ p99, calm (ms)", "calm_p99_ms", "{:.2f}"),
        ("neighbour PINGREQ p99, flood (ms)", "flood_p99_ms", "{:.2f}"),
        ("good login after the flood (s)", "good_login_after_s", "{:.3f}"),
        ("flood seconds", "flood_seconds", "{:.2f}"),
    ]
    names = list(results)
    lines = ["figure".ljust(36) + "".join(n.rjust(14) for n in names)
             + ("   mqttgw/mosquitto" if {"mqttgw", "mosquitto"} <= set(names) else "")]
    for label, key, fmt in rows:
        values = [results[n].get(key) for n in names]
        line = label.ljust(36) + "".join(("-" if v is None else fmt.format(v)).rjust(14) for v in values)
        if {"mqttgw", "mosquitto"} <= set(names):
            ours, theirs = results["mqttgw"].get(key), results["mosquitto"].get(key)
            line += f"   {ours / theirs:.2f}" if ours is not None and theirs else "   -"
        lines.append(line)
    for n in names:
        lines.append(f"{n}: answers {results[n]['answers']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=100, help="flooding connections open at once")
    parser.add_argument("--patience", type=float, default=1.0, help="seconds a flooding connection waits for CONNACK")
    parser.add_argument("--settle", type=float, default=SETTLE, help="seconds after the flood before the log is measured")
    parser.add_argument("--brokers", nargs="+", default=list(BROKERS), choices=list(BROKERS))
    parser.add_argument("--repeats", type=int, default=1, help="runs per broker, each figure's median reported")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    runs = {name: [] for name in args.brokers}
    with tempfile.TemporaryDirectory(prefix="mqttgw-flood-") as workdir:
        password_file = write_password_file(workdir)
        # The brokers take turns: this machine's load falls on both.
        for _ in range(args.repeats):
            for name in args.brokers:
                broker = BROKERS[name](workdir, password_file).start()
                try:
                    print(f"{name:10} flood of {args.connections:,} CONNECTs ...", end=" ", flush=True)
                    r = run(broker, args.connections, args.concurrency, args.patience, args.settle)
                    runs[name].append(r)
                    print(
                        f"{r['log_bytes_per_connection']:.2f} log bytes each, neighbour p99"
                        f" {r['flood_p99_ms'] or 0:.2f} ms, good login after"
                        f" {r['good_login_after_s'] if r['good_login_after_s'] is not None else '-'} s",
                        flush=True,
                    )
                finally:
                    broker.stop()
    results = {name: median_run(rs) for name, rs in runs.items()}
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2))
    return results


if __name__ == "__main__":
    main()

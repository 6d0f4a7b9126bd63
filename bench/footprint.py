"""
What a broker costs at the edge, beside the others in the same run:
resident memory idle with one TCP listener and with every listener kind
(TCP, TLS, WebSocket, secure WebSocket), the time from start to the first
CONNACK (median of three starts), and the memory each idle connection adds
with N and 5N held (10,000 and 50,000 by default; a count the open-file
limit cannot hold is reported as skipped, not tried); for mqttgw, what
that memory is made of (bench/connection_cost.py), and Twisted's reactor
alone with one TCP listener, started and measured the same way
(bench/reactor_alone.py), for what the gateway adds to it.
"""

import resource
import socket
import statistics
import subprocess
import time

from bench import connection_cost
from mqttgw.wire import packets as P

STARTS = 3
# After the first CONNACK, before memory is read: whatever the start-up
# left to do (a collection, a store's first commit) is done.
SETTLE = 1.0
# Descriptors a broker and the load generator need beside the connections.
SPARE_FILES = 1000


def write_pki(directory):
    """A self-signed certificate and key for the TLS listeners."""
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return {"cert": str(cert), "key": str(key)}


def first_connack(port, deadline):
    """Seconds spent until a CONNECT on ``port`` was answered, polling from now."""
    packet = P.Connect(client_id="footprint", keepalive=0).encode()
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(packet)
                answer = s.recv(4)
            if answer[:2] == b"\x20\x02":
                return time.monotonic()
        except OSError:
            pass
        time.sleep(0.002)
    raise RuntimeError(f"no CONNACK on port {port}")


def start(make_broker, kinds, pki):
    """
    A broker with listeners of ``kinds``, started, and its start-up: the
    seconds to the first CONNACK, and the CPU seconds it used until then
    (what a busy machine stretches less).
    """
    broker = make_broker(kinds=kinds, pki=pki)
    began = time.monotonic()
    broker.launch()
    try:
        answered = first_connack(broker.port, began + 30)
    except RuntimeError as e:
        broker.stop()
        raise RuntimeError(f"{broker.name}: {e}: {(broker.workdir / 'broker.log').read_text()[-2000:]}") from None
    return broker, (answered - began, broker.cpu_seconds())


def idle(make_broker, kinds, pki):
    """(RSS KiB idle, (start-up seconds, CPU seconds)) of one start."""
    broker, startup = start(make_broker, kinds, pki)
    try:
        time.sleep(SETTLE)
        return broker.rss_kib(), startup
    finally:
        broker.stop()


def file_limit():
    """The open-file limit, raised to its hard limit (or beyond, where allowed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in (1_048_576, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(wanted, hard)))
            return wanted
        except (ValueError, OSError):
            continue
    return soft


def run(make_broker, workdir, counts, hold, make_baseline=None):
    """
    ``make_broker(kinds=..., pki=...)``: a broker not started;
    ``hold(broker, count)``: run.run_connections; ``make_baseline``, made
    as ``make_broker``: what the broker's idle memory is set beside, each
    of its starts just before one of the broker's.  Figures in KiB and seconds.
    """
    pki = write_pki(workdir)
    startups = []
    rss_tcp = []
    rss_baseline = []
    for _ in range(STARTS):
        if make_baseline is not None:
            rss_baseline.append(idle(make_baseline, ("tcp",), pki)[0])
        rss, startup = idle(make_broker, ("tcp",), pki)
        rss_tcp.append(rss)
        startups.append(startup)
    rss_all, _ = idle(make_broker, ("tcp", "tls", "ws", "wss"), pki)
    result = {
        "rss_idle_tcp_kib": statistics.median(rss_tcp),
        "rss_idle_all_kib": rss_all,
        "startup_s": round(statistics.median(s for s, _ in startups), 3),
        "startup_runs_s": [round(s, 3) for s, _ in startups],
        "startup_cpu_s": round(statistics.median(c for _, c in startups), 3),
        "connections": {},
    }
    if rss_baseline:
        result["rss_idle_baseline_kib"] = statistics.median(rss_baseline)
        result["rss_idle_baseline_runs_kib"] = rss_baseline
    limit = file_limit()
    for count in counts:
        if count + SPARE_FILES > limit:
            result["connections"][str(count)] = {"skipped": f"open-file limit {limit}"}
            continue
        broker, _ = start(make_broker, ("tcp",), pki)
        try:
            time.sleep(SETTLE)
            held = hold(broker, count)
        finally:
            broker.stop()
        result["connections"][str(count)] = held
    return result


def summary(name, r):
    """One line of a broker's footprint figures."""
    held = []
    for count, c in r["connections"].items():
        if "skipped" in c:
            held.append(f"{int(count):,} skipped ({c['skipped']})")
        else:
            kib = c["kib_per_connection"]
            held.append(
                f"{c['connections']:,} held: {c['rss_after_kib'] / 1024:.1f} MiB,"
                f" {kib if kib is None else round(kib, 2)} KiB each"
            )
    line = (
        f"{name}: idle {r['rss_idle_tcp_kib'] / 1024:.1f} MiB with TCP only,"
        f" {r['rss_idle_all_kib'] / 1024:.1f} MiB with TCP, TLS, WebSocket and WSS;"
        f" first CONNACK {r['startup_s']:.3f} s after start ({r['startup_cpu_s']:.2f} s of CPU); "
        + "; ".join(held)
    )
    if "rss_idle_baseline_kib" in r:
        line += f"; {beside_reactor(r)}"
    if "per_connection" in r:
        line += f"; {connection_cost.summary(r['per_connection'])}"
    return line


def beside_reactor(r):
    """What the broker's idle memory with TCP only adds to Twisted's reactor alone's."""
    base = r["rss_idle_baseline_kib"]
    more = r["rss_idle_tcp_kib"] - base
    return (
        f"Twisted's reactor alone (loaded as the gateway loads it, one TCP listener)"
        f" idle {base / 1024:.1f} MiB, the broker {more / 1024:.1f} MiB"
        f" ({more * 1024 / 1e6:.1f} MB) more"
    )

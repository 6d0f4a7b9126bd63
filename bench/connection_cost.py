"""
What one idle connection costs the gateway's memory, by kind of object:
a TCP listener built as the gateway builds it (its lean transport and
poll loop), idle MQTT 3.1.1 clients held by a load generator in another
process, and what the Python heap grew by (tracemalloc), each allocation
put to the kind of object it made.  The footprint scenario runs it beside
its resident-memory figure, which this one explains.

    python -m bench.connection_cost --connections 2000
"""

import argparse
import json
import linecache
import multiprocessing
import os
import sys
import time
import tracemalloc
from collections import Counter

# Frames kept per allocation: enough to reach the line that asked for it
# from inside Twisted's and the socket module's constructors.
FRAMES = 12
# Seconds a step (connections held, or let go) may take.
STEP_TIMEOUT = 120

# The kind of object an allocation made, by the first of these a frame of
# its traceback (innermost first) matches: a constructor called on the
# line, or else the file it was made in.
BY_CALL = (
    ("MQTTServerProtocol(", "connection (MQTTServerProtocol)"),
    ("Reading(", "reading part"),
    ("Framer(", "framer"),
    ("Publishing(", "publishing part"),
    ("Subscribing(", "subscribing part"),
    ("Login(", "login part"),
    ("Deliveries(", "session's deliveries part"),
    ("Window(", "session's window part"),
    ("Outbox(", "session's outbox part"),
    ("Session(", "session"),
    ("raw_socket(", "socket object and peer address"),
    ("addr = (", "socket object and peer address"),
)
BY_FILE = (
    ("/socket.py", "socket object and peer address"),
    ("/epollreactor.py", "reactor's tables of descriptors"),
    ("/twisted/internet/tcp.py", "transport (tcp.Server)"),
    ("/mqttgw/transports/tcp.py", "transport (tcpserver.Server)"),
    ("/mqttgw/transports/tcpserver.py", "transport (tcpserver.Server)"),
    ("/mqttgw/wire/framing.py", "client id"),
    ("/mqttgw/broker/sessions.py", "router's table of sessions"),
    ("/mqttgw/broker/session.py", "session"),
    ("/mqttgw/transports/schedulers.py", "keepalive and CONNECT deadlines"),
    ("/mqttgw/transports/reading.py", "reading part"),
    ("/mqttgw/transports/protocol.py", "connection (MQTTServerProtocol)"),
)


def kind_of(traceback):
    """The kind of object an allocation with ``traceback`` made (see BY_CALL, BY_FILE)."""
    # tracemalloc keeps the oldest frame first.
    for frame in reversed(traceback):
        line = linecache.getline(frame.filename, frame.lineno)
        for call, kind in BY_CALL:
            if call in line:
                return kind
        for path, kind in BY_FILE:
            if frame.filename.endswith(path):
                return kind
    return "other"


def breakdown(before, after, count):
    """Bytes per connection by kind of object, between two snapshots, largest first."""
    kinds = Counter()
    for stat in after.compare_to(before, "traceback"):
        kinds[kind_of(stat.traceback)] += stat.size_diff
    return {kind: round(size / count, 1) for kind, size in kinds.most_common()}


def _hold(port, count):
    """A load generator's process holding ``count`` idle connections, and its results."""
    from bench import loadgen

    ctx = multiprocessing.get_context("fork")
    results = ctx.RawArray("d", 4)
    process = ctx.Process(target=loadgen.hold_connections, args=(port, count, 200, results))
    process.start()
    return process, results


def measure(count):
    """
    ``count`` idle connections held against an in-process listener: the
    Python heap's growth per connection, in all and by kind of object.
    """
    from twisted.internet import reactor

    from mqttgw.broker.router import Router
    from mqttgw.broker.session import SessionLimits
    from mqttgw.transports import leanreactor, tcp
    from mqttgw.transports.protocol import ConnectionLimits, MQTTServerFactory

    router = Router(reactor, SessionLimits())
    factory = MQTTServerFactory(router, ConnectionLimits(max_connections=count + 100), reactor)
    factory.kind = "tcp"
    leanreactor.poll_lean(reactor)
    port = tcp.serve_lean(
        reactor.listenTCP(0, factory, interface="127.0.0.1"), factory.flusher, factory.vacancies
    )
    number = port.getHost().port
    stats = router.stats
    figures = {}

    def until(done, then, deadline):
        if done():
            return then()
        if time.monotonic() > deadline:
            figures["error"] = f"not done in {STEP_TIMEOUT}s: {stats.connections} connections"
            return reactor.stop()
        reactor.callLater(0.02, until, done, then, deadline)

    def step(done, then):
        until(done, then, time.monotonic() + STEP_TIMEOUT)

    def warm():
        # What the first connections make once (tables, caches) is not theirs.
        process, results = _hold(number, 20)
        step(lambda: results[2] == 20 and stats.clients_connected == 20, lambda: let_go(process, results))

    def let_go(process, results):
        results[1] = 1
        process.join(STEP_TIMEOUT)
        step(lambda: stats.connections == 0, hold)

    def hold():
        tracemalloc.start(FRAMES)
        figures["before"] = tracemalloc.take_snapshot()
        process, results = _hold(number, count)
        step(lambda: results[2] and stats.clients_connected == results[2], lambda: held(process, results))

    def held(process, results):
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        before = figures.pop("before")
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        connections = int(results[2])
        figures.update(
            connections=connections,
            failed=int(results[3]),
            bytes_per_connection=round(grown / connections, 1),
            by_kind=breakdown(before, after, connections),
        )
        results[1] = 1
        process.join(STEP_TIMEOUT)
        reactor.stop()

    reactor.callWhenRunning(warm)
    reactor.run()
    if "error" in figures:
        raise RuntimeError(figures["error"])
    return figures


def run(count, repo=None):
    """:func:`measure` in a fresh interpreter (the reactor is its own), with ``repo``'s mqttgw."""
    return run_module("bench.connection_cost", count, repo, 3 * STEP_TIMEOUT)


def run_module(module, count, repo, timeout):
    """``python -m module --connections count --json`` with ``repo``'s mqttgw: its figures."""
    import subprocess

    repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-m", module, "--connections", str(count), "--json"],
        cwd=repo, env=dict(os.environ, PYTHONPATH=repo), capture_output=True, text=True,
        timeout=timeout,
    )
    if done.returncode:
        raise RuntimeError(f"{module} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def summary(r):
    """One line: bytes per idle connection, in all and by kind."""
    kinds = ", ".join(f"{kind} {size:.0f}" for kind, size in r["by_kind"].items())
    return f"{r['bytes_per_connection']:.0f} bytes of Python heap per idle connection ({r['connections']:,} held): {kinds}"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.connection_cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    r = measure(args.connections)
    print(json.dumps(r) if args.json else summary(r))
    return r


if __name__ == "__main__":
    main()

"""
What one connect costs the gateway's CPU, by part: a TCP listener built
as the gateway builds it (its own transport and poll loop), a storm of
MQTT 3.1.1 clients connecting at once from a load generator in another
process, and the Python function calls each accept + CONNECT + CONNACK
made, counted by cProfile and put to the part of the gateway (or of
Twisted) they ran in.  Counts do not vary with the load of a shared
machine as times do; the share of profiled time beside them does.  The
storm scenario runs it beside its wall-clock figures.

    python -m bench.connect_cost --connections 2000
"""

import argparse
import cProfile
import json
import multiprocessing
import pstats
import time
from collections import Counter

# Seconds a step (a storm, or its clients let go) may take.
STEP_TIMEOUT = 120

# The part a function belongs to, by the first of these its file's path
# ends with (a built-in's calls go to the part of whoever called it).
PARTS = (
    ("/mqttgw/transports/tcp.py", "accept and transport"),
    ("/mqttgw/transports/tcpserver.py", "accept and transport"),
    ("/mqttgw/transports/leanreactor.py", "reactor"),
    ("/twisted/internet/", "reactor"),
    ("/twisted/python/", "reactor"),
    ("/twisted/logger/", "reactor"),
    ("/mqttgw/transports/protocol.py", "connection (MQTTServerProtocol)"),
    ("/mqttgw/transports/reading.py", "reading and framing"),
    ("/mqttgw/wire/", "reading and framing"),
    ("/mqttgw/transports/login.py", "login and dialect"),
    ("/mqttgw/transports/dialects.py", "login and dialect"),
    ("/mqttgw/security/", "login and dialect"),
    ("/mqttgw/broker/", "session and router"),
    ("/mqttgw/transports/schedulers.py", "admission and deadlines"),
    ("/mqttgw/transports/connlog.py", "admission and deadlines"),
)


def part_of(filename):
    for path, part in PARTS:
        if path in filename or filename.endswith(path):
            return part
    return "other"


def breakdown(stats, count):
    """Calls per connect and shares of profiled time, by part, most calls first."""
    calls = Counter()
    seconds = Counter()
    for (filename, _, _), (_, ncalls, tottime, _, callers) in stats.items():
        if filename == "~" and callers:
            # A built-in: its calls are its callers'.
            for (caller, _, _), (_, n, t, _) in callers.items():
                calls[part_of(caller)] += n
                seconds[part_of(caller)] += t
        else:
            calls[part_of(filename)] += ncalls
            seconds[part_of(filename)] += tottime
    total = sum(seconds.values()) or 1.0
    return {
        part: {"calls": round(n / count, 1), "time_share": round(seconds[part] / total, 3)}
        for part, n in calls.most_common()
    }


def _storm(port, count):
    """A load generator's process connecting ``count`` clients at once, holding them until told."""
    from bench import loadgen

    ctx = multiprocessing.get_context("fork")
    results = ctx.RawArray("d", 4)
    process = ctx.Process(target=loadgen.hold_connections, args=(port, count, count, results))
    process.start()
    return process, results


def measure(count):
    """A storm of ``count`` connects on an in-process listener, profiled from its first accept to its last CONNACK."""
    from twisted.internet import reactor

    from mqttgw.broker.router import Router
    from mqttgw.broker.session import SessionLimits
    from mqttgw.transports import leanreactor, tcp
    from mqttgw.transports.protocol import ConnectionLimits, MQTTServerFactory

    router = Router(reactor, SessionLimits())
    # As the benchmark's gateway: no line per connect.
    limits = ConnectionLimits(max_connections=count + 100, connection_messages=False)
    factory = MQTTServerFactory(router, limits, reactor)
    factory.kind = "tcp"
    leanreactor.poll_lean(reactor)
    port = tcp.serve_lean(
        reactor.listenTCP(0, factory, interface="127.0.0.1"), factory.flusher, factory.vacancies
    )
    number = port.getHost().port
    stats = router.stats
    # CPU time, not wall time: the poll's wait for the clients is no cost.
    profile = cProfile.Profile(time.process_time)
    figures = {}

    def step(done, then, deadline=None):
        deadline = deadline or time.monotonic() + STEP_TIMEOUT
        if done():
            return then()
        if time.monotonic() > deadline:
            figures["error"] = f"not done in {STEP_TIMEOUT}s: {stats.clients_connected} connected"
            return reactor.stop()
        reactor.callLater(0.1, step, done, then, deadline)

    def warm():
        # What the first connections make once (tables, caches) is not theirs.
        process, results = _storm(number, 50)
        step(lambda: results[2] == 50, lambda: let_go(process, results, storm))

    def let_go(process, results, then):
        results[1] = 1
        process.join(STEP_TIMEOUT)
        step(lambda: stats.connections == 0, then)

    def storm():
        started = time.process_time()
        profile.enable()
        process, results = _storm(number, count)
        step(lambda: stats.clients_connected >= count, lambda: stormed(process, results, started))

    def stormed(process, results, started):
        profile.disable()
        figures["cpu_s"] = time.process_time() - started
        let_go(process, results, reactor.stop)

    reactor.callWhenRunning(warm)
    reactor.run()
    if "error" in figures:
        raise RuntimeError(figures["error"])
    by_part = breakdown(pstats.Stats(profile).stats, count)
    return {
        "connections": count,
        "calls_per_connect": round(sum(p["calls"] for p in by_part.values()), 1),
        # Under the profiler: several times the CPU it takes without.
        "profiled_cpu_us_per_connect": round(figures["cpu_s"] / count * 1e6, 1),
        "by_part": by_part,
    }


def run(count, repo=None):
    """:func:`measure` in a fresh interpreter (the reactor is its own), with ``repo``'s mqttgw."""
    from bench.connection_cost import run_module

    return run_module("bench.connect_cost", count, repo, 3 * STEP_TIMEOUT)


def summary(r):
    """One line: Python calls per connect, in all and by part."""
    parts = ", ".join(f"{part} {p['calls']:.0f}" for part, p in r["by_part"].items())
    return f"{r['calls_per_connect']:.0f} Python calls per connect ({r['connections']:,} at once): {parts}"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.connect_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    r = measure(args.connections)
    print(json.dumps(r) if args.json else summary(r))
    return r


if __name__ == "__main__":
    main()

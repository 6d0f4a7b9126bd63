"""
Runs the same scenarios against mqttgw, mosquitto and amqtt in one run and
prints a table of absolute figures and mqttgw's ratios to the others; the
figures also go to a JSON file, and the table to an reStructuredText file
beside it (``bench/results/latest.rst``) that the manual's performance
page includes.

    python -m bench                     # everything, 10 s per scenario
    python -m bench --duration 2 --brokers mqttgw mosquitto
"""

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import burst, connect_cost, connection_cost, drain, footprint, loadgen, logins, mqttsn, neighbours, retained
from bench.brokers import BROKERS, DEFAULT_BROKERS, MAX_INFLIGHT, MAX_QUEUED, PythonFloor, free_port
from bench.reactor_alone import ReactorAlone
from bench.percentile import nearest_rank

PAYLOAD = 64
RESULTS = Path(__file__).resolve().parent / "results" / "latest.rst"
README = RESULTS.parent.parent.parent / "README.rst"
# The README's comment lines around its copy of RESULTS.
RESULTS_BEGIN = ".. The last run's table: python -m bench writes it here from bench/results/latest.rst's first."
RESULTS_END = ".. End of the last run's table."

# Messages sent but not yet received by every subscriber, by QoS.  QoS 1/2
# windows stay well under every broker's queue bound, batches included
# (mosquitto drops queued QoS 1/2 messages well before max_queued_messages
# when bursts arrive); QoS 0 is not queued, and a small window would only
# measure round trips.
WINDOW = {0: 1000, 1: 100, 2: 100}
BATCH = {0: 32, 1: 16, 2: 16}

THROUGHPUT = {
    # name: (publishers, subscribers, qos)
    "fan-in qos0": (4, 1, 0),
    "fan-in qos1": (4, 1, 1),
    "fan-in qos2": (4, 1, 2),
    # Over WebSocket, one frame per packet as browsers send them: the
    # publishers for fan-in, the subscribers for fan-out.
    "fan-in qos0 ws": (4, 1, 0),
    "fan-in qos1 ws": (4, 1, 1),
    "fan-out qos0 ws": (1, 100, 0),
    # The subscriber has a persistent session: every message is stored.
    "fan-in qos1 persistent": (4, 1, 1),
    "fan-out qos0": (1, 8, 0),
    "fan-out qos1": (1, 8, 1),
    # With an ACL of 1,000 rules loaded (the same file for every broker).
    "fan-in qos0 acl": (4, 1, 0),
    "fan-in qos1 acl": (4, 1, 1),
    # Over MQTT 5.0 (publishers and subscriber), and with the publishers
    # sending each topic once, then its alias.
    "fan-in qos1 v5": (4, 1, 1),
    "fan-in qos1 v5 aliases": (4, 1, 1),
    # mqttgw only: fan-in QoS 0 with the dashboard open on its Topics view
    # in headless Chromium (subscribed to "#": every message reaches it).
    "fan-in qos0 + dashboard": (4, 1, 0),
}
DASHBOARD = "fan-in qos0 + dashboard"
# QoS 1 round trips at a steady rate, alone and beside every hostile client
# of bench/hostile.py (bench/neighbours.py).
NEIGHBOURS = {"calm qos1": False, "calm qos1 + hostile": True}
# A narrow wildcard SUBSCRIBE over many stored retained topics (bench/retained.py).
RETAINED = "retained narrow"
# 200 clients logging in with passwords at once (bench/logins.py).
LOGINS = "logins"
# A probe's round trips (QoS 0, 100 a second) beside fan-in QoS 1: the
# publishers as fast as the broker takes them, then held at half of
# mqttgw's top rate in that run.
PROBED = {"latency qos1 saturated": None, "latency qos1 half": 0.5}
# The same probe through an otherwise idle broker: one message's trip.
IDLE_LATENCY = "latency idle"
# A 100,000-message QoS 1 backlog delivered to a client (bench/drain.py);
# for mqttgw also drained by a bridge into a real mosquitto, compared with
# mosquitto delivering the same backlog to a client.
BACKLOG = "backlog qos1"
BRIDGE_DRAIN = "bridge drain qos1"
DRAINS = (BACKLOG, BRIDGE_DRAIN)
# Scenarios whose publishers keep at most a window outstanding, and the
# queue bound every broker gets in them.
WINDOWED = set(THROUGHPUT) | {"latency"} | set(PROBED)
WINDOWED_QUEUED = 1_000_000
# Memory idle and per idle connection, and start-up time (bench/footprint.py);
# for mqttgw, what a connection's memory is made of, over at most this many
# connections (bench/connection_cost.py: tracemalloc slows the gateway).
FOOTPRINT = "footprint"
BREAKDOWN_CONNECTIONS = 2000
# --storm clients connecting at once, --repeats runs (bench/burst.py); for
# mqttgw, where a connect's CPU goes, over at most BREAKDOWN_CONNECTIONS
# (bench/connect_cost.py).
STORM = "storm"
# mqttgw only: MQTT-SN clients over UDP (bench/mqttsn.py), against the
# Paho MQTT-SN Gateway's figures on this kind of machine (mqttsn.ANCHOR).
MQTTSN = "mqtt-sn"
ALL_SCENARIOS = (
    list(THROUGHPUT) + ["latency", IDLE_LATENCY] + list(PROBED) + [BACKLOG, BRIDGE_DRAIN, "connections"]
    + list(NEIGHBOURS) + [RETAINED, LOGINS, FOOTPRINT, STORM, MQTTSN]
)
# Brokers that can run a scenario (amqtt has no mosquitto-format files).
AUTH_SCENARIOS = {"fan-in qos0 acl", "fan-in qos1 acl", LOGINS}
# amqtt speaks no MQTT 5.0.
V5_SCENARIOS = {"fan-in qos1 v5", "fan-in qos1 v5 aliases"}


def _ctx():
    # Fork is cheapest and what the published figures used, but only safe
    # without other threads: a child forked while one of them holds a lock
    # can hang (a test run has paho's threads).  Then a fork server.
    if threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver")


def _pin(cpu):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _wait_ready(broker, shared, flags, need, what, processes, timeout=30):
    """Until ``need`` flags are set; on a client's error or the timeout, kill ``processes``."""
    deadline = time.monotonic() + timeout
    while sum(flags) < need:
        if time.monotonic() > deadline or shared.errors.value:
            for p in processes:
                p.kill()
            raise RuntimeError(
                f"{broker.name}: clients not ready: {sum(flags)} of {need} {what},"
                f" {shared.errors.value} failed (their errors are printed above);"
                f" broker {'running' if broker.process.poll() is None else 'exited'}"
            )
        time.sleep(0.01)


def publisher_process(ctx, broker, shared, index, publishers, qos, rate=None, cpu=None, websocket=False, v5=False, alias=False):
    """
    Publisher ``index`` of ``publishers``, not started.  Each checks the
    whole window, ``WINDOW[qos]``, against what all of them have
    outstanding: a share of the window checked against that total would
    hold them all to the share.
    """
    return ctx.Process(
        target=_pinned,
        args=(
            cpu, loadgen.publisher, broker.ws_port if websocket else broker.port,
            index, f"bench/{index}", qos, PAYLOAD, shared, WINDOW[qos],
            BATCH[qos], (rate / publishers) if rate else None, MAX_INFLIGHT,
            websocket, v5, alias,
        ),
    )


def run_throughput(broker, publishers, subscribers, qos, duration, rate=None, probe_count=0, cpu=None, websocket=None, persistent=False, v5=False, alias=False):
    """
    Deliveries per second, lost messages, the broker's CPU, and probe
    latencies (ms).  ``websocket`` is "publishers" or "subscribers": those
    connect over WebSocket, the others (the probe too) over TCP.  ``v5``:
    every client but the probe speaks MQTT 5.0; ``alias``: the publishers
    send their topic by alias.
    """
    ctx = _ctx()
    shared = loadgen.Shared(ctx, publishers, subscribers)
    psize = loadgen.packet_size("bench/0", PAYLOAD, qos, v5)
    subs = [
        ctx.Process(
            target=_pinned,
            args=(
                cpu, loadgen.subscriber, broker.ws_port if websocket == "subscribers" else broker.port,
                i, "bench/+", qos, psize, shared, persistent, websocket == "subscribers", v5,
            ),
        )
        for i in range(subscribers)
    ]
    pubs = [
        publisher_process(ctx, broker, shared, i, publishers, qos, rate, cpu, websocket == "publishers", v5, alias)
        for i in range(publishers)
    ]
    latencies = ctx.RawArray("q", probe_count) if probe_count else None
    # The probe's topic, "probe/t", is outside the subscribers' "bench/+",
    # and it writes none of the publishers' and subscribers' counters: the
    # window and the rate count the same messages with it as without.
    probe = (
        ctx.Process(
            target=_pinned,
            args=(cpu, loadgen.probe, broker.port, "probe/t", 0.01, shared, latencies),
        )
        if probe_count
        else None
    )
    for p in subs + ([probe] if probe else []):
        p.start()
    clients = subs + ([probe] if probe else [])
    _wait_ready(broker, shared, shared.ready, len(clients), "subscribed", clients)
    for p in pubs:
        p.start()
    # The clock starts when every publisher is connected and has its
    # packets made (a WebSocket publisher masks 65,535 frames first).
    _wait_ready(broker, shared, shared.publishers_ready, publishers, "publishers ready", pubs + clients)
    cpu_before = broker.cpu_seconds()
    started = time.perf_counter_ns()
    shared.go.value = 1
    time.sleep(duration)
    shared.stop.value = 1
    for p in pubs:
        p.join(30)
    drain = time.monotonic() + 15
    while time.monotonic() < drain and any(p.is_alive() for p in subs):
        time.sleep(0.02)
    shared.stop.value = 2
    for p in subs + ([probe] if probe else []):
        p.join(10)
        if p.is_alive():
            p.kill()
    sent = sum(shared.sent)
    received = sum(shared.received)
    last = max(shared.last, default=0) or started
    elapsed = (last - started) / 1e9
    wall = (time.perf_counter_ns() - started) / 1e9
    cpu = broker.cpu_seconds() - cpu_before
    result = {
        "sent": sent,
        "delivered": received,
        "lost": sent * subscribers - received,
        "per_second": received / elapsed if elapsed > 0 else 0.0,
        "errors": shared.errors.value,
        # Share of one core used while the scenario ran (and drained).
        "broker_cpu": round(cpu / wall, 2),
        # The same CPU time per message delivered, drain included; the
        # probe's 100 round trips a second are in it, a small share at
        # any rate worth measuring.
        "cpu_us_per_message": round(cpu / received * 1e6, 2) if received else None,
        "load_cpu": round(sum(shared.cpu) / wall, 2),
    }
    if probe_count:
        result.update(_percentiles(latencies))
    return result


def _percentiles(latencies):
    """
    The probe's round trips (ns; -1 for one sent that never came back, 0
    for one never sent): how many came back and how many did not, and
    p50/p99/max in ms, those that did not ranked above the slowest.
    """
    values = sorted(v / 1e6 for v in latencies if v > 0)
    lost = sum(1 for v in latencies if v < 0)
    if not values:
        return {"probes": 0, "probes_lost": lost}
    return {
        "probes": len(values),
        "probes_lost": lost,
        "p50_ms": nearest_rank(values, 0.5, lost),
        "p99_ms": nearest_rank(values, 0.99, lost),
        # Of those that came back.
        "max_ms": values[-1],
    }


@contextlib.contextmanager
def dashboard_open(http_port, workdir, cpu=None):
    """mqttgw's dashboard in headless Chromium, on the Topics view; on ``cpu`` with the load."""
    import shutil

    from tests.cdp import Chromium

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("the dashboard scenario needs chromium")
    browser = Chromium(
        chromium, Path(tempfile.mkdtemp(prefix="chromium-", dir=workdir)),
        None if cpu is None else {cpu},
    )
    try:
        page = browser.page()
        page.go(f"http://127.0.0.1:{http_port}/#topics")
        page.wait_for("document.querySelector('#connection').dataset.state === 'up'")
        yield page
    finally:
        browser.close()


def _pinned(cpu, target, *args):
    _pin(cpu)
    target(*args)


def run_connections(broker, count, cpu=None):
    ctx = _ctx()
    results = ctx.RawArray("d", 4)
    before = broker.rss_kib()
    p = ctx.Process(target=_pinned, args=(cpu, loadgen.hold_connections, broker.port, count, 200, results))
    p.start()
    deadline = time.monotonic() + 300
    while not results[2] and p.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # let the broker settle after the last CONNACK
    after = broker.rss_kib()
    held = int(results[2])
    results[1] = 1
    p.join(60)
    return {
        "connections": held,
        "failed": int(results[3]),
        "connects_per_second": results[0],
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_connection": (after - before) / held if held else None,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per throughput scenario")
    parser.add_argument(
        "--brokers", nargs="+", default=DEFAULT_BROKERS, choices=list(BROKERS),
        help="mqttgw-baseline: the checkout MQTTGW_BASELINE names, for old against new",
    )
    parser.add_argument("--durability", choices=["fsync", "os"], default=None, help="mqttgw's store durability (default: its own default)")
    parser.add_argument("--scenarios", nargs="+", default=ALL_SCENARIOS, choices=ALL_SCENARIOS)
    parser.add_argument("--connections", type=int, default=10_000, help="idle connections to hold")
    parser.add_argument("--storm", type=int, default=10_000, help="clients connecting at once in the storm scenario")
    parser.add_argument(
        "--mqttsn-subscribers", type=int, default=1000, help="MQTT-SN subscribers in the mqtt-sn fan-out row",
    )
    parser.add_argument("--backlog", type=int, default=100_000, help="messages in the backlog and bridge drain scenarios")
    parser.add_argument("--retained", type=int, default=1_000_000, help="retained topics stored for the retained scenario")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each drain and storm scenario, the median reported")
    parser.add_argument(
        "--rate-repeats", type=int, default=1,
        help="runs of each throughput scenario, the brokers taking turns, the median reported",
    )
    parser.add_argument("--json", default=str(RESULTS.with_suffix(".json")))
    parser.add_argument("--no-pin", action="store_true", help="do not pin broker and load to separate CPUs")
    parser.add_argument(
        "--neighbours", nargs="+", default=list(neighbours.BEHAVIOURS), choices=list(neighbours.BEHAVIOURS),
        help="the hostile behaviours beside the calm clients (default: all)",
    )
    parser.add_argument(
        "--turns", metavar="DIR",
        help="run mqttgw under bench/turns.py, its long reactor turns logged in DIR (figures are then not comparable)",
    )
    args = parser.parse_args(argv)

    cpus = sorted(os.sched_getaffinity(0))
    broker_cpu, load_cpu = (None, None) if args.no_pin or len(cpus) < 2 else (cpus[0], cpus[1])
    results = {name: {} for name in args.brokers}
    # mqttgw first: the latency scenario runs at half its top QoS 0 rate.
    order = sorted(args.brokers, key=lambda n: n != "mqttgw")
    rates = {}
    with tempfile.TemporaryDirectory(prefix="mqttgw-bench-") as workdir:
        auth_files = logins.write_files(Path(workdir))
        # Scenario by scenario, the brokers in turn: this machine's speed
        # drifts by 10-20% over minutes, so the figures a ratio compares
        # are taken a minute apart, not a broker's whole run apart.
        for scenario in args.scenarios:
            runs = {name: [] for name in order}
            for _ in range(_repeats(scenario, args)):
                for name in order:
                    r = _run_once(name, scenario, args, workdir, auth_files, broker_cpu, load_cpu, rates)
                    if r is not None:
                        runs[name].append(r)
            for name in order:
                if runs[name]:
                    results[name][scenario] = _median(scenario, runs[name])
            if scenario == STORM and "mqttgw" in results and STORM in results["mqttgw"]:
                # Where a connect's CPU goes, by part (bench/connect_cost.py).
                cost = connect_cost.run(min(args.storm, BREAKDOWN_CONNECTIONS))
                results["mqttgw"][STORM]["per_connect"] = cost
                print(f"{'mqttgw':10} {STORM}: {connect_cost.summary(cost)}", flush=True)
            if scenario == "fan-in qos0" and scenario in results.get("mqttgw", {}):
                # The latency scenario runs at half mqttgw's top QoS 0 rate.
                rates["latency"] = results["mqttgw"][scenario]["per_second"] / 2

    report = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
        "settings": {
            "payload_bytes": PAYLOAD, "window": WINDOW, "batch": BATCH,
            "max_inflight": MAX_INFLIGHT, "max_queued": MAX_QUEUED, "max_queued_windowed": WINDOWED_QUEUED,
            "duration_s": args.duration, "pinned": broker_cpu is not None,
            "neighbours": args.neighbours,
        },
        "results": results,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    text = rst(report, argv)
    path.with_suffix(".rst").write_text(text)
    if path.with_suffix(".rst").resolve() == RESULTS and PythonFloor.name in args.brokers:
        # Not a broker: its column of dashes has no place in the README.
        print(f"README not updated: {PythonFloor.name} is among the brokers", flush=True)
    elif path.with_suffix(".rst").resolve() == RESULTS:
        # The README shows the rates table of the manual's performance page.
        README.write_text(with_results(README.read_text(), headline(text)))
    print()
    print(table(results))
    print(f"\nfigures written to {path} and {path.with_suffix('.rst')}")
    return report


def headline(results):
    """
    The results file's opening line and first table (the rates and
    ratios): what the README shows of it, the rest being the manual's.
    """
    lines = results.split("\n")
    borders = [i for i, line in enumerate(lines) if line.startswith("=")]
    return "\n".join(lines[: borders[2] + 1]) + "\n" if len(borders) >= 3 else results


def readme_results(readme):
    """The results table ``readme`` holds between its markers."""
    _, rest = readme.split(RESULTS_BEGIN + "\n\n", 1)
    return rest.split("\n" + RESULTS_END, 1)[0]


def with_results(readme, results):
    """``readme`` with ``results`` between its markers, in place of what was there."""
    head, rest = readme.split(RESULTS_BEGIN + "\n\n", 1)
    tail = rest.split("\n" + RESULTS_END, 1)[1]
    return head + RESULTS_BEGIN + "\n\n" + results + "\n" + RESULTS_END + tail


def rst(report, argv):
    """The run's table as reStructuredText, for the manual to include."""
    machine = report["machine"]
    options = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"The last run, on a {machine['cpus']}-core machine (Python {machine['python']}"
        + (f", ``{options}``):" if options else "):"),
        "",
    ]
    for block in _blocks(table(report["results"])):
        lines += _rst_block(block)
    return "\n".join(lines).rstrip() + "\n"


def _blocks(text):
    """``text``'s runs of lines between blank lines."""
    block = []
    for line in text.split("\n") + [""]:
        if line:
            block.append(line)
        elif block:
            yield block
            block = []


_NO_FIGURE = re.compile(r"(^|  )-(?= |$)")


def _rst_block(block):
    """
    A block of the table's text as reStructuredText: a table (its header
    over a line of dashes) as a simple table; every other line (notes,
    5.0 ratios, connections, a table's title) a paragraph of its own.
    """
    rule = next((i for i, line in enumerate(block) if i and "-" in line and not line.strip("- ")), None)
    if rule is None:
        return [x for line in block for x in (line, "")]
    border = block[rule].replace("-", "=")
    # A cell that is or begins with a lone "-" would be a bullet list there:
    # an en dash, as wide, reads the same.
    rows = [_NO_FIGURE.sub("\\1\u2013", r.rstrip()) for r in block[rule + 1:]]
    paragraphs = [x for line in block[:rule - 1] for x in (line, "")]
    return paragraphs + [border, block[rule - 1].rstrip(), border] + rows + [border, ""]


def _repeats(scenario, args):
    """
    Runs of ``scenario`` per broker.  A drain is one event of a few
    seconds, not a rate held for --duration: --repeats of them.  A
    throughput figure moves by 10-20% between runs on a shared machine:
    --rate-repeats of them, for a median that one slow minute cannot set.
    """
    if scenario in DRAINS or scenario == STORM:
        return args.repeats
    if scenario in THROUGHPUT:
        return args.rate_repeats
    return 1


def _run_once(name, scenario, args, workdir, auth_files, broker_cpu, load_cpu, rates):
    """
    One run of ``scenario`` on a fresh ``name`` broker: its figures, or
    None where that broker cannot run it.  ``rates`` carries mqttgw's top
    rates to the scenarios held at a share of them.
    """
    if name == PythonFloor.name and scenario != STORM:
        # It answers a CONNECT and nothing else.
        return None
    options = ["--durability", args.durability] if args.durability and name == "mqttgw" else []
    auth = None
    # Where the load generator's window bounds what is outstanding (at
    # most 1,000), no queue can reach a bound; mosquitto 2.0.11 miscounts
    # its queues and drops QoS 1/2 messages ("Outgoing messages are being
    # dropped") well before 10,000, so every broker gets one it cannot reach.
    max_queued = WINDOWED_QUEUED if scenario in WINDOWED else MAX_QUEUED
    bridge_config = None
    if scenario in DRAINS:
        if name == "amqtt":
            return None
        max_queued = args.backlog
        if scenario == BRIDGE_DRAIN and name.startswith("mqttgw"):
            bridge_config = drain.bridge_config(Path(workdir), free_port(), args.backlog)
            options = options + ["--config", str(bridge_config)]
        elif scenario == BRIDGE_DRAIN:
            upstream_port = free_port()
            options = drain.mosquitto_bridge_lines(upstream_port)
    if scenario == DASHBOARD:
        if name != "mqttgw":
            return None
        http_port = free_port()
        options = options + ["--http", f"tcp:{http_port}:interface=127.0.0.1"]
    if scenario in V5_SCENARIOS and name == "amqtt":
        return None
    if scenario == FOOTPRINT:
        return _footprint(name, args, workdir, broker_cpu, load_cpu, options)
    if scenario == MQTTSN:
        return _mqttsn(name, args, workdir, broker_cpu, load_cpu)
    if scenario == STORM and burst.too_many(args.storm):
        print(f"{name:10} {STORM}: {args.storm:,} skipped ({burst.too_many(args.storm)})", flush=True)
        return None
    if scenario in AUTH_SCENARIOS:
        if name == "amqtt":
            return None
        key = "password_file" if scenario == LOGINS else "acl_file"
        auth = {key: auth_files[key]}
    broker = BROKERS[name](workdir, broker_cpu, options, auth, max_queued)
    if args.turns and name.startswith("mqttgw"):
        Path(args.turns).mkdir(parents=True, exist_ok=True)
        broker.turns_log = Path(args.turns).resolve() / f"{name}-{scenario.replace(' ', '-')}.log"
    broker.start()
    try:
        print(f"{name:10} {scenario} ...", end=" ", flush=True)
        if scenario == DASHBOARD:
            with dashboard_open(http_port, Path(workdir), load_cpu) as page:
                before = page.metrics()
                r = run_throughput(
                    broker, 4, 1, 0, args.duration, probe_count=_probes(args), cpu=load_cpu
                )
                after = page.metrics()
                r["page_busy"] = round(
                    (after["TaskDuration"] - before["TaskDuration"]) / args.duration, 2
                )
            print(
                f"{r['per_second']:,.0f}/s lost {r['lost']}, page main thread"
                f" {r['page_busy']:.0%} busy (broker CPU {r['broker_cpu']:.0%}); {beside(r)}",
                flush=True,
            )
        elif scenario in THROUGHPUT:
            pubs, subs, qos = THROUGHPUT[scenario]
            # Over WebSocket too, the probe connects over TCP: it measures
            # the broker's delay beside the load, not the transport's.
            r = run_throughput(
                broker, pubs, subs, qos, args.duration, probe_count=_probes(args), cpu=load_cpu,
                websocket=(
                    None if not scenario.endswith(" ws")
                    else "publishers" if pubs > 1 else "subscribers"
                ),
                persistent=scenario.endswith(" persistent"),
                v5=scenario in V5_SCENARIOS,
                alias=scenario.endswith(" aliases"),
            )
            print(
                f"{r['per_second']:,.0f}/s lost {r['lost']}"
                f" (broker CPU {r['broker_cpu']:.0%}, load CPU {r['load_cpu']:.0%}); {beside(r)}",
                flush=True,
            )
        elif scenario == "latency":
            rate = rates.get("latency") or 10_000
            r = run_throughput(
                broker, 4, 1, 0, args.duration, rate=rate,
                probe_count=_probes(args), cpu=load_cpu,
            )
            r["rate"] = rate
            print(f"p50 {r.get('p50_ms', 0):.2f} ms p99 {r.get('p99_ms', 0):.2f} ms at {rate:,.0f}/s", flush=True)
        elif scenario == IDLE_LATENCY:
            r = run_throughput(broker, 0, 0, 0, args.duration, probe_count=_probes(args), cpu=load_cpu)
            print(f"p50 {r.get('p50_ms', 0):.2f} ms p99 {r.get('p99_ms', 0):.2f} ms, nothing beside", flush=True)
        elif scenario in PROBED:
            share = PROBED[scenario]
            rate = share * rates["qos1"] if share and rates.get("qos1") else None
            r = run_throughput(
                broker, 4, 1, 1, args.duration, rate=rate,
                probe_count=_probes(args), cpu=load_cpu,
            )
            if share is None and name == "mqttgw":
                rates["qos1"] = r["per_second"]
            r["rate"] = rate
            print(
                f"p50 {r.get('p50_ms', 0):.2f} ms p99 {r.get('p99_ms', 0):.2f} ms"
                f" beside {r['per_second']:,.0f}/s lost {r['lost']}",
                flush=True,
            )
        elif scenario in DRAINS:
            runner = functools.partial(_pinned, load_cpu)
            if bridge_config is not None:
                r = drain.bridge(broker, bridge_config, args.backlog, Path(workdir), load_cpu, _ctx(), runner)
            elif scenario == BRIDGE_DRAIN:
                # mosquitto's own bridge, into the same upstream.
                r = drain.mosquitto_bridge(
                    broker, upstream_port, args.backlog, Path(workdir), load_cpu, _ctx(), runner
                )
            else:
                r = drain.backlog(broker, args.backlog, _ctx(), runner)
            print(
                f"{r['received']:,} of {r['messages']:,} in {r['seconds']} s"
                f" ({r['per_second']:,.0f}/s), {r['out_of_order']} out of order,"
                f" {r['repeated']} repeated; queued in {r['queued_s']} s",
                flush=True,
            )
        elif scenario == STORM:
            r = burst.run(broker, args.storm, _ctx(), functools.partial(_pinned, load_cpu))
            print(burst.summary(r), flush=True)
        elif scenario == LOGINS:
            r = logins.run(broker)
            print(
                f"{r['logins']} logins in {r['seconds']} s ({r['connects_per_second']:,.0f}/s);"
                f" probe p99 {r['probe_p99_ms'] or 0:.2f} ms over {r['probe_round_trips']} round trips",
                flush=True,
            )
        elif scenario == RETAINED:
            r = retained.run(broker, args.retained)
            print(
                f"{r['stored']:,} stored in {r['load_s']} s; "
                + ", ".join(f"{f} {r[f]['ms']} ms for {r[f]['matched']}" for f in retained.FILTERS),
                flush=True,
            )
        elif scenario in NEIGHBOURS:
            r = neighbours.run(
                broker, args.duration, NEIGHBOURS[scenario], _ctx(),
                functools.partial(_pinned, load_cpu), args.neighbours,
            )
            print(
                f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms, lost {r['lost']}"
                f" of {r['sent']}, peak RSS {r['peak_rss_mib']} MiB",
                flush=True,
            )
        else:
            r = run_connections(broker, args.connections, cpu=load_cpu)
            kib = r["kib_per_connection"]
            print(f"{r['connections']} held, {kib if kib is None else round(kib, 1)} KiB each, {r['connects_per_second']:,.0f} connects/s", flush=True)
        return r
    finally:
        broker.stop()


def _probes(args):
    """Round trips a probe makes in a run: 100 a second."""
    return int(args.duration * 100)


def beside(r):
    """A throughput run's probe percentiles and broker CPU per message, for its printed line."""
    lost = f", {r['probes_lost']} never back" if r.get("probes_lost") else ""
    probe = (
        f"probe p50 {_cell(r['p50_ms'])} p99 {_cell(r['p99_ms'])} max {r['max_ms']:.2f} ms{lost}"
        if r.get("probes") else "probe: no round trip"
    )
    cpu = r.get("cpu_us_per_message")
    return probe + (f", broker {cpu:.1f} us/msg" if cpu is not None else ", nothing delivered")


def _footprint(name, args, workdir, broker_cpu, load_cpu, options):
    """The footprint figures of ``name`` (amqtt's listeners are not configurable here)."""
    if name == "amqtt":
        return None
    make = functools.partial(BROKERS[name], workdir, broker_cpu, options)
    # What the gateway adds to Twisted's reactor alone.
    baseline = functools.partial(ReactorAlone, workdir, broker_cpu) if name.startswith("mqttgw") else None
    print(f"{name:10} {FOOTPRINT} ...", end=" ", flush=True)
    r = footprint.run(
        make, Path(tempfile.mkdtemp(prefix="pki-", dir=workdir)),
        [args.connections, 5 * args.connections],
        lambda broker, count: run_connections(broker, count, cpu=load_cpu),
        make_baseline=baseline,
    )
    if name.startswith("mqttgw"):
        # Where an idle connection's memory goes, by kind of object.
        r["per_connection"] = connection_cost.run(min(args.connections, BREAKDOWN_CONNECTIONS))
    print(footprint.summary(name, r), flush=True)
    return r


def _mqttsn(name, args, workdir, broker_cpu, load_cpu):
    """The MQTT-SN rows, mqttgw's alone: the others have no MQTT-SN listener."""
    if name != "mqttgw":
        return None
    print(f"{name:10} {MQTTSN} ...", flush=True)
    rows = mqttsn.run(
        workdir, args.duration, args.mqttsn_subscribers, args.connections,
        broker_cpu=broker_cpu, load_cpu=load_cpu,
    )
    for line in mqttsn.summary(rows):
        print(f"{name:10} {line}", flush=True)
    return rows


def _median(scenario, runs):
    """
    The run whose figure is the median (the lower of the middle two), with
    every run's figure beside it; but the first run that lost a message or
    delivered one out of order or twice, if any did: a median must not
    hide it.
    """
    flawed = [r for r in runs if r.get("lost") or r.get("out_of_order") or r.get("repeated")]
    ranked = sorted(runs, key=lambda r: _figure(scenario, r) or 0)
    r = dict(flawed[0] if flawed else ranked[(len(ranked) - 1) // 2])
    if len(runs) > 1:
        r["runs"] = [_figure(scenario, run) for run in runs]
    if scenario == STORM:
        # Any run's retries, not the median's alone.
        r["syn_retries_runs"] = [(run["slow_connects"], run["listen_overflows"]) for run in runs]
    return r


def _figure(scenario, r):
    if r is None:
        return None
    if scenario in THROUGHPUT or scenario in DRAINS:
        return r["per_second"]
    if scenario == STORM:
        return r["connects_per_second"]
    if scenario in NEIGHBOURS and not r.get("sent"):
        # The well-behaved clients could not send at all: no latency.
        return None
    if scenario in ("latency", IDLE_LATENCY) or scenario in PROBED or scenario in NEIGHBOURS:
        return r.get("p99_ms")
    if scenario == RETAINED:
        return r["ret/7/+"]["ms"]
    if scenario == LOGINS:
        return r["connects_per_second"]
    if scenario == FOOTPRINT:
        return r["rss_idle_tcp_kib"] / 1024
    if scenario == MQTTSN:
        return r["mqtt-sn fan-in qos0 10 clients"]["per_second"]
    return r["kib_per_connection"]


def _unsound(scenario, results, pair):
    """
    Why a throughput ratio between ``pair`` would mislead, or None.  A
    message a broker loses keeps one place of its publisher's window
    taken for the rest of the run, so the loser's rate is understated by
    its own fault (see WINDOWED_QUEUED for how mosquitto 2.0.11 lost them).
    """
    if scenario not in THROUGHPUT:
        return None
    lost = [(n, results[n].get(scenario, {}).get("lost")) for n in pair]
    lost = [(n, k) for n, k in lost if k]
    if not lost:
        return None
    return "; ".join(f"{n} lost {k} messages, which stall its publishers" for n, k in lost)


def table(results):
    """Rows: scenario; columns: each broker's figure, then mqttgw's ratios."""
    names = list(results)
    others = [n for n in names if n != "mqttgw"]
    header = ["scenario"] + names + [f"mqttgw/{o}" for o in others if "mqttgw" in names]
    rows = []
    notes = []
    scenarios = [s for s in ALL_SCENARIOS if s != MQTTSN and any(s in results[n] for n in names)]
    for s in scenarios:
        unit = {
            "connections": " (KiB/conn)", RETAINED: " (ms, ret/7/+)", LOGINS: " (connects/s)",
            FOOTPRINT: " (MiB idle, TCP only)", STORM: " (connects/s)",
        }.get(
            s, " (p99 ms)" if s in ("latency", IDLE_LATENCY) or s in PROBED or s in NEIGHBOURS else " (msg/s)"
        )
        row = [s + unit]
        figures = {n: _figure(s, results[n].get(s)) for n in names}
        for n in names:
            f = figures[n]
            lost = results[n].get(s, {}).get("lost")
            cell = "-" if f is None else (f"{f:,.0f}" if s in THROUGHPUT or s in DRAINS or s == STORM else f"{f:.2f}")
            if f is None and s in NEIGHBOURS and s in results[n]:
                cell += " (none sent)"
            if lost:
                cell += f" (lost {lost})"
            row.append(cell)
        if "mqttgw" in names:
            for o in others:
                a, b = figures["mqttgw"], figures[o]
                refused = _unsound(s, results, ("mqttgw", o))
                if refused and a and b:
                    row.append("- (lost)")
                    notes.append(f"mqttgw/{o} not given for {s}: {refused} (it would be {a / b:.2f})")
                else:
                    row.append(f"{a / b:.2f}" if a and b else "-")
        rows.append(row)
    conn = [n for n in names if "connections" in results[n]]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    if notes:
        out += [""] + notes
    beside_load = load_table(results)
    if beside_load:
        out += [""] + beside_load
    versions = [n for n in names if "fan-in qos1" in results[n] and results[n].keys() & V5_SCENARIOS]
    if versions:
        out.append("")
        for n in versions:
            base = results[n]["fan-in qos1"]["per_second"]
            ratios = ", ".join(
                f"{s} {results[n][s]['per_second'] / base:.2f}" for s in sorted(V5_SCENARIOS) if s in results[n] and base
            )
            out.append(f"{n}: over 5.0 against fan-in qos1 over 3.1.1: {ratios}")
    footprints = [n for n in names if FOOTPRINT in results[n]]
    if footprints:
        out.append("")
        out += [footprint.summary(n, results[n][FOOTPRINT]) for n in footprints]
    storms = [n for n in names if STORM in results[n]]
    if storms:
        out.append("")
        for n in storms:
            r = results[n][STORM]
            runs = ", ".join(f"{x:,.0f}" for x in r.get("runs", [r["connects_per_second"]]))
            retries = ", ".join(f"{a}/{b}" for a, b in r["syn_retries_runs"])
            out.append(
                f"{n}: storm {burst.summary(r)}; connects/s of each run: {runs};"
                f" slow connects/listen overflows of each run: {retries}"
                + (f"; {connect_cost.summary(r['per_connect'])}" if "per_connect" in r else "")
            )
    if MQTTSN in results.get("mqttgw", {}):
        # The anchor: the Paho MQTT-SN Gateway in front of mosquitto (mqttsn.ANCHOR).
        out += [""] + mqttsn.summary(results["mqttgw"][MQTTSN])
    if conn:
        out.append("")
        for n in conn:
            r = results[n]["connections"]
            out.append(f"{n}: {r['connections']} idle connections held, {r['connects_per_second']:,.0f} connects/s")
    return "\n".join(out)


def load_table(results):
    """
    The lines of the table beside the rates: rows, the throughput scenarios
    run with a probe; columns, each broker's probe p99 and CPU per message
    delivered, then mqttgw's ratios of p99 (lower is better).  ASCII only:
    it goes to the README and the manual too.
    """
    names = list(results)
    others = [n for n in names if n != "mqttgw"] if "mqttgw" in names else []
    scenarios = [s for s in THROUGHPUT if any(_beside(results[n].get(s)) for n in names)]
    if not scenarios:
        return []
    header = ["scenario"]
    for n in names:
        header += [f"{n} p99 ms", f"{n} us/msg"]
    header += [f"mqttgw/{o} p99" for o in others]
    rows = []
    for s in scenarios:
        p99 = {n: results[n].get(s, {}).get("p99_ms") for n in names}
        row = [s]
        for n in names:
            r = results[n].get(s, {})
            lost = r.get("probes_lost")
            # A p99 among the probes that never came back is no figure.
            row += [_cell(p99[n]) + (f" (lost {lost})" if lost else ""), _cell(r.get("cpu_us_per_message"))]
        row += [_cell(p99["mqttgw"] / p99[o] if p99["mqttgw"] and p99[o] else None) for o in others]
        rows.append(row)
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return [
        "Beside the load: the probe's p99 round trip in ms (QoS 0 over TCP, 100 a second)"
        " and the broker's CPU per message delivered in us.",
        line(header), line(["-" * w for w in widths]),
    ] + [line(r) for r in rows]


def _beside(r):
    """Whether a throughput result has figures beside its rate (older reports have none)."""
    return r is not None and ("p99_ms" in r or r.get("cpu_us_per_message") is not None)


def _cell(figure):
    return "-" if figure is None else f"{figure:.2f}"


if __name__ == "__main__":
    main()

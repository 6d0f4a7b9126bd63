"""
What tracing costs.  Two parts, each run in turns so that the machine's
drift falls on both sides of a comparison:

- unreachable collector: the same steady QoS 1 fan-in (4 publishers, 1
  subscriber, ``--rate`` messages a second in all) with the probe's round
  trips, through a gateway without tracing and through one tracing at
  ``--unreachable-ratio`` (0.01, a site's sampling; 1.0 traces every
  message) to a loopback port nothing listens on; delivered/s, lost, probe p50/p99, broker CPU per message, the p99
  ratio traced/untraced, and the spans the traced gateway counted in
  ``/metrics`` as failed and dropped;
- throughput: fan-in QoS 0 and QoS 1 as fast as the publishers go (as
  ``python -m bench`` runs them) with tracing off, sampling 0.01 and 1.0,
  exporting to an OTLP/HTTP receiver that accepts and discards; each
  rate, its ratio to off, and what tracing every message adds to the
  broker's CPU per message.

With tracing off nothing of OpenTelemetry is loaded, as without the
``otel`` extra.

    python -m bench.tracing                       # 60 s unreachable runs, 10 s rate runs, 3 of each
    python -m bench.tracing --duration 10 --repeats 1 --rate-repeats 1 --json out.json
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench.brokers import Mqttgw, free_port
from bench.run import THROUGHPUT, run_throughput

# Figures whose median is reported; lost messages and probes are summed
# over the runs instead, as a median must not hide a loss.
FIGURES = ("per_second", "p50_ms", "p99_ms", "cpu_us_per_message", "broker_cpu")
SUMMED = ("lost", "probes_lost", "errors")
# The sampling ratios of the throughput part; None is tracing off.
MODES = {"off": None, "0.01": 0.01, "1.0": 1.0}
RATE_SCENARIOS = ("fan-in qos0", "fan-in qos1")
UNREACHABLE = ("untraced", "unreachable")
# Seconds to wait after a run for the traced gateway's first failed export
# to be counted: the exporter gives a batch up after 5 s of retries.
FAILED_WAIT = 15.0
SPANS = "mqttgw_trace_spans_total"

# An OTLP/HTTP traces receiver that reads each request and answers 200
# with an empty ExportTraceServiceResponse (an empty protobuf message is
# zero bytes).  A process of its own, as bench/sysmetrics.py's scraper:
# a thread here would change how the load generator's processes start.
RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Discard(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Discard)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def unreachable_endpoint():
    """An OTLP/HTTP URL on a loopback port that was free a moment ago, and nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


@contextlib.contextmanager
def discarding_receiver(cpu=None):
    """The URL of a RECEIVER running on ``cpu`` (the load's, not the broker's)."""
    preexec = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    process = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, preexec_fn=preexec, text=True
    )
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        process.kill()
        process.wait()


def span_counts(http_port):
    """``{outcome: count}`` of ``mqttgw_trace_spans_total`` in the gateway's ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith(SPANS + "{"):
            labels, value = line[len(SPANS) + 1:].rsplit("} ", 1)
            outcome = dict(pair.split("=", 1) for pair in labels.split(","))["outcome"].strip('"')
            counts[outcome] = int(float(value))
    return counts


def counts_once_failed(http_port, timeout=FAILED_WAIT):
    """The span counts once a failed export has been counted, or as they are after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    counts = span_counts(http_port)
    while not counts.get("failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        counts = span_counts(http_port)
    return counts


def one_run(workdir, cpus, endpoint, ratio, run, wait_failed=False):
    """
    ``run(broker, load_cpu)``'s result through a gateway tracing at
    ``ratio`` to ``endpoint`` (not tracing if ``ratio`` is None), with
    the span counts of its ``/metrics`` beside.
    """
    broker_cpu, load_cpu = cpus
    http = free_port()
    options = ["--http", str(http)]
    if ratio is not None:
        options += ["--otel-endpoint", endpoint, "--otel-sample-ratio", str(ratio)]
    broker = Mqttgw(workdir, broker_cpu, options).start()
    try:
        r = run(broker, load_cpu)
        r["spans"] = counts_once_failed(http) if wait_failed else span_counts(http)
    finally:
        broker.stop()
    return r


def summary(runs):
    """The medians of FIGURES over ``runs``, SUMMED summed, every run's rate and p99 beside."""
    r = {}
    for key in FIGURES:
        values = [run[key] for run in runs if run.get(key) is not None]
        r[key] = statistics.median(values) if values else None
    for key in SUMMED:
        r[key] = sum(run.get(key) or 0 for run in runs)
    r["runs"] = [
        {"per_second": run["per_second"], "p99_ms": run.get("p99_ms"), "spans": run["spans"]}
        for run in runs
    ]
    # The spans of the median run by rate: counts are not averaged.
    r["spans"] = sorted(runs, key=lambda run: run["per_second"])[(len(runs) - 1) // 2]["spans"]
    return r


def in_turns(modes, repeats, one):
    """``{mode: [result, ...]}`` from ``one(mode)``, the modes' order rotated every repeat."""
    names = list(modes)
    runs = {name: [] for name in names}
    for i in range(repeats):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            print(f"  run {i + 1} {name} ...", end=" ", flush=True)
            r = one(name)
            runs[name].append(r)
            print(_line(r), flush=True)
    return runs


def unreachable(workdir, cpus, args):
    """DW2: steady QoS 1 fan-in with the probe, untraced and tracing every message to nowhere."""
    endpoint = unreachable_endpoint()
    probes = int(args.duration * 100)

    def load(broker, load_cpu):
        return run_throughput(
            broker, 4, 1, 1, args.duration, rate=args.rate, probe_count=probes, cpu=load_cpu
        )

    print(f"unreachable collector ({endpoint}), QoS 1 fan-in at {args.rate:,.0f}/s", flush=True)
    ratios = {"untraced": None, "unreachable": args.unreachable_ratio}
    runs = in_turns(
        UNREACHABLE, args.repeats,
        lambda mode: one_run(workdir, cpus, endpoint, ratios[mode], load, ratios[mode] is not None),
    )
    r = {mode: summary(runs[mode]) for mode in UNREACHABLE}
    a, b = r["untraced"]["p99_ms"], r["unreachable"]["p99_ms"]
    r["p99_ratio"] = b / a if a and b else None
    r["rate"] = args.rate
    r["sample_ratio"] = args.unreachable_ratio
    r["endpoint"] = endpoint
    return r


def throughput(workdir, cpus, args):
    """DW3: fan-in QoS 0 and QoS 1 as fast as they go, tracing off, at 0.01 and at 1.0."""
    probes = int(args.rate_duration * 100)
    results = {}
    with discarding_receiver(cpus[1]) as endpoint:
        for scenario in RATE_SCENARIOS:
            pubs, subs, qos = THROUGHPUT[scenario]

            def load(broker, load_cpu):
                return run_throughput(broker, pubs, subs, qos, args.rate_duration, probe_count=probes, cpu=load_cpu)

            print(f"{scenario}, spans to a receiver that discards them ({endpoint})", flush=True)
            runs = in_turns(MODES, args.rate_repeats, lambda mode: one_run(workdir, cpus, endpoint, MODES[mode], load))
            results[scenario] = with_ratios({mode: summary(runs[mode]) for mode in MODES})
    return results


def with_ratios(modes):
    """Each mode's rate ratio to off, and the CPU per message 1.0 adds to off's ("cost_us")."""
    off = modes["off"]
    for r in modes.values():
        r["ratio"] = r["per_second"] / off["per_second"] if off["per_second"] else None
    a, b = off["cpu_us_per_message"], modes["1.0"]["cpu_us_per_message"]
    modes["cost_us"] = b - a if a is not None and b is not None else None
    return modes


def _line(r):
    cpu = r.get("cpu_us_per_message")
    spans = ", ".join(f"{k} {v}" for k, v in sorted(r["spans"].items()) if v)
    return (
        f"{r['per_second']:,.0f}/s lost {r['lost']}, p50 {_ms(r.get('p50_ms'))} p99 {_ms(r.get('p99_ms'))} ms,"
        f" broker {_ms(cpu)} us/msg, {r['broker_cpu']:.0%} of a core; spans: {spans or 'none'}"
    )


def _ms(value):
    return "-" if value is None else f"{value:.2f}"


def _share(value):
    """A share of one core, as a percentage."""
    return "-" if value is None else f"{value:.0%}"


def _ratio(value):
    return "-" if value is None else f"{value:.3f}"


def table(results):
    """The printed table of both parts."""
    out = []
    u = results.get("unreachable")
    if u:
        out.append(
            f"Unreachable collector: QoS 1 fan-in at {u['rate']:,.0f}/s, sampling {u['sample_ratio']:g} (medians)"
        )
        out.append(
            f"{'gateway':<12}{'msg/s':>10}{'lost':>7}{'p50 ms':>9}{'p99 ms':>9}{'us/msg':>9}{'CPU':>6}"
            "  spans failed/dropped"
        )
        for mode in UNREACHABLE:
            r = u[mode]
            spans = f"{r['spans'].get('failed', 0)}/{r['spans'].get('dropped', 0)}"
            out.append(
                f"{mode:<12}{r['per_second']:>10,.0f}{r['lost']:>7}{_ms(r['p50_ms']):>9}"
                f"{_ms(r['p99_ms']):>9}{_ms(r['cpu_us_per_message']):>9}{_share(r['broker_cpu']):>6}  {spans}"
            )
        out.append(f"p99 unreachable/untraced: {_ratio(u['p99_ratio'])}")
    t = results.get("throughput")
    if t:
        out.append("")
        out.append("Throughput, spans exported to a receiver that discards them (medians)")
        out.append(
            f"{'scenario':<13}{'sampling':>9}{'msg/s':>10}{'lost':>7}{'/off':>7}{'us/msg':>9}{'CPU':>6}"
            "  spans exported/dropped"
        )
        for scenario, modes in t.items():
            for mode in MODES:
                r = modes[mode]
                spans = f"{r['spans'].get('exported', 0)}/{r['spans'].get('dropped', 0)}"
                out.append(
                    f"{scenario:<13}{mode:>9}{r['per_second']:>10,.0f}{r['lost']:>7}{_ratio(r['ratio']):>7}"
                    f"{_ms(r['cpu_us_per_message']):>9}{_share(r['broker_cpu']):>6}  {spans}"
                )
            out.append(f"{scenario}: tracing every message costs {_ms(modes['cost_us'])} us of broker CPU per message")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of each unreachable-collector run")
    parser.add_argument("--rate", type=float, default=5000.0, help="messages a second in all, unreachable-collector runs")
    parser.add_argument("--repeats", type=int, default=3, help="unreachable-collector runs of each gateway, in turns")
    parser.add_argument(
        "--unreachable-ratio", type=float, default=0.01, help="otel.sample_ratio of the unreachable-collector runs",
    )
    parser.add_argument("--rate-duration", type=float, default=10.0, help="seconds of each throughput run")
    parser.add_argument("--rate-repeats", type=int, default=3, help="throughput runs of each sampling, in turns")
    parser.add_argument("--parts", nargs="+", default=["unreachable", "throughput"], choices=["unreachable", "throughput"])
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--no-pin", action="store_true", help="do not pin broker and load to separate CPUs")
    args = parser.parse_args(argv)
    available = sorted(os.sched_getaffinity(0))
    cpus = (None, None) if args.no_pin or len(available) < 2 else (available[0], available[1])
    results = {}
    with tempfile.TemporaryDirectory(prefix="mqttgw-bench-tracing-") as workdir:
        if "unreachable" in args.parts:
            results["unreachable"] = unreachable(workdir, cpus, args)
        if "throughput" in args.parts:
            results["throughput"] = throughput(workdir, cpus, args)
    print()
    print(table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()

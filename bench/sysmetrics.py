"""
What $SYS and /metrics cost: fan-in QoS 0 through mqttgw with both off
(--sys-interval 0, no admin listener) and on ($SYS every second, /metrics
scraped every second), in alternating rounds of one run so that drift
between them cancels; reports the median of each and the median of the
rounds' on/off ratios.

    python -m bench.sysmetrics [--rounds 5] [--duration 8]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from bench.brokers import Mqttgw, free_port
from bench.run import THROUGHPUT, run_throughput

# GET /metrics every second, as Prometheus would (more often, in fact): in
# a process of its own, so that the load generator starts the same way
# (fork, with no other thread here) in both kinds of round.
SCRAPER = """
import sys, time, urllib.request
while True:
    time.sleep(1.0)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read()
    except OSError:
        pass
"""


def one_round(workdir, on, duration, cpus):
    broker_cpu, load_cpu = cpus
    http = free_port()
    options = ["--sys-interval", "1", "--http", str(http)] if on else ["--sys-interval", "0"]
    broker = Mqttgw(workdir, broker_cpu, options).start()
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, str(http)]) if on else None
    try:
        pubs, subs, qos = THROUGHPUT["fan-in qos0"]
        result = run_throughput(broker, pubs, subs, qos, duration, cpu=load_cpu)
    finally:
        if scraper is not None:
            scraper.kill()
            scraper.wait()
        broker.stop()
    return result["per_second"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.sysmetrics", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=8.0)
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    pinned = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    figures = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="mqttgw-bench-") as workdir:
        for i in range(args.rounds):
            for on in (False, True) if i % 2 == 0 else (True, False):
                rate = one_round(workdir, on, args.duration, pinned)
                figures[on].append(rate)
                print(f"round {i + 1} {'on ' if on else 'off'}: {rate:,.0f}/s", flush=True)
    off, on = statistics.median(figures[False]), statistics.median(figures[True])
    # Each round's pair ran back to back: their ratio is freest of drift.
    ratio = statistics.median(a / b for a, b in zip(figures[True], figures[False]))
    print(
        f"fan-in qos0: off {off:,.0f}/s, on {on:,.0f}/s (medians);"
        f" on/off {ratio:.3f} (median of the rounds' ratios): {(1 - ratio) * 100:.1f}% cost"
    )
    return {"off": off, "on": on, "ratio": ratio}


if __name__ == "__main__":
    main()

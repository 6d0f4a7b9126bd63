"""
A field site's backlog draining over a narrow uplink, unpaced and paced:
a site gateway in a network namespace bridged into mosquitto in another,
over a veth pair capped with tc's tbf.  The uplink is partitioned while a
device publishes readings, then healed while it goes on; the centre
records when each reading arrives.  Reported for each run: how long the
backlog took to drain, and how late the live readings (those published
after the heal) arrived while it drained.  Needs root and iproute2.

    python -m bench.fieldsite
    python -m bench.fieldsite --outage 60 --rate 20 --uplink 256kbit --pace 50
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.fieldsites import Client, MosquittoBroker
from tests.gateway import Gateway
from tests.topology import Topology


def run(pace, outage, rate, uplink, payload, workdir, after=60.0):
    topology = Topology(sites=1)
    [site] = topology.sites
    centre = gw = None
    clients = []
    try:
        topology.cap(site, uplink, burst="16kbit", latency="2s")
        centre = MosquittoBroker(topology.centre, workdir / "centre")
        (workdir / "site").mkdir(parents=True, exist_ok=True)
        lines = [
            "[[bridge]]", 'name = "centre"', f'addresses = ["{site.centre_address}:1883"]',
            "rules = ['sensors/# out 1']", "keepalive = 5", "reconnect_initial = 0.5",
            "reconnect_max = 2.0", "max_inflight_messages = 20",
        ]
        if pace:
            lines.append(f"drain_messages_per_second = {pace}")
        (workdir / "site" / "site.toml").write_text("\n".join(lines) + "\n")
        gw = Gateway(
            workdir / "site", "--config", str(workdir / "site" / "site.toml"),
            "--data-dir", str(workdir / "site" / "data"), "--tcp", "tcp:1883", "--durability", "os",
            prefix=["ip", "netns", "exec", site.name],
        )
        gw.wait_for_log("bridge centre: upstream accepted CONNECT", timeout=20)
        arrivals = {}
        watcher = Client(topology.centre.address, "watch")
        clients.append(watcher)
        watcher.client.on_message = lambda c, u, m: arrivals.setdefault(int(m.payload[:12]), time.time())
        watcher.subscribe("sensors/#", 1)
        device = Client(site.address, "device")
        clients.append(device)
        # When the bridge's link is up again: its retained state topic says 1.
        link_up = []
        device.client.on_message = lambda c, u, m: m.payload == b"1" and link_up.append(time.time())
        device.subscribe("mqttgw/bridge/centre/state", 0)
        sent = {}
        pad = b"x" * max(0, payload - 12)

        def publish_for(seconds, start):
            n = start
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                sent[n] = time.time()
                device.client.publish("sensors/t", b"%012d" % n + pad, 1)
                n += 1
                time.sleep(max(0.0, t0 + (n - start) / rate - time.monotonic()))
            return n

        n = publish_for(5, 0)
        topology.partition(site)
        n = publish_for(outage, n)
        backlog_end = n
        topology.heal(site)
        healed = time.time()
        n = publish_for(after, n)
        deadline = time.monotonic() + 300
        while len(arrivals) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        lost = n - len(arrivals)
        relinked = max((t for t in link_up if t >= healed), default=healed)
        # What waited: published before the link was up again.
        waited = [i for i in range(n) if sent[i] < relinked]
        backlog_end = len(waited)
        backlog_done = max(arrivals.get(i, relinked) for i in waited)
        # Live: published once the link was up, while the backlog drained.
        live = [arrivals[i] - sent[i] for i in range(backlog_end, n) if i in arrivals]
        during = [arrivals[i] - sent[i] for i in range(backlog_end, n) if i in arrivals and sent[i] <= backlog_done]
        return {
            "pace": pace or "unpaced",
            "messages": n,
            "backlog": backlog_end,
            "lost": lost,
            "relink_s": round(relinked - healed, 1),
            "drain_s": round(backlog_done - relinked, 1),
            "live_delay_during_drain_p50_s": round(statistics.median(during), 2) if during else None,
            "live_delay_during_drain_max_s": round(max(during), 2) if during else None,
            "live_delay_max_s": round(max(live), 2) if live else None,
        }
    finally:
        for c in clients:
            c.stop()
        if gw is not None:
            gw.stop()
        if centre is not None:
            centre.stop()
        topology.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.fieldsite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the uplink is partitioned")
    parser.add_argument("--rate", type=float, default=20.0, help="readings a second from the device")
    parser.add_argument("--uplink", default="256kbit", help="the uplink's rate (tc tbf)")
    parser.add_argument("--payload", type=int, default=200, help="bytes a reading")
    parser.add_argument("--pace", type=int, default=50, help="drain_messages_per_second for the paced run")
    parser.add_argument("--after", type=float, default=60.0, help="seconds of readings after the heal")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ["PATH"] += ":/usr/sbin"
    results = []
    with tempfile.TemporaryDirectory(prefix="mqttgw-fieldsite-") as tmp:
        for pace in (0, args.pace):
            r = run(pace, args.outage, args.rate, args.uplink, args.payload, Path(tmp) / f"run-{pace}", args.after)
            results.append(r)
            print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()

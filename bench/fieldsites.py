"""
Field sites bridged into one centre across bad uplinks, as they run in the
field: network namespaces joined by veth pairs (tests/topology.py), each
site's uplink capped with tc's tbf and passed through the fault proxy
(bench/faultproxy.py: delay with jitter, stalls, resets).  Each site runs a
field broker (an mqttgw gateway, or mosquitto with its own bridge) with
simulated devices (bench/devices.py, one connection each, QoS 0/1/2
readings); the centre runs mosquitto or an mqttgw gateway, where a watcher
records every reading's arrival and a commander sends each device QoS 1
commands.  Under way: one site is partitioned, another's field broker is
killed with SIGKILL and restarted, and the centre is restarted once.

Reported for each run: QoS 1/2 readings a field broker acknowledged that
never reached the centre (lost), duplicates by QoS, readings out of order,
commands lost or out of order, how long the partitioned site took to
drain its backlog after the heal and how late its live readings were
meanwhile, and how long the sites took to catch up after the centre's
restart.  Needs root and iproute2.

    python -m bench.fieldsites          # mqttgw unpaced and paced, and mosquitto; centre mosquitto
    python -m bench.fieldsites --field mqttgw --centre mqttgw
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

from tests.gateway import REPO, Gateway, gateway_env
from tests.topology import Topology


@dataclass
class Plan:
    """The scenario; times are seconds from the first reading."""

    sites: int = 8
    devices: int = 100
    interval: float = 2.0  # between a device's readings
    duration: float = 120.0  # of readings
    uplink: str = "2mbit"
    delay: float = 0.08
    jitter: float = 0.02
    stall_every: float = 25.0
    stall_for: float = 3.0
    reset_every: float = 40.0
    partition_at: float = 10.0
    partition_for: float = 60.0
    kill_at: float = 20.0
    kill_for: float = 5.0
    centre_restart_at: float = 40.0
    centre_down: float = 5.0  # seconds the centre is away when it restarts
    command_every: float = 10.0  # between commands to one device
    window: int = 20  # in-flight messages on each bridge
    pace: int = 50  # drain_messages_per_second of the "mqttgw-paced" field broker
    drain_timeout: float = 240.0


def _wait(what, predicate, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


def _mosquitto():
    path = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not os.path.exists(path):
        raise RuntimeError("mosquitto is not installed")
    return path


class MosquittoBroker:
    """mosquitto in a namespace; ``extra`` lines go into its configuration."""

    def __init__(self, namespace, workdir, extra=()):
        self.namespace = namespace
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "mosquitto.log"
        self.conf = self.workdir / "mosquitto.conf"
        self.conf.write_text("\n".join([
            "listener 1883",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "max_queued_messages 100000",
            "max_inflight_messages 20",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "user root",
            *extra,
        ]) + "\n")
        self.process = None
        self.start()

    def start(self):
        starts = self.log().count("listen socket on port 1883")
        self.process = self.namespace.popen([_mosquitto(), "-c", str(self.conf)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait("mosquitto start", lambda: self.log().count("listen socket on port 1883") > starts
              or self.process.poll() is not None, 15, 0.05)
        if self.process.poll() is not None:
            raise RuntimeError(f"mosquitto exited:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig=signal.SIGTERM):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self):
        self.stop(signal.SIGKILL)


class MqttgwBroker:
    """An mqttgw gateway in a namespace, its store kept across restarts."""

    def __init__(self, namespace, workdir, args=(), config=""):
        self.namespace = namespace
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "gateway.toml").write_text(config)
        self.args = list(args)
        self.runs = 0
        self.gateway = None
        self.start()

    def start(self):
        self.runs += 1
        run = self.workdir / f"run-{self.runs}"
        run.mkdir()
        self.gateway = Gateway(
            run, "--config", str(self.workdir / "gateway.toml"), "--data-dir", str(self.workdir / "data"),
            "--tcp", "tcp:1883", *self.args, prefix=["ip", "netns", "exec", self.namespace.name],
        )

    def log(self):
        return "".join((self.workdir / f"run-{n}" / "gateway.log").read_text(errors="replace")
                       for n in range(1, self.runs + 1))

    def stop(self, sig=signal.SIGTERM):
        if self.gateway is not None:
            self.gateway.stop(sig)

    def kill(self):
        self.stop(signal.SIGKILL)


def centre_broker(kind, topology, workdir):
    if kind == "mosquitto":
        return MosquittoBroker(topology.centre, workdir)
    return MqttgwBroker(topology.centre, workdir, config="[limits]\nmax_queued_messages = 100000\n")


def field_broker(kind, site, workdir, plan, dashboard=False):
    prefix = f"site-{site.index}/"
    if kind == "mosquitto":
        return MosquittoBroker(site, workdir, [
            # What a careful mosquitto bridge keeps across an outage: a
            # persistent session at the centre, its queue on disk
            # (written every autosave_interval seconds and at a clean stop).
            "autosave_interval 10",
            "connection centre",
            "address 127.0.0.1:11883",
            f"remote_clientid site-{site.index}",
            "cleansession false",
            "keepalive_interval 5",
            "restart_timeout 1 2",
            f'topic sensors/# out 2 "" {prefix}',
            f'topic commands/# in 1 "" {prefix}',
        ])
    config = "\n".join([
        "[[bridge]]",
        'name = "centre"',
        # Every site's own session at the centre (the sites share a host name here).
        f'client_id = "site-{site.index}"',
        'addresses = ["127.0.0.1:11883"]',
        f"rules = ['sensors/# out 2 \"\" {prefix}', 'commands/# in 1 \"\" {prefix}']",
        "keepalive = 5",
        "reconnect_initial = 0.2",
        "reconnect_max = 2.0",
        f"max_inflight_messages = {plan.window}",
        f"drain_messages_per_second = {plan.pace if kind == 'mqttgw-paced' else 0}",
        "",
    ])
    args = ["--durability", "os"]
    if dashboard:
        # The dashboard off the site's own machine: signed in, as it must be.
        Path(workdir).mkdir(parents=True, exist_ok=True)
        passwords = Path(workdir) / "passwd"
        subprocess.run([sys.executable, "-m", "mqttgw.passwd", "-c", "-b", str(passwords), *DASHBOARD_USER],
                       check=True, cwd=REPO, env=gateway_env(), timeout=60)
        config += "\n".join([
            "[auth]", f'password_file = "{passwords}"', "allow_anonymous = true",
            "[http]", f'address = "{site.address}:9883"', f'admin_users = ["{DASHBOARD_USER[0]}"]', "",
        ])
    return MqttgwBroker(site, workdir, args, config)


DASHBOARD_USER = ("operator", "field-site-operator")


def dashboard_token(host):
    """Signing in as the page does: POST /api/token with the user's password."""
    import base64

    basic = base64.b64encode(":".join(DASHBOARD_USER).encode()).decode()
    request = urllib.request.Request(f"http://{host}:9883/api/token", method="POST",
                                     headers={"Authorization": f"Basic {basic}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.load(r)["token"]


def start_proxy(site, workdir, *faults):
    """The fault proxy in the site's uplink: the field broker's bridge dials
    127.0.0.1:11883 in the site, the proxy dials the centre."""
    log_path = Path(workdir) / "faultproxy.log"
    log = open(log_path, "w")
    process = site.popen(
        [sys.executable, "-m", "bench.faultproxy", "--listen", "127.0.0.1:11883",
         "--target", f"{site.centre_address}:1883", *faults],
        cwd=REPO, env=gateway_env(), stdout=log, stderr=subprocess.STDOUT,
    )
    _wait("fault proxy start", lambda: "listening on" in log_path.read_text() or process.poll() is not None, 15, 0.05)
    if process.poll() is not None:
        raise RuntimeError(f"the fault proxy exited: {log_path.read_text()}")
    process.log_path = log_path
    return process


def plan_faults(plan, site):
    return [
        "--delay", str(plan.delay), "--jitter", str(plan.jitter), "--stall-every", str(plan.stall_every),
        "--stall-for", str(plan.stall_for), "--reset-every", str(plan.reset_every), "--seed", str(site.index),
    ]


class Client:
    """A paho client of the bench's own, reconnecting by itself."""

    def __init__(self, host, client_id, clean_session=True, port=1883, transport="tcp", headers=None,
                 credentials=None):
        self.client = c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                      clean_session=clean_session, transport=transport)
        if headers:
            c.ws_set_options(path="/mqtt", headers=headers)
        if credentials:
            c.username_pw_set(*credentials)
        c.max_inflight_messages_set(100)
        c.reconnect_delay_set(0.2, 2)
        self.subscribed = threading.Event()
        self.connected = threading.Event()
        self.subscriptions = []
        c.on_connect = self._connected
        c.on_disconnect = lambda *_: self.connected.clear()
        c.on_subscribe = lambda *_: self.subscribed.set()
        c.connect_async(host, port, 30)
        c.loop_start()
        _wait(f"{client_id} connect", self.connected.is_set, 20, 0.02)

    def _connected(self, client, userdata, flags, reason, properties):
        if not reason.is_failure:
            self.connected.set()
            for topic, qos in self.subscriptions:
                client.subscribe(topic, qos)

    def subscribe(self, topic, qos):
        self.subscriptions.append((topic, qos))
        self.subscribed.clear()
        self.client.subscribe(topic, qos)
        _wait(f"subscribe {topic}", self.subscribed.is_set, 20, 0.02)

    def stop(self):
        self.client.disconnect()
        self.client.loop_stop()


class Readings:
    """Where readings arrived: device -> [(seq, sent, arrived)]."""

    def __init__(self):
        self.by_device = {}
        self.count = 0

    def __call__(self, client, userdata, message):
        now = time.time()
        try:
            r = json.loads(message.payload)
        except ValueError:
            return
        self.by_device.setdefault(r["d"], []).append((r["n"], r["t"], now))
        self.count += 1


class Commander:
    """QoS 1 commands from the centre to every device, in turn."""

    def __init__(self, host, names, every):
        self.client = Client(host, "centre-commander", clean_session=False)
        self.names = names
        self.every = every
        self.sent = {n: [] for n in names}
        self._mids = {}
        self._acked = []
        self.client.client.on_publish = lambda c, u, mid, *_: self._acked.append(mid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        step = self.every / len(self.names)
        n, t0 = 0, time.monotonic()
        while not self._stop.is_set():
            name = self.names[n % len(self.names)]
            seq = n // len(self.names)
            site = name[1:name.index("d")]
            info = self.client.client.publish(f"site-{site}/commands/{name}", str(seq), 1)
            self._mids[info.mid] = (name, seq)
            self.sent[name].append(seq)
            n += 1
            self._stop.wait(max(0.0, t0 + n * step - time.monotonic()))

    def acked(self):
        out = {n: set() for n in self.names}
        for mid in list(self._acked):
            if mid in self._mids:
                name, seq = self._mids[mid]
                out[name].add(seq)
        return out

    def stop(self):
        self._stop.set()
        self._thread.join(10)


def firsts(seq):
    """Each value's first arrival, in arrival order."""
    seen, out = set(), []
    for n in seq:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def _read_devices(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"started": None, "devices": {}}


def run(field, centre_kind, plan, workdir, say=print):
    """One run of the scenario; returns its figures (and, under "detail", what a test checks)."""
    workdir = Path(workdir)
    topology = Topology(sites=plan.sites)
    sites = topology.sites
    centre = None
    brokers, proxies, devices, clients = [], [], [], []
    commander = None
    try:
        centre = centre_broker(centre_kind, topology, workdir / "centre")
        for site in sites:
            topology.cap(site, plan.uplink)
            (workdir / f"site-{site.index}").mkdir(parents=True)
            proxies.append(start_proxy(site, workdir / f"site-{site.index}", *plan_faults(plan, site)))
        for site in sites:
            brokers.append(field_broker(field, site, workdir / f"site-{site.index}" / "broker", plan,
                                        dashboard=site.index == 1))
        watcher = Client(topology.centre.address, "centre-watch", clean_session=False)
        readings = Readings()
        watcher.client.on_message = readings
        watcher.subscribe("+/sensors/#", 2)
        clients.append(watcher)

        # Each site's bridge carries commands in before anything starts.
        for site in sites:
            probe = Client(site.address, f"probe-{site.index}")
            got = threading.Event()
            probe.client.on_message = lambda *_, got=got: got.set()
            probe.subscribe("commands/probe", 1)
            poke = Client(topology.centre.address, f"poke-{site.index}")

            def arrived():
                poke.client.publish(f"site-{site.index}/commands/probe", "1", 1)
                return got.wait(0.5)

            _wait(f"site {site.index}'s bridge", arrived, 60, 0)
            probe.stop()
            poke.stop()

        # Site 1's own subscriber and its dashboard's feed (the page's
        # WebSocket at /mqtt, with the page's subprotocol).
        local = Client(sites[0].address, "site-watch")
        local_readings = Readings()
        local.client.on_message = local_readings
        local.subscribe("sensors/#", 1)
        clients.append(local)
        dash_readings = None
        if field.startswith("mqttgw"):
            token = dashboard_token(sites[0].address)
            dash = Client(sites[0].address, "dashboard", port=9883, transport="websockets",
                          headers={"Sec-Websocket-Protocol": "mqttgw-dashboard, mqtt"},
                          credentials=(DASHBOARD_USER[0], token))
            dash_readings = Readings()
            dash.client.on_message = dash_readings
            dash.subscribe("sensors/#", 0)
            clients.append(dash)

        outs = []
        for site in sites:
            out = workdir / f"site-{site.index}" / "devices.json"
            outs.append(out)
            log = open(workdir / f"site-{site.index}" / "devices.log", "w")
            devices.append(subprocess.Popen(
                [sys.executable, "-m", "bench.devices", "--host", site.address, "--site", str(site.index),
                 "--devices", str(plan.devices), "--interval", str(plan.interval),
                 "--duration", str(plan.duration), "--out", str(out)],
                cwd=REPO, env=gateway_env(), stdout=log, stderr=subprocess.STDOUT,
            ))
        _wait("devices ready", lambda: all(_read_devices(o)["started"] for o in outs)
              or any(d.poll() is not None for d in devices), 90, 0.2)
        if any(d.poll() is not None for d in devices):
            raise RuntimeError("a device simulator exited: " + " ".join(
                (workdir / f"site-{s.index}" / "devices.log").read_text() for s in sites))
        t0 = min(_read_devices(o)["started"] for o in outs)
        names = [f"s{s.index}d{k:03d}" for s in sites for k in range(plan.devices)]
        commander = Commander(topology.centre.address, names, plan.command_every)

        partitioned, killed = sites[0], sites[1] if len(sites) > 1 else None
        events = {}
        bridge_during = []

        def at(offset):
            while time.time() < t0 + offset:
                if dash_readings is not None and "partition" in events and "heal" not in events:
                    try:
                        request = urllib.request.Request(f"http://{partitioned.address}:9883/api/bridges",
                                                         headers={"Authorization": f"Bearer {token}"})
                        with urllib.request.urlopen(request, timeout=2) as r:
                            [b] = json.load(r)
                        bridge_during.append({"connected": b["connected"], "queued": b["queued"], "t": time.time()})
                    except OSError:
                        pass
                time.sleep(min(0.5, max(0.0, t0 + offset - time.time())))

        schedule = [
            (plan.partition_at, "partition", lambda: topology.partition(partitioned)),
            (plan.partition_at + plan.partition_for, "heal", lambda: topology.heal(partitioned)),
            (plan.centre_restart_at, "centre_restart", centre.stop),
            (plan.centre_restart_at + plan.centre_down, "centre_back", centre.start),
        ]
        if killed is not None:
            schedule += [
                (plan.kill_at, "kill", lambda: brokers[1].kill()),
                (plan.kill_at + plan.kill_for, "restart", lambda: brokers[1].start()),
            ]
        for offset, name, action in sorted(schedule, key=lambda e: e[0]):
            at(offset)
            events[name] = time.time()
            action()
            events[name + "_done"] = time.time()
            say(f"{field}/{centre_kind}: {name} at {events[name] - t0:.1f} s")
        at(plan.duration + 1)
        commander.stop()

        # Everything acknowledged arrives, or the deadline passes.
        def missing():
            n = 0
            for o in outs:
                for name, d in _read_devices(o)["devices"].items():
                    got = {r[0] for r in readings.by_device.get(name, ())}
                    n += len(set(d["acked"]) - got)
                    n += len([s for s in d["sent"] if s[1] and s[0] not in got and s[0] not in d["acked"]])
            acked = commander.acked()
            for o in outs:
                for name, d in _read_devices(o)["devices"].items():
                    n += len(acked[name] - set(d["commands"]))
            return n

        # (Or nothing more has come for 30 s: what is missing then is lost.)
        deadline = time.monotonic() + plan.drain_timeout
        still, since = None, time.monotonic()
        while time.monotonic() < deadline:
            now_missing = missing()
            if not now_missing or time.monotonic() - since > 30:
                break
            if now_missing != still:
                still, since = now_missing, time.monotonic()
            time.sleep(1.0)
        # Anything still coming (duplicates) has a moment to arrive.
        last = readings.count
        time.sleep(2.0)
        while readings.count != last and time.monotonic() < deadline:
            last = readings.count
            time.sleep(1.0)
        for d in devices:
            d.terminate()
        for d in devices:
            d.wait(30)
        reports = {}
        for o in outs:
            reports.update(_read_devices(o)["devices"])
        return figures(field, centre_kind, plan, t0, events, reports, readings, commander,
                       local_readings, dash_readings, bridge_during, brokers)
    finally:
        for d in devices:
            if d.poll() is None:
                d.kill()
        if commander is not None:
            commander.stop()
            commander.client.stop()
        for c in clients:
            c.stop()
        for b in brokers:
            b.stop()
        for p in proxies:
            p.terminate()
            p.wait(10)
        if centre is not None:
            centre.stop()
        topology.close()


def figures(field, centre_kind, plan, t0, events, reports, readings, commander, local, dash, bridge_during, brokers):
    lost, lost_qos0, duplicates, out_of_order = 0, 0, {1: 0, 2: 0}, []
    lost_which, duplicated_which = [], []
    sent_total = acknowledged = unacknowledged = 0
    for name, d in reports.items():
        got = [r[0] for r in readings.by_device.get(name, ())]
        sent_total += len(d["sent"])
        if d["qos"]:
            # Readings the field broker never acknowledged, though the
            # device kept trying until the end.
            acknowledged += len(set(d["acked"]))
            unacknowledged += len({s[0] for s in d["sent"]} - set(d["acked"]))
            missing = sorted(set(d["acked"]) - set(got))
            lost += len(missing)
            lost_which += [(name, n) for n in missing]
            duplicates[d["qos"]] += len(got) - len(set(got))
            if len(got) != len(set(got)):
                duplicated_which.append((name, got))
        else:
            lost_qos0 += len(d["sent"]) - len(set(got))
        if firsts(got) != sorted(set(got)):
            out_of_order.append(name)
    acked = commander.acked()
    commands_lost_which = [(n, sorted(acked[n] - set(d["commands"]))) for n, d in reports.items()
                           if acked[n] - set(d["commands"])]
    commands_lost = sum(len(c) for _, c in commands_lost_which)
    commands_out_of_order = [n for n, d in reports.items() if firsts(d["commands"]) != sorted(set(d["commands"]))]

    site1 = [n for n in reports if n.startswith("s1d")]
    heal = events["heal_done"]
    # The backlog: site 1's readings sent before the heal; drained when the last of them arrived.
    arrival = {}
    for n in site1:
        for seq, sent, arrived in readings.by_device.get(n, ()):
            arrival.setdefault((n, seq), (sent, arrived))
    backlog = [v for v in arrival.values() if v[0] < heal]
    drained = max((a for s, a in backlog), default=heal)
    # The link is back when the first reading crosses it; live readings
    # are those taken from then until the backlog has drained (those
    # taken between the heal and the relink waited with the backlog).
    relinked = min((a for s, a in arrival.values() if a >= heal), default=heal)
    live = [a - s for s, a in arrival.values() if relinked <= s <= drained]
    # After the centre's restart: the other sites' readings sent before it came back.
    back = events["centre_back_done"]
    others = [
        r[2] for n, rs in readings.by_device.items() if not n.startswith("s1d") for r in rs if r[1] < back
    ]
    caught_up = max(others, default=back)

    # Site 1's own subscribers during the partition.
    window = (events["partition"] + 1.0, heal - 1.0)

    def live_locally(seen):
        if seen is None:
            return None
        quiet = [n for n in site1 if not any(window[0] <= a <= window[1] for _, _, a in seen.by_device.get(n, ()))]
        return len(site1) - len(quiet)

    must_arrive_locally = {(n, s[0]) for n in site1 for s in reports[n]["sent"]
                           if s[1] and window[0] <= s[2] <= window[1] - 1.0 and s[0] in set(reports[n]["acked"])}
    local_got = {(n, r[0]) for n in site1 for r in local.by_device.get(n, ()) if r[2] <= heal}
    log = "".join(b.log() for b in brokers)
    return {
        "field": field,
        "centre": centre_kind,
        "sites": plan.sites,
        "devices": plan.sites * plan.devices,
        "readings": sent_total,
        "acknowledged": acknowledged,
        "unacknowledged": unacknowledged,
        "lost": lost,
        "lost_qos0": lost_qos0,
        "duplicates_qos1": duplicates[1],
        "duplicates_qos2": duplicates[2],
        "out_of_order": len(out_of_order),
        "commands": sum(len(v) for v in commander.sent.values()),
        "commands_lost": commands_lost,
        "commands_out_of_order": len(commands_out_of_order),
        "partition_relink_s": round(relinked - heal, 1),
        "partition_drain_s": round(drained - heal, 1),
        "live_delay_during_drain_p50_s": round(statistics.median(live), 2) if live else None,
        "live_delay_during_drain_max_s": round(max(live), 2) if live else None,
        "centre_restart_catch_up_s": round(max(0.0, caught_up - back), 1),
        "detail": {
            "plan": asdict(plan),
            "events": {k: round(v - t0, 2) for k, v in events.items()},
            "out_of_order_devices": [(n, [r[0] for r in readings.by_device.get(n, ())]) for n in out_of_order[:5]],
            "lost": lost_which[:20],
            "lost_by_site": dict(Counter(name[: name.index("d")] for name, _ in lost_which)),
            "duplicated": duplicated_which[:5],
            "commands_lost": commands_lost_which[:10],
            "commands_out_of_order_devices": commands_out_of_order[:10],
            "local_missed_during_partition": len(must_arrive_locally - local_got),
            "local_devices_live_during_partition": live_locally(local),
            "dashboard_devices_live_during_partition": live_locally(dash),
            "site_devices": len(site1),
            "bridge_during_partition": bridge_during,
            "tracebacks": log.count("Traceback"),
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.fieldsites", description=__doc__.split("\n\n")[0])
    parser.add_argument("--field", default="mqttgw,mqttgw-paced,mosquitto",
                        help="field brokers to run, comma-separated")
    parser.add_argument("--centre", default="mosquitto", help="mosquitto or mqttgw")
    for name, value in asdict(Plan()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--keep", default=None, help="keep the brokers' files and logs in this directory")
    args = parser.parse_args(argv)
    plan = Plan(**{k: getattr(args, k) for k in asdict(Plan())})
    os.environ["PATH"] += ":/usr/sbin:/sbin"
    results = []
    with tempfile.TemporaryDirectory(prefix="mqttgw-fieldsites-") as tmp:
        for field in args.field.split(","):
            r = run(field, args.centre, plan, Path(args.keep or tmp) / field)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "detail"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()

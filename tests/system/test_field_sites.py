"""
A field site bridged into a central mosquitto across a real link fault:
network namespaces joined by a veth pair capped at 2 Mbit/s (tests/topology.py),
the site's gateway under twistd inside its namespace, the centre's
mosquitto inside its own.  The uplink is partitioned while the site's
devices go on publishing: every QoS 1 message the gateway acknowledged
reaches the centre once the link heals, in order (duplicates, which QoS 1
allows after a lost link, are counted and bounded by the in-flight
window), and the site's own subscribers get every message live, during the
partition too.  At scale (bench/fieldsites.py): eight sites of a hundred
devices each behind the fault proxy, with a partition, a SIGKILL and a
restart of the centre, into mosquitto and into mqttgw.
"""

import os
import re
import socket
import time
from pathlib import Path

import pytest

from bench import fieldsites
from bench.fieldsites import firsts
from tests.conftest import require_program
from tests.gateway import Gateway
from tests.paho import PahoClient
from tests.topology import Topology, require_namespaces

MESSAGES_PER_PHASE = 150
WINDOW = 20


@pytest.fixture
def topology():
    topology = Topology(sites=1)
    yield topology
    topology.close()


@pytest.fixture
def clients():
    """MQTT clients a test opens, stopped at its end (the next test's
    namespaces have the same addresses, which their reconnects would find)."""
    made = []

    def connect(host, client_id, clean_session=True):
        client = PahoClient(1883, client_id, "MQTTv311", clean_session=clean_session)
        made.append(client)
        client.client.connect(host, 1883, 60)
        client.client.loop_start()
        assert client.connack.get(timeout=10)[1] == 0
        return client

    yield connect
    for client in made:
        client.client.disconnect()
        client.client.loop_stop()


def start_centre(topology, workdir):
    """The centre's mosquitto, logging every packet."""
    os.environ["PATH"] = os.environ["PATH"] + ":/usr/sbin"
    require_program("mosquitto")
    return fieldsites.MosquittoBroker(topology.centre, workdir, ["log_type all"])


def start_site(topology, site, workdir):
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "site.toml").write_text(
        "\n".join([
            "[[bridge]]",
            'name = "centre"',
            f'addresses = ["{site.centre_address}:1883"]',
            'rules = [\'sensors/# out 1 "" site-1/\']',
            "keepalive = 2",
            "reconnect_initial = 0.2",
            "reconnect_max = 2.0",
            f"max_inflight_messages = {WINDOW}",
        ]) + "\n"
    )
    gw = Gateway(
        workdir, "--config", str(workdir / "site.toml"), "--data-dir", str(workdir / "data"),
        "--tcp", "tcp:1883", prefix=["ip", "netns", "exec", site.name],
    )
    gw.wait_for_log("bridge centre: upstream accepted CONNECT", timeout=20)
    return gw


def publish(client, start, count):
    for i in range(start, start + count):
        client.publish("sensors/t", str(i).encode(), 1)


def test_a_partitioned_site_loses_nothing_and_keeps_serving_locally(tmp_path, topology, clients):
    [site] = topology.sites
    topology.cap(site, "2mbit")
    centre = start_centre(topology, tmp_path / "centre")
    gw = None
    try:
        gw = start_site(topology, site, tmp_path / "site")
        watcher = clients(topology.centre.address, "centre-watch", clean_session=False)
        watcher.subscribe("site-1/sensors/#", 1)
        local = clients(site.address, "site-watch")
        local.subscribe("sensors/#", 1)
        device = clients(site.address, "device-1")

        publish(device, 0, MESSAGES_PER_PHASE)
        topology.partition(site)
        # The site notices the dead link by its keepalive, not by a reset.
        gw.wait_for_log("upstream silent for", timeout=20)
        publish(device, MESSAGES_PER_PHASE, MESSAGES_PER_PHASE)
        # The partition lasts through two failed reconnects at least.
        deadline = time.monotonic() + 60
        while gw.log().count("bridge centre: upstream 10.77.1.1:1883 unreachable") < 2:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        # Live at the site during the partition.
        during = [int(m.payload) for m in local.receive(2 * MESSAGES_PER_PHASE, timeout=30)]
        assert during == list(range(2 * MESSAGES_PER_PHASE))
        topology.heal(site)
        publish(device, 2 * MESSAGES_PER_PHASE, MESSAGES_PER_PHASE)
        total = 3 * MESSAGES_PER_PHASE
        assert [int(m.payload) for m in local.receive(MESSAGES_PER_PHASE, timeout=30)] == list(
            range(2 * MESSAGES_PER_PHASE, total)
        )

        got = []
        deadline = time.monotonic() + 90
        while len(set(got)) < total and time.monotonic() < deadline:
            got += [int(m.payload) for m in watcher.receive(1, timeout=max(0.1, deadline - time.monotonic()))]
        assert firsts(got) == list(range(total)), (got, gw.log())
        duplicates = len(got) - total
        # Only what was in flight when the link died may come twice.
        assert 0 <= duplicates <= WINDOW, (duplicates, got)
        assert watcher.nothing_more(1.0)
        assert "Traceback" not in gw.log(), gw.log()
    finally:
        if gw is not None:
            gw.stop()
        centre.stop()


def test_delay_jitter_stalls_and_resets_lose_nothing_both_ways(tmp_path, topology, clients):
    [site] = topology.sites
    topology.cap(site, "2mbit")
    centre = start_centre(topology, tmp_path / "centre")
    (tmp_path / "site").mkdir()
    proxy = fieldsites.start_proxy(
        site, tmp_path / "site", "--delay", "0.08", "--jitter", "0.02",
        "--stall-every", "6", "--stall-for", "3", "--reset-every", "9",
    )
    gw = None
    try:
        (tmp_path / "site" / "site.toml").write_text(
            "\n".join([
                "[[bridge]]",
                'name = "centre"',
                'addresses = ["127.0.0.1:11883"]',
                'rules = [\'sensors/# out 2 "" site-1/\', \'commands/# in 1 "" site-1/\']',
                "keepalive = 2",
                "reconnect_initial = 0.2",
                "reconnect_max = 1.0",
                f"max_inflight_messages = {WINDOW}",
            ]) + "\n"
        )
        gw = Gateway(
            tmp_path / "site", "--config", str(tmp_path / "site" / "site.toml"),
            "--data-dir", str(tmp_path / "site" / "data"), "--tcp", "tcp:1883",
            prefix=["ip", "netns", "exec", site.name],
        )
        gw.wait_for_log("bridge centre: upstream accepted CONNECT", timeout=20)
        # The bridge's subscription for commands is in place at the centre.
        deadline = time.monotonic() + 20
        while f"Sending SUBACK to {socket.gethostname()}.centre" not in centre.log():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        watcher = clients(topology.centre.address, "centre-watch-2", clean_session=False)
        watcher.subscribe("site-1/sensors/#", 2)
        devices = []
        for n, qos in ((1, 1), (2, 2)):
            device = clients(site.address, f"dev-{n}", clean_session=False)
            device.subscribe(f"commands/dev-{n}", 1)
            devices.append((device, qos))
        commander = clients(topology.centre.address, "commander")

        count = 150
        sent = []
        for i in range(count):
            for device, qos in devices:
                sent.append(device.client.publish(f"sensors/{device.client._client_id.decode()}", str(i).encode(), qos))
            if i % 3 == 0:
                for n in (1, 2):
                    commander.client.publish(f"site-1/commands/dev-{n}", str(i // 3).encode(), 1)
            # About 15 readings a second from each device, for ten seconds:
            # long enough for stalls and resets to happen under way.
            time.sleep(0.066)
        for info in sent:
            info.wait_for_publish(60)
            assert info.is_published()

        by_device = {"dev-1": [], "dev-2": []}
        deadline = time.monotonic() + 120
        while any(len(set(v)) < count for v in by_device.values()) and time.monotonic() < deadline:
            for m in watcher.receive(1, timeout=max(0.1, deadline - time.monotonic())):
                by_device[m.topic.rsplit("/", 1)[1]].append(int(m.payload))
        assert watcher.nothing_more(2.0)

        # QoS 1: everything, in order; duplicates only for what was in flight.
        assert firsts(by_device["dev-1"]) == list(range(count))
        assert len(by_device["dev-1"]) - count <= WINDOW * 10
        # QoS 2: everything, in order, exactly once.
        assert by_device["dev-2"] == list(range(count))
        # Commands from the centre reached both devices, in order.
        for device, _ in devices:
            got = []
            deadline = time.monotonic() + 60
            while len(set(got)) < count // 3 and time.monotonic() < deadline:
                try:
                    got += [int(m.payload) for m in device.receive(1, timeout=max(0.1, deadline - time.monotonic()))]
                except Exception:
                    break
            assert firsts(got) == list(range(count // 3)), (device.client._client_id, got)
        log = proxy.log_path.read_text()
        assert "stall for 3.0 s" in log and "reset one connection" in log
        assert "Traceback" not in gw.log()
    finally:
        if gw is not None:
            gw.stop()
        proxy.terminate()
        proxy.wait(10)
        centre.stop()


def test_the_drain_benchmark_reports_both_runs_and_loses_nothing():
    # The benchmark makes its own namespaces (the same addresses as the
    # fixture's: never both at once).
    from bench import fieldsite

    require_namespaces()

    results = fieldsite.main(["--outage", "4", "--after", "6", "--rate", "20", "--pace", "50"])
    assert [r["pace"] for r in results] == ["unpaced", 50]
    for r in results:
        assert r["lost"] == 0, r
        assert r["backlog"] > 0 and r["messages"] > r["backlog"], r
        assert r["drain_s"] is not None and r["live_delay_max_s"] is not None, r


def bridge_lines(workdir, most=80):
    """The field gateways' bridge lines, for a failure's message: what their links did."""
    lines = []
    for path in sorted(Path(workdir).glob("**/gateway.log")):
        lines += [f"{path.parent.parent.name}: {line}" for line in path.read_text(errors="replace").splitlines()
                  if "bridge" in line]
    return lines[-most:]


@pytest.mark.parametrize("centre", ["mosquitto", "mqttgw"])
def test_eight_sites_of_a_hundred_devices_lose_nothing_through_partition_kill_and_centre_restart(
    tmp_path, centre
):
    # bench/fieldsites.py: 8 sites x 100 devices for two minutes, each
    # uplink capped at 2 Mbit/s behind the fault proxy (80 ms +- 20 ms,
    # 3 s stalls, resets); site 1 partitioned for 60 s, site 2's gateway
    # killed with SIGKILL and restarted, the centre restarted once.
    require_namespaces()
    os.environ["PATH"] = os.environ["PATH"] + ":/usr/sbin"
    require_program("mosquitto")
    plan = fieldsites.Plan()
    r = fieldsites.run("mqttgw", centre, plan, tmp_path, say=lambda text: None)
    d = r["detail"]
    # Every reading taken (60 a device), and every QoS 1/2 one (two devices
    # in three) acknowledged by its gateway in the end: the devices resend
    # through the partition, the kill and the resets.
    per_device = int(plan.duration / plan.interval)
    assert r["readings"] == 800 * per_device, r
    qos12 = sum(1 for k in range(plan.devices) if k % 3) * plan.sites * per_device
    assert r["acknowledged"] == qos12 and r["unacknowledged"] == 0, r
    # Every QoS 1/2 reading a gateway acknowledged reached the centre, in
    # order per device; QoS 2 exactly once.
    assert r["lost"] == 0, (d["lost"], bridge_lines(tmp_path))
    assert r["out_of_order"] == 0, d["out_of_order_devices"]
    assert r["duplicates_qos2"] == 0, d["duplicated"]
    # QoS 1 duplicates are counted: at most a window for each broken link.
    links_broken = plan.sites * (plan.duration / plan.reset_every + 2) + 2
    assert r["duplicates_qos1"] <= links_broken * plan.window, (r, d["duplicated"])
    # Commands from the centre reached every device, in order.
    assert r["commands"] > 0 and r["commands_lost"] == 0, d["commands_lost"]
    assert r["commands_out_of_order"] == 0, d["commands_out_of_order_devices"]
    # During the partition, site 1's own subscriber got every QoS 1/2
    # reading and its dashboard's feed heard from every device, while the
    # dashboard's API showed the bridge down and its queue growing.
    assert d["local_missed_during_partition"] == 0, d
    assert d["local_devices_live_during_partition"] == d["site_devices"] == 100
    assert d["dashboard_devices_live_during_partition"] == 100
    down = [b["queued"] for b in d["bridge_during_partition"] if not b["connected"]]
    assert len(down) > 10 and down[-1] > down[0] > 0, d["bridge_during_partition"]
    # The partitioned site drained its backlog once healed.
    assert r["partition_drain_s"] is not None and r["live_delay_during_drain_max_s"] is not None
    assert d["tracebacks"] == 0


SPARKPLUG_RULES = (
    "'spBv1.0/# out 1', 'spBv1.0/STATE/# in 1', 'spBv1.0/+/NCMD/# in 1', 'spBv1.0/+/DCMD/# in 1'"
)


def sparkplug_site(topology, site, workdir):
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "site.toml").write_text(
        "\n".join([
            "[[bridge]]",
            'name = "centre"',
            f'addresses = ["{site.centre_address}:1883"]',
            f"rules = [{SPARKPLUG_RULES}]",
            "keepalive = 2",
            "reconnect_initial = 0.2",
            "reconnect_max = 2.0",
        ]) + "\n"
    )
    gw = Gateway(
        workdir, "--config", str(workdir / "site.toml"), "--data-dir", str(workdir / "data"),
        "--tcp", "tcp:1883", prefix=["ip", "netns", "exec", site.name],
    )
    gw.wait_for_log("bridge centre: upstream accepted CONNECT", timeout=20)
    return gw


def test_sparkplug_edge_nodes_keep_order_qos_and_their_deaths_through_the_bridge(
    tmp_path, topology, clients
):
    # Sparkplug 3.0 end to end through a field site's bridge: NBIRTH,
    # DBIRTH, NDATA and DDATA at QoS 0 in each node's order (seq 0-255 and
    # round), an NDEATH will at QoS 1, the host's STATE retained at QoS 1
    # down to the site; and when the uplink is lost for good, the centre
    # publishes the NDEATH of each node still connected at the site.
    from bench.devices import EdgeNode
    from mqttgw.wire.sparkplug import payload as S

    [site] = topology.sites
    topology.cap(site, "2mbit")
    centre = start_centre(topology, tmp_path / "centre")
    gw = None
    nodes = []
    try:
        gw = sparkplug_site(topology, site, tmp_path / "site")
        host = clients(topology.centre.address, "host-app", clean_session=False)
        host.subscribe("spBv1.0/#", 2)
        edge_watch = clients(site.address, "edge-watch")
        edge_watch.subscribe("spBv1.0/STATE/#", 1)
        # The bridge's subscriptions are in place at the centre.
        deadline = time.monotonic() + 20
        while "spBv1.0/STATE/# (QoS 1)" not in centre.log():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        host.client.publish("spBv1.0/STATE/host-app", b'{"online":true,"timestamp":1}', 1, True)
        assert [m.topic for m in host.receive(1)] == ["spBv1.0/STATE/host-app"]
        [m] = edge_watch.receive(1, timeout=20)
        assert (m.topic, m.qos) == ("spBv1.0/STATE/host-app", 1), m
        # STATE is kept at the site retained, at QoS 1.
        edge_late = clients(site.address, "edge-late")
        edge_late.subscribe("spBv1.0/STATE/#", 1)
        [m] = edge_late.receive(1, timeout=20)
        assert (m.topic, m.qos, m.retain) == ("spBv1.0/STATE/host-app", 1, True), m

        nodes = [EdgeNode(site.address, 1883, "plant", f"node{k}", bd_seq=k + 3) for k in range(2)]
        for node in nodes:
            node.birth()
        # 300 data messages a node: seq goes round past 255.
        for i in range(300):
            for node in nodes:
                node.data(node.devices[0] if i % 2 else None)
        got = {node.node: [] for node in nodes}
        expected = {node.node: len(node.sent) for node in nodes}
        deadline = time.monotonic() + 60
        while any(len(got[n]) < expected[n] for n in got) and time.monotonic() < deadline:
            for m in host.receive(1, timeout=max(0.1, deadline - time.monotonic())):
                parts = m.topic.split("/")
                p = S.decode(m.payload)
                got[parts[3]].append([parts[2], parts[4] if len(parts) > 4 else None,
                                      p.seq if p.HasField("seq") else None, m.qos])
        for node in nodes:
            assert [g[:3] for g in got[node.node]] == node.sent, node.node
            # Every message as published: QoS 0.
            assert {g[3] for g in got[node.node]} == {0}
        seqs = [g[2] for g in got["node0"]]
        assert seqs == [i % 256 for i in range(len(seqs))] and len(seqs) > 256

        # node0's own link breaks at the site: its will, the NDEATH, at QoS 1.
        nodes[0].drop()
        [m] = host.receive(1, timeout=20)
        assert (m.topic, m.qos, m.retain) == ("spBv1.0/plant/NDEATH/node0", 1, False)
        assert S.metric_named(S.decode(m.payload), "bdSeq").long_value == 3
        # Acknowledged at the centre: the connection holding it there as a
        # will ends with DISCONNECT.
        deadline = time.monotonic() + 20
        while not re.search(r"Client \S+/\d+ disconnected\.", centre.log()):
            assert time.monotonic() < deadline, centre.log()
            time.sleep(0.05)

        # The uplink is lost for good while node1 is still connected at the
        # site: the centre publishes node1's NDEATH, with its birth's bdSeq.
        topology.partition(site)
        deadline = time.monotonic() + 30
        deaths = []
        while not deaths and time.monotonic() < deadline:
            try:
                [m] = host.receive(1, timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                break
            if m.topic.startswith("spBv1.0/"):
                deaths.append(m)
        assert [(m.topic, m.qos, m.retain) for m in deaths] == [("spBv1.0/plant/NDEATH/node1", 1, False)], (
            gw.log(), centre.log()[-3000:])
        assert S.metric_named(S.decode(deaths[0].payload), "bdSeq").long_value == 4
        assert host.nothing_more(1.0)
        assert "Traceback" not in gw.log(), gw.log()
    finally:
        for node in nodes[1:]:
            node.stop()
        if gw is not None:
            gw.stop()
        centre.stop()

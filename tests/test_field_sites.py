"""
A field site bridged into a central mosquitto across a real link fault:
network namespaces joined by a veth pair capped at 2 Mbit/s (tests/topology.py),
the site's gateway under twistd inside its namespace, the centre's
mosquitto inside its own.  The uplink is partitioned while the site's
devices go on publishing: every QoS 1 message the gateway acknowledged
reaches the centre once the link heals, in order (duplicates, which QoS 1
allows after a lost link, are counted and bounded by the in-flight
window), and the site's own subscribers get every message live, during the
partition too.
"""

import os
import subprocess
import time

import pytest

from tests.conftest import require_program
from tests.gateway import Gateway
from tests.paho import PahoClient
from tests.topology import Topology

MESSAGES_PER_PHASE = 150
WINDOW = 20


@pytest.fixture
def topology():
    topology = Topology(sites=1)
    yield topology
    topology.close()


def start_centre(topology, workdir):
    os.environ["PATH"] = os.environ["PATH"] + ":/usr/sbin"
    binary = require_program("mosquitto")
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "mosquitto.conf"
    lines = [
        "listener 1883",
        "allow_anonymous true",
        "persistence true",
        f"persistence_location {workdir}/",
        "max_queued_messages 100000",
        f"log_dest file {workdir}/mosquitto.log",
        "log_type all",
        "user root",
    ]
    conf.write_text("\n".join(lines) + "\n")
    log = open(workdir / "stdout.log", "wb")
    process = topology.centre.popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if (workdir / "mosquitto.log").exists() and "Opening ipv4 listen socket on port 1883" in (workdir / "mosquitto.log").read_text():
            return process
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("the centre's mosquitto did not start")


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


def test_a_partitioned_site_loses_nothing_and_keeps_serving_locally(tmp_path, topology):
    [site] = topology.sites
    topology.cap(site, "2mbit")
    centre = start_centre(topology, tmp_path / "centre")
    gw = None
    try:
        gw = start_site(topology, site, tmp_path / "site")
        watcher = PahoClient(1883, "centre-watch", "MQTTv311", clean_session=False)
        watcher.port = 1883
        watcher.client.connect(topology.centre.address, 1883, 60)
        watcher.client.loop_start()
        assert watcher.connack.get(timeout=10)[1] == 0
        watcher.subscribe("site-1/sensors/#", 1)
        local = PahoClient(1883, "site-watch", "MQTTv311")
        local.client.connect(site.address, 1883, 60)
        local.client.loop_start()
        assert local.connack.get(timeout=10)[1] == 0
        local.subscribe("sensors/#", 1)
        device = PahoClient(1883, "device-1", "MQTTv311")
        device.client.connect(site.address, 1883, 60)
        device.client.loop_start()
        assert device.connack.get(timeout=10)[1] == 0

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
        firsts = []
        for n in got:
            if n not in firsts:
                firsts.append(n)
        assert firsts == list(range(total))
        duplicates = len(got) - total
        # Only what was in flight when the link died may come twice.
        assert 0 <= duplicates <= WINDOW, duplicates
        assert watcher.nothing_more(1.0)
        assert "Traceback" not in gw.log()
    finally:
        if gw is not None:
            gw.stop()
        centre.terminate()
        centre.wait(15)

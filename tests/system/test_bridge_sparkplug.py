"""
Sparkplug B edge nodes behind a bridge into a real mosquitto
(bridges/deaths.py): each node whose NBIRTH the bridge forwarded has its
NDEATH held at the upstream as a will, so that when the gateway stops
answering for good (here: SIGSTOP, the whole site frozen) the upstream
publishes the NDEATH of every node still connected at the site, and none
of a node whose own NDEATH already went up.  Across real namespaces with
the uplink cut: tests/system/test_field_sites.py.
"""

import json
import re
import signal
import time
import urllib.request

import pytest

from bench.devices import EdgeNode
from mqttgw.wire.sparkplug import payload as S
from tests.gateway import Gateway
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient


def start_site(tmp_path, upstream_port, *extra):
    workdir = tmp_path / "site"
    workdir.mkdir()
    (workdir / "bridge.toml").write_text("\n".join([
        "[[bridge]]",
        'name = "up"',
        f'addresses = ["127.0.0.1:{upstream_port}"]',
        "rules = ['spBv1.0/# out 1']",
        "keepalive = 2",
        "reconnect_initial = 0.2",
        "reconnect_max = 1.0",
        *extra,
    ]) + "\n")
    http = free_port()
    gw = Gateway(workdir, "--config", str(workdir / "bridge.toml"), "--no-persistence",
                 "--http", str(http))
    gw.http_port = http
    gw.wait_for_log("bridge up: upstream accepted CONNECT")
    return gw


def wills_held(gw, count, timeout=20):
    """Waits until the admin API says the bridge holds ``count`` NDEATHs upstream."""
    port = gw.http_port
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/bridges", timeout=10) as r:
            [bridge] = json.load(r)
        if bridge["sparkplug_wills"] == count:
            return
        assert time.monotonic() < deadline, bridge
        time.sleep(0.05)


@pytest.fixture
def site_and_host(tmp_path, start_mosquitto):
    made = {"nodes": [], "gw": None}

    def start(*extra):
        upstream = start_mosquitto(tmp_path / "mosquitto")
        host = PahoClient(upstream.port, "host-app", "MQTTv311")
        host.connect()
        host.subscribe("spBv1.0/#", 1)
        made["host"] = host
        made["upstream"] = upstream
        gw = made["gw"] = start_site(tmp_path, upstream.port, *extra)
        return gw, host, made["nodes"], upstream.log

    yield start
    gw = made["gw"]
    if gw is not None:
        gw.process.send_signal(signal.SIGCONT)
        gw.stop()
        assert "Traceback" not in gw.log(), gw.log()
    for node in made["nodes"]:
        node.stop()
    if "host" in made:
        made["host"].disconnect()


def carrier_closed(log, timeout=20):
    """Waits until a will-holding connection ended with DISCONNECT (its will discarded)."""
    deadline = time.monotonic() + timeout
    while not re.search(r"Client \S+/\d+ disconnected\.", log()):
        assert time.monotonic() < deadline, log()
        time.sleep(0.05)


def births(host, count):
    """The NBIRTH topics the host got, the first ``count`` messages."""
    got = host.receive(count, timeout=20)
    return sorted(m.topic for m in got if "/NBIRTH/" in m.topic)


def deaths_after_freeze(gw, host, timeout=30):
    """What the host gets once the gateway stops answering: the NDEATHs."""
    gw.process.send_signal(signal.SIGSTOP)
    got = []
    deadline = time.monotonic() + timeout
    # Keepalive 2 s: the upstream gives up on the site after 3 s.
    while time.monotonic() < deadline:
        try:
            got += host.receive(1, timeout=max(0.1, min(6.0, deadline - time.monotonic())))
        except Exception:
            if got:
                break
    return got


def test_a_frozen_site_s_edge_nodes_die_at_the_upstream_with_their_bdseq(site_and_host):
    gw, host, nodes, upstream_log = site_and_host()
    nodes += [EdgeNode("127.0.0.1", gw.port, "plant", f"node{k}", bd_seq=10 + k) for k in range(3)]
    for node in nodes:
        node.birth()
    assert births(host, 6) == [f"spBv1.0/plant/NBIRTH/node{k}" for k in range(3)]
    wills_held(gw, 3)
    # node0 dies at the site: its own NDEATH goes up, at QoS 1, once.
    nodes[0].drop()
    [m] = host.receive(1, timeout=20)
    assert (m.topic, m.qos, m.retain) == ("spBv1.0/plant/NDEATH/node0", 1, False)
    assert S.metric_named(S.decode(m.payload), "bdSeq").long_value == 10
    nodes.pop(0)
    # Acknowledged upstream: the connection holding it there ends cleanly.
    carrier_closed(upstream_log)
    wills_held(gw, 2)
    got = deaths_after_freeze(gw, host)
    deaths = sorted((m.topic, m.qos, m.retain, S.metric_named(S.decode(m.payload), "bdSeq").long_value)
                    for m in got)
    assert deaths == [
        ("spBv1.0/plant/NDEATH/node1", 1, False, 11),
        ("spBv1.0/plant/NDEATH/node2", 1, False, 12),
    ], got
    assert host.nothing_more(1.0)


def test_a_rebirth_with_a_new_bdseq_replaces_the_held_death(site_and_host):
    gw, host, nodes, upstream_log = site_and_host()
    node = EdgeNode("127.0.0.1", gw.port, "plant", "node0", bd_seq=1)
    node.birth()
    assert births(host, 2) == ["spBv1.0/plant/NBIRTH/node0"]
    node.stop()  # DISCONNECT: no will here; born again with another bdSeq
    nodes.append(EdgeNode("127.0.0.1", gw.port, "plant", "node0", bd_seq=2))
    nodes[0].birth()
    assert births(host, 2) == ["spBv1.0/plant/NBIRTH/node0"]
    carrier_closed(upstream_log)
    [m] = deaths_after_freeze(gw, host)
    assert m.topic == "spBv1.0/plant/NDEATH/node0"
    assert S.metric_named(S.decode(m.payload), "bdSeq").long_value == 2


def test_max_sparkplug_wills_0_holds_no_death_upstream(site_and_host):
    gw, host, nodes, _ = site_and_host("max_sparkplug_wills = 0")
    nodes.append(EdgeNode("127.0.0.1", gw.port, "plant", "node0", bd_seq=1))
    nodes[0].birth()
    assert births(host, 2) == ["spBv1.0/plant/NBIRTH/node0"]
    assert deaths_after_freeze(gw, host, timeout=10) == []

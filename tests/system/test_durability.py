"""
The gateway as a process: killed with SIGKILL at random moments, restarted
normally, and started on a store it cannot use.
"""

import subprocess

from bench import crash
from tests.gateway import TWISTD, Gateway, gateway_env
from tests.paho import PahoClient


def test_nothing_acknowledged_is_lost_across_sigkill(tmp_path):
    figures, problems = crash.run(cycles=3, seed=7, workdir=tmp_path, log=lambda *a: None)
    assert problems == []
    assert figures["qos1_acknowledged"] > 100
    assert figures["qos2_acknowledged"] > 100
    assert figures["retained_acknowledged"] > 10


def test_retained_sessions_and_queues_survive_a_normal_restart(tmp_path):
    data = tmp_path / "data"
    first = Gateway(tmp_path, "--data-dir", str(data))
    port = first.port
    sub = PahoClient(port, "keeper", "MQTTv311", clean_session=False)
    sub.connect()
    sub.subscribe("keep/#", 2)
    sub.disconnect()
    pub = PahoClient(port, "pub", "MQTTv311")
    pub.connect()
    pub.publish("keep/retained", b"last value", 1, retain=True)
    for i in range(10):
        pub.publish(f"keep/{i}", f"m{i}".encode(), 1 + i % 2)
    pub.disconnect()
    first.stop()

    (tmp_path / "again").mkdir()
    second = Gateway(tmp_path / "again", "--data-dir", str(data), "--tcp", f"tcp:{port}:interface=127.0.0.1")
    try:
        back = PahoClient(port, "keeper", "MQTTv311", clean_session=False)
        flags = back.connect()
        assert flags.session_present
        got = {m.topic: m.payload for m in back.receive(11)}
        assert got == {
            "keep/retained": b"last value",
            **{f"keep/{i}": f"m{i}".encode() for i in range(10)},
        }
        fresh = PahoClient(port, "fresh", "MQTTv311")
        fresh.connect()
        fresh.subscribe("keep/retained", 0)
        [m] = fresh.receive()
        assert (m.payload, m.retain) == (b"last value", True)
    finally:
        second.stop()


def test_corrupt_store_stops_start_up_naming_the_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "mqttgw.db").write_bytes(b"\x00garbage" * 512)
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--data-dir", str(data)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=gateway_env(),
    )
    assert out.returncode != 0
    assert f"store {data / 'mqttgw.db'}: cannot be used" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert (data / "mqttgw.db").read_bytes().startswith(b"\x00garbage")


def test_no_persistence_writes_nothing(tmp_path):
    gw = Gateway(tmp_path, "--no-persistence")
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    pub.publish("r", b"v", 1, retain=True)
    gw.stop()
    assert not (tmp_path / "mqttgw-data").exists()

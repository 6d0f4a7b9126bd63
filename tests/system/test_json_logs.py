"""
``log.format = "json"`` against a gateway running under twistd: every
line it writes, through a client's connect, a refused login, a denied
publish and a bridge whose upstream goes away, is one JSON object with
the fields operators filter on; SIGUSR1 rotates such a log file.
"""

import io
import json
import re
import signal
import subprocess
import time

from twisted.logger import Logger

from mqttgw.passwd import main as passwd
from mqttgw.service.logs import json_observer
from tests.gateway import TWISTD, Gateway, gateway_env
from tests.paho import PahoClient, connack_code

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")
LEVELS = {"debug", "info", "warn", "error", "critical"}


def _refuse(constant):
    raise ValueError(f"{constant} is not JSON")


def records_of(text):
    """Every line of ``text`` as the JSON object it must be."""
    records = []
    for line in text.splitlines():
        record = json.loads(line, parse_constant=_refuse)
        assert isinstance(record, dict), line
        assert ISO_UTC.match(record["time"]), line
        assert record["level"] in LEVELS, line
        assert isinstance(record["namespace"], str) and isinstance(record["message"], str), line
        records.append(record)
    return records


def one(records, text, **fields):
    """The first record whose message has ``text`` and whose fields are ``fields``."""
    for record in records:
        if text in record["message"] and all(record.get(k) == v for k, v in fields.items()):
            return record
    raise AssertionError(f"no record with {text!r} and {fields}: {[r['message'] for r in records]}")


def test_json_lines_through_a_connect_a_refusal_and_a_bridge_outage(tmp_path, start_mosquitto):
    upstream = start_mosquitto(tmp_path / "upstream")
    passwords = tmp_path / "passwd"
    passwd(["-c", "-b", str(passwords), "dev-1", "s3cret"])
    config = tmp_path / "mqttgw.toml"
    config.write_text(
        '[log]\nformat = "json"\n'
        f'[auth]\npassword_file = "{passwords}"\n'
        '[[bridge]]\nname = "centre"\n'
        f'addresses = ["127.0.0.1:{upstream.port}"]\nrules = ["site/# out 1"]\n'
        "reconnect_initial = 0.2\nreconnect_max = 0.5\n"
    )
    gw = Gateway(tmp_path, "--config", str(config))
    try:
        gw.wait_for_log("bridge centre: upstream accepted CONNECT")
        device = PahoClient(gw.port, "dev-1", "MQTTv311")
        device.client.username_pw_set("dev-1", "s3cret")
        device.connect()
        device.publish("$SYS/forged", b"x", 1)
        gw.wait_for_log("may not publish on $SYS/forged")
        assert connack_code(gw.port, "MQTTv311", "intruder", "dev-1", "wrong") != 0
        gw.wait_for_log("refusing CONNECT")
        upstream.stop()
        gw.wait_for_log("bridge centre: upstream connection lost")
        gw.wait_for_log(f"bridge centre: upstream 127.0.0.1:{upstream.port} unreachable")
        device.disconnect()
        gw.wait_for_log("client dev-1 disconnected")
    finally:
        gw.stop()
    records = records_of(gw.log())
    assert len(records) > 10
    connected = one(records, "connected from", client_id="dev-1")
    assert re.match(r"127\.0\.0\.1:\d+\Z", connected["peer"])
    assert connected["namespace"].startswith("mqttgw.") and connected["level"] == "info"
    denied = one(records, "may not publish", client_id="dev-1")
    assert denied["topic"] == "$SYS/forged" and denied["level"] == "warn"
    refused = one(records, "refusing CONNECT", client_id="intruder")
    assert "bad user name or password" in refused["reason"] and refused["peer"].startswith("127.0.0.1:")
    lost = one(records, "upstream connection lost", name="centre")
    assert lost["reason"]
    unreachable = one(records, "unreachable", name="centre", address=f"127.0.0.1:{upstream.port}")
    assert unreachable["level"] == "warn" and "unreachable" in unreachable["reason"]
    # No line says what a password was.
    assert "s3cret" not in gw.log() and "wrong" not in gw.log()


def test_sigusr1_rotates_a_json_log_file_and_lines_go_on_in_the_new_one(tmp_path):
    config = tmp_path / "mqttgw.toml"
    config.write_text('[log]\nformat = "json"\n')
    log_file = tmp_path / "gateway.json.log"
    process = subprocess.Popen(
        [str(TWISTD), "-n", "--pidfile=", f"--logfile={log_file}", "mqttgw",
         "--tcp", "tcp:0:interface=127.0.0.1", "--config", str(config)],
        cwd=tmp_path, env=gateway_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def wait_for(path, text, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and text in path.read_text():
                return records_of(path.read_text())
            assert process.poll() is None, "the gateway exited"
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in {path} within {timeout}s")

    try:
        started = wait_for(log_file, " running: listeners ")
        port = int(re.search(r" starting on (\d+)", log_file.read_text()).group(1))
        process.send_signal(signal.SIGUSR1)
        wait_for(log_file, "SIGUSR1: log file rotated")
        client = PahoClient(port, "after-rotation", "MQTTv311")
        client.connect()
        client.disconnect()
        after = wait_for(log_file, "client after-rotation disconnected")
    finally:
        process.terminate()
        process.wait(15)
    rotated = records_of((tmp_path / "gateway.json.log.1").read_text())
    assert [r["message"] for r in rotated[: len(started)]] == [r["message"] for r in started]
    assert not any("after-rotation" in r["message"] for r in rotated)
    one(after, "connected from", client_id="after-rotation")


def test_the_stable_names_win_over_an_events_own_fields_and_objects_stay_in_the_message():
    out = io.StringIO()
    log = Logger(namespace="mqttgw.test", observer=json_observer(out))
    log.warn(
        "{peer} said {message!r} at {time}",
        peer=object(), message=("legacy", "tuple"), time=5, topics=["a/b", "c"], qos=1,
        rate=float("nan"), rates=[1.5, float("inf")],
    )
    try:
        1 / 0
    except ZeroDivisionError:
        log.failure("failed for {client_id}", client_id="dev-1")
    first, second = records_of(out.getvalue())
    assert first["namespace"] == "mqttgw.test" and first["level"] == "warn"
    assert "said ('legacy', 'tuple') at 5" in first["message"]
    assert first["time"] != 5 and "peer" not in first
    assert first["topics"] == ["a/b", "c"] and first["qos"] == 1
    assert first["rate"] == "nan" and first["rates"] == [1.5, "inf"]
    assert second["level"] == "critical" and second["client_id"] == "dev-1"
    assert "ZeroDivisionError" in second["traceback"]
    assert "\x1e" not in out.getvalue()

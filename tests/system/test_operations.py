"""
What an operator lives with: reload on SIGHUP, $SYS topics, /metrics,
/readyz, the admin API and its CLI, session expiry, configuration mistakes
as one-line errors, the data-directory lock, logs and the systemd unit.
All against the gateway running under twistd.
"""

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqttgw.web.systopics import SHARED
from mqttgw.wire import packets as P
from tests.conftest import require_program
from tests.gateway import REPO, TWISTD, Gateway, gateway_env
from tests.mosquitto_broker import Mosquitto
from tests.network import closed_by_peer, free_port, http, raw_connect, wait_until
from tests.paho import PahoClient


def ctl(port, *args, socket_path=None):
    """python -m mqttgw.ctl over TCP to ``port``, or over the Unix socket at ``socket_path``."""
    where = ["--socket", str(socket_path)] if socket_path is not None else ["--url", f"http://127.0.0.1:{port}"]
    return subprocess.run(
        [sys.executable, "-m", "mqttgw.ctl", *where, *args],
        capture_output=True,
        text=True,
        env=gateway_env(),
        timeout=30,
    )


# Reload


def test_sighup_adds_a_bridge_and_changes_limits_keeping_clients(gateway_with, start_mosquitto, tmp_path):
    upstream = start_mosquitto(tmp_path / "upstream")
    config = tmp_path / "mqttgw.toml"
    config.write_text("[limits]\nmax_packet_size = 100000\n")
    gw = gateway_with("--config", str(config))
    kept = PahoClient(gw.port, "kept", "MQTTv311")
    kept.connect()
    assert kept.subscribe("t", 1) == [1]
    far = PahoClient(upstream.port, "far", "MQTTv311")
    far.connect()
    far.subscribe("t", 1)

    config.write_text(
        "[limits]\nmax_packet_size = 1000\n"
        "[[bridge]]\nname = \"up\"\n"
        f"addresses = [\"127.0.0.1:{upstream.port}\"]\nrules = [\"t out 1\"]\n"
    )
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("bridges +up")
    gw.wait_for_log("bridge up: upstream accepted CONNECT")
    # The connection made before keeps its limits and its session; what it
    # publishes now also goes upstream through the new bridge.
    kept.publish("t", b"x" * 2000, 1)
    assert kept.receive(1)[0].payload == b"x" * 2000
    assert far.receive(1)[0].payload == b"x" * 2000
    # New connections get the new limit.
    sock, code = raw_connect(gw.port, "new")
    assert code == 0
    sock.sendall(P.Publish("t", b"y" * 2000, 0).encode())
    assert closed_by_peer(sock)
    assert not kept.disconnected.is_set()

    # A broken file changes nothing: the bridge and the limit stay.
    config.write_text("[limits]\nmax_packet_size = \"big\"\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("reload failed, nothing changed")
    sock, code = raw_connect(gw.port, "newer")
    sock.sendall(P.Publish("t", b"z" * 900, 0).encode())
    assert far.receive(1)[0].payload == b"z" * 900
    assert kept.receive(1)[0].payload == b"z" * 900
    sock.sendall(P.Publish("t", b"z" * 2000, 0).encode())
    assert closed_by_peer(sock)
    assert gw.log().count("bridge up: upstream accepted CONNECT") == 1

    # Removing the bridge stops it; the others go on.
    config.write_text("[limits]\nmax_packet_size = 1000\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("bridges -up")
    kept.publish("t", b"after", 1)
    assert kept.receive(1)[0].payload == b"after"
    far.nothing_more(1.0)
    assert not kept.disconnected.is_set()

    gw.process.send_signal(signal.SIGUSR1)
    gw.wait_for_log("ignoring signal SIGUSR1")
    kept.publish("t", b"still", 0)
    assert kept.receive(1)[0].payload == b"still"
    assert gw.process.poll() is None
    kept.disconnect()
    far.disconnect()
    upstream.stop()


def test_sighup_names_what_needs_a_restart(gateway_with, tmp_path):
    config = tmp_path / "mqttgw.toml"
    config.write_text("[persistence]\ndurability = \"fsync\"\n")
    gw = gateway_with("--config", str(config))
    config.write_text("[persistence]\ndurability = \"os\"\n[log]\nlevel = \"debug\"\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("changed but needs a restart: persistence.durability")
    gw.wait_for_log("log level debug")


# $SYS


def _sys_topics(port, seconds=3):
    out = subprocess.run(
        [require_program("mosquitto_sub"), "-p", str(port), "-t", "$SYS/#", "-F", "%t\t%p", "-W", str(seconds)],
        capture_output=True,
        text=True,
    ).stdout
    values = {}
    for line in out.splitlines():
        topic, _, value = line.partition("\t")
        values[topic] = value
    return values


def _wait_for_sys(client, topic, condition, timeout=15.0):
    """Read ``client``'s messages until a value of ``topic`` meets ``condition``."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            [message] = client.receive(1, timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        value = message.payload.decode()
        seen.append(value)
        if message.topic == topic and condition(value):
            return value
    raise AssertionError(f"no value of {topic} met the condition within {timeout}s: {seen}")


def _own(topic):
    """mqttgw's own $SYS topics, which mosquitto does not have."""
    return topic.startswith(("$SYS/broker/bridge/", "$SYS/broker/sparkplug/")) or topic in (
        "$SYS/broker/store/state",
        "$SYS/broker/store/commit/latency",
    )


def test_sys_topics_update_and_share_mosquittos_names(gateway_with, tmp_path):
    mosquitto = Mosquitto(tmp_path / "mosquitto", extra=["sys_interval 1"]).start()
    try:
        theirs = _sys_topics(mosquitto.port)
    finally:
        # Stopped whatever happens: a failing test leaves no broker behind.
        mosquitto.stop()
    gw = gateway_with("--sys-interval", "1")
    ours = _sys_topics(gw.port)
    missing = [t for t in SHARED if t not in ours]
    assert not missing, missing
    # Every topic both could have is named as mosquitto names it.
    unknown = sorted(t for t in ours if not _own(t) and t not in theirs)
    assert not unknown, unknown
    assert ours["$SYS/broker/version"].startswith("mqttgw version ")
    assert ours["$SYS/broker/store/state"] == "ok"
    # They update: traffic shows in the counters, retained for late comers.
    watch = PahoClient(gw.port, "watch", "MQTTv311")
    watch.connect()
    watch.subscribe("$SYS/broker/publish/messages/received", 0)
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    for _ in range(5):
        pub.publish("a", b"12345", 1)
    _wait_for_sys(watch, "$SYS/broker/publish/messages/received", lambda v: int(v) >= 5)
    later = _sys_topics(gw.port)
    assert int(later["$SYS/broker/publish/messages/received"]) >= 5
    assert int(later["$SYS/broker/publish/bytes/received"]) >= 25
    assert int(later["$SYS/broker/clients/connected"]) >= 1
    assert later["$SYS/broker/uptime"] != ours["$SYS/broker/uptime"]
    # Clients cannot write there.  The PUBACK comes once the gateway has
    # handled the publish; a $SYS value is published again only when it
    # changes, so no later tick would hide a forged one.
    pub.publish("$SYS/broker/version", b"forged", 1)
    assert _sys_topics(gw.port, 2)["$SYS/broker/version"].startswith("mqttgw version ")
    watch.disconnect()
    pub.disconnect()


# Metrics and readiness


FAMILIES = [
    "mqttgw_packets_received",
    "mqttgw_packets_sent",
    "mqttgw_bytes_received",
    "mqttgw_publish_received",
    "mqttgw_publish_sent",
    "mqttgw_publish_dropped",
    "mqttgw_clients_connected",
    "mqttgw_retained_messages",
    "mqttgw_subscriptions",
    "mqttgw_listener_up",
    "mqttgw_listener_connections",
    "mqttgw_store_up",
    "mqttgw_store_commit_seconds",
    "mqttgw_delivery_seconds",
    "mqttgw_bridge_up",
    "mqttgw_bridge_queued",
    "mqttgw_bridge_dropped",
    "mqttgw_archive_rows_written",
    "mqttgw_archive_rows_dropped",
]


def test_metrics_parse_and_carry_every_family(gateway_with, tmp_path):
    port = free_port()
    gw = gateway_with(
        "--http", str(port), "--archive", str(tmp_path / "archive"),
        "--bridge", f"127.0.0.1:{free_port()}", "--bridge-topic", "b/# out 1",
    )
    sub = PahoClient(gw.port, "sub", "MQTTv311")
    sub.connect()
    sub.subscribe("m/#", 1)
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    for i in range(200):
        pub.publish(f"m/{i}", b"v", 1, retain=i == 0)
    for i in range(1100):
        pub.client.publish("m/fast", b"v", 0)
    sub.receive(1300)
    status, body = http(port, "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    missing = [name for name in FAMILIES if name not in families]
    assert not missing, missing

    def value(name, suffix="", **labels):
        for sample in families[name].samples:
            if sample.name == name + suffix and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
        raise KeyError(name)

    assert value("mqttgw_publish_received", "_total") >= 200
    assert value("mqttgw_clients_connected") == 2
    assert value("mqttgw_listener_connections", kind="tcp") == 2
    assert value("mqttgw_bridge_up", bridge="default") == 0
    assert value("mqttgw_store_up") == 1
    # One message in 1024 is traced to its delivery.
    assert value("mqttgw_delivery_seconds", "_count") >= 1
    assert value("mqttgw_store_commit_seconds", "_count") >= 1
    pub.disconnect()
    sub.disconnect()


def _set_writable(path, writable):
    """
    Make ``path`` (a directory) refuse or take new files: for root, which
    permissions do not stop, with the immutable attribute.
    """
    if os.geteuid() == 0:
        chattr = require_program("chattr")
        subprocess.run([chattr, "-i" if writable else "+i", str(path)], check=True)
    else:
        path.chmod(0o755 if writable else 0o555)


def test_readyz_turns_503_when_the_store_cannot_be_written(gateway_with, tmp_path):
    port = free_port()
    data = tmp_path / "data"
    gw = gateway_with("--http", str(port), "--data-dir", str(data))
    assert http(port, "/readyz")[0] == 200
    assert http(port, "/healthz")[0] == 200
    _set_writable(data, False)
    try:
        wait_until(lambda: http(port, "/readyz")[0] == 503, what="/readyz 503")
        status, body = http(port, "/readyz")
        assert "store cannot be written" in json.loads(body)["reasons"][0]
        gw.wait_for_log("cannot write")
        assert "[mqttgw.broker.store#critical]" in gw.log()
        # A QoS 1 publish that must be stored is not left waiting: the
        # connection closes, and the client sends it again later.
        sock, code = raw_connect(gw.port, "publisher")
        assert code == 0
        sock.sendall(P.Publish("r", b"keep", 1, retain=True, message_id=1).encode())
        assert closed_by_peer(sock)
        # Persistent sessions are refused with CONNACK 3.
        sock, code = raw_connect(gw.port, "durable", clean_session=False)
        assert code == P.CONNACK_SERVER_UNAVAILABLE
        sock.close()
        # Between clean sessions, traffic goes on.
        sub = PahoClient(gw.port, "sub", "MQTTv311")
        sub.connect()
        sub.subscribe("live", 1)
        sub.client.publish("live", b"on", 1)
        assert sub.receive(1)[0].payload == b"on"
        sub.disconnect()
        families = {f.name: f for f in text_string_to_metric_families(http(port, "/metrics")[1].decode())}
        assert families["mqttgw_store_up"].samples[0].value == 0
        assert families["mqttgw_store_refused"].samples[0].value >= 1
    finally:
        _set_writable(data, True)
    wait_until(lambda: http(port, "/readyz")[0] == 200, what="/readyz 200 again")
    gw.wait_for_log("writable again")
    sock, code = raw_connect(gw.port, "durable", clean_session=False)
    assert code == 0
    sock.close()


# The admin API and its CLI


def test_admin_cli_lists_kicks_and_deletes(gateway_with):
    port = free_port()
    gw = gateway_with("--http", str(port))
    sock = gw.workdir / "mqttgw-data" / "admin.sock"

    def ctl(port, *args):
        # Over the Unix socket, as by default: changes need no credentials there.
        return globals()["ctl"](port, *args, socket_path=sock)

    device = PahoClient(gw.port, "dev/1", "MQTTv311", clean_session=False)
    device.connect()
    device.subscribe("x/#", 1)
    pub = PahoClient(gw.port, "pub", "MQTTv31")
    pub.connect()
    pub.publish("r/1", b"retained one", 1, retain=True)
    pub.publish("r/2", b"\xff\x00", 1, retain=True)

    listed = ctl(port, "clients")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:4] == ["CLIENT", "ID", "ADDRESS", "LISTENER"]
    assert any(row.startswith("dev/1 ") for row in rows)
    clients = {c["client_id"]: c for c in json.loads(ctl(port, "--json", "clients").stdout)}
    assert clients["dev/1"]["subscriptions"] == 1
    assert clients["dev/1"]["protocol"] == "3.1.1"
    assert clients["pub"]["protocol"] == "3.1"
    assert clients["pub"]["listener"] == "tcp"

    kicked = ctl(port, "kick", "dev/1")
    assert kicked.returncode == 0 and "kicked dev/1" in kicked.stdout
    assert device.disconnected.wait(10)
    device.client.loop_stop()
    gw.wait_for_log("client dev/1 disconnected by the admin API")

    sessions = json.loads(ctl(port, "--json", "sessions").stdout)
    assert [(s["client_id"], s["connected"], s["subscriptions"]) for s in sessions] == [
        ("dev/1", False, ["x/#"])
    ]
    assert ctl(port, "sessions", "delete", "dev/1").returncode == 0
    assert json.loads(ctl(port, "--json", "sessions").stdout) == []
    again = PahoClient(gw.port, "dev/1", "MQTTv311", clean_session=False)
    flags = again.connect()
    assert not flags.session_present
    again.disconnect()

    retained = ctl(port, "retained", "r/#")
    assert "retained one" in retained.stdout and "<binary>" in retained.stdout
    deleted = ctl(port, "retained", "delete", "r/1")
    assert deleted.returncode == 0 and "deleted 1 retained" in deleted.stdout
    left = json.loads(ctl(port, "--json", "retained", "r/#").stdout)
    assert [(m["topic"], m["payload"]) for m in left] == [("r/2", {"base64": "/wA="})]
    late = PahoClient(gw.port, "late", "MQTTv311")
    late.connect()
    late.subscribe("r/#", 1)
    assert [m.topic for m in late.receive(1)] == ["r/2"]
    late.nothing_more(0.5)

    assert ctl(port, "bridges").stdout.split()[:2] == ["NAME", "STATE"]
    # Mistakes are one line and a non-zero exit.
    missing = ctl(port, "kick", "nobody")
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "not connected" in missing.stderr
    unreachable = globals()["ctl"](free_port(), "clients")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
    # Over TCP, reads need no credentials on loopback; changes do.
    assert globals()["ctl"](port, "clients").returncode == 0
    refused = globals()["ctl"](port, "retained", "delete", "r/2")
    assert refused.returncode == 1 and "403" in refused.stderr and "Unix socket" in refused.stderr
    late.disconnect()
    pub.disconnect()


def test_admin_api_beyond_loopback_asks_for_an_admin_user(gateway_with, tmp_path):
    from mqttgw.passwd import main as passwd

    passwords = tmp_path / "passwd"
    passwd(["-c", "-b", str(passwords), "root", "rootpw"])
    passwd(["-b", str(passwords), "viewer", "viewpw"])
    port = free_port()
    gw = gateway_with(
        "--http", f"0.0.0.0:{port}", "--password-file", str(passwords), "--admin-user", "root"
    )
    gw.wait_for_log(f"starting on {port}")
    assert http(port, "/readyz")[0] == 200
    assert http(port, "/api/clients")[0] == 401

    def as_user(user, password, path):
        import base64

        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    assert as_user("root", "wrong", "/api/clients") == 401
    assert as_user("viewer", "viewpw", "/api/clients") == 403
    assert as_user("root", "rootpw", "/api/clients") == 200
    assert as_user("root", "rootpw", "/metrics") == 200
    os.environ["MQTTGW_PASSWORD"] = "rootpw"
    try:
        listed = ctl(port, "--user", "root", "--json", "clients")
    finally:
        del os.environ["MQTTGW_PASSWORD"]
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert "rootpw" not in gw.log()


# Session lifecycle


def test_an_unused_persistent_session_expires_with_its_queue(gateway_with, tmp_path):
    data = tmp_path / "data"
    port = free_port()
    gw = gateway_with(
        "--data-dir", str(data), "--persistent-client-expiration", "2", "--http", str(port)
    )
    device = PahoClient(gw.port, "dev", "MQTTv311", clean_session=False)
    device.connect()
    device.subscribe("q", 1)
    device.disconnect()
    keeper = PahoClient(gw.port, "keeper", "MQTTv311", clean_session=False)
    keeper.connect()
    keeper.subscribe("q", 1)
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    pub.publish("q", b"queued", 1)
    pub.disconnect()
    gw.wait_for_log("expiring persistent session of client dev")
    # The connected one stays, however long.
    assert [s["client_id"] for s in json.loads(http(port, "/api/sessions")[1])] == ["keeper"]
    keeper.disconnect()
    gw.stop()
    # Gone from the store too: after a restart there is no session, no queue.
    later = gateway_with("--data-dir", str(data))
    device = PahoClient(later.port, "dev", "MQTTv311", clean_session=False)
    assert not device.connect().session_present
    device.nothing_more(0.5)
    device.disconnect()


def test_persistent_sessions_and_retained_messages_have_limits(gateway_with):
    gw = gateway_with("--max-persistent-sessions", "1", "--max-retained-messages", "1")
    sock, code = raw_connect(gw.port, "first", clean_session=False)
    assert code == 0
    sock.close()
    sock, code = raw_connect(gw.port, "second", clean_session=False)
    assert code == P.CONNACK_SERVER_UNAVAILABLE
    gw.wait_for_log("max_persistent_sessions (1) reached")
    # The first may come back; clean sessions are not counted.
    for client_id, clean in (("first", False), ("third", True)):
        sock, code = raw_connect(gw.port, client_id, clean_session=clean)
        assert code == 0
        sock.close()
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    pub.publish("r/1", b"one", 1, retain=True)
    pub.publish("r/2", b"two", 1, retain=True)
    pub.publish("r/1", b"one again", 1, retain=True)
    gw.wait_for_log("not retaining r/2: max_retained_messages (1) reached")
    late = PahoClient(gw.port, "late", "MQTTv311")
    late.connect()
    late.subscribe("r/#", 1)
    assert [(m.topic, m.payload) for m in late.receive(1)] == [("r/1", b"one again")]
    late.nothing_more(0.5)
    late.disconnect()
    pub.disconnect()


# Configuration mistakes


def run_twistd(cwd, *args, timeout=30):
    return subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "--logfile=-", "mqttgw", *args],
        cwd=cwd,
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


BRIDGE = '[[bridge]]\nname = "b"\naddresses = ["127.0.0.1:1883"]\nrules = ["a out 1"]\n'


@pytest.mark.parametrize(
    "args, config, error",
    [
        (["--tcp", "99999"], None, "port 99999 is not in 0-65535"),
        (["--max-queued-messages", "0"], None, "max_queued_messages must be at least 1"),
        (["--max-inflight-messages", "0"], None, "max_inflight_messages must be at least 1"),
        ([], BRIDGE + "keepalive = 0\n", "bridge.keepalive must be at least 1"),
        ([], BRIDGE + "max_inflight_messages = 0\n", "bridge.max_inflight_messages must be at least 1"),
        ([], BRIDGE + "max_queued_messages = -1\n", "bridge.max_queued_messages must be at least 1"),
        ([], BRIDGE + "reconnect_initial = 10.0\nreconnect_max = 5.0\n", "reconnect_max must not be below"),
        ([], '[websocket]\ntrusted_proxies = ["10.0.0.0/33"]\n', "'10.0.0.0/33' is not an address or network"),
        (["--cert", "server.pem"], None, "tls.cert (--cert) is set but there is no TLS listener"),
        (["--persistent-client-expiration", "2x"], None, "'2x' is not a duration"),
        (["--http", "0.0.0.0:9883"], None, "reachable beyond this machine"),
        (["--log-level", "loud"], None, "log.level must be one of"),
    ],
)
def test_configuration_mistakes_are_one_line_errors(tmp_path, args, config, error):
    if config is not None:
        (tmp_path / "mqttgw.toml").write_text(config)
        args = ["--config", "mqttgw.toml", *args]
    result = run_twistd(tmp_path, "--tcp", "tcp:0:interface=127.0.0.1", *args)
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("mqttgw: ") and error in lines[0], lines


def test_trusted_proxies_take_networks():
    from mqttgw.service import config

    settings = config.build({"websocket.trusted_proxies": ["10.0.0.0/8", "192.168.1.7"]}, {})
    assert [str(n) for n in settings.websocket.trusted_proxies] == ["10.0.0.0/8", "192.168.1.7/32"]


def test_a_port_in_use_is_one_line_naming_the_listener(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        result = run_twistd(tmp_path, "--tcp", f"tcp:{port}:interface=127.0.0.1")
    finally:
        taken.close()
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert "Traceback" not in output
    # Said on stderr, which twistd logs when logging to stdout.
    last = output.splitlines()[-1]
    assert f"mqttgw: tcp listener tcp:{port}:interface=127.0.0.1: cannot listen" in last
    assert last.endswith("Address already in use")


def test_a_second_gateway_on_the_same_data_dir_refuses_to_start(gateway_with, tmp_path):
    data = tmp_path / "shared-data"
    first = gateway_with("--data-dir", str(data))
    result = run_twistd(tmp_path, "--tcp", "tcp:0:interface=127.0.0.1", "--data-dir", str(data))
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and f"data directory {data} is in use by another gateway (pid {first.process.pid})" in lines[0]
    assert first.process.poll() is None


def test_help_says_what_each_flag_does():
    result = subprocess.run(
        [str(TWISTD), "mqttgw", "--help"], env=gateway_env(), capture_output=True, text=True
    )
    text = " ".join(result.stdout.split())
    assert "--no-persistence keep everything in memory only" in text
    assert "default ]" not in text
    version = subprocess.run(
        [str(TWISTD), "mqttgw", "--version"], env=gateway_env(), capture_output=True, text=True
    )
    from mqttgw import __version__

    assert version.returncode == 0 and version.stdout.startswith(f"mqttgw {__version__} ")


# Logs


def test_json_log_lines_and_a_level_sighup_changes(tmp_path):
    config = tmp_path / "mqttgw.toml"
    config.write_text("[log]\nformat = \"json\"\n")
    gw = Gateway(tmp_path, "--config", str(config))
    try:
        sock, code = raw_connect(gw.port, "c")
        sock.sendall(b"\xf0\x00")
        assert closed_by_peer(sock)
        gw.wait_for_log("closing connection of client c")
        config.write_text(
            "[log]\nformat = \"json\"\nlevel = \"warn\"\n[persistence]\ndurability = \"os\"\n"
        )
        gw.process.send_signal(signal.SIGHUP)
        # The reload's summary is info, and so no longer shown; its warning is.
        gw.wait_for_log("changed but needs a restart: persistence.durability")
        sock, code = raw_connect(gw.port, "quiet")
        sock.sendall(b"\xf0\x00")
        assert closed_by_peer(sock)
        gw.wait_for_log("closing connection of client quiet")
    finally:
        gw.stop()
    lines = gw.log().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == len(lines)
    closing = [r for r in records if "closing connection" in r["message"]]
    assert closing[0]["client_id"] == "c" and closing[0]["namespace"] == "mqttgw.transports.connection"
    assert closing[0]["level"] == "warn"
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", closing[0]["time"])
    # At warn, the connect of "c" was logged and that of "quiet" was not.
    connected = [r["message"] for r in records if "connected from" in r["message"]]
    assert any("client c " in m for m in connected)
    assert not any("quiet" in m for m in connected)
    assert not any(r["message"].startswith("reloaded") for r in records)


# Deployment


def test_systemd_unit_scores_2_5_or_lower():
    analyze = require_program("systemd-analyze")
    result = subprocess.run(
        [analyze, "security", "--offline=true", str(REPO / "deploy" / "mqttgw.service")],
        capture_output=True,
        text=True,
    )
    found = re.search(r"Overall exposure level for mqttgw.service: (\d+\.\d)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 2.5, result.stdout


def test_a_failed_tls_handshake_is_logged_with_the_peer(gateway_with, tmp_path):
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    port = free_port()
    gw = gateway_with(
        "--tls", f"tcp:{port}:interface=127.0.0.1",
        "--cert", str(tmp_path / "server.pem"), "--key", str(tmp_path / "server.key"),
    )
    # A client that trusts another authority gives up during the handshake.
    context = ssl.create_default_context(cafile=None)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    with pytest.raises(ssl.SSLError):
        context.wrap_socket(sock, server_hostname="127.0.0.1")
    gw.wait_for_log("TLS handshake with 127.0.0.1:")
    assert "failed:" in gw.log()


def test_the_gateway_freezes_its_start_up_objects_out_of_garbage_collection(tmp_path):
    gw = Gateway(tmp_path, "--log-level", "debug", "--no-persistence")
    try:
        gw.wait_for_log("garbage collector:")
        line = next(line for line in gw.log().splitlines() if "garbage collector:" in line)
        frozen = int(re.search(r"(\d+) start-up objects frozen", line).group(1))
        # Twisted and the gateway's own modules at least.
        assert frozen > 10_000
        assert "thresholds (10000, 20, 50)" in line
    finally:
        gw.stop()

"""
Bridges against a real mosquitto upstream, started by the tests: rules and
prefixes, QoS and retained messages both ways, no loops, outages (with
gateway restarts and SIGKILL), failover, backoff, the state topic, TLS.
"""

import re
import signal
import socket
import threading
import time

import pytest
import trustme

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.service import config
from tests.config_files import bridge_config
from tests.gateway import REPO, Gateway
from tests.mosquitto_broker import Mosquitto, free_port
from tests.paho import PahoClient


@pytest.fixture
def upstream(tmp_path, start_mosquitto):
    return start_mosquitto(tmp_path / "mosquitto")


_started = []


@pytest.fixture(autouse=True)
def _no_tracebacks():
    """Every gateway a test here started logged no traceback."""
    yield
    started = list(_started)
    _started.clear()
    for gw in started:
        gw.stop()
        assert "Traceback" not in gw.log(), gw.log()


def start_gateway(tmp_path, upstream_addresses, name="gw", port=None, **extra):
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    cfg = bridge_config(workdir / "bridge.toml", upstream_addresses, **extra)
    args = ["--config", cfg, "--data-dir", str(tmp_path / "gateway-data")]
    if port:
        args += ["--tcp", f"tcp:{port}:interface=127.0.0.1"]
    gw = Gateway(workdir, *args)
    _started.append(gw)
    gw.wait_for_log("bridge up: upstream accepted CONNECT")
    return gw


def client(port, client_id, **kwargs):
    c = PahoClient(port, client_id, "MQTTv311", **kwargs)
    c.connect()
    return c


def test_rules_carry_qos_and_retained_messages_both_ways_without_loops(tmp_path, upstream):
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"])
    try:
        remote = client(upstream.port, "remote-watch")
        for topic in ("local/#", "up/site/a/#", "shared/#", "unbridged/#"):
            remote.subscribe(topic, 2)
        local = client(gw.port, "local-watch")
        for topic in ("remote/#", "site/b/#", "shared/#", "elsewhere"):
            local.subscribe(topic, 2)
        local_pub = client(gw.port, "local-pub")
        remote_pub = client(upstream.port, "remote-pub")

        # out, with QoS kept up to the rule's QoS, and with prefixes
        for qos in (0, 1, 2):
            local_pub.publish("local/out/x", f"out{qos}".encode(), qos)
        local_pub.publish("site/a/1", b"prefixed", 1)
        local_pub.publish("unbridged/x", b"stays here", 1)
        got = [(m.topic, m.payload, m.qos) for m in remote.receive(4)]
        assert sorted(got) == sorted(
            [("local/out/x", b"out0", 0), ("local/out/x", b"out1", 1),
             ("local/out/x", b"out2", 2), ("up/site/a/1", b"prefixed", 1)]
        )
        # in, likewise
        for qos in (0, 1, 2):
            remote_pub.publish("remote/in/y", f"in{qos}".encode(), qos)
        remote_pub.publish("up/site/b/2", b"down", 1)
        remote_pub.publish("elsewhere", b"stays upstream", 1)
        local_got = [(m.topic, m.payload, m.qos) for m in local.receive(4)]
        assert sorted(local_got) == sorted(
            [("remote/in/y", b"in0", 0), ("remote/in/y", b"in1", 1),
             ("remote/in/y", b"in2", 2), ("site/b/2", b"down", 1)]
        )
        # both, in each direction, arrives once on each side: nothing loops.
        local_pub.publish("shared/from-local", b"L", 1)
        remote_pub.publish("shared/from-remote", b"R", 1)
        remote_seen = [(m.topic, m.payload) for m in remote.receive(2)]
        local_seen = [(m.topic, m.payload) for m in local.receive(2)]
        assert sorted(remote_seen) == [("shared/from-local", b"L"), ("shared/from-remote", b"R")]
        assert sorted(local_seen) == [("shared/from-local", b"L"), ("shared/from-remote", b"R")]
        assert remote.nothing_more(1.5)
        assert local.nothing_more(0.5)

        # retained messages keep their flag across the bridge, both ways
        local_pub.publish("local/out/state", b"kept upstream", 1, retain=True)
        remote_pub.publish("remote/in/state", b"kept here", 1, retain=True)
        remote.receive(1)
        local.receive(1)
        later_remote = client(upstream.port, "later-remote")
        later_remote.subscribe("local/out/state", 1)
        [m] = later_remote.receive()
        assert (m.payload, m.retain) == (b"kept upstream", True)
        later_local = client(gw.port, "later-local")
        later_local.subscribe("remote/in/state", 1)
        [m] = later_local.receive()
        assert (m.payload, m.retain) == (b"kept here", True)
    finally:
        gw.stop()


def _sequence_subscriber(upstream):
    """A persistent subscriber upstream that mosquitto keeps over restarts."""
    sub = PahoClient(upstream.port, "seq-watch", "MQTTv311", clean_session=False)
    sub.connect(reconnect_delay=(0.2, 0.5))
    sub.subscribe("local/out/seq", 1)
    return sub


def _publish_sequence(port, count, start=0):
    pub = PahoClient(port, f"seq-pub-{start}", "MQTTv311")
    pub.client.max_inflight_messages_set(100)
    pub.connect()
    sent = [pub.client.publish("local/out/seq", str(i).encode(), 1) for i in range(start, start + count)]
    for info in sent:
        info.wait_for_publish(30)
        assert info.is_published()
    pub.disconnect()


def _receive_sequence(sub, count):
    got = [int(m.payload) for m in sub.receive(count, timeout=60)]
    sub.nothing_more(1.0)
    return got


def test_outage_queues_1000_messages_delivered_in_order_once(tmp_path, upstream):
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"])
    try:
        sub = _sequence_subscriber(upstream)
        upstream.stop()
        gw.wait_for_log("bridge up: upstream connection lost")
        _publish_sequence(gw.port, 1000)
        upstream.start()
        assert _receive_sequence(sub, 1000) == list(range(1000))
    finally:
        gw.stop()


def test_outage_survives_gateway_restart_and_sigkill(tmp_path, upstream):
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"])
    port = gw.port
    sub = _sequence_subscriber(upstream)
    upstream.stop()
    _publish_sequence(port, 400, 0)
    gw.stop()  # a normal restart during the outage
    gw = Gateway(tmp_path / "gw", "--config", str(tmp_path / "gw" / "bridge.toml"),
                 "--data-dir", str(tmp_path / "gateway-data"), "--tcp", f"tcp:{port}:interface=127.0.0.1")
    _publish_sequence(port, 400, 400)
    gw.stop(signal.SIGKILL)  # and a crash
    gw = Gateway(tmp_path / "gw", "--config", str(tmp_path / "gw" / "bridge.toml"),
                 "--data-dir", str(tmp_path / "gateway-data"), "--tcp", f"tcp:{port}:interface=127.0.0.1")
    try:
        _publish_sequence(port, 200, 800)
        upstream.start()
        assert _receive_sequence(sub, 1000) == list(range(1000))
    finally:
        gw.stop()


def test_failover_backoff_and_state_topic(tmp_path, upstream):
    dead = f"127.0.0.1:{free_port()}"
    gw = start_gateway(tmp_path, [dead, f"127.0.0.1:{upstream.port}"])
    port = gw.port
    assert f"bridge up: upstream {dead} unreachable" in gw.log()
    assert f"bridge up: connected to 127.0.0.1:{upstream.port}" in gw.log()
    state = client(upstream.port, "state-watch")
    # Upstream, the bridge's state is mosquitto's notification topic.
    state.subscribe(f"$SYS/broker/connection/{socket.gethostname()}.up/state", 1)
    assert state.receive()[0].payload == b"1"
    # The gateway dies: the bridge's will tells the upstream.
    gw.stop(signal.SIGKILL)
    assert state.receive()[0].payload == b"0"
    gw = start_gateway(tmp_path, [dead, f"127.0.0.1:{upstream.port}"], port=port)
    try:
        assert state.receive()[0].payload == b"1"
        # The upstream goes away: reconnects back off, visibly.
        local_state = client(gw.port, "local-state")
        local_state.subscribe("mqttgw/bridge/up/state", 1)
        assert local_state.receive()[0].payload == b"1"
        upstream.stop()
        assert local_state.receive()[0].payload == b"0"
        gw.wait_for_log("Scheduling retry 2 to connect")
        delays = [float(d) for d in re.findall(r"Scheduling retry \d+ to connect .* in ([\d.]+) seconds", gw.log())]
        assert len(delays) >= 2 and max(delays) <= 2.0
        upstream.start()
        assert local_state.receive(timeout=15)[0].payload == b"1"
    finally:
        gw.stop()


class Sequence:
    """A device publishing 0, 1, 2, ... at QoS 1, ``rate`` a second, from a thread of its own."""

    def __init__(self, port, topic, rate=50):
        self.topic = topic
        self.client = client(port, "sequence-device")
        # (number, when published, paho's MQTTMessageInfo)
        self.sent = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(1.0 / rate,), daemon=True)
        self._thread.start()

    def _run(self, interval):
        n = 0
        while not self._stop.wait(interval):
            self.sent.append((n, time.monotonic(), self.client.client.publish(self.topic, str(n).encode(), 1)))
            n += 1

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        wait_for(lambda: all(info.is_published() for _, _, info in self.sent), 30, "the gateway's PUBACKs")
        self.client.disconnect()

    def after(self, moment):
        return {n for n, at, _ in self.sent if at > moment}

    @property
    def acknowledged(self):
        return {n for n, _, info in self.sent if info.is_published()}


class Arrivals:
    """What a subscriber upstream received: (when, number)."""

    def __init__(self, port, client_id):
        self.seen = []
        self.client = PahoClient(port, client_id, "MQTTv311", clean_session=False)
        self.client.client.on_message = lambda c, u, m: self.seen.append((time.monotonic(), int(m.payload)))
        # Back soon after its broker restarts, for what it kept meanwhile.
        self.client.connect(reconnect_delay=(1, 2))
        self.client.subscribe("sensors/#", 1)

    def numbers(self):
        return [n for _, n in list(self.seen)]

    def first_of(self, numbers):
        return next((at for at, n in list(self.seen) if n in numbers), None)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.05)


def test_with_the_defaults_two_mosquittos_fail_over_within_10_s_and_back_losing_nothing(tmp_path, start_mosquitto):
    first = start_mosquitto(tmp_path / "first")
    second = start_mosquitto(tmp_path / "second")
    workdir = tmp_path / "gw"
    workdir.mkdir()
    (workdir / "bridge.toml").write_text(
        '[[bridge]]\nname = "up"\n'
        f'addresses = ["127.0.0.1:{first.port}", "127.0.0.1:{second.port}"]\n'
        'rules = ["sensors/# out 1"]\n'
    )
    gw = Gateway(workdir, "--config", str(workdir / "bridge.toml"), "--data-dir", str(tmp_path / "data"))
    _started.append(gw)
    gw.wait_for_log(f"bridge up: connected to 127.0.0.1:{first.port}")
    at_first = Arrivals(first.port, "watch-first")
    at_second = Arrivals(second.port, "watch-second")
    device = Sequence(gw.port, "sensors/site/t")
    try:
        # Past the link's first 2 s, when a loss is one of a working link.
        wait_for(lambda: len(at_first.numbers()) >= 150, 20, "150 messages at the first")
        first.stop()
        stopped = time.monotonic()
        wait_for(lambda: at_second.first_of(device.after(stopped)), 10, "the bridge on the second")
        assert at_second.first_of(device.after(stopped)) - stopped < 10
        assert "bridge up: connected to 127.0.0.1:" + str(second.port) in gw.log()
        # round_robin = false: back to the first once it takes connections.
        first.start()
        restarted = time.monotonic()
        wait_for(lambda: at_first.first_of(device.after(restarted + 1)), 30, "the bridge back on the first")
    finally:
        device.stop()
    # At least once: every message the gateway acknowledged reached one
    # of them (the first's subscriber gets what it kept through its stop).
    acknowledged = device.acknowledged
    wait_for(lambda: acknowledged <= set(at_first.numbers()) | set(at_second.numbers()), 60,
             "every acknowledged message upstream")
    assert len(acknowledged) > 150
    assert f"bridge up: 127.0.0.1:{first.port}, the first address, takes connections again" in gw.log()
    for watcher in (at_first, at_second):
        watcher.client.disconnect()
    gw.stop()


@pytest.fixture(scope="module")
def upstream_pki(tmp_path_factory):
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("upstream-pki")
    server = ca.issue_cert("localhost")
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    server.private_key_pem.write_to_path(str(d / "server.key"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(d / "other-ca.pem"))
    bridge = ca.issue_cert("bridge-1@example.test", common_name="bridge-1")
    bridge.cert_chain_pems[0].write_to_path(str(d / "bridge.pem"))
    bridge.private_key_pem.write_to_path(str(d / "bridge.key"))
    return {
        "cert": str(d / "server.pem"),
        "key": str(d / "server.key"),
        "ca": str(d / "ca.pem"),
        "other_ca": str(d / "other-ca.pem"),
        "client_cert": str(d / "bridge.pem"),
        "client_key": str(d / "bridge.key"),
    }


def test_bridge_presents_a_client_certificate_to_an_upstream_that_requires_one(tmp_path, upstream_pki):
    upstream = Mosquitto(
        tmp_path / "mosquitto",
        tls=upstream_pki,
        extra=[f"cafile {upstream_pki['ca']}", "require_certificate true"],
    ).start()
    try:
        gw = start_gateway(
            tmp_path,
            [f"localhost:{upstream.tls_port}"],
            tls=True,
            ca=upstream_pki["ca"],
            cert=upstream_pki["client_cert"],
            key=upstream_pki["client_key"],
        )
        try:
            remote = client(upstream.port, "cert-watch")
            remote.subscribe("local/out/#", 1)
            pub = client(gw.port, "cert-pub")
            pub.publish("local/out/with-cert", b"identified", 1)
            assert remote.receive()[0].payload == b"identified"
        finally:
            gw.stop()
        # Without the certificate the upstream refuses the handshake.
        workdir = tmp_path / "no-cert"
        workdir.mkdir()
        address = f"localhost:{upstream.tls_port}"
        cfg = bridge_config(workdir / "bridge.toml", [address], tls=True, ca=upstream_pki["ca"])
        gw = Gateway(workdir, "--config", cfg, "--no-persistence")
        try:
            gw.wait_for_log(f"bridge up: upstream {address} TLS handshake failed")
            assert "accepted CONNECT" not in gw.log()
        finally:
            gw.stop()
    finally:
        upstream.stop()


def test_bridge_logs_in_to_an_upstream_mqttgw_with_a_token(tmp_path, gateway_with):
    import jwt

    secret = tmp_path / "secret"
    secret.write_bytes(b"k" * 40)
    central = gateway_with("--jwt-secret-file", str(secret))
    watcher = PahoClient(central.port, "central-watch", "MQTTv311")
    watcher.client.username_pw_set(
        "watch", jwt.encode({"sub": "watch", "exp": time.time() + 600}, b"k" * 40, algorithm="HS256")
    )
    watcher.connect()
    watcher.subscribe("up/site/#", 1)
    token = jwt.encode(
        # Its notification topic needs no grant: it tells only of itself.
        {"sub": "site-7", "exp": time.time() + 600, "mqtt_publish": ["up/site/#"]},
        b"k" * 40,
        algorithm="HS256",
    )
    gw = start_gateway(
        tmp_path, [f"127.0.0.1:{central.port}"], rules=["a/# out 1 site/ up/site/"],
        username="site-7", password=token,
    )
    try:
        pub = client(gw.port, "site-pub")
        pub.publish("site/a/reading", b"42", 1)
        message = watcher.receive()[0]
        assert (message.topic, message.payload) == ("up/site/a/reading", b"42")
        central.wait_for_log("(MQTT 3.1.1, clean session False, keepalive 5s, user site-7)")
    finally:
        gw.stop()
        watcher.disconnect()


def test_tls_bridge_checks_the_ca_and_the_host_name(tmp_path, upstream_pki):
    upstream = Mosquitto(tmp_path / "mosquitto", tls=upstream_pki).start()
    try:
        gw = start_gateway(
            tmp_path, [f"localhost:{upstream.tls_port}"], tls=True, ca=upstream_pki["ca"]
        )
        try:
            remote = client(upstream.port, "tls-watch")
            remote.subscribe("local/out/#", 1)
            pub = client(gw.port, "tls-pub")
            pub.publish("local/out/secure", b"over tls", 1)
            assert remote.receive()[0].payload == b"over tls"
        finally:
            gw.stop()
        for name, address, ca, message in [
            ("wrong-ca", f"localhost:{upstream.tls_port}", upstream_pki["other_ca"], "certificate verify failed"),
            ("wrong-host", f"127.0.0.1:{upstream.tls_port}", upstream_pki["ca"], "Mismatch"),
        ]:
            workdir = tmp_path / name
            workdir.mkdir()
            cfg = bridge_config(workdir / "bridge.toml", [address], tls=True, ca=ca)
            gw = Gateway(workdir, "--config", cfg, "--no-persistence")
            try:
                gw.wait_for_log(f"bridge up: upstream {address} TLS handshake failed")
                line = [l for l in gw.log().splitlines() if f"upstream {address} TLS handshake failed" in l][0]
                assert message in line and "check ca, cert, key" in line
                assert "accepted CONNECT" not in gw.log()
            finally:
                gw.stop()
    finally:
        upstream.stop()


def test_bridges_guide_field_to_central_example_is_a_valid_config(tmp_path):
    text = (REPO / "docs" / "guide" / "bridges.rst").read_text()
    example = re.search(r"# field-to-central\n(.*?)\n\n(?! )", text, re.S).group(1)
    example = "\n".join(line[4:] for line in example.splitlines())
    path = tmp_path / "example.toml"
    path.write_text("# field-to-central\n" + example + "\n")
    values = config.load_file(str(path))
    [bridge] = values["bridges"]
    checked = MQTTBridgeKind.check({k: v for k, v in bridge.items() if k not in ("ca", "cert", "key", "tls")})
    assert checked.name == "central"
    assert any(r.direction == "out" for r in checked.rules)
    assert any(r.direction == "in" for r in checked.rules)


def test_bridge_speaking_mqtt_3_1(tmp_path, upstream):
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"], protocol="mqttv31", client_id="old-bridge")
    try:
        remote = client(upstream.port, "v31-watch")
        remote.subscribe("local/out/#", 1)
        pub = client(gw.port, "v31-pub")
        pub.publish("local/out/v31", b"over 3.1", 1)
        assert remote.receive()[0].payload == b"over 3.1"
        # mosquitto numbers MQTT 3.1 as p1, and names bridges as such.
        assert "New bridge connected from 127.0.0.1" in upstream.log()
        assert "as old-bridge (p1," in upstream.log()
    finally:
        gw.stop()


# MQTT 5.0 upstream


def _v5(port, client_id, **kwargs):
    c = PahoClient(port, client_id, "MQTTv5", **kwargs)
    c.connect()
    return c


def test_a_5_0_bridge_reads_the_upstreams_receive_maximum_and_loses_nothing(tmp_path, start_mosquitto):
    # mosquitto gives max_inflight_messages as its CONNACK's receive
    # maximum, and answers a QoS 2 PUBLISH past it with PUBREC 0x97 (quota
    # exceeded): the message is refused.  The bridge's own window is 20.
    upstream = start_mosquitto(tmp_path / "mosquitto", extra=["max_inflight_messages 2"])
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"], protocol="mqttv5",
                       rules=["local/out/# out 2"], max_inflight_messages=20)
    try:
        gw.wait_for_log("bridge up: upstream limits: receive maximum 2,")
        sub = PahoClient(upstream.port, "seq-watch", "MQTTv311", clean_session=False)
        sub.connect(reconnect_delay=(0.2, 0.5))
        sub.subscribe("local/out/seq", 2)
        # A backlog while the upstream is away, so the bridge has many to send at once.
        upstream.stop()
        gw.wait_for_log("bridge up: upstream connection lost")
        pub = PahoClient(gw.port, "seq-pub", "MQTTv311")
        pub.client.max_inflight_messages_set(100)
        pub.connect()
        sent = [pub.client.publish("local/out/seq", str(i).encode(), 2) for i in range(300)]
        for info in sent:
            info.wait_for_publish(30)
            assert info.is_published()
        upstream.start()
        got = [int(m.payload) for m in sub.receive(300, timeout=60)]
        assert got == list(range(300))
        assert sub.nothing_more(1.0)
        # Not one refused: never more than 2 in flight.
        assert "upstream answered" not in gw.log()
        assert "rc151" not in upstream.log()
        assert f"Sending PUBREC to {socket.gethostname()}.up" in upstream.log()
    finally:
        gw.stop()


def test_a_5_0_bridge_carries_properties_both_ways_without_loops(tmp_path, upstream):
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"], protocol="mqttv5")
    try:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        def properties(**values):
            props = Properties(PacketTypes.PUBLISH)
            for name, value in values.items():
                setattr(props, name, value)
            return props

        remote = _v5(upstream.port, "remote5")
        remote.subscribe("shared/#", 1)
        remote.subscribe("local/out/#", 1)
        local = _v5(gw.port, "local5")
        local.subscribe("shared/#", 1)
        local.subscribe("remote/in/#", 1)
        local_pub = _v5(gw.port, "local-pub5")
        remote_pub = _v5(upstream.port, "remote-pub5")

        local_pub.publish("local/out/p", b"up", 1, properties=properties(
            ContentType="text/plain", UserProperty=[("site", "7"), ("unit", "C")],
            ResponseTopic="replies/7", CorrelationData=b"\x07"))
        [m] = remote.receive()
        assert (m.topic, m.payload) == ("local/out/p", b"up")
        assert m.properties.ContentType == "text/plain"
        assert m.properties.UserProperty == [("site", "7"), ("unit", "C")]
        assert (m.properties.ResponseTopic, m.properties.CorrelationData) == ("replies/7", b"\x07")

        remote_pub.publish("remote/in/p", b"down", 1, properties=properties(
            PayloadFormatIndicator=1, UserProperty=[("from", "centre")], MessageExpiryInterval=600))
        [m] = local.receive()
        assert (m.topic, m.payload) == ("remote/in/p", b"down")
        assert m.properties.UserProperty == [("from", "centre")]
        assert m.properties.PayloadFormatIndicator == 1
        assert 0 < m.properties.MessageExpiryInterval <= 600

        # A two-way rule: each message arrives once on each side (no local).
        local_pub.publish("shared/from-local", b"L", 1)
        remote_pub.publish("shared/from-remote", b"R", 1)
        assert sorted(m.payload for m in remote.receive(2)) == [b"L", b"R"]
        assert sorted(m.payload for m in local.receive(2)) == [b"L", b"R"]
        assert remote.nothing_more(1.5)
        assert local.nothing_more(0.5)
        assert f"as {socket.gethostname()}.up (p5," in upstream.log()
    finally:
        gw.stop()


def test_a_5_0_bridge_session_outlives_the_link_by_its_expiry_interval(tmp_path, upstream):
    port = free_port()
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"], port=port, protocol="mqttv5")
    local = PahoClient(port, "keeper", "MQTTv311", clean_session=False)
    local.connect(reconnect_delay=(0.2, 0.5))
    local.subscribe("remote/in/#", 1)
    gw.stop()
    # While the gateway is away the upstream keeps the bridge's session and
    # queues what its subscriptions match.
    remote_pub = client(upstream.port, "remote-pub")
    for i in range(5):
        remote_pub.publish("remote/in/kept", str(i).encode(), 1)
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"], port=port, protocol="mqttv5")
    try:
        assert [int(m.payload) for m in local.receive(5, timeout=30)] == list(range(5))
    finally:
        gw.stop()


# Bridges changed at runtime


def _ctl(socket_path, *args):
    """python -m mqttgw.ctl over the gateway's admin socket, where changes need no password."""
    import subprocess
    import sys

    from tests.gateway import gateway_env

    return subprocess.run(
        [sys.executable, "-m", "mqttgw.ctl", "--socket", str(socket_path), *args],
        capture_output=True, text=True, env=gateway_env(), timeout=30,
    )


def test_bridges_added_and_removed_at_runtime_survive_sighup_and_a_restart(tmp_path, upstream):
    import json
    import os
    import stat

    http = free_port()
    port = free_port()
    gw = start_gateway(tmp_path, [f"127.0.0.1:{upstream.port}"], port=port)
    gw.stop()
    args = ["--config", str(tmp_path / "gw" / "bridge.toml"), "--data-dir", str(tmp_path / "gateway-data"),
            "--tcp", f"tcp:{port}:interface=127.0.0.1", "--http", str(http)]
    gw = Gateway(tmp_path / "gw", *args)
    _started.append(gw)
    gw.wait_for_log("bridge up: upstream accepted CONNECT")
    admin = tmp_path / "gateway-data" / "admin.sock"
    extra = tmp_path / "extra.toml"
    extra.write_text(
        "[[bridge]]\n"
        f'addresses = ["127.0.0.1:{upstream.port}"]\n'
        'rules = ["x/# out 1 \\"\\" extra/"]\n'
        'client_id = "mqttgw-extra"\n'
        "reconnect_initial = 0.2\n"
    )
    added = _ctl(admin, "bridge-set", "extra", str(extra))
    assert added.returncode == 0, added.stderr
    assert "bridge extra: +extra" in added.stdout
    gw.wait_for_log("bridge extra: upstream accepted CONNECT")
    remote = client(upstream.port, "remote-extra")
    remote.subscribe("extra/#", 1)
    local = client(port, "local-extra")
    local.publish("x/1", b"through extra", 1)
    assert remote.receive()[0].payload == b"through extra"
    # Kept in the data directory, for its owner only (a table may hold a password).
    kept = tmp_path / "gateway-data" / "bridges.json"
    assert "extra" in json.loads(kept.read_text())
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    # A table that fails its checks changes nothing and says why.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"addresses": ["127.0.0.1:1"], "rules": ["a"], "colour": "red"}))
    refused = _ctl(admin, "bridge-set", "bad", str(bad))
    assert refused.returncode == 1
    assert "unknown key bridge.colour" in refused.stderr
    # The file's bridge removed at runtime.
    removed = _ctl(admin, "bridge-delete", "up")
    assert removed.returncode == 0, removed.stderr
    assert "-up" in removed.stdout
    assert _ctl(admin, "bridge-delete", "nothing").returncode == 1

    def names():
        listed = _ctl(admin, "--json", "bridges")
        assert listed.returncode == 0, listed.stderr
        return sorted(b["name"] for b in json.loads(listed.stdout))

    assert names() == ["extra"]
    # SIGHUP reads the file again: the runtime changes still apply.
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("reloaded:")
    assert names() == ["extra"]
    # And so after a restart.
    gw.stop()
    gw = Gateway(tmp_path / "gw", *args)
    _started.append(gw)
    gw.wait_for_log("bridge extra: upstream accepted CONNECT")
    assert names() == ["extra"]
    local = client(port, "local-extra-2")
    local.publish("x/2", b"after the restart", 1)
    assert [m.payload for m in remote.receive()] == [b"after the restart"]

"""The twistd plugin: options, the TOML file, and the service it builds."""

import signal
import subprocess
import sys

import pytest
from twisted.internet.testing import MemoryReactorClock as MemoryReactor

from mqttgw.service import config
from mqttgw.service.tap import Options, makeService
from tests.config_files import parse, write
from tests.gateway import REPO, TWISTD, Gateway, gateway_env


def test_defaults_listen_on_tcp_1883():
    options = parse()
    assert options.settings.listeners.tcp == ["1883"]
    assert options.settings.limits.max_packet_size == 1024 * 1024
    assert options.settings.limits.connect_timeout == 10.0


def test_tcp_option_repeats_and_takes_endpoint_strings():
    options = parse("--tcp", "1883", "--tcp", r"tcp6:1884:interface=\:\:1")
    assert options.settings.listeners.tcp == ["1883", r"tcp6:1884:interface=\:\:1"]


def test_service_listens_on_every_listener():
    reactor = MemoryReactor()
    options = parse("--tcp", "1883", "--tcp", "tcp:1884:interface=127.0.0.1", "--no-persistence")
    service = makeService(options, reactor)
    service.startService()
    ports = [(port, interface) for port, _, _, interface in reactor.tcpServers]
    assert ports == [(1883, ""), (1884, "127.0.0.1")]
    service.stopService()


def test_listener_flags_take_host_and_port():
    reactor = MemoryReactor()
    options = parse(
        "--tcp", "127.0.0.1:1883", "--ws", "[::1]:8080", "--tcp", "localhost:1884",
        "--tcp", "tcp:1885", "--no-persistence",
    )
    service = makeService(options, reactor)
    service.startService()
    ports = sorted((port, interface) for port, _, _, interface in reactor.tcpServers)
    assert ports == [(1883, "127.0.0.1"), (1884, "localhost"), (1885, ""), (8080, "::1")]
    service.stopService()


def test_a_listener_that_is_no_address_is_one_line_naming_it(tmp_path):
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--tcp", "127.0.0.1:99999"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=gateway_env(),
    )
    assert out.returncode != 0
    assert "listeners.tcp: '127.0.0.1:99999'" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_config_file_sets_every_section(tmp_path):
    path = write(
        tmp_path,
        """
        [listeners]
        tcp = ["2883"]
        [limits]
        max_packet_size = 4096
        connect_timeout = 3
        max_inflight_messages = 5
        [mqtt]
        retry_interval = 7.5
        queue_qos0_messages = true
        max_qos = 1
        """,
    )
    s = parse("--config", path).settings
    assert s["listeners.tcp"] == ["2883"]
    assert s["limits.max_packet_size"] == 4096
    assert s["limits.connect_timeout"] == 3.0
    assert s["mqtt.retry_interval"] == 7.5
    assert s["mqtt.queue_qos0_messages"] is True
    router = makeService(parse("--config", path, "--no-persistence"), MemoryReactor()).router
    assert router.limits.max_inflight_messages == 5
    assert router.max_qos == 1


def test_flags_win_over_the_file(tmp_path):
    path = write(tmp_path, '[listeners]\ntcp = ["2883"]\n[limits]\nmax_packet_size = 4096\n')
    s = parse("--config", path, "--tcp", "3883", "--max-packet-size", "8192").settings
    assert s["listeners.tcp"] == ["3883"]
    assert s["limits.max_packet_size"] == 8192


def test_every_key_but_listener_lists_has_a_flag():
    flags = {o[0] for o in Options.optParameters} | {o[0] for o in Options.optFlags}
    for key in config.KEYS:
        if key.type is list:
            assert hasattr(Options, "opt_" + key.flag.replace("-", "_"))
        else:
            assert key.flag in flags


@pytest.mark.parametrize(
    "text,message",
    [
        ("[limits]\nmax_pakcet_size = 10\n", "unknown key limits.max_pakcet_size"),
        ("[limit]\nmax_packet_size = 10\n", "unknown section [limit]"),
        ('[limits]\nmax_packet_size = "big"\n', "limits.max_packet_size must be an integer"),
        ("[limits]\nconnect_timeout = true\n", "limits.connect_timeout must be a number"),
        ("[listeners]\ntcp = 1883\n", "listeners.tcp must be a list of strings"),
        ('[listeners]\ntcp = ["nonsense:1"]\n', "listeners.tcp: 'nonsense:1'"),
        ("[mqtt]\nmax_qos = 3\n", "mqtt.max_qos must be at most 2"),
        ("[limits]\nmax_inflight_messages = 0\n", "limits.max_inflight_messages must be at least 1"),
        ("limits = 3\n", "limits must be a table"),
        ("[limits\n", "not valid TOML"),
    ],
)
def test_bad_config_stops_with_one_line_naming_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(SystemExit) as exc:
        parse("--config", path)
    line = str(exc.value.code)
    assert "\n" not in line
    assert message in line
    assert path in line or "listeners.tcp" in line


def test_missing_config_file_names_the_file(tmp_path):
    with pytest.raises(SystemExit) as exc:
        parse("--config", str(tmp_path / "absent.toml"))
    assert "absent.toml: cannot read" in str(exc.value.code)


def test_bad_flag_value_is_one_line_naming_the_flag():
    with pytest.raises(SystemExit, match="^mqttgw: --max-packet-size must be an integer, not 'lots'$"):
        parse("--max-packet-size", "lots")
    with pytest.raises(SystemExit, match="at least 1"):
        parse("--max-packet-size", "0")


# The real thing, as an operator runs it


def test_twistd_lists_the_plugin():
    out = subprocess.run(
        [str(TWISTD), "--help"], capture_output=True, text=True, cwd=REPO, timeout=60,
        env=gateway_env(),
    )
    assert "mqttgw" in out.stdout


def test_twistd_bad_config_exits_nonzero_with_the_key_named(tmp_path):
    path = write(tmp_path, "[limits]\nmax_packet_size = -5\n")
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--config", path],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=gateway_env(),
    )
    assert out.returncode != 0
    assert "limits.max_packet_size must be at least 1" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_sigterm_shuts_down_cleanly(tmp_path):
    gw = Gateway(tmp_path)
    # Running, so twistd's signal handlers are in place: the port is bound
    # before the reactor runs, and a SIGTERM then would meet Python's own.
    gw.wait_for_log("running: listeners")
    # twistd stops the reactor, then re-raises SIGTERM as its exit status.
    assert gw.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert "Server Shut Down." in gw.log()
    assert "Traceback" not in gw.log()


def test_port_in_use_fails_start_up_with_a_message(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Gateway(tmp_path / "a")
    try:
        out = subprocess.run(
            [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--tcp", f"tcp:{first.port}:interface=127.0.0.1"],
            capture_output=True,
            text=True,
            cwd=tmp_path / "b",
            timeout=60,
            env=gateway_env(),
        )
        assert out.returncode != 0
        assert "Address already in use" in out.stdout + out.stderr
    finally:
        first.stop()


def test_python_is_the_one_running_the_tests():
    # The gateway helper runs the twistd beside this interpreter.
    assert TWISTD.parent == type(TWISTD)(sys.executable).parent


def test_twist_runs_the_plugin_too(tmp_path):
    import time

    process = subprocess.Popen(
        [str(TWISTD.parent / "twist"), "mqttgw", "--tcp", "tcp:0:interface=127.0.0.1", "--no-persistence"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=gateway_env(),
    )
    try:
        deadline = time.monotonic() + 30
        lines = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if "MQTTServerFactory starting on" in line:
                break
        assert "MQTTServerFactory starting on" in lines[-1], "".join(lines)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


@pytest.mark.parametrize(
    "table,message",
    [
        ('kind = "tcp"\naddress = 1883\nbogus = 1', "unknown key listener.bogus"),
        ('kind = "udp"\naddress = 1883', "listener.kind must be one of"),
        ('kind = "tcp"', "listener.address is required"),
        ('kind = "tcp"\naddress = 1883\nallow_anonymous = "yes"', "listener.allow_anonymous must be true or false"),
        ('kind = "tls"\naddress = 8883', "a TLS listener needs cert and key"),
        ('kind = "tcp"\naddress = 1883\nallowed_origins = ["*"]', "allowed_origins is for ws and wss"),
        ('kind = "ws"\naddress = 8080\nuse_identity_as_username = true', "use_identity_as_username is for tls and wss"),
    ],
)
def test_bad_listener_tables_are_one_line_errors(tmp_path, table, message):
    path = tmp_path / "l.toml"
    path.write_text(f"[[listener]]\n{table}\n")
    with pytest.raises(SystemExit) as exc:
        parse("--config", str(path))
    assert message in str(exc.value.code)
    assert "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    "text, seconds",
    [("", None), ("90", 90), ("12h", 12 * 3600), ("2d", 2 * 86400), ("1w", 7 * 86400), ("1m", 30 * 86400), ("1y", 365 * 86400)],
)
def test_persistent_client_expiration_reads_mosquittos_units(text, seconds):
    assert config.parse_duration(text, "x") == seconds


@pytest.mark.parametrize("text", ["0", "-1h", "1.5d", "d", "2x"])
def test_persistent_client_expiration_refuses_what_is_not_a_duration(text):
    with pytest.raises(config.ConfigError, match="is not a duration"):
        config.parse_duration(text, "x")


def test_an_admin_listener_may_share_an_mqtt_listeners_endpoint_string(tmp_path):
    # Before: "RuntimeError: cannot have two services with same name", a
    # traceback at start-up.  Port 0 gives each its own port.
    gw = Gateway(tmp_path, "--http", "tcp:0:interface=127.0.0.1")
    try:
        gw.wait_for_log("running: listeners")
        assert "Traceback" not in gw.log()
    finally:
        gw.stop()


def test_one_listener_given_twice_is_one_line(tmp_path):
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw",
         "--tcp", "tcp:0:interface=127.0.0.1", "--tcp", "tcp:0:interface=127.0.0.1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=gateway_env(),
    )
    assert out.returncode != 0
    assert "tcp listener tcp:0:interface=127.0.0.1: given twice" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_a_listener_table_takes_what_it_leaves_out_from_the_main_sections(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[tls]\nuse_identity_as_username = true\n'
        '[websocket]\nallowed_origins = ["https://site.example"]\n'
        '[[listener]]\nkind = "wss"\naddress = "8081"\n'
        '[[listener]]\nkind = "wss"\naddress = "8082"\nallowed_origins = []\nuse_identity_as_username = false\n'
    )
    settings = config.build(config.load_file(str(path)), {})
    left_out, own = (config.with_inherited(t, settings) for t in settings.listener_tables)
    assert (left_out["allowed_origins"], left_out["use_identity_as_username"]) == (["https://site.example"], True)
    # A value of its own stays, an empty list included: no origin beyond its own.
    assert (own["allowed_origins"], own["use_identity_as_username"]) == ([], False)
    # Left to be worked out at start-up (no password file yet): not filled in.
    assert "allow_anonymous" not in left_out

"""
Authentication and the ACL against a running gateway, with clients nobody
here wrote: a password file written by Debian's mosquitto_passwd, paho-mqtt
in both protocol versions, mosquitto_pub/mosquitto_sub with -u/-P; and
reload on SIGHUP keeping connections up.
"""

import signal
import subprocess
import time

import pytest

from tests.conftest import require_program
from tests.mosquitto_clients import Sub, pub
from tests.network import free_port
from tests.paho import PahoClient, connack_code

VERSIONS = ["MQTTv31", "MQTTv311"]
# paho reports MQTT 3 CONNACK codes as MQTT 5 reason codes.
BAD_CREDENTIALS = {4, 134}
NOT_AUTHORIZED = {5, 135}


@pytest.fixture
def password_file(tmp_path):
    mosquitto_passwd = require_program("mosquitto_passwd")
    path = tmp_path / "passwd"
    subprocess.run([mosquitto_passwd, "-c", "-b", str(path), "alice", "s3cret"], check=True)
    subprocess.run([mosquitto_passwd, "-b", str(path), "bob", "hunter2"], check=True)
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_logs_in_with_a_mosquitto_passwd_file(gateway_with, password_file, version):
    gw = gateway_with("--password-file", str(password_file))
    assert connack_code(gw.port, version, "good", "alice", "s3cret") == 0
    assert connack_code(gw.port, version, "bad", "alice", "wrong") in BAD_CREDENTIALS
    assert connack_code(gw.port, version, "anon") in NOT_AUTHORIZED
    log = gw.log()
    assert "s3cret" not in log and "wrong" not in log


@pytest.mark.parametrize("version", ["mqttv31", "mqttv311"])
def test_mosquitto_clients_log_in_with_user_and_password(gateway_with, password_file, version):
    gw = gateway_with("--password-file", str(password_file))
    # Sub returns once mosquitto_sub has its SUBACK.
    sub = Sub(gw.port, version, "-t", "t/#", "-u", "bob", "-P", "hunter2", "-v")
    try:
        pub(gw.port, version, "t/1", "-m", "hello", "-u", "alice", "-P", "s3cret")
        assert sub.messages(1) == ["t/1 hello"]
        with pytest.raises(subprocess.CalledProcessError):
            pub(gw.port, version, "t/1", "-m", "x", "-u", "alice", "-P", "nope")
        with pytest.raises(subprocess.CalledProcessError):
            pub(gw.port, version, "t/1", "-m", "x")
    finally:
        sub.stop()


def test_anonymous_listener_is_named_in_a_warning_at_start_up(gateway_with):
    gw = gateway_with()
    gw.wait_for_log("accepts anonymous clients")


def test_sighup_applies_a_changed_password_file_and_acl_without_dropping_clients(
    gateway_with, password_file, tmp_path
):
    mosquitto_passwd = require_program("mosquitto_passwd")
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite a/#\nuser bob\ntopic read a/#\n")
    gw = gateway_with("--password-file", str(password_file), "--acl-file", str(acl))
    bob = PahoClient(gw.port, "bob", "MQTTv311")
    bob.client.username_pw_set("bob", "hunter2")
    bob.connect()
    assert bob.subscribe("a/#", 0) == [0]
    alice = PahoClient(gw.port, "alice", "MQTTv311")
    alice.client.username_pw_set("alice", "s3cret")
    alice.connect()
    alice.publish("a/1", b"before", 1)
    assert bob.receive(1)[0].payload == b"before"
    assert connack_code(gw.port, "MQTTv311", "carol", "carol", "new") in BAD_CREDENTIALS

    # carol is added; alice may no longer write a/#.
    subprocess.run([mosquitto_passwd, "-b", str(password_file), "carol", "new"], check=True)
    acl.write_text("user alice\ntopic read a/#\nuser bob\ntopic read a/#\nuser carol\ntopic a/#\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("reloaded: 3 users")
    assert connack_code(gw.port, "MQTTv311", "carol", "carol", "new") == 0
    alice.publish("a/1", b"after", 1)
    bob.nothing_more(1.0)
    gw.wait_for_log("may not publish on a/1")

    # A broken file changes nothing.
    acl.write_text("user alice\nfrobnicate a/#\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("reload failed, nothing changed")
    assert connack_code(gw.port, "MQTTv311", "carol2", "carol", "new") == 0
    assert not bob.disconnected.is_set() and not alice.disconnected.is_set()
    assert gw.process.poll() is None
    bob.disconnect()
    alice.disconnect()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_sigusr_signals_do_not_stop_the_gateway(gateway_with, sig):
    gw = gateway_with()
    gw.process.send_signal(sig)
    gw.wait_for_log("ignoring signal")
    assert gw.process.poll() is None


def test_listeners_have_their_own_anonymous_setting(gateway_with, password_file, tmp_path):
    loopback, exposed = free_port(), free_port()
    config = tmp_path / "listeners.toml"
    config.write_text(
        f'[auth]\npassword_file = "{password_file}"\n\n'
        f'[[listener]]\nkind = "tcp"\naddress = "tcp:{loopback}:interface=127.0.0.1"\nallow_anonymous = true\n\n'
        f'[[listener]]\nkind = "tcp"\naddress = "tcp:{exposed}:interface=127.0.0.1"\n'
    )
    gw = gateway_with("--config", str(config))
    gw.wait_for_log(f"starting on {exposed}")
    assert connack_code(loopback, "MQTTv311", "anon-local") == 0
    assert connack_code(exposed, "MQTTv311", "anon-exposed") in NOT_AUTHORIZED
    assert connack_code(exposed, "MQTTv311", "alice", "alice", "s3cret") == 0
    assert connack_code(loopback, "MQTTv311", "bad", "alice", "wrong") in BAD_CREDENTIALS
    gw.wait_for_log(f"listener tcp:{loopback}:interface=127.0.0.1 (tcp) accepts anonymous clients")
    assert f"listener tcp:{exposed}" not in gw.log()


def test_a_listener_may_accept_tokens_only(gateway_with, password_file, tmp_path):

    import jwt

    secret = tmp_path / "secret"
    secret.write_bytes(b"t" * 40)
    tokens_only = free_port()
    config = tmp_path / "listeners.toml"
    config.write_text(
        f'[auth]\npassword_file = "{password_file}"\njwt_secret_file = "{secret}"\n\n'
        f'[[listener]]\nkind = "tcp"\naddress = "tcp:{tokens_only}:interface=127.0.0.1"\nauth = ["token"]\n'
    )
    gw = gateway_with("--config", str(config))
    gw.wait_for_log(f"starting on {tokens_only}")
    token = jwt.encode({"sub": "svc", "exp": time.time() + 60}, b"t" * 40, algorithm="HS256")
    assert connack_code(tokens_only, "MQTTv311", "tok", "svc", token) == 0
    assert connack_code(tokens_only, "MQTTv311", "pw", "alice", "s3cret") in BAD_CREDENTIALS
    # The other listener takes both.
    assert connack_code(gw.port, "MQTTv311", "pw2", "alice", "s3cret") == 0
    assert connack_code(gw.port, "MQTTv311", "tok2", "svc", token) == 0

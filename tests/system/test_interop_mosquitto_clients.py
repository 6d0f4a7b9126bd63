"""
mosquitto_pub and mosquitto_sub, speaking MQTT 3.1 and 3.1.1, against the
gateway run by twistd.
"""

import signal
import subprocess

import pytest

from tests.conftest import require_program
from tests.mosquitto_clients import TIMEOUT, Sub
from tests.mosquitto_clients import pub as _pub

pytestmark = pytest.mark.parametrize("version", ["mqttv31", "mqttv311"])


def pub(gateway, *args, **kwargs):
    _pub(gateway.port, *args, **kwargs)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_and_subscribe_at_each_qos(gateway, version, qos):
    sub = Sub(gateway.port, version, "-t", "m/#", "-q", str(qos), "-i", "msub")
    lines = "\n".join(f"line {i}" for i in range(10)) + "\n"
    pub(gateway, version, "m/lines", "-q", str(qos), "-l", input=lines)
    assert sub.messages(10) == [f"m/lines line {i}" for i in range(10)]
    # QoS 1 and 2 deliveries to mosquitto_sub were acknowledged by it.
    if qos == 1:
        sub.wait_for_debug("sending PUBACK", 10)
    elif qos == 2:
        sub.wait_for_debug("sending PUBCOMP", 10)
    sub.stop()


def test_retained_set_and_clear(gateway, version):
    pub(gateway, version, "r/x", "-r", "-q", "1", "-m", "kept")
    out = subprocess.run(
        [require_program("mosquitto_sub"), "-p", str(gateway.port), "-V", version,
         "-t", "r/#", "-v", "-C", "1", "-W", "5"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert out.stdout == "r/x kept\n"
    pub(gateway, version, "r/x", "-r", "-q", "1", "-n")
    out = subprocess.run(
        [require_program("mosquitto_sub"), "-p", str(gateway.port), "-V", version,
         "-t", "r/#", "-v", "-C", "1", "-W", "1"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert out.stdout == ""


def test_will_on_killed_client(gateway, version):
    watcher = Sub(gateway.port, version, "-t", "will/#", "-q", "1", "-i", "watcher")
    device = Sub(
        gateway.port, version, "-t", "nothing", "-i", "device",
        "--will-topic", "will/device", "--will-payload", "gone", "--will-qos", "1",
    )
    device.stop(signal.SIGKILL)
    assert watcher.messages(1) == ["will/device gone"]
    watcher.stop()


def test_persistent_session_resumed_with_queued_messages(gateway, version):
    keeper = Sub(gateway.port, version, "-t", "q/#", "-q", "2", "-i", "keeper", "-c")
    keeper.stop(signal.SIGKILL)
    pub(gateway, version, "q/a", "-q", "1", "-m", "one")
    pub(gateway, version, "q/b", "-q", "2", "-m", "two")
    pub(gateway, version, "q/c", "-q", "1", "-m", "three")
    back = Sub(gateway.port, version, "-t", "q/#", "-q", "2", "-i", "keeper", "-c")
    got = back.messages(3)
    assert sorted(got) == ["q/a one", "q/b two", "q/c three"]
    assert [g for g in got if g != "q/b two"] == ["q/a one", "q/c three"]
    back.stop()


def test_takeover_closes_the_older_connection(gateway, version):
    first = Sub(gateway.port, version, "-t", "tk", "-i", "same")
    pub(gateway, version, "tk", "-i", "same", "-m", "hello")
    gateway.wait_for_log("client same taken over")
    # mosquitto_sub noticed the close and connected again.
    first.wait_for_debug("sending CONNECT", 2)
    first.stop()

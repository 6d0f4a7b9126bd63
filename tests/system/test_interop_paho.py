"""
paho-mqtt, in both MQTT 3.1 and 3.1.1 modes, against the gateway run by
twistd: QoS 0/1/2 both ways, retained messages, wills, persistent sessions
and take-over.
"""

import pytest

from tests.paho import PahoClient

pytestmark = pytest.mark.parametrize("version", ["MQTTv31", "MQTTv311"])


def client(gateway, client_id, version, **kwargs):
    c = PahoClient(gateway.port, client_id, version, **kwargs)
    c.connect()
    return c


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_and_receive_at_each_qos(gateway, version, qos):
    sub = client(gateway, "sub", version)
    assert sub.subscribe("t/#", qos) == [qos]
    pub = client(gateway, "pub", version)
    for i in range(20):
        pub.publish(f"t/{i}", f"m{i}".encode(), qos)
    got = sub.receive(20)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        (f"t/{i}", f"m{i}".encode(), qos) for i in range(20)
    ]
    assert sub.nothing_more()
    sub.disconnect()
    pub.disconnect()


def test_delivery_is_downgraded_to_the_subscription_qos(gateway, version):
    sub = client(gateway, "sub", version)
    sub.subscribe("d", 1)
    pub = client(gateway, "pub", version)
    pub.publish("d", b"x", 2)
    [m] = sub.receive()
    assert m.qos == 1


def test_retained_set_and_clear(gateway, version):
    pub = client(gateway, "pub", version)
    pub.publish("r/state", b"on", 1, retain=True)
    first = client(gateway, "first", version)
    first.subscribe("r/+", 1)
    [m] = first.receive()
    assert (m.topic, m.payload, m.retain) == ("r/state", b"on", True)
    pub.publish("r/state", b"", 1, retain=True)
    [cleared] = first.receive()
    assert cleared.payload == b"" and not cleared.retain
    second = client(gateway, "second", version)
    second.subscribe("r/+", 1)
    assert second.nothing_more()


def test_will_is_published_when_the_connection_drops(gateway, version):
    watcher = client(gateway, "watcher", version)
    watcher.subscribe("will/#", 1)
    device = client(gateway, "device", version, will=("will/device", b"lost", 1, False))
    device.drop()
    [m] = watcher.receive()
    assert (m.topic, m.payload, m.qos) == ("will/device", b"lost", 1)


def test_will_is_not_published_after_disconnect(gateway, version):
    watcher = client(gateway, "watcher", version)
    watcher.subscribe("will/#", 1)
    device = client(gateway, "device", version, will=("will/device", b"lost", 1, False))
    device.disconnect()
    assert watcher.nothing_more(1.0)


def test_persistent_session_receives_what_was_queued_while_offline(gateway, version):
    sub = client(gateway, "keeper", version, clean_session=False)
    sub.subscribe("q/#", 2)
    sub.disconnect()
    pub = client(gateway, "pub", version)
    pub.publish("q/0", b"zero", 0)
    for i in range(1, 6):
        pub.publish(f"q/{i}", f"m{i}".encode(), 1 if i % 2 else 2)
    back = PahoClient(gateway.port, "keeper", version, clean_session=False)
    flags = back.connect()
    if version == "MQTTv311":
        assert flags.session_present
    got = [(m.topic, m.payload, m.qos) for m in back.receive(5)]
    expected = [(f"q/{i}", f"m{i}".encode(), 1 if i % 2 else 2) for i in range(1, 6)]
    # In order within each QoS level (paho hands QoS 2 over only at PUBREL).
    for qos in (1, 2):
        assert [g for g in got if g[2] == qos] == [e for e in expected if e[2] == qos]
    assert back.nothing_more()


def test_takeover_disconnects_the_older_client(gateway, version):
    first = client(gateway, "same", version)
    first.subscribe("x", 0)
    second = client(gateway, "same", version)
    assert first.disconnected.wait(10)
    second.subscribe("x", 0)
    pub = client(gateway, "pub", version)
    pub.publish("x", b"to the new one", 0)
    [m] = second.receive()
    assert m.payload == b"to the new one"
    gateway.wait_for_log("client same taken over")

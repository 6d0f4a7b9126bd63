"""
Wills: when a connection's will is published, delayed or discarded, and what
it carries, driven through fake transports and a fake clock.

A test of behaviour the versions share runs for each of them (``version``
is :data:`~mqttgw.testing.V31`, ``V311`` or ``V5``).  A 5.0 test is named
after the normative statement of the OASIS MQTT Version 5.0 standard it
covers (``MQTT_3_1_2_4`` is [MQTT-3.1.2-4]; further statements in its
docstring); tests/CONFORMANCE.md and tests/CONFORMANCE5.md map the
statements to the tests.
"""

import pytest

from mqttgw.testing import (
    V31,
    V311,
    V5,
    FakeBroker,
    close_reason,
    connect,
    connect5,
    connected,
    decode5,
    deliveries,
    disconnect_of,
    options,
    payloads,
    publishes,
    raw,
    subscribe,
    subscribed,
)
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests.versions import both_versions, every_version
from tests.wills import will_client, will_watcher


# MQTT 3.1 and 3.1.1


@pytest.mark.parametrize(
    "ending",
    ["connection lost", "keepalive", "protocol violation"],
)
@every_version
def test_will_is_published_when_the_connection_ends_without_disconnect(broker, version, ending):
    watcher = will_watcher(broker)
    client = connected(
        broker, "c", keepalive=5, will_topic="will/c", will_message=b"bye", will_qos=1, version=version
    )
    if ending == "connection lost":
        client.lose_connection()
    elif ending == "keepalive":
        broker.clock.advance(8)
    else:
        client.send_bytes(b"\xf0\x00")
    assert deliveries(watcher.received()) == [("will/c", b"bye", 1)]


@every_version
def test_will_is_discarded_on_disconnect(broker, version):
    watcher = will_watcher(broker)
    client = connected(broker, "c", will_topic="will/c", will_message=b"bye", version=version)
    client.send(P.Disconnect())
    client.finish_close()
    assert deliveries(watcher.received()) == []


@every_version
def test_will_is_published_only_once(broker, version):
    watcher = will_watcher(broker)
    client = connected(broker, "c", will_topic="will/c", will_message=b"bye", version=version)
    client.send_bytes(b"\xf0\x00")
    client.finish_close()
    assert len(deliveries(watcher.received())) == 1


@every_version
def test_MQTT_3_1_2_15_will_retain_1_is_retained(broker, version):
    """MQTT-3.1.2-15."""
    client = connected(broker, "c", version, will_topic="will/c", will_message=b"offline", will_retain=True)
    client.lose_connection()
    later = connected(broker, "later", version=version)
    later.send(P.Subscribe(1, [("will/c", 0)]))
    suback, retained = later.received()
    assert (retained.topic, retained.payload, retained.retain) == ("will/c", b"offline", True)


@every_version
@pytest.mark.parametrize("will_topic", ["will/+", "will/#", ""])
def test_will_topic_with_wildcard_or_empty_closes(broker, logged, version, will_topic):
    client = broker.client(connect("c", version, will_topic=will_topic, will_message=b"x"))
    if version is V5:
        # 5.0 has a code for it: CONNACK 0x90, Topic Name invalid.
        [connack] = client.received()
        assert connack.return_code == R.TOPIC_NAME_INVALID
    else:
        assert client.received() == []
    problem = f"topic name {will_topic!r} contains a wildcard" if will_topic else "topic name is empty"
    assert close_reason(client, logged()) == f"invalid will topic: {problem}"


# MQTT 5.0


def test_MQTT_3_1_2_12_will_qos_3_is_malformed(broker, logged):
    """MQTT-3.1.2-12, MQTT-3.1.4-1."""
    wire = bytearray(connect5("c", will_topic="w", will_message=b"m", will_qos=1).encode())
    wire[9] |= 0x18  # Will QoS 3
    client = broker.client()
    client.send_bytes(bytes(wire))
    # Malformed: closed without a CONNACK.
    assert decode5(raw(client)) == []
    assert close_reason(client, logged()) == "will QoS 3 is reserved"


def test_MQTT_3_2_2_12_will_qos_above_the_maximum_is_refused(broker):
    """MQTT-3.2.2-12, MQTT-3.2.2-6, MQTT-3.2.2-7."""
    broker.router.max_qos = 1
    client = broker.client(connect5("c", will_topic="w", will_message=b"m", will_qos=2))
    [connack] = client.received()
    assert connack.return_code == R.QOS_NOT_SUPPORTED
    assert connack.session_present is False
    assert client.closed


def test_MQTT_3_2_2_13_will_retain_without_retain_available_is_refused():
    """MQTT-3.2.2-13, MQTT-3.2.2-7."""
    broker = FakeBroker(retain_available=False)
    client = broker.client(connect5("c", will_topic="w", will_message=b"m", will_retain=True))
    [connack] = client.received()
    assert connack.return_code == R.RETAIN_NOT_SUPPORTED
    assert connack.session_present is False
    assert client.closed


def test_MQTT_3_1_2_8_will_is_published_after_the_will_delay(broker):
    """MQTT-3.1.2-8, MQTT-3.1.2-7."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=5, expiry=60)
    client.lose_connection()
    broker.clock.advance(4.9)
    assert watcher.received() == []
    broker.clock.advance(0.2)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_2_8_will_without_delay_is_published_at_once(broker):
    """MQTT-3.1.2-8."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, expiry=60)
    client.lose_connection()
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_3_9_no_will_when_the_client_comes_back_within_the_delay(broker):
    """MQTT-3.1.3-9, MQTT-3.1.2-8."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=10, expiry=60)
    client.lose_connection()
    broker.clock.advance(5)
    back = connected(broker, "c", clean_start=False, version=V5)
    assert back.connack.session_present is True
    broker.clock.advance(100)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_will_is_published_when_the_session_ends_before_the_delay(broker):
    """MQTT-3.1.2-8, MQTT-4.1.0-2."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=30, expiry=5)
    client.lose_connection()
    broker.clock.advance(4.9)
    assert watcher.received() == []
    broker.clock.advance(0.2)
    assert payloads(watcher.received()) == [b"gone"]
    broker.clock.advance(60)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_will_delay_with_session_expiry_0_publishes_at_once(broker):
    """MQTT-3.1.2-8: the session ends with the connection."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=30)
    client.lose_connection()
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_2_8_clean_start_reconnection_within_the_delay_sends_no_will(broker):
    """MQTT-3.1.2-8: a new Network Connection for the Client Identifier
    within the delay, even one that starts a new session (Clean Start 1,
    which ends the old one), means no will."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=30, expiry=60)
    client.lose_connection()
    broker.clock.advance(10)
    again = connected(broker, "c", clean_start=True, version=V5)
    assert again.connack.session_present is False
    broker.clock.advance(100)
    assert watcher.received() == []


@pytest.mark.parametrize("clean_start", [True, False])
@pytest.mark.parametrize("expiry", [0, 60])
def test_MQTT_3_1_2_8_takeover_within_the_delay_sends_no_will(broker, clean_start, expiry):
    """MQTT-3.1.2-8, MQTT-3.1.4-3: a connection taken over by a new one for
    its Client Identifier is closed; the new connection came before the
    Will Delay Interval could pass, so its will is not sent, whether the
    session goes on or not."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    first = will_client(broker, delay=5, expiry=expiry)
    second = connected(
        broker,
        "c",
        clean_start=clean_start,
        properties={"session_expiry_interval": 60},
        version=V5,
    )
    assert disconnect_of(first).reason_code == R.SESSION_TAKEN_OVER
    assert second.connack.session_present is (not clean_start and expiry > 0)
    broker.clock.advance(100)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_takeover_without_a_delay_sends_the_will_when_the_session_ends(broker):
    """MQTT-3.1.2-8, MQTT-3.1.4-3: with no delay, a session that ends at
    the takeover (Clean Start 1) publishes the will of the connection it
    closed; one that goes on (Clean Start 0) does not."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    will_client(broker, expiry=60)
    connected(
        broker,
        "c",
        clean_start=False,
        properties={"session_expiry_interval": 60},
        version=V5,
    )
    assert watcher.received() == []
    will_client(broker, expiry=60)
    connected(broker, "c", clean_start=True, version=V5)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_2_8_a_311_connection_within_the_delay_sends_no_will(broker):
    """MQTT-3.1.2-8: a new connection for the Client Identifier in any
    protocol version comes within the delay."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=30, expiry=60)
    client.lose_connection()
    broker.clock.advance(10)
    connected(broker, "c", clean_session=True)
    broker.clock.advance(100)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_a_refused_connect_does_not_cancel_the_will():
    """MQTT-3.1.2-8: only a connection the server accepts counts as the
    client's: a CONNECT refused for its credentials leaves the will to
    its delay (else anyone could silence another client's will)."""
    broker = FakeBroker(passwords={"u": "right"})
    watcher = broker.client(connect5("w", username="u", password=b"right"))
    watcher.received()
    subscribe(watcher, ("will", options(0)))
    client = broker.client(
        connect5(
            "c", username="u", password=b"right",
            properties={"session_expiry_interval": 60},
            will_topic="will", will_message=b"gone", will_qos=1,
            will_properties={"will_delay_interval": 5},
        )
    )
    assert client.received()[0].return_code == R.SUCCESS
    client.lose_connection()
    intruder = broker.client(connect5("c", username="u", password=b"wrong"))
    broker.clock.advance(1)
    assert decode5(raw(intruder))[0].return_code == R.BAD_USER_NAME_OR_PASSWORD
    broker.clock.advance(10)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_14_4_3_normal_disconnect_discards_the_will(broker):
    """MQTT-3.14.4-3, MQTT-3.1.2-10."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=5, expiry=60)
    client.send(P.Disconnect(R.NORMAL_DISCONNECTION))
    assert client.closed
    broker.clock.advance(100)
    assert watcher.received() == []


def test_disconnect_0x04_publishes_the_will(broker):
    """DISCONNECT with Will Message (0x04): the will is published."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker)
    client.send(P.Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE))
    assert client.closed
    assert payloads(watcher.received()) == [b"gone"]


def test_disconnect_0x04_publishes_the_will_after_its_delay(broker):
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker, delay=5, expiry=60)
    client.send(P.Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE))
    broker.clock.advance(4)
    assert watcher.received() == []
    broker.clock.advance(2)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_3_10_will_properties_are_published_in_order(broker):
    """MQTT-3.1.3-10; the will's message properties travel with it."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    users = [("z", "1"), ("a", "2"), ("z", "3")]
    client = will_client(
        broker, user_property=users, content_type="text/plain", response_topic="r"
    )
    client.lose_connection()
    [will] = publishes(watcher.received())
    assert will.properties["user_property"] == users
    assert will.properties["content_type"] == "text/plain"
    assert will.properties["response_topic"] == "r"
    assert "will_delay_interval" not in will.properties


def test_MQTT_3_1_2_14_will_retain_0_is_not_retained(broker):
    """MQTT-3.1.2-14."""
    client = will_client(broker, retain=False)
    client.lose_connection()
    watcher = subscribed(broker, "w", ("will", 0), version=V5)
    assert publishes(watcher.received()) == []

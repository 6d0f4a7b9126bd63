"""
Bad input: malformed packets, protocol errors and bad strings get a clear
refusal (a DISCONNECT reason code in 5.0) and close only that connection,
driven through fake transports and a fake clock.

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
    connected,
    deliveries,
    disconnect_of,
    options,
    payloads,
    publish,
    publishes,
    subscribed,
)
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests.wills import will_client
from tests.versions import both_versions, every_version


# MQTT 3.1 and 3.1.1


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xf0\x00",  # reserved type 15
        b"\x00\x00",  # reserved type 0
        b"\x30\xff\xff\xff\xff\x01",  # 5-byte remaining length
        b"\x32\x05\x00\x03a/b",  # QoS 1 PUBLISH without message id
        b"\x30\x05\x00\x03\xff\xfe\xfd",  # bad UTF-8 topic
        b"\x20\x02\x00\x00",  # CONNACK from a client
        b"\x90\x03\x00\x01\x00",  # SUBACK from a client
        b"\xd0\x00",  # PINGRESP from a client
    ],
)
def test_bad_input_closes_only_that_connection_and_is_logged(broker, logged, garbage):
    bystander = subscribed(broker, "bystander", ("a", 0))
    bad = connected(broker, "bad")
    bad.send_bytes(garbage)
    assert bad.closed
    assert not bystander.closed
    assert broker.router.stats.protocol_errors == 1
    [line] = [m for m in logged() if "closing connection" in m]
    assert "bad" in line and "127.0.0.1:" in line
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"still works"))
    assert deliveries(bystander.received()) == [("a", b"still works", 0)]


def test_packet_over_the_size_limit_closes(logged):
    broker = FakeBroker(max_packet_size=100)
    client = connected(broker, "c")
    client.send(P.Publish("a", b"x" * 200))
    assert close_reason(client, logged()) == "packet of 206 bytes exceeds maximum packet size 100"


def test_bytes_after_a_violation_in_the_same_chunk_are_ignored(broker):
    sub = subscribed(broker, "s", ("a", 0))
    bad = connected(broker, "bad")
    bad.send_bytes(b"\xf0\x00" + P.Publish("a", b"never").encode())
    assert deliveries(sub.received()) == []


def test_internal_error_closes_the_connection_without_escaping(broker, logged):
    client = connected(broker, "c")

    def explode(message):
        raise RuntimeError("boom")

    broker.router.publish = explode
    client.send(P.Publish("a", b"x"))  # must not raise
    assert client.closed
    assert any("internal error" in m for m in logged())


# MQTT 5.0


def test_MQTT_4_13_1_1_malformed_packet_gets_disconnect_0x81(broker):
    """MQTT-4.13.1-1, MQTT-3.3.1-4 (QoS 3), MQTT-3.14.4-1: nothing after the
    DISCONNECT."""
    client = connected(broker, "c", version=V5)
    client.send_bytes(b"\x36\x05\x00\x01t\x00\x01" + P.Pingreq().encode())
    packets = client.received()
    assert packets == [packets[-1]] and isinstance(packets[0], P.Disconnect), packets
    assert packets[0].reason_code == R.MALFORMED_PACKET
    assert client.closed


def test_MQTT_3_6_1_1_pubrel_with_bad_flags_is_malformed(broker):
    """MQTT-3.6.1-1, MQTT-2.1.3-1."""
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1))
    client.received()
    client.send_bytes(b"\x60\x02\x00\x01")
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


def test_MQTT_3_14_1_1_disconnect_with_reserved_flags_gets_disconnect_0x81(broker):
    """MQTT-3.14.1-1; the will is published (not a normal disconnection)."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    client = will_client(broker)
    client.send_bytes(b"\xe1\x00")
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_15_1_1_auth_with_reserved_flags_is_malformed(broker, logged):
    """MQTT-3.15.1-1."""
    client = connected(broker, "c", version=V5)
    client.send_bytes(b"\xf1\x00")
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET
    assert close_reason(client, logged()) == "AUTH fixed header flags 0x1 are reserved"


def test_MQTT_4_13_2_1_packet_too_large_gets_disconnect_0x95_and_close():
    """MQTT-4.13.2-1, MQTT-3.2.2-15, MQTT-3.14.2-2."""
    broker = FakeBroker(max_packet_size=64)
    client = connected(broker, "c", version=V5)
    client.send(P.Subscribe(1, [("t" * 100, 0)], {}))
    disconnect = disconnect_of(client)
    assert disconnect.reason_code == R.PACKET_TOO_LARGE
    assert "session_expiry_interval" not in disconnect.properties


@pytest.mark.parametrize(
    "wire",
    [
        # Ill-formed UTF-8 in the topic.
        P.Publish(b"a/\xc3", b"x", properties={}).encode(),
        # A surrogate code point, as UTF-8 would spell it.
        P.Publish(b"a/\xed\xb0\x80", b"x", properties={}).encode(),
        # U+0000 in the topic.
        P.Publish("a/\x00", b"x", properties={}).encode(),
        # A user property whose value is ill-formed UTF-8.
        P.Publish("a", b"x", properties={"user_property": [("k", b"\xff")]}).encode(),
        # A user property name holding U+0000.
        P.Publish("a", b"x", properties={"user_property": [("k\x00", "v")]}).encode(),
        # A Response Topic, a Content Type that are not UTF-8.
        P.Publish("a", b"x", properties={"response_topic": b"r/\xff"}).encode(),
        P.Publish("a", b"x", properties={"content_type": b"\xc0\xaf"}).encode(),
    ],
    ids=["utf8", "surrogate", "nul", "pair-value", "pair-name-nul", "response-topic",
         "content-type"],
)
def test_MQTT_1_5_4_1_bad_strings_are_malformed(broker, wire):
    """MQTT-1.5.4-1, MQTT-1.5.4-2, MQTT-1.5.7-1, MQTT-3.3.2-1, MQTT-4.7.3-2,
    MQTT-3.3.2-13, MQTT-3.3.2-19: DISCONNECT 0x81, nothing routed."""
    watcher = subscribed(broker, "w", ("#", 0), version=V5)
    client = connected(broker, "c", version=V5)
    client.send_bytes(wire)
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET
    assert publishes(watcher.received()) == []


def test_MQTT_1_5_4_3_byte_order_mark_is_kept(broker):
    """MQTT-1.5.4-3, MQTT-4.7.3-4: U+FEFF is part of the topic; nothing is
    stripped or normalised in matching."""
    bom = subscribed(broker, "bom", ("\ufeffa/b", 0), version=V5)
    plain = subscribed(broker, "plain", ("a/b", 0), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("\ufeffa/b", b"1"), publish("a/b", b"2"))
    assert [(p.topic, p.payload) for p in publishes(bom.received())] == [("\ufeffa/b", b"1")]
    assert [(p.topic, p.payload) for p in publishes(plain.received())] == [("a/b", b"2")]


@pytest.mark.parametrize(
    "wire",
    [
        P.Subscribe(1, [(b"a/\xff", 0)], {}).encode(),
        P.Subscribe(1, [("a/\x00", 0)], {}).encode(),
        P.Unsubscribe(1, [b"a/\xed\xa0\x80"], {}).encode(),
        # UNSUBSCRIBE with fixed-header flags 0000 rather than 0010.
        b"\xa0" + P.Unsubscribe(1, ["a"], {}).encode()[1:],
    ],
    ids=["subscribe-utf8", "subscribe-nul", "unsubscribe-utf8", "unsubscribe-flags"],
)
def test_MQTT_3_8_3_1_bad_subscribe_and_unsubscribe_are_malformed(broker, wire):
    """MQTT-3.8.3-1, MQTT-3.10.3-1, MQTT-3.10.1-1: DISCONNECT 0x81."""
    client = subscribed(broker, "c", ("a/#", 0), version=V5)
    client.send_bytes(wire)
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET

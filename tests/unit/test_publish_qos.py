"""
PUBLISH and its QoS flows, both ways: acknowledgements, duplicates, message
ids, retries and resumption, message properties, expiry and topic aliases,
driven through fake transports and a fake clock.

A test of behaviour the versions share runs for each of them (``version``
is :data:`~mqttgw.testing.V31`, ``V311`` or ``V5``).  A 5.0 test is named
after the normative statement of the OASIS MQTT Version 5.0 standard it
covers (``MQTT_3_1_2_4`` is [MQTT-3.1.2-4]; further statements in its
docstring); tests/CONFORMANCE.md and tests/CONFORMANCE5.md map the
statements to the tests.
"""

import pytest

from mqttgw.broker.session import SessionLimits
from mqttgw.testing import (
    V31,
    V311,
    V5,
    FakeBroker,
    close_reason,
    connect5,
    connected,
    deliveries,
    disconnect_of,
    in_version,
    options,
    payloads,
    publish,
    publishes,
    subscribe,
    subscribed,
)
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests.versions import both_versions, every_version


def _resolve_aliases(packets, maximum):
    """The topics of PUBLISHes to a client that keeps the aliases it is sent."""
    mapping = {}
    topics = []
    for p in publishes(packets):
        alias = p.properties.get("topic_alias")
        if alias is not None:
            assert 1 <= alias <= maximum, alias
            if p.topic:
                mapping[alias] = p.topic
            else:
                assert alias in mapping, f"alias {alias} used before it was set"
        else:
            assert p.topic
        topics.append(p.topic or mapping[alias])
    return topics


# MQTT 3.1 and 3.1.1


@every_version
def test_qos0_publish_is_delivered(broker, version):
    sub = subscribed(broker, "s", ("a", 0), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"hello"))
    assert pub.received() == []
    assert sub.received() == [in_version(version, P.Publish("a", b"hello"))]


@every_version
def test_qos1_publish_is_acknowledged_and_delivered(broker, version):
    sub = subscribed(broker, "s", ("a", 1), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 1, message_id=7))
    assert pub.received() == [in_version(version, P.Puback(7))]
    [delivered] = sub.received()
    assert (delivered.qos, delivered.payload) == (1, b"x")
    assert delivered.message_id != 0


@every_version
def test_qos2_publish_is_delivered_exactly_once(broker, version):
    sub = subscribed(broker, "s", ("a", 2), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 2, message_id=9))
    assert pub.received() == [in_version(version, P.Pubrec(9))]
    # The publisher did not see the PUBREC and sends again with DUP.
    pub.send(P.Publish("a", b"x", 2, dup=True, message_id=9))
    assert pub.received() == [in_version(version, P.Pubrec(9))]
    assert len(deliveries(sub.received())) == 1
    pub.send(P.Pubrel(9))
    assert pub.received() == [in_version(version, P.Pubcomp(9))]
    # After PUBREL the id is free: the same id now carries a new message.
    pub.send(P.Publish("a", b"y", 2, message_id=9))
    assert deliveries(sub.received()) == [("a", b"y", 2)]


@both_versions
def test_pubrel_for_unknown_id_is_still_completed(broker, version):
    pub = connected(broker, "p", version=version)
    pub.send(P.Pubrel(33))
    assert pub.received() == [P.Pubcomp(33)]


@every_version
@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_delivery_qos_is_the_lower_of_publish_and_granted(broker, version, pub_qos, sub_qos):
    sub = subscribed(broker, "s", ("a", sub_qos), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", pub_qos, message_id=1 if pub_qos else None))
    [delivered] = deliveries(sub.received())
    assert delivered[2] == min(pub_qos, sub_qos)


@every_version
@pytest.mark.parametrize("topic", ["a/+", "a/#", "#", "+"])
def test_MQTT_3_3_2_2_wildcard_in_topic_name_closes_the_connection(broker, logged, version, topic):
    """MQTT-3.3.2-2, MQTT-4.7.0-1: 5.0 gets a DISCONNECT 0x90 first."""
    pub = connected(broker, "p", version)
    pub.send(P.Publish(topic, b"x"))
    if version is V5:
        assert disconnect_of(pub).reason_code == R.TOPIC_NAME_INVALID
    assert close_reason(pub, logged()) == f"invalid topic name {topic!r} in PUBLISH"


def test_traced_deliveries_are_the_next_message_and_then_one_in_every(broker):
    sub = subscribed(broker, "s", ("t", 0))
    pub = connected(broker, "p")
    pub.send(P.Publish("t", b"before"))
    traced = []

    def trace(message):
        traced.append(message.payload)
        return message

    broker.router.trace_deliveries(trace, 3)
    for i in range(7):
        pub.send(P.Publish("t", b"%d" % i))
    assert traced == [b"0", b"3", b"6"]
    assert [payload for _, payload, _ in deliveries(sub.received())] == [b"before"] + [
        b"%d" % i for i in range(7)
    ]


@every_version
def test_outbound_qos1_is_removed_from_inflight_on_puback(broker, version):
    sub = subscribed(broker, "s", ("a", 1), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    [delivered] = sub.received()
    assert list(broker.router.sessions["s"].inflight) == [delivered.message_id]
    sub.send(P.Puback(delivered.message_id))
    assert broker.router.sessions["s"].inflight == {}


@every_version
def test_MQTT_4_3_3_4_outbound_qos2_flow(broker, version):
    """MQTT-4.3.3-3, MQTT-4.3.3-4, MQTT-4.3.3-5, MQTT-2.2.1-5, MQTT-3.6.2-1: PUBLISH, PUBREC,
    PUBREL with the same id, PUBCOMP; the id is then free."""
    sub = subscribed(broker, "s", ("a", 2), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 2, message_id=1), P.Pubrel(1))
    [delivered] = sub.received()
    sub.send(P.Pubrec(delivered.message_id))
    assert sub.received() == [in_version(version, P.Pubrel(delivered.message_id))]
    sub.send(P.Pubcomp(delivered.message_id))
    assert sub.received() == []
    assert broker.router.sessions["s"].inflight == {}


@every_version
def test_qos2_pubrels_are_sent_in_the_order_of_their_publishes(broker, version):
    sub = subscribed(broker, "s", ("a", 2), version=version)
    pub = connected(broker, "p", version=version)
    for i in range(1, 4):
        pub.send(P.Publish("a", b"%d" % i, 2, message_id=i))
    mids = [p.message_id for p in sub.received()]
    for mid in mids:
        sub.send(P.Pubrec(mid))
    assert sub.received() == [in_version(version, P.Pubrel(m)) for m in mids]


def test_message_ids_are_unique_among_inflight_and_never_zero():
    broker = FakeBroker(SessionLimits(max_inflight_messages=100, retry_interval=0))
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    seen = set()
    inflight = []
    for i in range(70000):
        pub.send(P.Publish("a", b"", 1, message_id=i % 65535 + 1))
        pub.transport.clear()
        [delivered] = sub.received()
        mid = delivered.message_id
        assert mid != 0
        assert mid not in inflight
        inflight.append(mid)
        seen.add(mid)
        # Leave every 1000th message unacknowledged across the wrap-around.
        if i % 1000:
            sub.send(P.Puback(inflight.pop()))
    assert len(seen) == 65535


def test_messages_keep_their_order_within_a_qos_level():
    broker = FakeBroker(SessionLimits(max_inflight_messages=3))
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    for i in range(50):
        pub.send(P.Publish("a", b"%d" % i, 1, message_id=i + 1))
    got = []
    for _ in range(50):
        packets = sub.received()
        assert packets, "delivery stopped"
        got.extend(p.payload for p in packets)
        sub.send(*[P.Puback(p.message_id) for p in packets])
        if len(got) >= 50:
            break
    assert got == [b"%d" % i for i in range(50)]


def test_unacknowledged_message_is_retried_with_dup_at_growing_intervals():
    broker = FakeBroker(SessionLimits(retry_interval=10, retry_max_interval=25))
    sub = subscribed(broker, "s", ("a", 1))
    sub.protocol.keepalive = 0
    pub = connected(broker, "p", keepalive=0)
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    [first] = sub.received()
    assert not first.dup
    times = []
    for _ in range(60):
        broker.clock.advance(1)
        for p in sub.received():
            assert p.dup and p.message_id == first.message_id
            times.append(broker.clock.seconds())
    # 10 s, then 20 s later, then capped at 25 s.
    assert times[:3] == [10, 30, 55]
    sub.send(P.Puback(first.message_id))
    broker.clock.advance(100)
    assert sub.received() == []


def test_unacknowledged_pubrel_is_retried():
    broker = FakeBroker(SessionLimits(retry_interval=5))
    sub = subscribed(broker, "s", ("a", 2))
    pub = connected(broker, "p", keepalive=0)
    pub.send(P.Publish("a", b"x", 2, message_id=1))
    [delivered] = sub.received()
    sub.send(P.Pubrec(delivered.message_id))
    assert sub.received() == [P.Pubrel(delivered.message_id)]
    broker.clock.advance(5)
    assert sub.received() == [P.Pubrel(delivered.message_id)]


def test_retry_interval_zero_resends_only_on_reconnect():
    broker = FakeBroker(SessionLimits(retry_interval=0))
    sub = subscribed(broker, "s", ("a", 1), clean_session=False)
    pub = connected(broker, "p", keepalive=0)
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    sub.received()
    broker.clock.advance(1000)
    assert deliveries(sub.received()) == []


@every_version
def test_qos2_duplicate_is_detected_by_message_id_not_by_dup_flag(broker, version):
    # DUP is only a hint: a re-send without it is still the same message.
    sub = subscribed(broker, "s", ("a", 2), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 2, message_id=4), P.Publish("a", b"x", 2, message_id=4))
    assert pub.received() == [in_version(version, P.Pubrec(4)), in_version(version, P.Pubrec(4))]
    assert len(deliveries(sub.received())) == 1


@every_version
def test_qos1_duplicate_is_republished_and_acknowledged_again(broker, version):
    sub = subscribed(broker, "s", ("a", 1), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 1, message_id=4), P.Publish("a", b"x", 1, dup=True, message_id=4))
    assert pub.received() == [in_version(version, P.Puback(4)), in_version(version, P.Puback(4))]
    assert len(deliveries(sub.received())) == 2


@every_version
def test_zero_length_payload_is_a_valid_publish(broker, version):
    sub = subscribed(broker, "s", ("a", 1), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"", 1, message_id=1))
    assert deliveries(sub.received()) == [("a", b"", 1)]


@every_version
def test_client_and_server_message_ids_are_independent(broker, version):
    client = subscribed(broker, "c", ("a", 1), version=version)
    client.send(P.Publish("a", b"x", 1, message_id=1))
    packets = client.received()
    assert in_version(version, P.Puback(1)) in packets
    [delivered] = [p for p in packets if isinstance(p, P.Publish)]
    assert delivered.message_id == 1
    client.send(P.Puback(1))
    assert broker.router.sessions["c"].inflight == {}


# MQTT 5.0


def test_MQTT_3_2_2_9_maximum_qos_is_stated_and_enforced(broker):
    """MQTT-3.2.2-9, MQTT-3.2.2-10, MQTT-3.2.2-11."""
    broker.router.max_qos = 1
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["maximum_qos"] == 1
    # SUBSCRIBE at QoS 2 is accepted, granted at most QoS 1.
    assert subscribe(client, ("t", options(2))).granted_qos == [1]
    client.send(publish("t", b"x", 2, 1))
    assert disconnect_of(client).reason_code == R.QOS_NOT_SUPPORTED


def test_MQTT_3_2_2_9_maximum_qos_left_out_when_qos_2_is_supported(broker):
    """MQTT-3.2.2-9."""
    client = connected(broker, "c", version=V5)
    assert "maximum_qos" not in client.connack.properties


def test_MQTT_3_2_2_17_topic_alias_maximum_is_stated_and_enforced(broker):
    """MQTT-3.2.2-17, MQTT-3.3.2-9."""
    client = connected(broker, "c", version=V5)
    maximum = client.connack.properties["topic_alias_maximum"]
    assert maximum == 10
    client.send(publish("t", b"x", topic_alias=maximum + 1))
    assert disconnect_of(client).reason_code == R.TOPIC_ALIAS_INVALID


def test_MQTT_3_2_2_18_no_topic_alias_maximum_means_no_aliases():
    """MQTT-3.2.2-18."""
    broker = FakeBroker(max_topic_alias=0)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties.get("topic_alias_maximum", 0) == 0
    client.send(publish("t", b"x", topic_alias=1))
    assert disconnect_of(client).reason_code == R.TOPIC_ALIAS_INVALID


def test_MQTT_3_3_4_1_publishes_are_acknowledged_as_their_qos_requires(broker):
    """MQTT-3.3.4-1, MQTT-2.2.1-5, MQTT-4.3.2-4, MQTT-4.3.3-8, MQTT-4.3.3-11."""
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"0", 0), publish("t", b"1", 1, 7), publish("t", b"2", 2, 8))
    assert client.received() == [P.Puback(7, 0, {}), P.Pubrec(8, 0, {})]
    client.send(P.Pubrel(8))
    assert client.received() == [P.Pubcomp(8, 0, {})]


def test_MQTT_4_3_3_10_repeated_qos2_publish_is_not_delivered_twice(broker):
    """MQTT-4.3.3-10, MQTT-4.3.3-12."""
    watcher = subscribed(broker, "w", ("t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"once", 2, 5))
    client.send(P.Publish("t", b"once", 2, dup=True, message_id=5, properties={}))
    assert client.received() == [P.Pubrec(5, 0, {}), P.Pubrec(5, 0, {})]
    assert payloads(watcher.received()) == [b"once"]
    client.send(P.Pubrel(5))
    client.send(publish("t", b"new", 2, 5))
    assert client.received() == [P.Pubcomp(5, 0, {}), P.Pubrec(5, 0, {})]
    assert payloads(watcher.received()) == [b"new"]


def test_MQTT_4_3_2_5_qos1_id_reused_after_puback_is_a_new_message(broker):
    """MQTT-4.3.2-5."""
    watcher = subscribed(broker, "w", ("t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"a", 1, 3))
    client.send(publish("t", b"b", 1, 3))
    assert client.received() == [P.Puback(3, 0, {}), P.Puback(3, 0, {})]
    assert payloads(watcher.received()) == [b"a", b"b"]


def test_pubrel_for_an_unknown_id_gets_pubcomp_0x92(broker):
    """PUBCOMP reason 0x92 (Packet Identifier not found), MQTT-3.7.2-1."""
    client = connected(broker, "c", version=V5)
    client.send(P.Pubrel(9))
    [pubcomp] = client.received()
    assert pubcomp.message_id == 9
    assert pubcomp.reason_code == R.PACKET_IDENTIFIER_NOT_FOUND


def test_MQTT_3_3_2_17_message_properties_are_forwarded_unchanged_in_order(broker):
    """MQTT-3.3.2-17, MQTT-3.3.2-18, MQTT-3.3.2-4, MQTT-3.3.2-15, MQTT-3.3.2-16,
    MQTT-3.3.2-20."""
    watcher = subscribed(broker, "w", ("t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    users = [("z", "1"), ("a", "2"), ("z", "0"), ("k", "v"), ("k", "v")]
    client.send(
        publish(
            "t",
            b"{}",
            1,
            1,
            payload_format_indicator=1,
            content_type="application/json",
            response_topic="replies/c",
            correlation_data=b"\x00\x01corr",
            user_property=users,
        )
    )
    [delivered] = publishes(watcher.received())
    props = delivered.properties
    assert props["user_property"] == users
    assert props["payload_format_indicator"] == 1
    assert props["content_type"] == "application/json"
    assert props["response_topic"] == "replies/c"
    assert props["correlation_data"] == b"\x00\x01corr"
    assert delivered.payload == b"{}"


def test_MQTT_3_3_2_17_properties_of_a_qos0_message_reach_every_5_0_subscriber(broker):
    """MQTT-3.3.2-17, MQTT-3.3.2-18 for several subscribers at once."""
    watchers = [subscribed(broker, f"w{i}", ("t/#", 0), version=V5) for i in range(3)]
    client = connected(broker, "c", version=V5)
    users = [("b", "1"), ("a", "2")]
    client.send(publish("t/x", b"p", user_property=users, content_type="text/plain"))
    for watcher in watchers:
        [delivered] = publishes(watcher.received())
        assert delivered.properties["user_property"] == users
        assert delivered.properties["content_type"] == "text/plain"


def test_5_0_properties_are_dropped_for_a_3_1_1_subscriber(broker):
    """A 3.1.1 subscriber gets a 3.1.1 PUBLISH: topic and payload, nothing else."""
    watcher = connected(broker, "old")
    watcher.send(P.Subscribe(1, [("t", 1)]))
    assert watcher.received() == [P.Suback(1, [1])]
    client = connected(broker, "c", version=V5)
    client.send(
        publish("t", b"payload", 1, 1, user_property=[("k", "v")], content_type="x",
                message_expiry_interval=100)
    )
    assert watcher.received() == [P.Publish("t", b"payload", 1, message_id=1)]


def test_3_1_1_publishers_message_reaches_a_5_0_subscriber_without_properties(broker):
    watcher = subscribed(broker, "w", ("t", options(1)), version=V5)
    old = connected(broker, "old")
    old.send(P.Publish("t", b"from 3.1.1", 1, message_id=1))
    assert old.received() == [P.Puback(1)]
    [delivered] = publishes(watcher.received())
    assert delivered.payload == b"from 3.1.1"
    assert delivered.properties == {}


def test_MQTT_3_3_1_3_forwarded_dup_does_not_follow_the_incoming_dup(broker):
    """MQTT-3.3.1-3, MQTT-4.3.2-2, MQTT-2.2.1-4."""
    watcher = subscribed(broker, "w", ("t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(P.Publish("t", b"x", 1, dup=True, message_id=4, properties={}))
    [delivered] = publishes(watcher.received())
    assert delivered.dup is False
    assert delivered.qos == 1 and delivered.message_id


def test_MQTT_2_2_1_2_qos0_delivery_has_no_packet_id_and_no_dup(broker):
    """MQTT-2.2.1-2, MQTT-3.3.1-2, MQTT-4.3.1-1, MQTT-3.8.4-8."""
    watcher = subscribed(broker, "w", ("t", options(0)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1))
    [delivered] = publishes(watcher.received())
    assert delivered.qos == 0 and delivered.message_id is None and delivered.dup is False


def test_MQTT_3_3_2_6_forwarded_expiry_interval_is_reduced_by_the_wait(broker):
    """MQTT-3.3.2-6."""
    watcher = subscribed(
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}, version=V5
    )
    watcher.lose_connection()
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1, message_expiry_interval=10))
    broker.clock.advance(4)
    back = broker.client(connect5("w", clean_start=False))
    [delivered] = publishes(back.received())
    assert delivered.properties["message_expiry_interval"] == 6


def test_MQTT_3_3_2_6_message_delivered_at_once_keeps_its_expiry_interval(broker):
    watcher = subscribed(broker, "w", ("t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1, message_expiry_interval=10))
    [delivered] = publishes(watcher.received())
    assert delivered.properties["message_expiry_interval"] == 10


def test_MQTT_3_3_2_5_expired_message_is_not_delivered_from_the_offline_queue(broker):
    """MQTT-3.3.2-5."""
    watcher = subscribed(
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}, version=V5
    )
    watcher.lose_connection()
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"short", 1, 1, message_expiry_interval=5))
    client.send(publish("t", b"long", 1, 2, message_expiry_interval=50))
    client.send(publish("t", b"forever", 1, 3))
    broker.clock.advance(6)
    back = broker.client(connect5("w", clean_start=False))
    assert payloads(back.received()) == [b"long", b"forever"]


def test_MQTT_3_3_2_5_expired_message_is_not_delivered_from_the_inflight_queue(broker):
    """MQTT-3.3.2-5: queued behind the client's Receive Maximum."""
    watcher = subscribed(
        broker,
        "w",
        ("t", options(1)),
        properties={"receive_maximum": 1},
        version=V5,
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"first", 1, 1, message_expiry_interval=5))
    client.send(publish("t", b"second", 1, 2, message_expiry_interval=5))
    client.send(publish("t", b"third", 1, 3, message_expiry_interval=50))
    [first] = publishes(watcher.received())
    broker.clock.advance(6)
    watcher.send(P.Puback(first.message_id))
    [third] = publishes(watcher.received())
    assert third.payload == b"third"
    assert third.properties["message_expiry_interval"] == 44


def test_MQTT_3_3_2_12_every_topic_alias_up_to_the_maximum_is_accepted(broker):
    """MQTT-3.3.2-12: an alias is set by a PUBLISH with topic and alias, and
    used by one with an empty topic."""
    watcher = subscribed(broker, "w", ("t/#", 0), version=V5)
    client = connected(broker, "c", version=V5)
    maximum = client.connack.properties["topic_alias_maximum"]
    for alias in range(1, maximum + 1):
        client.send(publish(f"t/{alias}", b"set", topic_alias=alias))
    for alias in range(1, maximum + 1):
        client.send(publish("", b"use", topic_alias=alias))
    assert not client.closed
    got = [(p.topic, p.payload) for p in publishes(watcher.received())]
    assert got == [(f"t/{a}", b"set") for a in range(1, maximum + 1)] + [
        (f"t/{a}", b"use") for a in range(1, maximum + 1)
    ]
    # The alias is per hop: what is forwarded carries none of the client's.
    client.send(publish("", b"again", topic_alias=3))
    [delivered] = publishes(watcher.received())
    assert delivered.topic == "t/3"
    assert "topic_alias" not in delivered.properties


def test_topic_alias_can_be_mapped_to_another_topic(broker):
    watcher = subscribed(broker, "w", ("#", 0), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("a", b"1", topic_alias=1), publish("b", b"2", topic_alias=1))
    client.send(publish("", b"3", topic_alias=1))
    assert [(p.topic, p.payload) for p in publishes(watcher.received())] == [
        ("a", b"1"), ("b", b"2"), ("b", b"3")
    ]


def test_unknown_topic_alias_is_a_protocol_error(broker):
    """An empty topic with an alias that has no mapping: DISCONNECT 0x82."""
    client = connected(broker, "c", version=V5)
    client.send(publish("", b"x", topic_alias=2))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_3_2_7_topic_aliases_do_not_carry_over_to_a_new_connection(broker):
    """MQTT-3.3.2-7."""
    client = connected(broker, "c", properties={"session_expiry_interval": 60}, version=V5)
    client.send(publish("t", b"x", topic_alias=1))
    client.send(P.Disconnect())
    again = connected(broker, "c", clean_start=False, version=V5)
    again.send(publish("", b"y", topic_alias=1))
    assert disconnect_of(again).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_3_2_11_server_sends_topic_aliases_within_the_clients_maximum(broker):
    """MQTT-3.3.2-11, MQTT-3.1.2-26, MQTT-3.3.2-8 (no alias 0)."""
    watcher = subscribed(
        broker, "w", ("t/#", options(1)), properties={"topic_alias_maximum": 2}, version=V5
    )
    client = connected(broker, "c", version=V5)
    sent = []
    mid = 0
    for _ in range(3):
        for topic in ("t/a", "t/b", "t/c", "t/d"):
            for qos in (0, 1):
                mid += 1
                client.send(publish(topic, b"x", qos, mid if qos else None))
                sent.append(topic)
    packets = watcher.received()
    assert _resolve_aliases(packets, 2) == sent
    # The server does use them.
    assert any(not p.topic for p in publishes(packets))


def test_MQTT_3_1_2_27_no_topic_aliases_to_a_client_without_a_maximum(broker):
    """MQTT-3.1.2-27, for Topic Alias Maximum absent and 0."""
    absent = subscribed(broker, "absent", ("t/#", options(1)), version=V5)
    zero = subscribed(
        broker,
        "zero",
        ("t/#", options(1)),
        properties={"topic_alias_maximum": 0},
        version=V5,
    )
    client = connected(broker, "c", version=V5)
    for i in range(4):
        client.send(publish("t/a", b"x", 0), publish("t/b", b"x", 1, i + 1))
    for watcher in (absent, zero):
        packets = publishes(watcher.received())
        assert len(packets) == 8
        for p in packets:
            assert p.topic
            assert "topic_alias" not in p.properties


def test_MQTT_3_2_2_11_publish_above_maximum_qos_gets_disconnect_0x9B(broker):
    """MQTT-3.2.2-11, MQTT-4.13.1-1."""
    broker.router.max_qos = 0
    watcher = subscribed(broker, "w", ("t", 0), version=V5)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["maximum_qos"] == 0
    client.send(publish("t", b"x", 1, 1))
    assert disconnect_of(client).reason_code == R.QOS_NOT_SUPPORTED
    assert publishes(watcher.received()) == []


def test_MQTT_3_4_2_1_denied_publish_gets_puback_0x87():
    """MQTT-3.4.2-1, MQTT-3.5.2-1; the message is not routed."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    watcher = subscribed(broker, "w", ("#", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("closed/x", b"x", 1, 1), publish("closed/y", b"y", 2, 2))
    puback, pubrec = client.received()
    assert isinstance(puback, P.Puback) and puback.message_id == 1
    assert puback.reason_code == R.NOT_AUTHORIZED
    assert isinstance(pubrec, P.Pubrec) and pubrec.message_id == 2
    assert pubrec.reason_code == R.NOT_AUTHORIZED
    assert puback.properties.get("reason_string")
    assert publishes(watcher.received()) == []
    assert not client.closed


def test_MQTT_4_3_3_9_after_pubrec_0x87_the_same_id_is_a_new_message():
    """MQTT-4.3.3-9."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    watcher = subscribed(broker, "w", ("#", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("closed/y", b"refused", 2, 2))
    [pubrec] = client.received()
    assert pubrec.reason_code == R.NOT_AUTHORIZED
    client.send(publish("open/y", b"accepted", 2, 2))
    assert client.received() == [P.Pubrec(2, 0, {})]
    assert payloads(watcher.received()) == [b"accepted"]


def test_MQTT_3_3_4_6_subscription_identifier_from_a_client_is_a_protocol_error(broker):
    """MQTT-3.3.4-6."""
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", subscription_identifier=5))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_4_4_0_1_unacknowledged_publish_is_not_resent_on_a_live_connection(broker):
    """MQTT-4.4.0-1: re-sending happens on session resumption and at no other
    time."""
    watcher = subscribed(broker, "w", ("t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"1", 1, 1), publish("t", b"2", 2, 2), P.Pubrel(2))
    first, second = publishes(watcher.received())
    assert (first.qos, second.qos) == (1, 2)
    watcher.send(P.Pubrec(second.message_id))
    assert watcher.received() == [P.Pubrel(second.message_id, 0, {})]
    broker.clock.advance(600)
    assert watcher.received() == []


def test_MQTT_4_4_0_1_unacknowledged_publish_is_resent_on_resumption(broker):
    """MQTT-4.4.0-1, MQTT-3.3.1-1, MQTT-4.3.2-3: re-sent with DUP and the
    original id when the session resumes, until its PUBACK comes."""
    watcher = subscribed(
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}, version=V5
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1))
    [first] = publishes(watcher.received())
    assert first.dup is False
    watcher.lose_connection()
    back = broker.client(connect5("w", clean_start=False))
    [again] = publishes(back.received())
    assert again.dup is True
    assert again.message_id == first.message_id
    assert again.payload == b"x"
    back.send(P.Puback(again.message_id), P.Disconnect())
    last = broker.client(connect5("w", clean_start=False))
    assert last.received()[1:] == []


def test_MQTT_4_4_0_1_pubrel_is_resent_on_resumption(broker):
    """MQTT-4.4.0-1, MQTT-4.3.3-4, MQTT-4.3.3-6: after PUBREC only the PUBREL
    is sent again, never the PUBLISH."""
    watcher = subscribed(
        broker, "w", ("t", options(2)), properties={"session_expiry_interval": 60}, version=V5
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1), P.Pubrel(1))
    [first] = publishes(watcher.received())
    watcher.send(P.Pubrec(first.message_id))
    assert watcher.received() == [P.Pubrel(first.message_id, 0, {})]
    watcher.lose_connection()
    back = broker.client(connect5("w", clean_start=False))
    packets = back.received()
    assert packets[1:] == [P.Pubrel(first.message_id, 0, {})]
    back.send(P.Pubcomp(first.message_id))
    assert back.received() == []


def test_MQTT_4_4_0_2_failed_pubrec_ends_the_flow(broker):
    """MQTT-4.4.0-2: a PUBREC of 0x80 or above acknowledges the message; no
    PUBREL follows and it is not sent again."""
    watcher = subscribed(
        broker, "w", ("t", options(2)), properties={"session_expiry_interval": 60}, version=V5
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1))
    [first] = publishes(watcher.received())
    watcher.send(P.Pubrec(first.message_id, R.UNSPECIFIED_ERROR))
    assert watcher.received() == []
    watcher.lose_connection()
    back = broker.client(connect5("w", clean_start=False))
    assert back.received()[1:] == []


def test_MQTT_4_4_0_2_failed_puback_ends_the_flow(broker):
    """MQTT-4.4.0-2 for QoS 1."""
    watcher = subscribed(
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}, version=V5
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1))
    [first] = publishes(watcher.received())
    watcher.send(P.Puback(first.message_id, R.IMPLEMENTATION_SPECIFIC_ERROR))
    watcher.lose_connection()
    back = broker.client(connect5("w", clean_start=False))
    assert back.received()[1:] == []


def test_MQTT_4_3_3_7_qos2_flow_under_way_is_finished_after_expiry(broker):
    """MQTT-4.3.3-7: once sent, a QoS 2 message is sent again on resumption
    although its expiry interval has passed."""
    watcher = subscribed(
        broker, "w", ("t", options(2)), properties={"session_expiry_interval": 600}, version=V5
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1, message_expiry_interval=5), P.Pubrel(1))
    [first] = publishes(watcher.received())
    watcher.lose_connection()
    broker.clock.advance(10)
    back = broker.client(connect5("w", clean_start=False))
    [again] = publishes(back.received())
    assert again.message_id == first.message_id and again.dup is True


def test_MQTT_4_7_3_1_empty_topic_without_an_alias_is_a_protocol_error(broker):
    """MQTT-4.7.3-1."""
    client = connected(broker, "c", version=V5)
    client.send(publish("", b"x"))
    disconnect = disconnect_of(client)
    assert disconnect.reason_code in (R.PROTOCOL_ERROR, R.TOPIC_NAME_INVALID)


def test_MQTT_2_2_1_4_server_packet_ids_are_nonzero_and_unused(broker):
    """MQTT-2.2.1-4, MQTT-4.3.2-1, MQTT-4.3.2-2, MQTT-4.3.3-1, MQTT-4.3.3-2."""
    watcher = subscribed(broker, "w", ("t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    for i in range(1, 11):
        client.send(publish("t", b"%d" % i, 1 + i % 2, i))
        if i % 2:
            client.send(P.Pubrel(i))
    delivered = publishes(watcher.received())
    ids = [p.message_id for p in delivered]
    assert len(delivered) == 10
    assert 0 not in ids and len(set(ids)) == 10
    assert all(p.dup is False for p in delivered)
    assert [p.qos for p in delivered] == [1 + i % 2 for i in range(1, 11)]


def test_MQTT_4_6_0_5_messages_keep_their_order_per_publisher():
    """MQTT-4.6.0-5, MQTT-4.6.0-6."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=200))
    watcher = subscribed(broker, "w", ("t/#", options(2)), version=V5)
    first = connected(broker, "p1", version=V5)
    second = connected(broker, "p2", version=V5)
    mid = 0
    for i in range(20):
        for qos in (0, 1, 2):
            mid += 1
            first.send(publish("t/a", b"1-%d-%d" % (qos, i), qos, mid if qos else None))
            second.send(publish("t/a", b"2-%d-%d" % (qos, i), qos, mid if qos else None))
            if qos == 2:
                first.send(P.Pubrel(mid))
                second.send(P.Pubrel(mid))
    got = payloads(watcher.received())
    assert len(got) == 120
    for sender in (b"1", b"2"):
        for qos in (b"0", b"1", b"2"):
            seq = [p for p in got if p.startswith(sender + b"-" + qos + b"-")]
            assert seq == [sender + b"-" + qos + b"-%d" % i for i in range(20)]


def test_MQTT_4_3_3_13_qos2_exchange_is_finished_after_the_message_expired(broker):
    """MQTT-4.3.3-13."""
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1, message_expiry_interval=1))
    assert client.received() == [P.Pubrec(1, 0, {})]
    broker.clock.advance(5)
    client.send(P.Pubrel(1))
    assert client.received() == [P.Pubcomp(1, 0, {})]


def test_MQTT_3_3_2_14_a_response_topic_with_a_wildcard_is_a_protocol_error(broker):
    client = connected(broker, "c", version=V5)
    client.send(P.Publish("a", b"x", 0, properties={"response_topic": "replies/+"}))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert client.closed
    # A will's likewise: its CONNECT is refused.
    will = broker.client(connect5(
        "w", will_topic="w/t", will_message=b"gone", will_properties={"response_topic": "r/#"},
    ))
    [connack] = will.received()
    assert connack.return_code == R.PROTOCOL_ERROR
    assert will.closed


def test_MQTT_3_6_2_2_3_7_2_2_3_11_2_1_no_reason_string_or_user_property_past_the_maximum_packet_size(broker):
    """
    Also [MQTT-3.6.2-3], [MQTT-3.7.2-3], [MQTT-3.11.2-2]: PUBREL, PUBCOMP
    and UNSUBACK to a client with a small maximum packet size carry no
    property at all (the server sends reason strings on none of them).
    """
    client = connected(
        broker,
        "c",
        properties={"maximum_packet_size": 16, "request_problem_information": 1},
        version=V5,
    )
    client.send(P.Unsubscribe(1, ["never/subscribed"], {}))
    client.send(P.Pubrel(9))
    sub = connected(broker, "s", properties={"maximum_packet_size": 64}, version=V5)
    sub.send(P.Subscribe(1, [("q2", 2)], {}))
    sub.received()
    pub = connected(broker, "p")
    pub.send(P.Publish("q2", b"x", 2, message_id=1))
    [publish] = [p for p in sub.received() if isinstance(p, P.Publish)]
    sub.send(P.Pubrec(publish.message_id))
    [pubrel] = sub.received()
    unsuback, pubcomp = client.received()
    assert unsuback.reason_codes == [R.NO_SUBSCRIPTION_EXISTED] and not unsuback.properties
    assert pubcomp.reason_code == R.PACKET_IDENTIFIER_NOT_FOUND and not pubcomp.properties
    assert isinstance(pubrel, P.Pubrel) and not pubrel.properties


def test_MQTT_4_7_3_3_topics_encode_to_at_most_65535_bytes():
    broker = FakeBroker(max_packet_size=200_000)
    sub = connected(broker, "s", version=V5)
    sub.send(P.Subscribe(1, [("#", 0)], {}))
    sub.received()
    pub = connected(broker, "p", version=V5)
    longest = "t" * 65535
    pub.send(P.Publish(longest, b"x", 0, properties={}))
    [message] = [p for p in sub.received() if isinstance(p, P.Publish)]
    assert message.topic == longest
    # One byte more has no encoding: the length field is 16 bits.
    with pytest.raises(ValueError):
        P.Publish(longest + "t", b"x", 0, properties={}).encode()

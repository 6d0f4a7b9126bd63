"""
SUBSCRIBE and UNSUBSCRIBE: filters, granted QoS, overlapping and shared
subscriptions, subscription options and identifiers, and matching, driven
through fake transports and a fake clock.

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
    raw,
    subscribe,
    subscribed,
)
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests.versions import both_versions, every_version


# MQTT 3.1 and 3.1.1


@every_version
def test_publish_on_dollar_topic_is_not_matched_by_leading_wildcard(broker, version):
    everything = subscribed(broker, "all", ("#", 0), ("+/x", 0), version=version)
    sys = subscribed(broker, "sys", ("$dev/#", 0), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("$dev/x", b"1"))
    assert deliveries(everything.received()) == []
    assert deliveries(sys.received()) == [("$dev/x", b"1", 0)]


@every_version
def test_publisher_receives_its_own_message_when_subscribed(broker, version):
    client = subscribed(broker, "c", ("a", 0), version=version)
    client.send(P.Publish("a", b"echo"))
    assert deliveries(client.received()) == [("a", b"echo", 0)]


@every_version
def test_subscribe_to_several_topics_grants_each(broker, version):
    client = connected(broker, "c", version=version)
    client.send(P.Subscribe(5, [("a", 0), ("b/+", 1), ("c/#", 2)]))
    assert client.received() == [in_version(version, P.Suback(5, [0, 1, 2]))]


def test_granted_qos_is_capped_by_max_qos():
    broker = FakeBroker()
    broker.router.max_qos = 1
    client = connected(broker, "c")
    client.send(P.Subscribe(5, [("a", 2), ("b", 0)]))
    assert client.received() == [P.Suback(5, [1, 0])]


@every_version
def test_overlapping_subscriptions_deliver_once_at_the_highest_qos(broker, version):
    sub = subscribed(broker, "s", ("a/#", 0), ("a/+", 2), ("a/b", 1), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a/b", b"x", 2, message_id=1))
    assert deliveries(sub.received()) == [("a/b", b"x", 2)]


def test_v311_invalid_filter_gets_0x80_and_the_others_are_granted(broker):
    client = connected(broker, "c")
    client.send(P.Subscribe(3, [("a", 1), ("a/#/b", 1), ("b+", 0), ("c", 2)]))
    assert client.received() == [P.Suback(3, [1, 0x80, 0x80, 2])]
    assert set(broker.router.sessions["c"].subscriptions) == {"a", "c"}
    assert not client.closed


def test_v31_invalid_filter_closes(broker, logged):
    client = connected(broker, "c", version=V31)
    client.send(P.Subscribe(3, [("a", 1), ("a/#/b", 1)]))
    # 3.1 has no failure code in a SUBACK.
    assert client.received() == []
    reason = close_reason(client, logged())
    assert reason == "SUBSCRIBE: filter 'a/#/b': '#' must be the whole last level"


@both_versions
def test_unsubscribe_several_topics_stops_their_delivery(broker, version):
    sub = subscribed(broker, "s", ("a", 0), ("b", 0), ("c", 0), version=version)
    sub.send(P.Unsubscribe(4, ["a", "b", "not-subscribed"]))
    assert sub.received() == [P.Unsuback(4)]
    pub = connected(broker, "p", version=version)
    for t in "abc":
        pub.send(P.Publish(t, b"x"))
    assert deliveries(sub.received()) == [("c", b"x", 0)]


@every_version
def test_wildcard_delivery_carries_the_publishers_topic_name(broker, version):
    sub = subscribed(broker, "s", ("sensors/+/temp", 0), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("sensors/7/temp", b"21"))
    assert deliveries(sub.received()) == [("sensors/7/temp", b"21", 0)]


@both_versions
def test_unsubscribe_of_an_invalid_filter_is_acknowledged(broker, version):
    client = connected(broker, "c", version=version)
    client.send(P.Unsubscribe(2, ["a/#/b"]))
    assert client.received() == [P.Unsuback(2)]


# MQTT 5.0


def test_wildcard_subscriptions_off_suback_0xA2():
    """Wildcard Subscription Available 0: a wildcard filter is refused with
    0xA2, a plain one granted (MQTT-3.9.3-2)."""
    broker = FakeBroker(wildcard_subscription_available=False)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["wildcard_subscription_available"] == 0
    suback = subscribe(client, ("a/#", options(1)), ("a/+/b", 0), ("a/b", options(1)))
    assert suback.granted_qos == [
        R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
        R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
        1,
    ]


def test_shared_subscriptions_off_suback_0x9E():
    """Shared Subscription Available 0: a $share filter is refused with 0x9E."""
    broker = FakeBroker(shared_subscription_available=False)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["shared_subscription_available"] == 0
    suback = subscribe(client, ("$share/g/a", options(1)), ("a", options(1)))
    assert suback.granted_qos == [R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, 1]


def test_subscription_identifiers_off_disconnect_0xA1():
    """Subscription Identifier Available 0: a SUBSCRIBE with one is a Protocol
    Error, DISCONNECT 0xA1."""
    broker = FakeBroker(subscription_identifier_available=False)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["subscription_identifier_available"] == 0
    assert subscribe(client, ("a", options(1))).granted_qos == [1]
    client.send(P.Subscribe(2, [("b", options(1))], {"subscription_identifier": 3}))
    assert disconnect_of(client).reason_code == R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED


def test_MQTT_4_7_2_1_wildcards_at_the_start_do_not_match_dollar_topics(broker):
    """MQTT-4.7.2-1, MQTT-3.3.2-3."""
    hash_ = subscribed(broker, "h", ("#", 0), version=V5)
    plus = subscribed(broker, "p", ("+/x", 0), version=V5)
    explicit = subscribed(broker, "e", ("$data/#", 0), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("$data/x", b"x"))
    assert publishes(hash_.received()) == []
    assert publishes(plus.received()) == []
    assert [p.topic for p in publishes(explicit.received())] == ["$data/x"]


def test_MQTT_3_8_3_3_no_local_keeps_a_clients_own_messages_from_it(broker):
    """MQTT-3.8.3-3."""
    client = subscribed(broker, "c", ("t", options(1, no_local=True)), version=V5)
    other = subscribed(broker, "o", ("t", options(1, no_local=True)), version=V5)
    client.send(publish("t", b"mine", 1, 1))
    assert publishes(client.received()) == []
    assert payloads(other.received()) == [b"mine"]
    other.send(publish("t", b"theirs", 0))
    assert payloads(client.received()) == [b"theirs"]


def test_MQTT_3_8_3_3_no_local_on_one_filter_leaves_the_others(broker):
    """MQTT-3.8.3-3 with an overlapping subscription without No Local."""
    client = subscribed(
        broker, "c", ("t/#", options(1, no_local=True)), ("t/+", options(0)), version=V5
    )
    client.send(publish("t/x", b"mine", 1, 1))
    [delivered] = publishes([p for p in client.received() if isinstance(p, P.Publish)])
    assert delivered.payload == b"mine" and delivered.qos == 0


def test_MQTT_3_3_4_2_overlapping_subscriptions_deliver_at_the_highest_qos(broker):
    """MQTT-3.3.4-2, MQTT-3.3.4-3, MQTT-3.3.4-4."""
    watcher = connected(broker, "w", version=V5)
    subscribe(watcher, ("a/#", options(0)), subscription_identifier=7)
    subscribe(watcher, ("a/b", options(2)), mid=2, subscription_identifier=9)
    subscribe(watcher, ("+/b", options(1)), mid=3)
    client = connected(broker, "c", version=V5)
    client.send(publish("a/b", b"x", 2, 1))
    [delivered] = publishes(watcher.received())
    assert delivered.qos == 2
    assert sorted(delivered.properties["subscription_identifier"]) == [7, 9]


def test_MQTT_3_3_4_3_subscription_identifier_is_sent_with_each_message(broker):
    """MQTT-3.3.4-3; a SUBSCRIBE that changes the identifier replaces it, and
    one without an identifier removes it."""
    watcher = connected(broker, "w", version=V5)
    subscribe(watcher, ("s/#", options(1)), subscription_identifier=1)
    subscribe(watcher, ("u", options(1)), mid=2)
    client = connected(broker, "c", version=V5)
    client.send(publish("s/1", b"x", 0), publish("u", b"y", 0))
    first, second = publishes(watcher.received())
    assert first.properties["subscription_identifier"] == [1]
    assert "subscription_identifier" not in second.properties
    subscribe(watcher, ("s/#", options(1)), mid=3, subscription_identifier=268_435_455)
    client.send(publish("s/1", b"x", 0))
    [third] = publishes(watcher.received())
    assert third.properties["subscription_identifier"] == [268_435_455]
    subscribe(watcher, ("s/#", options(1)), mid=4)
    client.send(publish("s/1", b"x", 0))
    [fourth] = publishes(watcher.received())
    assert "subscription_identifier" not in fourth.properties


def test_MQTT_3_3_4_3_subscription_identifier_on_retained_messages(broker):
    client = connected(broker, "c", version=V5)
    client.send(publish("r", b"kept", retain=True))
    watcher = connected(broker, "w", version=V5)
    subscribe(watcher, ("r", options(0)), subscription_identifier=42)
    [retained] = publishes(watcher.received())
    assert retained.properties["subscription_identifier"] == [42]


def test_MQTT_3_8_4_6_suback_has_one_code_per_filter_in_order():
    """MQTT-3.8.4-6, MQTT-3.8.4-5, MQTT-3.8.4-7, MQTT-3.9.3-1, MQTT-3.9.3-2,
    MQTT-3.8.4-1, MQTT-3.8.4-2, MQTT-2.2.1-6: 0x8F invalid filter, 0x87 not
    authorized, granted QoS otherwise."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(broker, "c", version=V5)
    suback = subscribe(
        client,
        ("open/a", options(2)),
        ("open/#/x", options(1)),
        ("closed/a", options(1)),
        ("open/b", options(0)),
        ("open/+", options(1)),
        ("open/c+", options(1)),
        mid=0x1234,
    )
    assert suback.message_id == 0x1234
    assert suback.granted_qos == [
        2,
        R.TOPIC_FILTER_INVALID,
        R.NOT_AUTHORIZED,
        0,
        1,
        R.TOPIC_FILTER_INVALID,
    ]


def test_MQTT_2_2_2_1_suback_without_properties_has_property_length_0(broker):
    """MQTT-2.2.2-1."""
    client = connected(broker, "c", version=V5)
    client.send(P.Subscribe(5, [("a", 1)], {}))
    assert raw(client) == b"\x90\x04\x00\x05\x00\x01"
    client.send(P.Unsubscribe(6, ["a"], {}))
    assert raw(client) == b"\xb0\x04\x00\x06\x00\x00"


def test_suback_0x97_when_the_subscription_quota_is_reached():
    """Quota exceeded: the filters beyond max_subscriptions are refused; one
    already held may still be replaced."""
    broker = FakeBroker(SessionLimits(max_subscriptions=2))
    client = connected(broker, "c", version=V5)
    suback = subscribe(client, ("a", 1), ("b", 1), ("c", 1))
    assert suback.granted_qos == [1, 1, R.QUOTA_EXCEEDED]
    assert subscribe(client, ("a", 0), mid=2).granted_qos == [0]


def test_MQTT_3_8_3_4_no_local_on_a_shared_subscription_is_a_protocol_error(broker):
    """MQTT-3.8.3-4."""
    client = connected(broker, "c", version=V5)
    client.send(P.Subscribe(1, [("$share/g/t", options(1, no_local=True))], {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_8_3_5_reserved_subscription_option_bits_are_malformed(broker):
    """MQTT-3.8.3-5, MQTT-4.13.1-1: DISCONNECT 0x81."""
    client = connected(broker, "c", version=V5)
    client.send(P.Subscribe(1, [("t", 0x40 | 1)], {}))
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


def test_MQTT_3_8_1_1_subscribe_with_bad_fixed_header_flags_is_malformed(broker):
    """MQTT-3.8.1-1, MQTT-2.1.3-1."""
    client = connected(broker, "c", version=V5)
    wire = bytearray(P.Subscribe(1, [("t", 1)], {}).encode())
    wire[0] = 0x80
    client.send_bytes(bytes(wire))
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


def test_MQTT_3_8_3_2_subscribe_without_filters_is_a_protocol_error(broker):
    """MQTT-3.8.3-2."""
    client = connected(broker, "c", version=V5)
    client.send(P.Subscribe(1, [], {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_10_3_2_unsubscribe_without_filters_is_a_protocol_error(broker):
    """MQTT-3.10.3-2."""
    client = connected(broker, "c", version=V5)
    client.send(P.Unsubscribe(1, [], {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_11_3_1_unsuback_has_one_code_per_filter_in_order(broker):
    """MQTT-3.11.3-1, MQTT-3.11.3-2, MQTT-3.10.4-1, MQTT-3.10.4-4, MQTT-3.10.4-5,
    MQTT-3.10.4-6, MQTT-3.10.4-2: 0x00 removed, 0x11 none existed."""
    client = subscribed(broker, "c", ("a", 1), ("b/+", 1), version=V5)
    client.send(P.Unsubscribe(0x4321, ["a", "x", "b/+", "b/#"], {}))
    [unsuback] = client.received()
    assert unsuback.message_id == 0x4321
    assert unsuback.reason_codes == [
        R.SUCCESS,
        R.NO_SUBSCRIPTION_EXISTED,
        R.SUCCESS,
        R.NO_SUBSCRIPTION_EXISTED,
    ]
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("a", b"x", 1, 1), publish("b/c", b"y", 1, 2))
    assert publishes(client.received()) == []


def test_MQTT_3_10_4_6_unsubscribe_naming_a_filter_twice_is_two_unsubscribes(broker):
    """MQTT-3.10.4-6, MQTT-3.11.3-1: as a sequence of UNSUBSCRIBEs, the second
    finds no subscription (0x11)."""
    client = subscribed(broker, "c", ("a", 1), version=V5)
    client.send(P.Unsubscribe(2, ["a", "a"], {}))
    [unsuback] = client.received()
    assert unsuback.reason_codes == [R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED]


def test_MQTT_3_8_4_5_subscribe_naming_a_filter_twice_is_two_subscribes(broker):
    """MQTT-3.8.4-5, MQTT-3.3.1-10: with Retain Handling 1 the second finds the
    subscription made by the first, so the retained message comes once."""
    client = connected(broker, "c", version=V5)
    client.send(publish("r", b"kept", retain=True))
    watcher = connected(broker, "w", version=V5)
    suback = subscribe(
        watcher,
        ("r", options(1, retain_handling=1)),
        ("r", options(0, retain_handling=1)),
    )
    assert suback.granted_qos == [1, 0]
    [retained] = publishes(watcher.received())
    assert retained.payload == b"kept"
    assert retained.qos == 0


def test_MQTT_3_10_4_3_deliveries_under_way_are_completed_after_unsubscribe(broker):
    """MQTT-3.10.4-3."""
    watcher = subscribed(broker, "w", ("t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1), P.Pubrel(1))
    [delivered] = publishes(watcher.received())
    watcher.send(P.Unsubscribe(2, ["t"], {}))
    assert watcher.received() == [P.Unsuback(2, [R.SUCCESS], {})]
    watcher.send(P.Pubrec(delivered.message_id))
    assert watcher.received() == [P.Pubrel(delivered.message_id, 0, {})]
    watcher.send(P.Pubcomp(delivered.message_id))
    assert not watcher.closed


def test_MQTT_3_8_4_1_subscribe_in_the_same_read_as_connect_is_answered(broker):
    """MQTT-3.8.4-1, MQTT-4.2-1: packets that follow a 5.0 CONNECT in the same
    read are decoded as 5.0 packets."""
    client = broker.client()
    client.send(connect5("c"), P.Subscribe(1, [("t", options(1))], {"subscription_identifier": 4}))
    packets = client.received()
    assert [type(p) for p in packets] == [P.Connack, P.Suback], packets
    assert packets[1].granted_qos == [1]
    assert not client.closed


@pytest.mark.parametrize("version", ["5.0", "3.1.1"])
def test_MQTT_4_8_2_1_shared_subscription_gives_each_message_to_one_member(broker, version):
    """MQTT-4.8.2-1, MQTT-4.8.2-2; round robin among the members."""
    members = []
    for name in ("a", "b"):
        if version == "5.0":
            members.append(subscribed(broker, name, ("$share/g/t/#", options(1)), version=V5))
        else:
            member = connected(broker, name)
            member.send(P.Subscribe(1, [("$share/g/t/#", 1)]))
            assert member.received() == [P.Suback(1, [1])]
            members.append(member)
    client = connected(broker, "c", version=V5)
    for i in range(6):
        client.send(publish("t/x", b"%d" % i, 1, i + 1))
    got = []
    for member in members:
        got.append(payloads(member.received()))
    assert sorted(got[0] + got[1]) == [b"%d" % i for i in range(6)]
    assert got == [[b"0", b"2", b"4"], [b"1", b"3", b"5"]]


def test_shared_subscription_mixes_5_0_and_3_1_1_members(broker):
    five = subscribed(broker, "five", ("$share/g/t", options(1)), version=V5)
    old = connected(broker, "old")
    old.send(P.Subscribe(1, [("$share/g/t", 1)]))
    old.received()
    plain = subscribed(broker, "plain", ("t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    for i in range(4):
        client.send(publish("t", b"%d" % i, 1, i + 1, user_property=[("n", str(i))]))
    from_five = publishes(five.received())
    from_old = publishes(old.received())
    assert sorted(p.payload for p in from_five + from_old) == [b"0", b"1", b"2", b"3"]
    assert len(from_five) == len(from_old) == 2
    assert all(p.properties is None for p in from_old)
    assert all(p.properties["user_property"] == [("n", p.payload.decode())] for p in from_five)
    # A non-shared subscription on the same topic gets every message.
    assert payloads(plain.received()) == [b"0", b"1", b"2", b"3"]


def test_MQTT_4_8_2_3_shared_delivery_respects_the_members_granted_qos(broker):
    """MQTT-4.8.2-3."""
    low = subscribed(broker, "low", ("$share/g/t", options(0)), version=V5)
    high = subscribed(broker, "high", ("$share/g/t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"1", 2, 1), publish("t", b"2", 2, 2))
    [to_low] = publishes(low.received())
    [to_high] = publishes(high.received())
    assert to_low.qos == 0
    assert to_high.qos == 2


def test_shared_qos1_message_in_flight_goes_to_another_member_when_the_connection_drops(broker):
    """4.8.2: a QoS 1 message a member did not acknowledge before its session
    ended is sent to another member."""
    first = subscribed(broker, "a", ("$share/g/t", options(1)), version=V5)
    second = subscribed(broker, "b", ("$share/g/t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1))
    [got] = publishes(first.received())
    assert got.qos == 1
    assert publishes(second.received()) == []
    first.lose_connection()
    [handed] = publishes(second.received())
    assert handed.payload == b"x" and handed.qos == 1


def test_MQTT_4_8_2_4_shared_qos2_delivery_is_completed_with_the_same_member(broker):
    """MQTT-4.8.2-4."""
    first = subscribed(
        broker,
        "a",
        ("$share/g/t", options(2)),
        properties={"session_expiry_interval": 60},
        version=V5,
    )
    second = subscribed(broker, "b", ("$share/g/t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1))
    [got] = publishes(first.received())
    assert got.qos == 2
    first.lose_connection()
    assert publishes(second.received()) == []
    back = broker.client(connect5("a", clean_start=False))
    [again] = publishes(back.received())
    assert again.message_id == got.message_id and again.payload == b"x"
    assert publishes(second.received()) == []


def test_MQTT_4_8_2_5_shared_qos2_message_goes_to_no_other_member_when_the_session_ends(broker):
    """MQTT-4.8.2-5: the member's session ends with its connection (expiry 0)."""
    first = subscribed(broker, "a", ("$share/g/t", options(2)), version=V5)
    second = subscribed(broker, "b", ("$share/g/t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1))
    [got] = publishes(first.received())
    assert got.qos == 2
    first.lose_connection()
    assert publishes(second.received()) == []


def test_MQTT_4_8_2_5_shared_qos2_message_goes_to_no_other_member_after_expiry(broker):
    """MQTT-4.8.2-5: the member's session expires before it reconnects."""
    first = subscribed(
        broker,
        "a",
        ("$share/g/t", options(2)),
        properties={"session_expiry_interval": 10},
        version=V5,
    )
    second = subscribed(broker, "b", ("$share/g/t", options(2)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 2, 1))
    [got] = publishes(first.received())
    assert got.qos == 2
    first.lose_connection()
    broker.clock.advance(11)
    assert publishes(second.received()) == []


def test_MQTT_4_8_2_6_failed_puback_from_a_member_discards_the_message(broker):
    """MQTT-4.8.2-6."""
    first = subscribed(broker, "a", ("$share/g/t", options(1)), version=V5)
    second = subscribed(broker, "b", ("$share/g/t", options(1)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"x", 1, 1))
    [got] = publishes(first.received())
    first.send(P.Puback(got.message_id, R.UNSPECIFIED_ERROR))
    first.send(P.Disconnect())
    assert publishes(second.received()) == []


@pytest.mark.parametrize(
    "topic_filter",
    ["$share/g", "$share//t", "$share/g+/t", "$share/g#/t", "$share/g/", "$share/g/t/#/x"],
)
def test_MQTT_4_8_2_2_malformed_shared_filters_are_refused(broker, topic_filter):
    """MQTT-4.8.2-1, MQTT-4.8.2-2: SUBACK 0x8F."""
    client = connected(broker, "c", version=V5)
    suback = subscribe(client, (topic_filter, options(1)), ("ok", options(1)))
    assert suback.granted_qos == [R.TOPIC_FILTER_INVALID, 1]
    assert not client.closed


def test_MQTT_4_7_3_4_topics_are_matched_without_normalisation(broker):
    """MQTT-4.7.3-4, MQTT-3.3.2-3."""
    watcher = subscribed(broker, "w", ("a/b", 0), ("Caf\u00e9", 0), version=V5)
    client = connected(broker, "c", version=V5)
    for topic in ("A/b", "a//b", "a/b/", "/a/b", "Cafe\u0301", "a/b", "Caf\u00e9"):
        client.send(publish(topic, topic.encode()))
    assert [p.topic for p in publishes(watcher.received())] == ["a/b", "Caf\u00e9"]


@pytest.mark.parametrize("topic_filter", ["", "a#", "a/#/b", "a/b+", "+a/b", "#/"])
def test_MQTT_4_7_1_1_invalid_filters_get_suback_0x8F(broker, topic_filter):
    """MQTT-4.7.1-1, MQTT-4.7.1-2, MQTT-4.7.3-1."""
    client = connected(broker, "c", version=V5)
    suback = subscribe(client, (topic_filter, options(1)), ("ok/+/#", options(1)))
    assert suback.granted_qos == [R.TOPIC_FILTER_INVALID, 1]

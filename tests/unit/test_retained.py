"""
Retained messages: kept, replaced, cleared, sent on subscribing, and the
subscription options that govern them, driven through fake transports and a
fake clock.

A test of behaviour the versions share runs for each of them (``version``
is :data:`~mqttgw.testing.V31`, ``V311`` or ``V5``).  A 5.0 test is named
after the normative statement of the OASIS MQTT Version 5.0 standard it
covers (``MQTT_3_1_2_4`` is [MQTT-3.1.2-4]; further statements in its
docstring); tests/CONFORMANCE.md and tests/CONFORMANCE5.md map the
statements to the tests.
"""

from mqttgw.testing import (
    V31,
    V311,
    V5,
    FakeBroker,
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


# Every version, and 3.1 and 3.1.1


@every_version
def test_retained_message_is_sent_on_subscribe_with_retain_set(broker, version):
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("r/1", b"last", 1, retain=True, message_id=1))
    sub = connected(broker, "s", version=version)
    sub.send(P.Subscribe(1, [("r/+", 2)]))
    suback, retained = sub.received()
    assert suback == in_version(version, P.Suback(1, [2]))
    assert (retained.topic, retained.payload, retained.qos, retained.retain) == (
        "r/1",
        b"last",
        1,
        True,
    )


@every_version
def test_live_delivery_never_carries_retain(broker, version):
    sub = subscribed(broker, "s", ("r", 0), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("r", b"v", 0, retain=True))
    [delivered] = sub.received()
    assert not delivered.retain


@every_version
def test_MQTT_3_3_1_5_retained_message_replaces_the_previous_one(broker, version):
    """MQTT-3.3.1-5, MQTT-3.3.1-8: only the last retained message per topic
    is kept; a message that is not retained does not replace it."""
    client = connected(broker, "c", version)
    client.send(P.Publish("r", b"one", retain=True), P.Publish("r", b"two", retain=True))
    client.send(P.Publish("r", b"not retained"))
    watcher = subscribed(broker, "w", ("r", 0), version=version)
    [retained] = publishes(watcher.received())
    assert (retained.topic, retained.payload, retained.qos, retained.retain) == ("r", b"two", 0, True)


@every_version
def test_MQTT_3_3_1_6_empty_retained_message_clears_the_topic(broker, version):
    """MQTT-3.3.1-6, MQTT-3.3.1-7."""
    live = subscribed(broker, "live", ("r", 0), version=version)
    client = connected(broker, "c", version)
    client.send(P.Publish("r", b"value", retain=True), P.Publish("r", b"", retain=True))
    # Subscribers at the time still receive the empty message.
    assert deliveries(live.received()) == [("r", b"value", 0), ("r", b"", 0)]
    watcher = subscribed(broker, "w", ("r", 0), version=version)
    assert publishes(watcher.received()) == []
    assert "r" not in broker.router.retained


@every_version
def test_retained_messages_match_wildcards_and_respect_dollar_rule(broker, version):
    pub = connected(broker, "p", version=version)
    for topic in ["a/1", "a/2", "b/1", "$dev/x"]:
        pub.send(P.Publish(topic, topic.encode(), retain=True))
    sub = connected(broker, "s", version=version)
    sub.send(P.Subscribe(1, [("#", 0)]))
    assert sorted(t for t, _, _ in deliveries(sub.received())) == ["a/1", "a/2", "b/1"]


@every_version
def test_resubscribing_sends_the_retained_message_again(broker, version):
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("r", b"v", retain=True))
    sub = subscribed(broker, "s", ("r", 0), version=version)
    assert deliveries(sub.received()) == [("r", b"v", 0)]
    sub.send(P.Subscribe(2, [("r", 1)]))
    assert deliveries(sub.received()) == [("r", b"v", 0)]


# MQTT 5.0


def test_MQTT_3_2_2_14_retain_unavailable_is_stated_and_enforced():
    """MQTT-3.2.2-14."""
    broker = FakeBroker(retain_available=False)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["retain_available"] == 0
    client.send(publish("t", b"x", 0, retain=True))
    assert disconnect_of(client).reason_code == R.RETAIN_NOT_SUPPORTED


def test_MQTT_3_3_2_5_expired_retained_message_is_not_sent(broker):
    """MQTT-3.3.2-5 for a retained message."""
    client = connected(broker, "c", version=V5)
    client.send(publish("r", b"soon gone", 0, retain=True, message_expiry_interval=5))
    broker.clock.advance(3)
    early = subscribed(broker, "early", ("r", 0), version=V5)
    [retained] = publishes(early.received())
    assert retained.properties["message_expiry_interval"] == 2
    broker.clock.advance(3)
    late = subscribed(broker, "late", ("r", 0), version=V5)
    assert publishes(late.received()) == []


def test_MQTT_3_3_1_9_retain_handling_0_sends_retained_on_every_subscribe(broker):
    """MQTT-3.3.1-9, MQTT-3.8.4-3, MQTT-3.8.4-4."""
    client = connected(broker, "c", version=V5)
    client.send(publish("r/1", b"kept", 1, 1, retain=True))
    client.received()
    watcher = connected(broker, "w", version=V5)
    subscribe(watcher, ("r/#", options(1, retain_handling=0)))
    [first] = publishes(watcher.received())
    assert first.payload == b"kept" and first.retain is True
    # The same filter again replaces the subscription and sends them again.
    subscribe(watcher, ("r/#", options(0, retain_handling=0)), mid=2)
    [second] = publishes(watcher.received())
    assert second.payload == b"kept" and second.qos == 0
    # One subscription, not two: one copy per message.
    client.send(publish("r/1", b"live", 1, 2))
    assert payloads(watcher.received()) == [b"live"]


def test_MQTT_3_3_1_10_retain_handling_1_sends_retained_only_to_a_new_subscription(broker):
    """MQTT-3.3.1-10."""
    client = connected(broker, "c", version=V5)
    client.send(publish("r/1", b"kept", retain=True))
    watcher = connected(broker, "w", version=V5)
    subscribe(watcher, ("r/#", options(1, retain_handling=1)))
    assert payloads(watcher.received()) == [b"kept"]
    subscribe(watcher, ("r/#", options(1, retain_handling=1)), mid=2)
    assert publishes(watcher.received()) == []


def test_MQTT_3_3_1_11_retain_handling_2_sends_no_retained(broker):
    """MQTT-3.3.1-11."""
    client = connected(broker, "c", version=V5)
    client.send(publish("r/1", b"kept", retain=True))
    watcher = connected(broker, "w", version=V5)
    subscribe(watcher, ("r/#", options(1, retain_handling=2)))
    assert publishes(watcher.received()) == []
    client.send(publish("r/1", b"live"))
    assert payloads(watcher.received()) == [b"live"]


def test_MQTT_3_3_1_12_retain_as_published_0_clears_retain_on_forwarding(broker):
    """MQTT-3.3.1-12."""
    watcher = subscribed(broker, "w", ("r", options(0)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("r", b"x", retain=True))
    [delivered] = publishes(watcher.received())
    assert delivered.retain is False


def test_MQTT_3_3_1_13_retain_as_published_1_keeps_retain_on_forwarding(broker):
    """MQTT-3.3.1-13."""
    watcher = subscribed(broker, "w", ("r", options(0, retain_as_published=True)), version=V5)
    client = connected(broker, "c", version=V5)
    client.send(publish("r", b"kept", retain=True), publish("r", b"plain"))
    first, second = publishes(watcher.received())
    assert first.retain is True
    assert second.retain is False


def test_retained_messages_are_not_sent_to_a_shared_subscription(broker):
    """4.8.2: retained messages are not sent when a shared subscription is made."""
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"kept", retain=True))
    member = connected(broker, "m", version=V5)
    subscribe(member, ("$share/g/t", options(1)))
    assert publishes(member.received()) == []
    client.send(publish("t", b"live", retain=True))
    [live] = publishes(member.received())
    assert live.payload == b"live"

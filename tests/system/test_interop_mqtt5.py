"""
MQTT 5.0 clients nobody on the project wrote against the gateway run by
twistd: paho-mqtt's MQTTv5 client, and mosquitto_pub / mosquitto_sub with
``-V mqttv5``.  Message properties, subscription options and identifiers,
shared subscriptions, session expiry across a restart, CONNACK properties,
message expiry and topic aliases.
"""

import queue
import subprocess
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.conftest import require_program
from tests.mosquitto_clients import Sub
from tests.mosquitto_clients import pub as mosquitto_pub
from tests.paho import TIMEOUT, PahoClient

V5 = "MQTTv5"


def properties(packet_type, **values):
    """paho Properties for ``packet_type`` ("PUBLISH", "CONNECT", ...)."""
    props = Properties(getattr(PacketTypes, packet_type))
    for name, value in values.items():
        setattr(props, name, value)
    return props


def client(gateway, client_id, version=V5, connect_properties=None, **kwargs):
    c = PahoClient(gateway.port, client_id, version, **kwargs)
    c.connect(properties=connect_properties)
    return c


def drain(c, wait=0.5):
    """Messages that arrive until none has for ``wait`` seconds."""
    got = []
    while True:
        try:
            got.append(c.messages.get(timeout=wait))
        except queue.Empty:
            return got


def subscription_ids(message):
    return sorted(getattr(message.properties, "SubscriptionIdentifier", []))


# Message properties


USER_PROPERTIES = [("a", "1"), ("b", "2"), ("a", "3"), ("ключ", "значение")]


def full_properties(expiry=3600):
    return properties(
        "PUBLISH",
        UserProperty=list(USER_PROPERTIES),
        ContentType="application/json; charset=utf-8",
        PayloadFormatIndicator=1,
        ResponseTopic="reply/to/me",
        CorrelationData=b"\x00\x01corr\xff",
        MessageExpiryInterval=expiry,
    )


def assert_full_properties(m, expiry=3600):
    p = m.properties
    assert p.UserProperty == USER_PROPERTIES
    assert p.ContentType == "application/json; charset=utf-8"
    assert p.PayloadFormatIndicator == 1
    assert p.ResponseTopic == "reply/to/me"
    assert p.CorrelationData == b"\x00\x01corr\xff"
    # Less the time it waited in the gateway [MQTT-3.3.2-6]: next to nothing.
    assert expiry - 2 <= p.MessageExpiryInterval <= expiry


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho5_publish_properties_reach_a_v5_subscriber_unchanged_and_a_v311_one_not_at_all(
    gateway, qos
):
    sub5 = client(gateway, "sub5")
    assert sub5.subscribe("props/#", qos) == [qos]
    sub311 = client(gateway, "sub311", "MQTTv311")
    assert sub311.subscribe("props/#", qos) == [qos]
    pub = client(gateway, "pub5")
    payload = '{"temperature": 21.5, "unit": "°C"}'.encode()
    pub.publish("props/room", payload, qos, properties=full_properties())

    [m] = sub5.receive()
    assert (m.topic, m.payload, m.qos) == ("props/room", payload, qos)
    assert_full_properties(m)
    assert not hasattr(m.properties, "TopicAlias")
    assert not hasattr(m.properties, "SubscriptionIdentifier")

    [m] = sub311.receive()
    assert (m.topic, m.payload, m.qos) == ("props/room", payload, qos)
    assert m.properties is None
    assert sub5.nothing_more() and sub311.nothing_more()


def test_paho5_retained_message_keeps_its_properties(gateway):
    pub = client(gateway, "pub5")
    pub.publish("kept/props", b"{}", 1, retain=True, properties=full_properties())
    sub = client(gateway, "sub5")
    sub.subscribe("kept/#", 1)
    [m] = sub.receive()
    assert (m.topic, m.payload, m.retain) == ("kept/props", b"{}", True)
    assert_full_properties(m)


def test_paho311_publish_reaches_a_v5_subscriber_without_properties(gateway):
    sub = client(gateway, "sub5")
    sub.subscribe("old/#", 1)
    pub = client(gateway, "pub311", "MQTTv311")
    pub.publish("old/x", b"plain", 1)
    [m] = sub.receive()
    assert (m.topic, m.payload) == ("old/x", b"plain")
    assert str(m.properties) == "[]", m.properties


# Subscribe options and subscription identifiers


def test_paho5_no_local_keeps_own_publishes_away_but_not_other_clients(gateway):
    me = client(gateway, "me")
    assert me.subscribe("nl/#", options=SubscribeOptions(qos=1, noLocal=True)) == [1]
    other = client(gateway, "other")
    me.publish("nl/mine", b"from me", 1)
    other.publish("nl/theirs", b"from other", 1)
    [m] = me.receive()
    assert (m.topic, m.payload) == ("nl/theirs", b"from other")
    assert me.nothing_more()


def test_paho5_retain_as_published_keeps_the_retain_flag_of_a_live_message(gateway):
    as_published = client(gateway, "rap1")
    as_published.subscribe("rap/#", options=SubscribeOptions(qos=1, retainAsPublished=True))
    plain = client(gateway, "rap0")
    plain.subscribe("rap/#", options=SubscribeOptions(qos=1, retainAsPublished=False))
    pub = client(gateway, "pub")
    pub.publish("rap/x", b"retained", 1, retain=True)
    pub.publish("rap/y", b"not retained", 1)
    assert [(m.topic, m.retain) for m in as_published.receive(2)] == [
        ("rap/x", True),
        ("rap/y", False),
    ]
    assert [(m.topic, m.retain) for m in plain.receive(2)] == [
        ("rap/x", False),
        ("rap/y", False),
    ]
    # A retained message sent because of a subscription has RETAIN 1 whatever
    # the option ([MQTT-3.3.1-9], 3.3.1.3).
    late = client(gateway, "late")
    late.subscribe("rap/#", options=SubscribeOptions(qos=1, retainAsPublished=False))
    [m] = late.receive()
    assert (m.topic, m.retain) == ("rap/x", True)


def test_paho5_retain_handling_2_sends_no_retained_message_on_subscribe(gateway):
    pub = client(gateway, "pub")
    pub.publish("rh/state", b"kept", 1, retain=True)
    sub = client(gateway, "sub")
    options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
    assert sub.subscribe("rh/#", options=options) == [1]
    pub.publish("rh/live", b"fresh", 1)
    [m] = sub.receive()
    assert (m.topic, m.payload) == ("rh/live", b"fresh")
    assert sub.nothing_more()


def test_paho5_retain_handling_1_sends_retained_only_for_a_new_subscription(gateway):
    pub = client(gateway, "pub")
    pub.publish("rh/state", b"kept", 1, retain=True)
    sub = client(gateway, "sub")
    options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
    sub.subscribe("rh/#", options=options)
    [m] = sub.receive()
    assert (m.topic, m.payload, m.retain) == ("rh/state", b"kept", True)
    sub.subscribe("rh/#", options=options)
    pub.publish("rh/live", b"fresh", 1)
    [m] = sub.receive()
    assert (m.topic, m.payload) == ("rh/live", b"fresh")
    assert sub.nothing_more()
    # Retain handling 0 sends it again on the same, existing subscription.
    sub.subscribe("rh/#", options=SubscribeOptions(qos=1))
    [m] = sub.receive()
    assert (m.topic, m.payload, m.retain) == ("rh/state", b"kept", True)


def test_paho5_subscription_identifiers_come_with_each_delivery(gateway):
    pub = client(gateway, "pub")
    pub.publish("sid/kept", b"retained", 1, retain=True)
    sub = client(gateway, "sub")
    sub.subscribe("sid/#", 1, properties=properties("SUBSCRIBE", SubscriptionIdentifier=42))
    [m] = sub.receive()
    assert (m.topic, m.retain, subscription_ids(m)) == ("sid/kept", True, [42])
    sub.subscribe("sid/one", 1, properties=properties("SUBSCRIBE", SubscriptionIdentifier=7))
    sub.subscribe("sid/+/none", 1)

    pub.publish("sid/other", b"a", 1)
    [m] = sub.receive()
    assert (m.topic, subscription_ids(m)) == ("sid/other", [42])

    # Two matching subscriptions with identifiers: one copy carrying both
    # [MQTT-3.3.4-4], or a copy for each carrying its own [MQTT-3.3.4-5].
    pub.publish("sid/one", b"b", 1)
    [m] = sub.receive()
    if subscription_ids(m) == [7, 42]:
        assert sub.nothing_more()
    else:
        [m2] = sub.receive()
        assert sorted([subscription_ids(m), subscription_ids(m2)]) == [[7], [42]]

    # A subscription without an identifier adds none: one copy with 42, or
    # that and a copy with no identifier.
    pub.publish("sid/x/none", b"c", 1)
    got = sub.receive()
    got += drain(sub)
    assert sorted(subscription_ids(m) for m in got) in ([[42]], [[], [42]])


# Shared subscriptions


def merged_messages(*clients):
    """One queue of (client index, message) for all of ``clients``."""
    merged = queue.Queue()
    for i, c in enumerate(clients):
        c.client.on_message = lambda c_, u, m, i=i: merged.put((i, m))
    return merged


@pytest.mark.parametrize("second", ["MQTTv5", "MQTTv311"])
def test_paho5_shared_subscription_members_get_each_message_once_between_them(gateway, second):
    members = [client(gateway, "member-a"), client(gateway, "member-b", second)]
    for m in members:
        assert m.subscribe("$share/g/t/#", 1) == [1]
    everyone = client(gateway, "everyone")
    everyone.subscribe("t/#", 1)
    merged = merged_messages(*members)
    pub = client(gateway, "pub")
    n = 40
    for i in range(n):
        pub.publish(f"t/{i % 3}", f"m{i}".encode(), 1)

    got = [merged.get(timeout=TIMEOUT) for _ in range(n)]
    assert sorted(m.payload for _, m in got) == sorted(f"m{i}".encode() for i in range(n))
    assert all(m.qos == 1 for _, m in got)
    counts = [sum(1 for who, _ in got if who == i) for i in (0, 1)]
    assert all(counts), counts
    with pytest.raises(queue.Empty):
        merged.get(timeout=0.5)
    # A non-shared subscription to the same filter gets every message.
    assert [m.payload for m in everyone.receive(n)] == [f"m{i}".encode() for i in range(n)]
    assert everyone.nothing_more()


def test_paho5_shared_subscription_with_no_local_is_a_protocol_error(gateway):
    c = client(gateway, "bad")
    c.client.subscribe("$share/g/x", options=SubscribeOptions(qos=1, noLocal=True))
    rc, _ = c.disconnect_reason.get(timeout=TIMEOUT)
    # [MQTT-3.8.3-4]: DISCONNECT 0x82 Protocol Error.
    assert rc.value == 0x82, rc


# Session expiry


def test_paho5_session_with_expiry_interval_survives_a_gateway_restart(gateway_with, tmp_path):
    data = tmp_path / "data"
    first = gateway_with("--data-dir", str(data))
    port = first.port
    session = properties("CONNECT", SessionExpiryInterval=300)
    keeper = client(first, "keeper5", clean_session=False, connect_properties=session)
    assert keeper.subscribe("away/#", 2) == [2]
    keeper.disconnect()
    pub = client(first, "pub")
    sent = [(f"away/{i}", f"m{i}".encode(), 1 + i % 2) for i in range(6)]
    for topic, payload, qos in sent:
        pub.publish(topic, payload, qos)
    pub.disconnect()
    first.stop()

    second = gateway_with("--data-dir", str(data), "--tcp", f"tcp:{port}:interface=127.0.0.1")
    assert second.port == port
    back = PahoClient(port, "keeper5", V5, clean_session=False)
    flags = back.connect(properties=properties("CONNECT", SessionExpiryInterval=300))
    assert flags.session_present
    got = [(m.topic, m.payload, m.qos) for m in back.receive(len(sent))]
    for qos in (1, 2):
        assert [g for g in got if g[2] == qos] == [s for s in sent if s[2] == qos]
    assert back.nothing_more()


@pytest.mark.parametrize("resume_expiry", [None, 60], ids=["resumed-without-expiry", "resumed-with-expiry"])
def test_paho5_session_begun_with_clean_start_resumes_after_a_gateway_restart(
    gateway_with, tmp_path, resume_expiry
):
    """[MQTT-3.1.2-5], [MQTT-3.1.2-23]: Clean Start 1 with an expiry makes a
    new session that outlives its connection and a restart; resumed with
    Clean Start 0, even without an expiry, it delivers what was queued."""
    data = tmp_path / "data"
    first = gateway_with("--data-dir", str(data))
    port = first.port
    keeper = client(
        first, "fresh5", clean_session=True,
        connect_properties=properties("CONNECT", SessionExpiryInterval=60),
    )
    assert keeper.subscribe("queued/#", 2) == [2]
    keeper.drop()
    pub = client(first, "pub")
    sent = [("queued/1", b"at least once", 1), ("queued/2", b"exactly once", 2)]
    for topic, payload, qos in sent:
        pub.publish(topic, payload, qos)
    pub.disconnect()
    first.stop()

    second = gateway_with("--data-dir", str(data), "--tcp", f"tcp:{port}:interface=127.0.0.1")
    back = PahoClient(port, "fresh5", V5, clean_session=False)
    resume = None
    if resume_expiry is not None:
        resume = properties("CONNECT", SessionExpiryInterval=resume_expiry)
    assert back.connect(properties=resume).session_present
    assert sorted((m.topic, m.payload, m.qos) for m in back.receive(len(sent))) == sent
    assert back.nothing_more()
    back.disconnect()
    assert "Traceback" not in second.log()


def test_paho5_session_without_expiry_interval_ends_with_the_connection(gateway):
    keeper = client(gateway, "brief", clean_session=False)
    keeper.subscribe("gone/#", 1)
    keeper.disconnect()
    pub = client(gateway, "pub")
    pub.publish("gone/x", b"nobody", 1)
    back = PahoClient(gateway.port, "brief", V5, clean_session=False)
    assert not back.connect().session_present
    assert back.nothing_more()


def test_paho5_queued_message_expires_while_the_session_is_offline(gateway):
    session = properties("CONNECT", SessionExpiryInterval=300)
    keeper = client(gateway, "keeper5", clean_session=False, connect_properties=session)
    keeper.subscribe("q/#", 1)
    keeper.disconnect()
    pub = client(gateway, "pub")
    pub.publish("q/short", b"expires", 1, properties=properties("PUBLISH", MessageExpiryInterval=1))
    pub.publish("q/long", b"stays", 1, properties=properties("PUBLISH", MessageExpiryInterval=600))
    published = time.monotonic()
    # Waiting out the 1 s interval is the point of the test.
    time.sleep(max(0.0, published + 2.0 - time.monotonic()))
    back = PahoClient(gateway.port, "keeper5", V5, clean_session=False)
    assert back.connect(properties=session).session_present
    [m] = back.receive()
    assert (m.topic, m.payload) == ("q/long", b"stays")
    waited = time.monotonic() - published
    assert 600 - waited - 1 <= m.properties.MessageExpiryInterval <= 600 - int(waited)
    assert back.nothing_more()


# CONNACK


def test_paho5_reads_the_connack_properties_the_gateway_announces(gateway_with, tmp_path):
    config = tmp_path / "mqttgw.toml"
    config.write_text(
        "[limits]\nmax_inflight_messages = 7\nmax_packet_size = 5000\n"
        "[mqtt]\nmax_topic_alias = 4\n"
    )
    gw = gateway_with("--config", str(config))
    c = client(gw, "reader")
    p = c.connack_properties
    assert p.ReceiveMaximum == 7
    assert p.MaximumPacketSize == 5000
    assert p.TopicAliasMaximum == 4
    assert not hasattr(p, "AssignedClientIdentifier")


def test_paho5_reads_the_default_connack_limits(gateway):
    p = client(gateway, "reader").connack_properties
    assert p.ReceiveMaximum == 20
    assert p.MaximumPacketSize == 1024 * 1024
    assert p.TopicAliasMaximum == 10


def test_paho5_topic_aliases_up_to_the_announced_maximum_are_accepted(gateway_with, tmp_path):
    config = tmp_path / "mqttgw.toml"
    config.write_text("[mqtt]\nmax_topic_alias = 4\n")
    gw = gateway_with("--config", str(config))
    sub = client(gw, "sub")
    sub.subscribe("ta/#", 1)
    pub = client(gw, "pub")
    pub.publish("ta/long/topic/name", b"sets 4", 1, properties=properties("PUBLISH", TopicAlias=4))
    pub.publish("", b"uses 4", 1, properties=properties("PUBLISH", TopicAlias=4))
    pub.publish("ta/other", b"resets 4", 0, properties=properties("PUBLISH", TopicAlias=4))
    pub.publish("", b"uses 4 again", 0, properties=properties("PUBLISH", TopicAlias=4))
    got = sub.receive(4)
    assert [(m.topic, m.payload) for m in got] == [
        ("ta/long/topic/name", b"sets 4"),
        ("ta/long/topic/name", b"uses 4"),
        ("ta/other", b"resets 4"),
        ("ta/other", b"uses 4 again"),
    ]
    assert all(not hasattr(m.properties, "TopicAlias") for m in got)
    # One past the maximum: DISCONNECT 0x94 Topic Alias invalid [MQTT-3.2.2-17].
    pub.client.publish("ta/x", b"too far", 0, properties=properties("PUBLISH", TopicAlias=5))
    rc, _ = pub.disconnect_reason.get(timeout=TIMEOUT)
    assert rc.value == 0x94, rc
    assert sub.nothing_more()


def test_paho5_publish_over_the_announced_maximum_packet_size_is_refused(gateway_with, tmp_path):
    config = tmp_path / "mqttgw.toml"
    config.write_text("[limits]\nmax_packet_size = 5000\n")
    gw = gateway_with("--config", str(config))
    sub = client(gw, "sub")
    sub.subscribe("big/#", 0)
    pub = client(gw, "pub")
    pub.publish("big/ok", b"x" * 4000, 0)
    pub.client.publish("big/no", b"x" * 6000, 0)
    rc, _ = pub.disconnect_reason.get(timeout=TIMEOUT)
    # [MQTT-3.2.2-15]: DISCONNECT 0x95 Packet too large.
    assert rc.value == 0x95, rc
    [m] = sub.receive()
    assert m.topic == "big/ok"
    assert sub.nothing_more()


def test_paho5_gateway_sends_nothing_larger_than_the_clients_maximum_packet_size(gateway):
    limit = properties("CONNECT", MaximumPacketSize=200)
    small = client(gateway, "small", connect_properties=limit)
    small.subscribe("mps/#", 1)
    pub = client(gateway, "pub")
    pub.publish("mps/big", b"x" * 500, 1)
    pub.publish("mps/small", b"y" * 50, 1)
    [m] = small.receive()
    assert (m.topic, m.payload) == ("mps/small", b"y" * 50)
    assert small.nothing_more()


def test_paho5_empty_client_id_gets_a_unique_assigned_identifier_it_can_resume(gateway):
    session = properties("CONNECT", SessionExpiryInterval=300)
    first = client(gateway, "", clean_session=False, connect_properties=session)
    second = client(gateway, "")
    assigned = first.connack_properties.AssignedClientIdentifier
    other = second.connack_properties.AssignedClientIdentifier
    assert assigned and other and assigned != other
    # The CONNECT is handled as if the assigned id had been sent
    # [MQTT-3.1.3-7]: the session can be resumed under it.
    first.subscribe("assigned/#", 1)
    first.disconnect()
    pub = client(gateway, "pub")
    pub.publish("assigned/x", b"for the assigned id", 1)
    back = PahoClient(gateway.port, assigned, V5, clean_session=False)
    assert back.connect(properties=session).session_present
    assert not hasattr(back.connack_properties, "AssignedClientIdentifier")
    [m] = back.receive()
    assert m.payload == b"for the assigned id"


# mosquitto_pub / mosquitto_sub -V mqttv5

FORMAT = "%t|%P|%E|%C|%F|%R|%D|%r|%p"

PUB_PROPERTIES = [
    "-D", "publish", "user-property", "k1", "v1",
    "-D", "publish", "user-property", "k2", "v2",
    "-D", "publish", "user-property", "k1", "again",
    "-D", "publish", "message-expiry-interval", "120",
    "-D", "publish", "content-type", "text/plain",
    "-D", "publish", "payload-format-indicator", "1",
    "-D", "publish", "response-topic", "answers/here",
    "-D", "publish", "correlation-data", "request-17",
]


def split(line):
    topic, user, expiry, content, pfi, response, corr, retain, payload = line.split("|")
    return {
        "topic": topic, "user": user, "expiry": expiry, "content": content, "pfi": pfi,
        "response": response, "corr": corr, "retain": retain, "payload": payload,
    }


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto5_properties_reach_mosquitto_sub(gateway, qos):
    sub = Sub(gateway.port, "mqttv5", "-t", "mp/#", "-q", str(qos), "-F", FORMAT)
    mosquitto_pub(gateway.port, "mqttv5", "mp/x", "-q", str(qos), "-m", "hello", *PUB_PROPERTIES)
    [line] = sub.messages(1)
    got = split(line)
    assert 118 <= int(got.pop("expiry")) <= 120
    assert got == {
        "topic": "mp/x", "user": "k1:v1 k2:v2 k1:again", "content": "text/plain", "pfi": "1",
        "response": "answers/here", "corr": "request-17", "retain": "0", "payload": "hello",
    }
    sub.stop()


def test_mosquitto5_properties_reach_paho5(gateway):
    sub = client(gateway, "sub5")
    sub.subscribe("mp/#", 1)
    mosquitto_pub(gateway.port, "mqttv5", "mp/y", "-q", "1", "-m", "hello", *PUB_PROPERTIES)
    [m] = sub.receive()
    p = m.properties
    assert (m.topic, m.payload) == ("mp/y", b"hello")
    assert p.UserProperty == [("k1", "v1"), ("k2", "v2"), ("k1", "again")]
    assert 118 <= p.MessageExpiryInterval <= 120
    assert (p.ContentType, p.PayloadFormatIndicator) == ("text/plain", 1)
    assert (p.ResponseTopic, p.CorrelationData) == ("answers/here", b"request-17")


def test_paho5_properties_reach_mosquitto_sub(gateway):
    sub = Sub(gateway.port, "mqttv5", "-t", "pm/#", "-q", "1", "-F", FORMAT)
    pub = client(gateway, "pub5")
    props = properties(
        "PUBLISH",
        UserProperty=[("z", "1"), ("a", "2")],
        ContentType="text/plain",
        PayloadFormatIndicator=1,
        ResponseTopic="r/t",
        CorrelationData=b"c-1",
        MessageExpiryInterval=99,
    )
    pub.publish("pm/x", b"from paho", 1, properties=props)
    got = split(sub.messages(1)[0])
    assert 97 <= int(got.pop("expiry")) <= 99
    assert got == {
        "topic": "pm/x", "user": "z:1 a:2", "content": "text/plain", "pfi": "1",
        "response": "r/t", "corr": "c-1", "retain": "0", "payload": "from paho",
    }
    sub.stop()


def retained_now(port, topic_filter):
    """The retained messages a fresh mosquitto_sub -V mqttv5 gets, as lines."""
    sub = Sub(port, "mqttv5", "-t", topic_filter, "-q", "1", "--retained-only",
              "-F", "%t|%r|%E|%p")
    # The first message that is not retained ends mosquitto_sub, unprinted.
    mosquitto_pub(port, "mqttv5", topic_filter.replace("#", "end-of-retained"), "-m", "x")
    return sorted(sub.finish())


def test_mosquitto5_retained_message_is_gone_once_its_expiry_interval_passes(gateway):
    port = gateway.port
    mosquitto_pub(port, "mqttv5", "exp/keep", "-r", "-q", "1", "-m", "kept")
    mosquitto_pub(port, "mqttv5", "exp/gone", "-r", "-q", "1", "-m", "soon gone",
                  "-D", "publish", "message-expiry-interval", "2")
    published = time.monotonic()
    before = retained_now(port, "exp/#")
    assert len(before) == 2 and before[1] == "exp/keep|1||kept", before
    topic, retain, expiry, payload = before[0].split("|")
    assert (topic, retain, payload) == ("exp/gone", "1", "soon gone")
    assert expiry in ("1", "2"), expiry
    # Waiting out the 2 s interval is the point of the test.
    time.sleep(max(0.0, published + 3.0 - time.monotonic()))
    assert retained_now(port, "exp/#") == ["exp/keep|1||kept"]


# Topic aliases from mosquitto_pub


@pytest.mark.parametrize("qos", [0, 1])
def test_mosquitto5_pub_topic_alias_is_resolved_for_subscribers(gateway, qos):
    # mosquitto_pub -l sends the topic with the alias once, then the alias alone.
    sub5 = client(gateway, "sub5")
    sub5.subscribe("alias/#", qos)
    sub311 = Sub(gateway.port, "mqttv311", "-t", "alias/#", "-q", str(qos))
    lines = "".join(f"line {i}\n" for i in range(5))
    mosquitto_pub(gateway.port, "mqttv5", "alias/a/long/topic", "-q", str(qos), "-l",
                  "-D", "publish", "topic-alias", "3", input=lines)
    got = sub5.receive(5)
    assert [(m.topic, m.payload) for m in got] == [
        ("alias/a/long/topic", f"line {i}".encode()) for i in range(5)
    ]
    # paho set no Topic Alias Maximum, so none is sent to it [MQTT-3.1.2-27].
    assert all(not hasattr(m.properties, "TopicAlias") for m in got)
    assert sub311.messages(5) == [f"alias/a/long/topic line {i}" for i in range(5)]
    sub311.stop()


def test_mosquitto5_pub_topic_alias_over_the_maximum_is_refused(gateway):
    sub = client(gateway, "sub5")
    sub.subscribe("alias/#", 0)
    out = subprocess.run(
        [
            require_program("mosquitto_pub"), "-h", "127.0.0.1", "-p", str(gateway.port),
            "-V", "mqttv5", "-d", "-t", "alias/x", "-q", "1", "-m", "too far",
            "-D", "publish", "topic-alias", "11",
        ],
        check=False, capture_output=True, text=True, timeout=TIMEOUT,
    )
    # Default max_topic_alias 10: no PUBACK but DISCONNECT 0x94 (148)
    # [MQTT-3.3.2-9].
    assert "Received DISCONNECT (148)" in out.stdout, out
    assert sub.nothing_more()


def test_a_gateway_that_stops_tells_its_5_0_clients_why_and_closes_3_1_1_ones(gateway):
    # [MQTT-4.13.2-1]: a 5.0 client is sent DISCONNECT 0x8B; 3.1.1 has no
    # DISCONNECT from the server, so its connection just closes.
    v5 = client(gateway, "five")
    v311 = client(gateway, "three", version="MQTTv311")
    gateway.stop()
    reason, _ = v5.disconnect_reason.get(timeout=TIMEOUT)
    assert reason.value == 0x8B and str(reason) == "Server shutting down"
    assert v311.disconnected.wait(TIMEOUT)

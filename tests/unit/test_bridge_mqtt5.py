"""
A bridge speaking MQTT 5.0 to its upstream, in-process on a
MemoryReactorClock (tests/fake_network.py plays the upstream):
the CONNECT it sends, the limits of the upstream's CONNACK kept to, no
local on its subscriptions, properties carried both ways, and the reason
codes it is answered with logged and counted.  tests/system/test_bridge.py runs
it against a real mosquitto.
"""

from twisted.internet.address import IPv4Address

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.testing import FakeClient
from mqttgw.web.metrics import Metrics
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests.fake_network import Listener
from tests.mqtt5_bridge import REMOTE_STATE, UPSTREAM, connected, local5, published, start_bridge, upstream_connect


# CONNECT


def test_the_connect_is_level_5_with_a_session_expiry_and_no_try_private(router, reactor):
    start_bridge(router, reactor)
    _, connect = upstream_connect(reactor)
    # No mosquitto bridge flag on the level: no local does its work.
    assert (connect.protocol_name, connect.protocol_level) == ("MQTT", P.MQTT_5)
    assert connect.clean_session is False
    # The upstream keeps the session across link drops: for ever by default.
    assert connect.properties["session_expiry_interval"] == 0xFFFFFFFF
    assert connect.properties["topic_alias_maximum"] > 0
    assert (connect.will_topic, connect.will_message, connect.will_retain) == (REMOTE_STATE, b"0", True)


def test_the_session_expiry_is_a_key_and_a_clean_session_has_none(router, reactor):
    start_bridge(router, reactor, session_expiry_interval=3600)
    assert upstream_connect(reactor)[1].properties["session_expiry_interval"] == 3600


def test_a_clean_session_asks_for_no_expiry(router, reactor):
    start_bridge(router, reactor, clean_session=True, session_expiry_interval=3600)
    _, connect = upstream_connect(reactor)
    assert connect.clean_session is True
    assert "session_expiry_interval" not in connect.properties


def test_protocol_version_5_is_the_same_as_protocol_mqttv5():
    table = {"name": "up", "addresses": [UPSTREAM], "rules": ["t/# out 1"]}
    assert MQTTBridgeKind.check({**table, "protocol_version": 5}).protocol_level == P.MQTT_5
    assert MQTTBridgeKind.check({**table, "protocol": "mqttv50"}).protocol_level == P.MQTT_5
    # 3.1.1 stays the default.
    assert MQTTBridgeKind.check(table).protocol_level == P.MQTT_311


def test_a_refusing_connack_is_logged_by_its_reason_name(router, reactor, logged):
    bridge = start_bridge(router, reactor)
    upstream, _ = upstream_connect(reactor)
    upstream.send(P.Connack(R.BAD_USER_NAME_OR_PASSWORD, properties={}))
    assert upstream.closed
    assert any("CONNACK 0x86: bad user name or password" in line for line in logged())
    assert bridge.status()["connected"] is False


# The upstream's limits


def test_the_upstreams_receive_maximum_bounds_the_messages_in_flight(router, reactor):
    bridge = start_bridge(router, reactor, max_inflight_messages=20)
    upstream = connected(reactor, receive_maximum=2)
    publisher = Listener.of(router, reactor).client("pub")
    for i in range(7):
        publisher.send(P.Publish("t/seq", str(i).encode(), 1, message_id=i + 1))
    got = []
    for _ in range(10):
        batch = published(upstream)
        if not batch:
            break
        # Never more than the upstream's receive maximum unacknowledged.
        assert len(batch) <= 2
        assert len(bridge.session.inflight) <= 2
        got += [int(p.payload) for p in batch]
        upstream.send(*(P.Puback(p.message_id) for p in batch))
    assert got == list(range(7))
    status = bridge.status()
    assert status["window"] == 2
    assert status["upstream_limits"]["receive_maximum"] == 2


def test_a_message_larger_than_the_upstream_takes_is_dropped_and_counted(router, reactor):
    # The prefix grows each topic by 10 bytes upstream: that is allowed for.
    bridge = start_bridge(router, reactor, rules=['t/# out 1 "" 0123456789'])
    upstream = connected(reactor, maximum_packet_size=200)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"x" * 190, 1, message_id=1))
    publisher.send(P.Publish("t/a", b"small", 1, message_id=2))
    [sent] = published(upstream)
    assert (sent.topic, sent.payload) == ("0123456789t/a", b"small")
    assert bridge.status()["dropped"] == 1
    assert router.stats.messages_too_large == 1
    # Whatever fits was below the limit with its rewritten topic.
    publisher.send(P.Publish("t/a", b"y" * 150, 1, message_id=3))
    [sent] = published(upstream)
    assert len(sent.encode()) <= 200


def test_out_rules_are_held_to_the_upstreams_maximum_qos(router, reactor):
    bridge = start_bridge(router, reactor, rules=["t/# out 2"])
    upstream = connected(reactor, maximum_qos=1)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"v", 2, message_id=1))
    [sent] = published(upstream)
    assert sent.qos == 1
    upstream.send(P.Puback(sent.message_id))
    assert not bridge.session.inflight
    # Back to the rule's QoS with an upstream that takes it.
    upstream.lose()
    reactor.advance(120)
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub-again")
    publisher.send(P.Publish("t/a", b"w", 2, message_id=2))
    [sent] = published(upstream)
    assert sent.qos == 2


def test_without_retain_available_nothing_is_sent_retained(router, reactor):
    start_bridge(router, reactor)
    upstream = connected(reactor, retain_available=0)
    received = upstream.received()
    [state] = [p for p in received if isinstance(p, P.Publish) and p.topic == REMOTE_STATE]
    assert state.retain is False
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"v", 1, True, message_id=1))
    [sent] = published(upstream)
    assert (sent.payload, sent.retain) == (b"v", False)


def test_the_servers_keep_alive_replaces_the_bridges(router, reactor):
    start_bridge(router, reactor, keepalive=60)
    upstream = connected(reactor, server_keep_alive=5)
    reactor.advance(5)
    assert P.Pingreq() in upstream.received()


# Subscriptions upstream


def test_subscriptions_upstream_are_no_local_and_retain_as_published(router, reactor):
    start_bridge(router, reactor, rules=["c/# in 1", "both/# both 2"])
    upstream = connected(reactor)
    [subscribe] = [p for p in upstream.received() if isinstance(p, P.Subscribe)]
    assert subscribe.topics == [("c/#", 1 | 0x04 | 0x08), ("both/#", 2 | 0x04 | 0x08)]


# Properties both ways


MESSAGE_PROPERTIES = {
    "payload_format_indicator": 1,
    "content_type": "text/plain",
    "response_topic": "replies/1",
    "correlation_data": b"\x01\x02",
    "user_property": [("site", "7"), ("unit", "C"), ("site", "8")],
}


def test_a_local_publishers_properties_go_upstream_with_the_expiry_left(router, reactor):
    start_bridge(router, reactor)
    upstream = connected(reactor)
    publisher = local5(router, reactor, "pub5")
    properties = {**MESSAGE_PROPERTIES, "message_expiry_interval": 30}
    publisher.send(P.Publish("t/a", b"21.5", 1, message_id=1, properties=properties))
    [sent] = published(upstream)
    assert sent.properties == {**MESSAGE_PROPERTIES, "message_expiry_interval": 30}


def test_an_upstream_publish_brings_its_properties_down_to_5_0_subscribers_only(router, reactor):
    start_bridge(router, reactor, rules=["c/# in 1 site/ up/"])
    upstream = connected(reactor)
    sub5 = local5(router, reactor, "sub5")
    sub5.send(P.Subscribe(1, [("site/c/#", 1)], {}))
    sub311 = Listener.of(router, reactor).client("sub311")
    sub311.send(P.Subscribe(1, [("site/c/#", 1)]))
    sub5.received(), sub311.received()
    # With a topic alias, which the bridge resolves.
    props = {**MESSAGE_PROPERTIES, "topic_alias": 3}
    upstream.send(P.Publish("up/c/x", b"on", 1, message_id=9, properties=props))
    upstream.send(P.Publish("", b"off", 1, message_id=10, properties={"topic_alias": 3}))
    got5 = [p for p in sub5.received() if isinstance(p, P.Publish)]
    assert [(p.topic, p.payload, p.properties) for p in got5] == [
        ("site/c/x", b"on", MESSAGE_PROPERTIES), ("site/c/x", b"off", {}),
    ]
    got311 = [p for p in sub311.received() if isinstance(p, P.Publish)]
    assert [(p.topic, p.payload, p.properties) for p in got311] == [
        ("site/c/x", b"on", None), ("site/c/x", b"off", None),
    ]
    acks = [p for p in upstream.received() if isinstance(p, P.Puback)]
    assert [a.message_id for a in acks] == [9, 10]


def test_an_upstream_messages_expiry_holds_here(router, reactor):
    start_bridge(router, reactor, rules=["c/# in 1"])
    upstream = connected(reactor)
    sub = local5(router, reactor, "sub5", session_expiry_interval=600)
    sub.send(P.Subscribe(1, [("c/#", 1)], {}))
    sub.received()
    sub.lose_connection()
    upstream.send(P.Publish("c/x", b"soon stale", 1, message_id=1, properties={"message_expiry_interval": 10}))
    upstream.send(P.Publish("c/y", b"lasting", 1, message_id=2, properties={"message_expiry_interval": 100}))
    reactor.advance(30)
    back = FakeClient(Listener.of(router, reactor), IPv4Address("TCP", "127.0.0.1", 41000))
    back.send(P.Connect(client_id="sub5", protocol_level=P.MQTT_5, clean_session=False, properties={"session_expiry_interval": 600}))
    got = [p for p in back.received() if isinstance(p, P.Publish)]
    assert [(p.topic, p.properties.get("message_expiry_interval")) for p in got] == [("c/y", 70)]


def test_an_upstream_topic_alias_beyond_the_maximum_is_a_disconnect_0x94(router, reactor):
    start_bridge(router, reactor, rules=["c/# in 1"])
    upstream = connected(reactor)
    upstream.received()
    upstream.send(P.Publish("c/x", b"v", 0, properties={"topic_alias": 1000}))
    [disconnect] = upstream.received()
    assert disconnect.reason_code == R.TOPIC_ALIAS_INVALID
    assert upstream.closed


# Reason codes


def test_refusals_of_messages_are_counted_by_reason_and_logged_with_the_reason_string(router, reactor, logged):
    bridge = start_bridge(router, reactor, rules=["t/# out 2"])
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"1", 1, message_id=1))
    publisher.send(P.Publish("t/b", b"2", 2, message_id=2))
    publisher.received()
    first, second = published(upstream)
    upstream.send(P.Puback(first.message_id, R.QUOTA_EXCEEDED, {"reason_string": "queue full"}))
    upstream.send(P.Pubrec(second.message_id, R.NOT_AUTHORIZED))
    # A refused QoS 2 flow ends at its PUBREC: no PUBREL follows.
    assert not any(isinstance(p, P.Pubrel) for p in upstream.received())
    assert not bridge.session.inflight
    status = bridge.status()
    assert status["refused"] == 2
    assert status["reason_codes"] == {"PUBACK quota exceeded": 1, "PUBREC not authorized": 1}
    lines = logged()
    assert "bridge up: upstream answered PUBACK with 0x97 (quota exceeded): queue full" in lines
    assert "bridge up: upstream answered PUBREC with 0x87 (not authorized)" in lines


def test_success_codes_are_counted_but_not_logged(router, reactor, logged):
    bridge = start_bridge(router, reactor)
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"1", 1, message_id=1))
    [sent] = published(upstream)
    upstream.send(P.Puback(sent.message_id, R.NO_MATCHING_SUBSCRIBERS))
    assert bridge.status()["reason_codes"] == {"PUBACK no matching subscribers": 1}
    assert bridge.status()["refused"] == 0
    assert not any("upstream answered" in line for line in logged())


def test_a_refused_subscription_and_a_disconnect_are_logged_and_counted(router, reactor, logged):
    bridge = start_bridge(router, reactor, rules=["c/# in 1"])
    upstream = connected(reactor)
    upstream.received()
    upstream.send(P.Suback(1, [R.NOT_AUTHORIZED], {}))
    upstream.send(P.Disconnect(R.SERVER_SHUTTING_DOWN))
    assert bridge.status()["reason_codes"] == {
        "SUBACK not authorized": 1, "DISCONNECT server shutting down": 1,
    }
    lines = logged()
    assert "bridge up: upstream answered SUBACK with 0x87 (not authorized)" in lines
    assert "bridge up: upstream answered DISCONNECT with 0x8b (server shutting down)" in lines


def test_reason_codes_are_in_the_metrics(router, reactor):
    bridge = start_bridge(router, reactor)
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"1", 1, message_id=1))
    [sent] = published(upstream)
    upstream.send(P.Puback(sent.message_id, R.QUOTA_EXCEEDED))
    families = {f.name: f for f in Metrics(router, bridges=[bridge]).collect()}
    [sample] = families["mqttgw_bridge_reason_codes"].samples
    assert sample.labels == {"bridge": "up", "packet": "PUBACK", "reason": "quota exceeded"}
    assert sample.value == 1
    [refused] = families["mqttgw_bridge_refused"].samples
    assert refused.value == 1


# What the upstream's limits mean for what waited, and a new session there


def test_queued_and_in_flight_messages_are_held_to_the_upstreams_maximum_qos(router, reactor):
    bridge = start_bridge(router, reactor, rules=["t/# out 2"])
    publisher = Listener.of(router, reactor).client("pub")
    # Queued before the upstream is there, at the rule's QoS.
    publisher.send(P.Publish("t/a", b"queued", 2, message_id=1), P.Pubrel(1))
    upstream = connected(reactor, maximum_qos=1)
    [sent] = published(upstream)
    assert (sent.payload, sent.qos) == (b"queued", 1)
    upstream.send(P.Puback(sent.message_id))
    assert not bridge.session.inflight
    # In flight at QoS 2 when the link drops; the upstream comes back
    # taking QoS 1 at most: the flow starts again at QoS 1.
    upstream.lose()
    reactor.advance(120)
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub-2")
    publisher.send(P.Publish("t/a", b"flying", 2, message_id=2), P.Pubrel(2))
    [sent] = published(upstream)
    assert sent.qos == 2
    upstream.lose()
    reactor.advance(120)
    upstream = connected(reactor, maximum_qos=1)
    [again] = published(upstream)
    assert (again.payload, again.qos) == (b"flying", 1)
    upstream.send(P.Puback(again.message_id))
    assert not bridge.session.inflight


def test_messages_sent_again_after_a_reconnection_keep_to_the_receive_maximum(router, reactor):
    bridge = start_bridge(router, reactor, max_inflight_messages=20)
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub")
    for i in range(5):
        publisher.send(P.Publish("t/a", str(i).encode(), 1, message_id=i + 1))
    assert len(published(upstream)) == 5
    upstream.lose()
    reactor.advance(120)
    upstream = connected(reactor, receive_maximum=2)
    got = []
    for _ in range(5):
        batch = published(upstream)
        assert len(batch) <= 2
        got += [int(p.payload) for p in batch]
        assert all(p.dup for p in batch)
        upstream.send(*(P.Puback(p.message_id) for p in batch))
    assert got == [0, 1, 2, 3, 4]
    assert not bridge.session.inflight


def test_a_rewritten_topic_that_lengthens_remaining_length_still_fits(router, reactor):
    start_bridge(router, reactor, rules=['t/# out 0 "" ab'])
    upstream = connected(reactor, maximum_packet_size=130)
    publisher = Listener.of(router, reactor).client("pub")
    for size in range(110, 130):
        publisher.send(P.Publish("t/a", b"x" * size, 0))
    assert all(len(p.encode()) <= 130 for p in published(upstream))


def test_an_upstream_without_retained_messages_is_asked_again_without_a_retained_will(router, reactor, logged):
    start_bridge(router, reactor)
    upstream, connect = upstream_connect(reactor)
    assert connect.will_retain is True
    # [MQTT-3.2.2-13]: it refuses a retained will.
    upstream.send(P.Connack(R.RETAIN_NOT_SUPPORTED, properties={}))
    reactor.advance(120)
    upstream, again = upstream_connect(reactor)
    assert (again.will_retain, again.will_qos) == (False, 1)
    upstream.send(P.Connack(0, properties={"retain_available": 0}))
    assert any("upstream refused the will (retain not supported)" in line for line in logged())


def test_a_new_session_upstream_frees_the_ids_of_qos_2_messages_not_released(router, reactor):
    start_bridge(router, reactor, rules=["c/# in 2"])
    upstream = connected(reactor)
    # No keepalive: it stays while the clock runs.
    sub = Listener.of(router, reactor).client("sub", keepalive=0)
    sub.send(P.Subscribe(1, [("c/#", 2)]))
    sub.received()
    upstream.send(P.Publish("c/x", b"first", 2, message_id=1, properties={}))
    upstream.lose()
    reactor.advance(120)
    # The upstream lost the bridge's session: its id 1 is a new message.
    upstream, _ = upstream_connect(reactor)
    upstream.send(P.Connack(0, session_present=False, properties={}))
    upstream.send(P.Publish("c/x", b"second", 2, message_id=1, properties={}))
    upstream.send(P.Pubrel(1))
    # (Its own copy of the first is sent again meanwhile, with DUP.)
    got = [p.payload for p in sub.received() if isinstance(p, P.Publish) and not p.dup]
    assert got == [b"first", b"second"]


def test_a_new_session_upstream_is_sent_again_what_it_had_of_ours_past_pubrec(router, reactor):
    # mosquitto passes a QoS 2 message on at PUBREL: an upstream that lost
    # the session before it came lost the message with it.
    bridge = start_bridge(router, reactor, rules=["t/# out 2"])
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"held", 2, message_id=5))
    publisher.send(P.Pubrel(5))
    [sent] = published(upstream)
    upstream.send(P.Pubrec(sent.message_id))
    assert [type(p) for p in upstream.received()] == [P.Pubrel]
    upstream.lose()
    reactor.advance(120)
    upstream, _ = upstream_connect(reactor)
    upstream.send(P.Connack(0, session_present=False, properties={}))
    [again] = published(upstream)
    assert (again.topic, again.payload, again.qos) == ("t/a", b"held", 2)
    upstream.send(P.Pubrec(again.message_id))
    assert [type(p) for p in upstream.received()] == [P.Pubrel]
    upstream.send(P.Pubcomp(again.message_id))
    assert not bridge.session.inflight


def test_a_resumed_session_upstream_is_sent_pubrel_again_not_the_message(router, reactor):
    start_bridge(router, reactor, rules=["t/# out 2"])
    upstream = connected(reactor)
    publisher = Listener.of(router, reactor).client("pub")
    publisher.send(P.Publish("t/a", b"held", 2, message_id=5))
    publisher.send(P.Pubrel(5))
    [sent] = published(upstream)
    upstream.send(P.Pubrec(sent.message_id))
    upstream.received()
    upstream.lose()
    reactor.advance(120)
    upstream, _ = upstream_connect(reactor)
    upstream.send(P.Connack(0, session_present=True, properties={}))
    got = [p for p in upstream.received() if getattr(p, "topic", None) != REMOTE_STATE]
    assert [(type(p), p.message_id) for p in got] == [(P.Pubrel, sent.message_id)]


def test_a_3_1_1_upstream_refusing_a_5_0_connect_is_logged_as_such(router, reactor, logged):
    start_bridge(router, reactor)
    upstream, _ = upstream_connect(reactor)
    # A 3.1.1 server's answer: return code 1, two bytes, no properties.
    upstream.protocol.dataReceived(b"\x20\x02\x00\x01")
    assert upstream.closed
    assert any("CONNACK 0x84: unsupported protocol version" in line for line in logged())


def test_a_malformed_packet_from_the_upstream_is_answered_and_the_link_closed_gracefully(router, reactor):
    start_bridge(router, reactor, rules=["c/# in 1"])
    upstream = connected(reactor)
    upstream.received()
    upstream.send(P.Publish("c/x", b"v", 0, properties={"topic_alias": 1000}))
    [disconnect] = upstream.received()
    assert disconnect.reason_code == R.TOPIC_ALIAS_INVALID
    # Closed after the write, not aborted (which would drop the DISCONNECT
    # still in the socket's buffer); aborted only if the close hangs.
    assert upstream.transport.disconnecting
    assert not upstream.transport.disconnected
    reactor.advance(5)
    assert upstream.transport.disconnected

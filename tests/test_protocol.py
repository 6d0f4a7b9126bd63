"""
The broker's behaviour on the wire, driven through fake transports and a
fake clock: CONNECT rules, sessions, QoS flows, retained messages, wills,
subscriptions, flow control and bad input.
"""

import pytest

from mqttgw.broker.session import SessionLimits
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire.encoding import encode_string
from mqttgw.wire.framing import Framer
from mqttgw.wire.packets import _frame

V31 = {"protocol_level": P.MQTT_31}
V311 = {"protocol_level": P.MQTT_311}
both_versions = pytest.mark.parametrize("version", [V31, V311], ids=["3.1", "3.1.1"])


def connected(broker, client_id, clean_session=True, version=V311, **fields):
    client = broker.client(client_id=client_id, clean_session=clean_session, **version, **fields)
    [connack] = client.received()
    assert connack.return_code == 0
    return client


def subscribed(broker, client_id, *topics, clean_session=True, version=V311):
    client = connected(broker, client_id, clean_session, version)
    client.send(P.Subscribe(1, list(topics)))
    assert isinstance(client.received()[0], P.Suback)
    return client


def publishes(packets):
    return [(p.topic, p.payload, p.qos) for p in packets if isinstance(p, P.Publish)]


# CONNECT


@both_versions
def test_connect_is_answered_with_connack_accepted(broker, version):
    client = broker.client(client_id="c1", **version)
    assert client.transport.value() == b"\x20\x02\x00\x00"
    assert not client.closed


@pytest.mark.parametrize(
    "name,level", [("MQIsdp", 4), ("MQTT", 3), ("MQTT", 6), ("MQIsdp", 1)]
)
def test_unsupported_protocol_gets_connack_1_and_close(broker, name, level):
    client = broker.client(P.Connect(client_id="c", protocol_name=name, protocol_level=level))
    assert client.received() == [P.Connack(1)]
    assert client.closed


@pytest.mark.parametrize("client_id", ["", "x" * 24])
def test_v31_client_id_outside_1_to_23_characters_gets_connack_2(broker, client_id):
    client = broker.client(client_id=client_id, **V31)
    assert client.received() == [P.Connack(2)]
    assert client.closed


def test_v31_client_id_of_23_characters_is_accepted(broker):
    client = broker.client(client_id="ü" * 23, **V31)
    assert client.received() == [P.Connack(0)]


def test_v311_empty_client_id_with_clean_session_is_assigned_one(broker):
    client = broker.client(client_id="", clean_session=True, **V311)
    assert client.received() == [P.Connack(0)]
    assert client.protocol.client_id.startswith("mqttgw-")
    other = broker.client(client_id="", clean_session=True, **V311)
    assert other.protocol.client_id != client.protocol.client_id


def test_v311_empty_client_id_without_clean_session_gets_connack_2(broker):
    client = broker.client(client_id="", clean_session=False, **V311)
    assert client.received() == [P.Connack(2)]
    assert client.closed


def test_v311_long_client_id_is_accepted(broker):
    client = broker.client(client_id="x" * 200, **V311)
    assert client.received() == [P.Connack(0)]


@pytest.mark.parametrize("first", [P.Publish("a", b"x"), P.Pingreq(), P.Subscribe(1, [("a", 0)])])
def test_first_packet_other_than_connect_closes(broker, first):
    client = broker.client()
    client.send(first)
    assert client.closed
    assert client.received() == []


def test_second_connect_closes_the_connection(broker):
    client = connected(broker, "c")
    client.send(P.Connect(client_id="c"))
    assert client.closed


def test_no_connect_within_timeout_closes(broker):
    client = broker.client()
    broker.clock.advance(9.9)
    assert not client.closed
    broker.clock.advance(0.2)
    assert client.closed


def test_connect_timeout_is_configurable():
    broker = FakeBroker(connect_timeout=2)
    client = broker.client()
    broker.clock.advance(2.1)
    assert client.closed


def test_connect_in_time_stops_the_connect_timer(broker):
    client = connected(broker, "c", keepalive=0)
    broker.clock.advance(100)
    assert not client.closed


def test_connect_deadline_passing_while_connect_is_answered_does_not_close():
    # A refusal held back (a throttled login: 0.1 s doubled per failure)
    # is still on its way when the CONNECT deadline comes.
    broker = FakeBroker(connect_timeout=2, passwords={"u": "right"})
    for _ in range(6):
        broker.client(client_id="c", username="u", password=b"wrong")
        broker.clock.advance(10)
    late = broker.client(client_id="c", username="u", password=b"wrong")
    broker.clock.advance(2.5)
    assert late.received() == [] and not late.closed
    broker.clock.advance(4)
    assert late.received() == [P.Connack(4)] and late.closed


def test_connections_closed_before_connect_are_not_held_until_their_deadline(broker):
    deadlines = broker.factory.flusher.connects
    for _ in range(1000):
        broker.client().lose_connection()
    # Rebuilt without them as they closed, not kept for ten seconds.
    assert deadlines._held < 200
    waiting = broker.client()
    broker.clock.advance(10.1)
    assert waiting.closed


def test_connect_and_subscribe_in_one_chunk_are_both_handled(broker):
    client = broker.client()
    client.send(P.Connect(client_id="c"), P.Subscribe(1, [("a", 1)]))
    assert client.received() == [P.Connack(0), P.Suback(1, [1])]


@both_versions
def test_user_name_and_password_are_accepted_without_authentication(broker, version):
    client = broker.client(client_id="c", username="u", password=b"p", **version)
    assert client.received() == [P.Connack(0)]


# Sessions


def test_session_present_is_set_for_a_resumed_v311_session(broker):
    client = connected(broker, "p", clean_session=False)
    client.send(P.Disconnect())
    client.finish_close()
    again = broker.client(client_id="p", clean_session=False)
    assert again.transport.value() == b"\x20\x02\x01\x00"


def test_session_present_byte_stays_zero_for_v31(broker):
    client = connected(broker, "p", clean_session=False, version=V31)
    client.send(P.Disconnect())
    client.finish_close()
    again = broker.client(client_id="p", clean_session=False, **V31)
    assert again.transport.value() == b"\x20\x02\x00\x00"


def test_clean_session_discards_the_previous_session(broker):
    sub = subscribed(broker, "s", ("a", 1), clean_session=False)
    sub.send(P.Disconnect())
    sub.finish_close()
    clean = broker.client(client_id="s", clean_session=True)
    assert clean.received() == [P.Connack(0, session_present=False)]
    pub = connected(broker, "pub")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    assert publishes(clean.received()) == []
    clean.send(P.Disconnect())
    clean.finish_close()
    assert "s" not in broker.router.sessions


def test_clean_session_state_is_dropped_when_the_connection_ends(broker):
    sub = subscribed(broker, "s", ("a", 0))
    sub.lose_connection()
    assert "s" not in broker.router.sessions
    assert broker.router.subscriptions.count == 0


@both_versions
def test_persistent_session_keeps_subscriptions_and_queues_qos12_while_offline(broker, version):
    sub = subscribed(broker, "s", ("a/#", 2), clean_session=False, version=version)
    sub.lose_connection()
    pub = connected(broker, "pub")
    pub.send(
        P.Publish("a/0", b"zero", 0),
        P.Publish("a/1", b"one", 1, message_id=1),
        P.Publish("a/2", b"two", 2, message_id=2),
    )
    back = broker.client(client_id="s", clean_session=False, **version)
    packets = back.received()
    assert packets[0].return_code == 0
    # QoS 0 is not queued for an offline session.
    assert publishes(packets) == [("a/1", b"one", 1), ("a/2", b"two", 2)]


def test_unacknowledged_deliveries_are_resent_with_dup_on_resume(broker):
    sub = subscribed(broker, "s", ("a", 2), clean_session=False)
    pub = connected(broker, "pub")
    pub.send(P.Publish("a", b"1", 1, message_id=1), P.Publish("a", b"2", 2, message_id=2))
    first = [p for p in sub.received() if isinstance(p, P.Publish)]
    assert [p.dup for p in first] == [False, False]
    sub.send(P.Pubrec(first[1].message_id))
    assert sub.received() == [P.Pubrel(first[1].message_id)]
    sub.lose_connection()
    back = broker.client(client_id="s", clean_session=False)
    packets = back.received()
    assert packets[0] == P.Connack(0, True)
    resent = packets[1]
    assert (resent.message_id, resent.payload, resent.dup) == (first[0].message_id, b"1", True)
    # The QoS 2 flow resumes from its last unacknowledged step: PUBREL.
    assert packets[2] == P.Pubrel(first[1].message_id)
    back.send(P.Puback(first[0].message_id), P.Pubcomp(first[1].message_id))
    assert broker.router.sessions["s"].inflight == {}


def test_takeover_closes_the_old_connection_before_the_new_connack(broker):
    old = connected(broker, "c", will_topic="will/c", will_message=b"gone")
    watcher = subscribed(broker, "w", ("will/#", 0))
    order = []
    old.transport.abortConnection = lambda: order.append("old closed")
    new = broker.client()
    new.transport.write = lambda data: order.append(("new got", data))
    new.send(P.Connect(client_id="c"))
    assert order == ["old closed", ("new got", b"\x20\x02\x00\x00")]
    # Take-over is not a DISCONNECT: the old connection's will is published.
    assert publishes(watcher.received()) == [("will/c", b"gone", 0)]
    assert broker.router.sessions["c"].connection is new.protocol


def test_takeover_of_persistent_session_keeps_its_subscriptions(broker):
    subscribed(broker, "s", ("a", 1), clean_session=False)
    new = broker.client(client_id="s", clean_session=False)
    assert new.received() == [P.Connack(0, True)]
    pub = connected(broker, "pub")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    assert publishes(new.received()) == [("a", b"x", 1)]


def test_old_connection_lost_after_takeover_does_not_disturb_the_new_one(broker):
    old = connected(broker, "c")
    new = connected(broker, "c")
    old.lose_connection()
    assert broker.router.sessions["c"].connection is new.protocol


# Keepalive


@both_versions
def test_keepalive_expires_after_one_and_a_half_times_the_interval(broker, version):
    client = connected(broker, "c", keepalive=10, version=version)
    broker.clock.advance(14.9)
    assert not client.closed
    broker.clock.advance(0.2)
    assert client.closed


def test_any_packet_resets_the_keepalive(broker):
    client = connected(broker, "c", keepalive=10)
    for _ in range(5):
        broker.clock.advance(10)
        client.send(P.Pingreq())
        assert client.received() == [P.Pingresp()]
    broker.clock.advance(14)
    assert not client.closed
    broker.clock.advance(1.1)
    assert client.closed


def test_bytes_of_an_unfinished_packet_do_not_reset_the_keepalive(broker):
    client = connected(broker, "c", keepalive=10)
    data = P.Publish("t", b"x" * 100).encode()
    for i in range(14):
        broker.clock.advance(1)
        client.send_bytes(data[i : i + 1])
    broker.clock.advance(1.1)
    assert client.closed


def test_keepalive_zero_means_no_timeout(broker):
    client = connected(broker, "c", keepalive=0)
    broker.clock.advance(100000)
    assert not client.closed


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5], ids=["3.1.1", "5.0"])
def test_a_stall_of_the_gateway_is_no_clients_silence(broker, logged, level):
    # Stopped (SIGSTOP) or the clock jumped: 30 s pass with nothing read.
    # A client whose PINGREQ waited in its socket meanwhile is kept; one
    # that truly stays silent is still dropped, its will published.
    watcher = will_watcher(broker)
    props = {"properties": {}} if level == P.MQTT_5 else {}
    healthy, silent = (
        connected(
            broker, name, keepalive=10, version={"protocol_level": level},
            will_topic=f"will/{name}", will_message=b"gone", **props,
        )
        for name in ("healthy", "silent")
    )
    broker.clock.advance(5)
    healthy.send(P.Pingreq())
    assert healthy.received() == [P.Pingresp()]
    broker.clock.stall(30)
    assert not healthy.closed and not silent.closed
    assert publishes(watcher.received()) == []
    assert [line for line in logged() if "did not run" in line] == [
        "the gateway did not run for 30.0s (stopped, or the clock jumped):"
        " what clients sent meanwhile is read before keepalive is judged"
    ]
    healthy.send(P.Pingreq())
    assert healthy.received() == [P.Pingresp()]
    for _ in range(3):
        broker.clock.advance(5)
        healthy.send(P.Pingreq())
        assert healthy.received() == [P.Pingresp()]
    # 15 s of its own silence (5 before the stall, 10 after), and 1.5 x 10
    # is the limit.
    assert silent.closed and not healthy.closed
    assert publishes(watcher.received()) == [("will/silent", b"gone", 0)]
    assert any("client silent keepalive expired (15.0s silent)" in line for line in logged())


def test_a_connection_waiting_for_connect_through_a_stall_is_read_first():
    broker = FakeBroker(connect_timeout=2)
    late, silent = broker.client(), broker.client()
    broker.clock.advance(1)
    broker.clock.stall(30)
    # Its CONNECT was waiting to be read: it is answered, not cut off.
    assert not late.closed and not silent.closed
    late.send(P.Connect("late"))
    assert late.received() == [P.Connack(0)]
    broker.clock.advance(0.5)
    assert not silent.closed
    # Its own silence past the timeout after the stall: closed.
    broker.clock.advance(2)
    assert silent.closed and not late.closed


# Wills


def will_watcher(broker):
    return subscribed(broker, "watcher", ("will/#", 2))


@pytest.mark.parametrize(
    "ending",
    ["connection lost", "keepalive", "protocol violation"],
)
def test_will_is_published_when_the_connection_ends_without_disconnect(broker, ending):
    watcher = will_watcher(broker)
    client = connected(
        broker, "c", keepalive=5, will_topic="will/c", will_message=b"bye", will_qos=1
    )
    if ending == "connection lost":
        client.lose_connection()
    elif ending == "keepalive":
        broker.clock.advance(8)
    else:
        client.send_bytes(b"\xf0\x00")
    assert publishes(watcher.received()) == [("will/c", b"bye", 1)]


def test_will_is_discarded_on_disconnect(broker):
    watcher = will_watcher(broker)
    client = connected(broker, "c", will_topic="will/c", will_message=b"bye")
    client.send(P.Disconnect())
    client.finish_close()
    assert publishes(watcher.received()) == []


def test_will_is_published_only_once(broker):
    watcher = will_watcher(broker)
    client = connected(broker, "c", will_topic="will/c", will_message=b"bye")
    client.send_bytes(b"\xf0\x00")
    client.finish_close()
    assert len(publishes(watcher.received())) == 1


def test_retained_will_is_kept_as_the_retained_message(broker):
    client = connected(broker, "c", will_topic="will/c", will_message=b"offline", will_retain=True)
    client.lose_connection()
    later = connected(broker, "later")
    later.send(P.Subscribe(1, [("will/c", 0)]))
    suback, retained = later.received()
    assert (retained.topic, retained.payload, retained.retain) == ("will/c", b"offline", True)


@pytest.mark.parametrize("will_topic", ["will/+", "will/#", ""])
def test_will_topic_with_wildcard_or_empty_closes(broker, will_topic):
    client = broker.client(client_id="c", will_topic=will_topic, will_message=b"x")
    assert client.closed
    assert client.received() == []


# PUBLISH from clients


@both_versions
def test_qos0_publish_is_delivered(broker, version):
    sub = subscribed(broker, "s", ("a", 0), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"hello"))
    assert pub.received() == []
    assert sub.received() == [P.Publish("a", b"hello")]


@both_versions
def test_qos1_publish_is_acknowledged_and_delivered(broker, version):
    sub = subscribed(broker, "s", ("a", 1), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 1, message_id=7))
    assert pub.received() == [P.Puback(7)]
    [delivered] = sub.received()
    assert (delivered.qos, delivered.payload) == (1, b"x")
    assert delivered.message_id != 0


@both_versions
def test_qos2_publish_is_delivered_exactly_once(broker, version):
    sub = subscribed(broker, "s", ("a", 2), version=version)
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish("a", b"x", 2, message_id=9))
    assert pub.received() == [P.Pubrec(9)]
    # The publisher did not see the PUBREC and sends again with DUP.
    pub.send(P.Publish("a", b"x", 2, dup=True, message_id=9))
    assert pub.received() == [P.Pubrec(9)]
    assert len(publishes(sub.received())) == 1
    pub.send(P.Pubrel(9))
    assert pub.received() == [P.Pubcomp(9)]
    # After PUBREL the id is free: the same id now carries a new message.
    pub.send(P.Publish("a", b"y", 2, message_id=9))
    assert publishes(sub.received()) == [("a", b"y", 2)]


def test_pubrel_for_unknown_id_is_still_completed(broker):
    pub = connected(broker, "p")
    pub.send(P.Pubrel(33))
    assert pub.received() == [P.Pubcomp(33)]


@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_delivery_qos_is_the_lower_of_publish_and_granted(broker, pub_qos, sub_qos):
    sub = subscribed(broker, "s", ("a", sub_qos))
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"x", pub_qos, message_id=1 if pub_qos else None))
    [delivered] = publishes(sub.received())
    assert delivered[2] == min(pub_qos, sub_qos)


@both_versions
@pytest.mark.parametrize("topic", ["a/+", "a/#", "#", "+"])
def test_wildcard_in_publish_topic_closes(broker, version, topic):
    pub = connected(broker, "p", version=version)
    pub.send(P.Publish(topic, b"x"))
    assert pub.closed


def test_publish_on_dollar_topic_is_not_matched_by_leading_wildcard(broker):
    everything = subscribed(broker, "all", ("#", 0), ("+/x", 0))
    sys = subscribed(broker, "sys", ("$dev/#", 0))
    pub = connected(broker, "p")
    pub.send(P.Publish("$dev/x", b"1"))
    assert publishes(everything.received()) == []
    assert publishes(sys.received()) == [("$dev/x", b"1", 0)]


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
    assert [payload for _, payload, _ in publishes(sub.received())] == [b"before"] + [
        b"%d" % i for i in range(7)
    ]


def test_publisher_receives_its_own_message_when_subscribed(broker):
    client = subscribed(broker, "c", ("a", 0))
    client.send(P.Publish("a", b"echo"))
    assert publishes(client.received()) == [("a", b"echo", 0)]


# Outbound QoS flows


def test_outbound_qos1_is_removed_from_inflight_on_puback(broker):
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    [delivered] = sub.received()
    assert list(broker.router.sessions["s"].inflight) == [delivered.message_id]
    sub.send(P.Puback(delivered.message_id))
    assert broker.router.sessions["s"].inflight == {}


def test_outbound_qos2_completes_with_pubrec_pubrel_pubcomp(broker):
    sub = subscribed(broker, "s", ("a", 2))
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"x", 2, message_id=1))
    [delivered] = sub.received()
    sub.send(P.Pubrec(delivered.message_id))
    assert sub.received() == [P.Pubrel(delivered.message_id)]
    sub.send(P.Pubcomp(delivered.message_id))
    assert broker.router.sessions["s"].inflight == {}


def test_qos2_pubrels_are_sent_in_the_order_of_their_publishes(broker):
    sub = subscribed(broker, "s", ("a", 2))
    pub = connected(broker, "p")
    for i in range(1, 4):
        pub.send(P.Publish("a", b"%d" % i, 2, message_id=i))
    mids = [p.message_id for p in sub.received()]
    for mid in mids:
        sub.send(P.Pubrec(mid))
    assert sub.received() == [P.Pubrel(m) for m in mids]


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


def test_inflight_window_queues_the_rest_until_acknowledged():
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    for i in range(5):
        pub.send(P.Publish("a", b"%d" % i, 1, message_id=i + 1))
    first = sub.received()
    assert [p.payload for p in first] == [b"0", b"1"]
    sub.send(P.Puback(first[0].message_id))
    [third] = sub.received()
    assert third.payload == b"2"
    sub.send(P.Puback(first[1].message_id), P.Puback(third.message_id))
    assert [p.payload for p in sub.received()] == [b"3", b"4"]


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
    assert publishes(sub.received()) == []


# Retained messages


def test_retained_message_is_sent_on_subscribe_with_retain_set(broker):
    pub = connected(broker, "p")
    pub.send(P.Publish("r/1", b"last", 1, retain=True, message_id=1))
    sub = connected(broker, "s")
    sub.send(P.Subscribe(1, [("r/+", 2)]))
    suback, retained = sub.received()
    assert suback == P.Suback(1, [2])
    assert (retained.topic, retained.payload, retained.qos, retained.retain) == (
        "r/1",
        b"last",
        1,
        True,
    )


def test_live_delivery_never_carries_retain(broker):
    sub = subscribed(broker, "s", ("r", 0))
    pub = connected(broker, "p")
    pub.send(P.Publish("r", b"v", 0, retain=True))
    [delivered] = sub.received()
    assert not delivered.retain


def test_only_the_last_retained_message_per_topic_is_kept(broker):
    pub = connected(broker, "p")
    pub.send(P.Publish("r", b"1", retain=True), P.Publish("r", b"2", retain=True))
    sub = connected(broker, "s")
    sub.send(P.Subscribe(1, [("r", 0)]))
    assert publishes(sub.received()) == [("r", b"2", 0)]


def test_zero_length_retained_publish_clears_the_topic(broker):
    live = subscribed(broker, "live", ("r", 0))
    pub = connected(broker, "p")
    pub.send(P.Publish("r", b"v", retain=True), P.Publish("r", b"", retain=True))
    # Subscribers at the time still receive the empty message.
    assert publishes(live.received()) == [("r", b"v", 0), ("r", b"", 0)]
    sub = connected(broker, "s")
    sub.send(P.Subscribe(1, [("r", 0)]))
    assert publishes(sub.received()) == []
    assert "r" not in broker.router.retained


def test_non_retained_publish_does_not_replace_the_retained_message(broker):
    pub = connected(broker, "p")
    pub.send(P.Publish("r", b"kept", retain=True), P.Publish("r", b"passing"))
    sub = connected(broker, "s")
    sub.send(P.Subscribe(1, [("r", 0)]))
    assert publishes(sub.received()) == [("r", b"kept", 0)]


def test_retained_messages_match_wildcards_and_respect_dollar_rule(broker):
    pub = connected(broker, "p")
    for topic in ["a/1", "a/2", "b/1", "$dev/x"]:
        pub.send(P.Publish(topic, topic.encode(), retain=True))
    sub = connected(broker, "s")
    sub.send(P.Subscribe(1, [("#", 0)]))
    assert sorted(t for t, _, _ in publishes(sub.received())) == ["a/1", "a/2", "b/1"]


def test_resubscribing_sends_the_retained_message_again(broker):
    pub = connected(broker, "p")
    pub.send(P.Publish("r", b"v", retain=True))
    sub = subscribed(broker, "s", ("r", 0))
    sub.send(P.Subscribe(2, [("r", 1)]))
    assert publishes(sub.received()) == [("r", b"v", 0)]


# SUBSCRIBE and UNSUBSCRIBE


def test_subscribe_to_several_topics_grants_each(broker):
    client = connected(broker, "c")
    client.send(P.Subscribe(5, [("a", 0), ("b/+", 1), ("c/#", 2)]))
    assert client.received() == [P.Suback(5, [0, 1, 2])]


def test_granted_qos_is_capped_by_max_qos():
    broker = FakeBroker()
    broker.router.max_qos = 1
    client = connected(broker, "c")
    client.send(P.Subscribe(5, [("a", 2), ("b", 0)]))
    assert client.received() == [P.Suback(5, [1, 0])]


def test_overlapping_subscriptions_deliver_once_at_the_highest_qos(broker):
    sub = subscribed(broker, "s", ("a/#", 0), ("a/+", 2), ("a/b", 1))
    pub = connected(broker, "p")
    pub.send(P.Publish("a/b", b"x", 2, message_id=1))
    assert publishes(sub.received()) == [("a/b", b"x", 2)]


def test_v311_invalid_filter_gets_0x80_and_the_others_are_granted(broker):
    client = connected(broker, "c")
    client.send(P.Subscribe(3, [("a", 1), ("a/#/b", 1), ("b+", 0), ("c", 2)]))
    assert client.received() == [P.Suback(3, [1, 0x80, 0x80, 2])]
    assert set(broker.router.sessions["c"].subscriptions) == {"a", "c"}
    assert not client.closed


def test_v31_invalid_filter_closes(broker):
    client = connected(broker, "c", version=V31)
    client.send(P.Subscribe(3, [("a", 1), ("a/#/b", 1)]))
    assert client.closed


def test_unsubscribe_several_topics_stops_their_delivery(broker):
    sub = subscribed(broker, "s", ("a", 0), ("b", 0), ("c", 0))
    sub.send(P.Unsubscribe(4, ["a", "b", "not-subscribed"]))
    assert sub.received() == [P.Unsuback(4)]
    pub = connected(broker, "p")
    for t in "abc":
        pub.send(P.Publish(t, b"x"))
    assert publishes(sub.received()) == [("c", b"x", 0)]


# Slow consumers


def test_paused_connection_queues_then_drops_qos0_and_counts():
    broker = FakeBroker(SessionLimits(max_queued_messages=10))
    sub = subscribed(broker, "s", ("a", 0))
    pub = connected(broker, "p")
    sub.protocol.pauseProducing()
    for i in range(25):
        pub.send(P.Publish("a", b"%d" % i))
    assert sub.received() == []
    session = broker.router.sessions["s"]
    assert session.queued == 10
    assert session.dropped == 15
    assert broker.router.stats.messages_dropped == 15
    sub.protocol.resumeProducing()
    assert [p.payload for p in sub.received()] == [b"%d" % i for i in range(10)]
    assert session.queued == 0


def test_queue_is_bounded_by_bytes_too():
    broker = FakeBroker(SessionLimits(max_queued_bytes=1000))
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    sub.protocol.pauseProducing()
    for i in range(10):
        pub.send(P.Publish("a", b"x" * 300, 1, message_id=i + 1))
    session = broker.router.sessions["s"]
    assert session.queued == 3
    assert session.queued_bytes == 900
    assert session.dropped == 7


def test_transport_full_buffer_pauses_delivery(broker):
    """The transport's producer API is what tells the session to hold back."""
    sub = subscribed(broker, "s", ("a", 0))
    assert sub.transport.producer is sub.protocol
    assert sub.transport.streaming
    pub = connected(broker, "p")
    sub.transport.producer.pauseProducing()
    pub.send(P.Publish("a", b"held"))
    assert sub.received() == []
    sub.transport.producer.resumeProducing()
    assert publishes(sub.received()) == [("a", b"held", 0)]


def test_a_paused_connection_is_not_read_from_until_it_resumes(broker):
    client = subscribed(broker, "s", ("a", 0))
    client.protocol.pauseProducing()
    assert client.transport.producerState == "paused"
    client.protocol.resumeProducing()
    assert client.transport.producerState == "producing"


def test_output_past_the_high_water_mark_is_written_at_once(broker):
    from mqttgw.transports.connection import OUTPUT_HIGH_WATER

    sub = subscribed(broker, "s", ("a", 0))
    pub = connected(broker, "p")
    payload = b"x" * 1000
    writes = []
    write = sub.transport.write
    sub.transport.write = lambda data: (writes.append(len(data)), write(data))
    pub.send(*[P.Publish("a", payload) for _ in range(200)])
    # Written as the output grows, not all in one turn-end write.
    assert len(writes) > 1
    assert max(writes) <= OUTPUT_HIGH_WATER + 2000
    assert len(publishes(sub.received())) == 200


def test_one_connection_failing_to_write_does_not_stop_the_others(broker, logged):
    subs = [subscribed(broker, f"s{i}", ("a", 0)) for i in range(3)]

    def broken(data):
        raise ValueError("payload too large for this transport")

    subs[1].transport.write = broken
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"one"))
    assert publishes(subs[0].received()) == [("a", b"one", 0)]
    assert publishes(subs[2].received()) == [("a", b"one", 0)]
    assert subs[1].closed
    assert any("cannot write to client s1" in line for line in logged())
    pub.send(P.Publish("a", b"two"))
    assert publishes(subs[0].received()) == [("a", b"two", 0)]
    assert publishes(subs[2].received()) == [("a", b"two", 0)]


def test_retained_messages_go_out_a_bounded_amount_per_turn():
    broker = FakeBroker()
    pub = connected(broker, "p")
    pub.send(*[P.Publish(f"r/{i}", b"v", 0, retain=True) for i in range(5000)])
    sub = connected(broker, "s")
    sub.protocol.dataReceived(P.Subscribe(1, [("r/#", 0)]).encode())
    sub.protocol.flush()
    first_turn = list(sub._framer.feed(sub.transport.value()))
    sub.transport.clear()
    assert isinstance(first_turn[0], P.Suback)
    # The walk over 5,000 topics is work too: little or nothing is sent
    # with the SUBACK, the rest over the turns that follow.
    assert len(first_turn) - 1 < 5000
    rest = sub.received()
    while len(first_turn) - 1 + len(rest) < 5000:
        more = sub.received()
        assert more, "retained delivery stopped"
        rest += more
    topics = [p.topic for p in first_turn[1:] + rest]
    assert sorted(topics) == sorted(f"r/{i}" for i in range(5000))


def test_retained_messages_wait_for_a_paused_connection():
    broker = FakeBroker(SessionLimits(max_queued_messages=10))
    pub = connected(broker, "p")
    pub.send(*[P.Publish(f"r/{i}", b"v", 1, retain=True, message_id=i + 1) for i in range(100)])
    sub = connected(broker, "s")
    sub.protocol.pauseProducing()
    sub.send(P.Subscribe(1, [("r/#", 0)]))
    assert broker.router.sessions["s"].dropped == 0
    sub.protocol.resumeProducing()
    got = []
    for _ in range(100):
        got += publishes(sub.received())
        if len(got) == 100:
            break
    assert len(got) == 100


def test_a_subscribe_with_many_filters_is_handled_over_several_turns_in_order(broker):
    client = connected(broker, "c")
    filters = [(f"f/{i}", 1) for i in range(1500)] + [("bad#", 0)]
    client.protocol.dataReceived(P.Subscribe(7, filters).encode() + P.Pingreq().encode())
    client.protocol.flush()
    # Nothing answered in the first turn: one step's filters done of 1,501.
    assert client.transport.value() == b""
    step = client.protocol.FILTERS_PER_STEP
    assert step < 1500
    assert len(broker.router.sessions["c"].subscriptions) == step
    assert client.transport.producerState == "paused"
    assert client.received() == [P.Suback(7, [1] * 1500 + [P.SUBACK_FAILURE]), P.Pingresp()]
    assert client.transport.producerState == "producing"
    client.send(P.Unsubscribe(8, [f for f, _ in filters]))
    assert client.received() == [P.Unsuback(8)]
    assert broker.router.subscriptions.count == 0


def test_a_large_subscribe_is_decoded_over_several_turns_and_checked_whole_before_use(broker):
    client = connected(broker, "c")
    good = b"".join(encode_string(f"f/{i}") + b"\x01" for i in range(5000))
    bad = b"\x00\x02\xff\xfe\x01"  # a filter that is not UTF-8, at the end
    client.protocol.dataReceived(_frame(0x82, b"\x00\x07" + good + bad))
    client.protocol.flush()
    # Decoding takes turns of its own; nothing is subscribed meanwhile.
    assert client.transport.value() == b""
    assert client.transport.producerState == "paused"
    assert len(broker.router.sessions["c"].subscriptions) == 0
    broker.clock.advance(0)
    # The malformed filter closes the connection before any filter is used.
    assert client.transport.disconnecting
    assert broker.router.subscriptions.count == 0


def test_a_large_subscribe_is_answered_once_all_of_it_is_decoded_and_applied(broker):
    client = connected(broker, "c")
    filters = [(f"f/{i}", 1) for i in range(5000)]
    client.send(P.Subscribe(7, filters))
    assert client.received() == [P.Suback(7, [1] * 5000)]
    assert len(broker.router.sessions["c"].subscriptions) == 5000


def test_control_characters_in_a_client_id_are_escaped_in_log_lines(broker, logged):
    # MQTT 3.1 has no rule against them (3.1.1 connections are closed).
    client = connected(broker, "a\nb\x1b[31mc\x85", version=V31)
    client.lose_connection()
    lines = [line for line in logged() if "a\\x0ab" in line]
    assert lines and all("\x1b" not in line and "\n" not in line for line in lines)
    assert any("a\\x0ab\\x1b[31mc\\x85 connected" in line for line in lines)


def test_offline_queue_is_bounded():
    broker = FakeBroker(SessionLimits(max_queued_messages=5))
    sub = subscribed(broker, "s", ("a", 1), clean_session=False)
    sub.lose_connection()
    pub = connected(broker, "p")
    for i in range(20):
        pub.send(P.Publish("a", b"%d" % i, 1, message_id=i + 1))
    assert broker.router.sessions["s"].queued == 5
    back = broker.client(client_id="s", clean_session=False)
    assert [p.payload for p in back.received()[1:]] == [b"%d" % i for i in range(5)]


def test_queue_qos0_messages_option_queues_them_for_offline_sessions():
    broker = FakeBroker(SessionLimits(queue_qos0_messages=True))
    sub = subscribed(broker, "s", ("a", 0), clean_session=False)
    sub.lose_connection()
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"kept"))
    back = broker.client(client_id="s", clean_session=False)
    assert publishes(back.received()) == [("a", b"kept", 0)]


# Bad input


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
    assert publishes(bystander.received()) == [("a", b"still works", 0)]


def test_packet_over_the_size_limit_closes():
    broker = FakeBroker(max_packet_size=100)
    client = connected(broker, "c")
    client.send(P.Publish("a", b"x" * 200))
    assert client.closed


def test_bytes_after_a_violation_in_the_same_chunk_are_ignored(broker):
    sub = subscribed(broker, "s", ("a", 0))
    bad = connected(broker, "bad")
    bad.send_bytes(b"\xf0\x00" + P.Publish("a", b"never").encode())
    assert publishes(sub.received()) == []


def test_internal_error_closes_the_connection_without_escaping(broker, logged):
    client = connected(broker, "c")

    def explode(message):
        raise RuntimeError("boom")

    broker.router.publish = explode
    client.send(P.Publish("a", b"x"))  # must not raise
    assert client.closed
    assert any("internal error" in m for m in logged())


def test_max_connections_refuses_beyond_the_limit():
    broker = FakeBroker(max_connections=2)
    broker.client()
    broker.client()
    assert broker.factory.buildProtocol(None) is None
    assert broker.router.stats.connections_refused == 1


# Further statements of the specification


def test_qos2_duplicate_is_detected_by_message_id_not_by_dup_flag(broker):
    # DUP is only a hint: a re-send without it is still the same message.
    sub = subscribed(broker, "s", ("a", 2))
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"x", 2, message_id=4), P.Publish("a", b"x", 2, message_id=4))
    assert pub.received() == [P.Pubrec(4), P.Pubrec(4)]
    assert len(publishes(sub.received())) == 1


def test_qos1_duplicate_is_republished_and_acknowledged_again(broker):
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"x", 1, message_id=4), P.Publish("a", b"x", 1, dup=True, message_id=4))
    assert pub.received() == [P.Puback(4), P.Puback(4)]
    assert len(publishes(sub.received())) == 2


def test_zero_length_payload_is_a_valid_publish(broker):
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"", 1, message_id=1))
    assert publishes(sub.received()) == [("a", b"", 1)]


def test_client_and_server_message_ids_are_independent(broker):
    client = subscribed(broker, "c", ("a", 1))
    client.send(P.Publish("a", b"x", 1, message_id=1))
    packets = client.received()
    assert P.Puback(1) in packets
    [delivered] = [p for p in packets if isinstance(p, P.Publish)]
    assert delivered.message_id == 1
    client.send(P.Puback(1))
    assert broker.router.sessions["c"].inflight == {}


def test_wildcard_delivery_carries_the_publishers_topic_name(broker):
    sub = subscribed(broker, "s", ("sensors/+/temp", 0))
    pub = connected(broker, "p")
    pub.send(P.Publish("sensors/7/temp", b"21"))
    assert publishes(sub.received()) == [("sensors/7/temp", b"21", 0)]


def test_keepalive_expiry_keeps_a_persistent_sessions_subscriptions(broker):
    sub = subscribed(broker, "s", ("a", 1), clean_session=False)
    sub.protocol.keepalive = 0
    expiring = connected(broker, "e", clean_session=False, keepalive=2)
    expiring.send(P.Subscribe(1, [("a", 1)]))
    broker.clock.advance(3.1)
    assert expiring.closed
    assert broker.router.sessions["e"].subscriptions == {"a": 1}


def test_disconnect_of_a_clean_session_discards_its_state(broker):
    client = subscribed(broker, "c", ("a", 1))
    client.send(P.Disconnect())
    assert client.closed
    assert "c" not in broker.router.sessions
    assert broker.router.subscriptions.match("a") == ()


def test_unsubscribe_of_an_invalid_filter_is_acknowledged(broker):
    client = connected(broker, "c")
    client.send(P.Unsubscribe(2, ["a/#/b"]))
    assert client.received() == [P.Unsuback(2)]


def test_connection_messages_can_be_turned_off(logged):
    broker = FakeBroker(connection_messages=False)
    client = connected(broker, "quiet")
    client.send(P.Disconnect())
    other = connected(broker, "dropped")
    other.lose_connection()
    assert not [line for line in logged() if "quiet" in line or "dropped" in line]
    loud = FakeBroker()
    connected(loud, "loud").send(P.Disconnect())
    assert any("client loud connected" in line for line in logged())
    assert any("client loud disconnected" in line for line in logged())


def test_pending_retained_walks_are_bounded_for_a_client_that_never_reads(tmp_path):
    broker = FakeBroker(store_dir=tmp_path)
    pub = connected(broker, "p")
    pub.send(P.Publish("r/1", b"v", 1, retain=True, message_id=1))
    broker.commit()
    sessions = broker.router.sessions
    for round_ in range(3):
        sub = broker.client(client_id="s", clean_session=False)
        sub.received()
        sub.protocol.pauseProducing()
        sub.send(*[P.Subscribe(i + 1, [(f"r/{i % 2 + 1}", 1)]) for i in range(80)])
        sub.lose_connection()
    session = sessions["s"]
    assert len(session._retained) <= session.MAX_PENDING_WALKS
    assert session.dropped > 0


def backlog_awaiting_acks(broker, queued):
    """A subscriber with a full in-flight window and ``queued`` more behind it."""
    sub = subscribed(broker, "s", ("a", 1))
    pub = connected(broker, "p")
    window = broker.router.limits.max_inflight_messages
    pub.send(*[P.Publish("a", b"%d" % n, 1, message_id=n + 1) for n in range(window + queued)])
    inflight = sub.received()
    assert len(inflight) == window
    return sub, inflight


def writes_during(client, data):
    """The transport writes made while ``data`` is read, before the turn ends."""
    writes = []
    write = client.transport.write
    client.transport.write = lambda out: (writes.append(out), write(out))
    client.protocol.dataReceived(data)
    client.transport.write = write
    return writes


def test_a_lone_connections_output_leaves_while_its_read_is_handled(broker):
    sub, inflight = backlog_awaiting_acks(broker, 40)
    every = sub.protocol.FLUSH_EVERY
    acks = b"".join(P.Puback(p.message_id).encode() for p in inflight)
    writes = writes_during(sub, acks)
    # The next messages leave every FLUSH_EVERY PUBACKs, not at the end.
    assert every < len(inflight)
    assert writes and len(writes) == len(inflight) // every
    assert [len(publishes(packets_in(w))) for w in writes] == [every] * len(writes)
    # The rest at the end of the turn; all of them in order.
    got = sub.received()
    assert [p.payload for p in got] == [b"%d" % n for n in range(20, 40)]


def test_output_waits_for_the_turns_end_when_other_connections_have_some(broker):
    sub, inflight = backlog_awaiting_acks(broker, 40)
    other = subscribed(broker, "o", ("b", 0))
    # A message for another connection first, then the PUBACKs.
    data = P.Publish("b", b"x").encode() + b"".join(
        P.Puback(p.message_id).encode() for p in inflight
    )
    assert writes_during(sub, data) == []
    assert len(publishes(sub.received())) == 20
    assert publishes(other.received()) == [("b", b"x", 0)]


def packets_in(data):
    """The packets in bytes the broker wrote."""
    framer = Framer(P.MAX_REMAINING_LENGTH + 5)
    framer.from_client = False
    return list(framer.feed(data))

"""
Flow control: receive maximum, in-flight windows, queue bounds, packet size
limits, slow consumers and the bounded work done per reactor turn, driven
through fake transports and a fake clock.

A test of behaviour the versions share runs for each of them (``version``
is :data:`~mqttgw.testing.V31`, ``V311`` or ``V5``).  A 5.0 test is named
after the normative statement of the OASIS MQTT Version 5.0 standard it
covers (``MQTT_3_1_2_4`` is [MQTT-3.1.2-4]; further statements in its
docstring); tests/CONFORMANCE.md and tests/CONFORMANCE5.md map the
statements to the tests.
"""

from mqttgw.broker.session import SessionLimits
from mqttgw.testing import (
    V5,
    V31,
    V311,
    FakeBroker,
    connect5,
    connected,
    decode5,
    deliveries,
    disconnect_of,
    frames,
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
from mqttgw.wire.encoding import encode_string
from mqttgw.wire.framing import Framer
from mqttgw.wire.packets import _frame
from tests.versions import both_versions, every_version


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


def packets_in(data):
    """The packets in bytes the broker wrote."""
    framer = Framer(P.MAX_REMAINING_LENGTH + 5)
    framer.from_client = False
    return list(framer.feed(data))


# MQTT 3.1 and 3.1.1


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
    assert deliveries(sub.received()) == [("a", b"held", 0)]


def test_a_paused_connection_is_not_read_from_until_it_resumes(broker):
    client = subscribed(broker, "s", ("a", 0))
    client.protocol.pauseProducing()
    assert client.transport.producerState == "paused"
    client.protocol.resumeProducing()
    assert client.transport.producerState == "producing"


def test_output_past_the_high_water_mark_is_written_at_once(broker):
    from mqttgw.transports.protocol import OUTPUT_HIGH_WATER

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
    assert len(deliveries(sub.received())) == 200


def test_one_connection_failing_to_write_does_not_stop_the_others(broker, logged):
    subs = [subscribed(broker, f"s{i}", ("a", 0)) for i in range(3)]

    def broken(data):
        raise ValueError("payload too large for this transport")

    subs[1].transport.write = broken
    pub = connected(broker, "p")
    pub.send(P.Publish("a", b"one"))
    assert deliveries(subs[0].received()) == [("a", b"one", 0)]
    assert deliveries(subs[2].received()) == [("a", b"one", 0)]
    assert subs[1].closed
    assert any("cannot write to client s1" in line for line in logged())
    pub.send(P.Publish("a", b"two"))
    assert deliveries(subs[0].received()) == [("a", b"two", 0)]
    assert deliveries(subs[2].received()) == [("a", b"two", 0)]


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
        got += deliveries(sub.received())
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
    step = client.protocol.subscribing.FILTERS_PER_STEP
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
    assert deliveries(back.received()) == [("a", b"kept", 0)]


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
    assert len(session.outbox._retained) <= session.outbox.MAX_PENDING_WALKS
    assert session.dropped > 0


def test_a_lone_connections_output_leaves_while_its_read_is_handled(broker):
    sub, inflight = backlog_awaiting_acks(broker, 40)
    every = sub.protocol.reading.FLUSH_EVERY
    acks = b"".join(P.Puback(p.message_id).encode() for p in inflight)
    writes = writes_during(sub, acks)
    # The next messages leave every FLUSH_EVERY PUBACKs, not at the end.
    assert every < len(inflight)
    assert writes and len(writes) == len(inflight) // every
    assert [len(deliveries(packets_in(w))) for w in writes] == [every] * len(writes)
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
    assert len(deliveries(sub.received())) == 20
    assert deliveries(other.received()) == [("b", b"x", 0)]


# MQTT 5.0


def test_MQTT_4_9_0_1_connack_receive_maximum_is_the_servers_window():
    """MQTT-4.9.0-1: the CONNACK states the server's Receive Maximum."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["receive_maximum"] == 2


def test_MQTT_3_3_4_7_client_exceeding_the_receive_maximum_gets_disconnect_0x93():
    """MQTT-3.3.4-7, MQTT-4.13.1-1: QoS 2 publishes whose PUBREL never comes."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"1", 2, 1), publish("t", b"2", 2, 2))
    assert client.received() == [P.Pubrec(1, 0, {}), P.Pubrec(2, 0, {})]
    client.send(publish("t", b"3", 2, 3))
    assert disconnect_of(client).reason_code == R.RECEIVE_MAXIMUM_EXCEEDED


def test_MQTT_3_3_4_7_completed_flows_free_the_receive_maximum():
    """MQTT-3.3.4-7, MQTT-4.3.3-11."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"1", 2, 1), publish("t", b"2", 2, 2))
    client.received()
    client.send(P.Pubrel(1))
    assert client.received() == [P.Pubcomp(1, 0, {})]
    client.send(publish("t", b"3", 2, 3))
    assert client.received() == [P.Pubrec(3, 0, {})]
    assert not client.closed


def test_MQTT_3_3_4_9_server_keeps_within_the_clients_receive_maximum(broker):
    """MQTT-3.3.4-9, MQTT-4.9.0-1, MQTT-4.9.0-2, MQTT-4.9.0-3, MQTT-3.3.4-10: with
    the send quota used up, PINGREQ and SUBSCRIBE are still answered."""
    client = connected(broker, "c", properties={"receive_maximum": 2}, version=V5)
    subscribe(client, ("t", options(1)))
    publisher = connected(broker, "p", version=V5)
    for i in range(1, 5):
        publisher.send(publish("t", b"%d" % i, 1, i))
    sent = publishes(client.received())
    assert [p.payload for p in sent] == [b"1", b"2"]
    client.send(P.Pingreq(), P.Subscribe(2, [("u", options(1))], {}))
    assert client.received() == [P.Pingresp(), P.Suback(2, [1], {})]
    client.send(P.Puback(sent[0].message_id))
    assert payloads(client.received()) == [b"3"]
    client.send(P.Puback(sent[1].message_id))
    assert payloads(client.received()) == [b"4"]


def test_MQTT_3_2_2_15_packet_over_the_servers_maximum_gets_disconnect_0x95():
    """MQTT-3.2.2-15, MQTT-4.13.1-1."""
    broker = FakeBroker(max_packet_size=100)
    client = connected(broker, "c", version=V5)
    assert client.connack.properties["maximum_packet_size"] == 100
    client.send(publish("t", b"x" * 10))
    assert not client.closed
    client.send(publish("t", b"x" * 200))
    assert disconnect_of(client).reason_code == R.PACKET_TOO_LARGE


def test_MQTT_3_1_2_24_message_larger_than_the_clients_maximum_is_not_sent(broker):
    """MQTT-3.1.2-24, MQTT-3.1.2-25."""
    watcher = subscribed(
        broker, "w", ("t", options(0)), properties={"maximum_packet_size": 64}, version=V5
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"big" * 40), publish("t", b"small"))
    data = raw(watcher)
    assert all(len(frame) <= 64 for frame in frames(data))
    assert payloads(decode5(data)) == [b"small"]
    assert not watcher.closed


def test_MQTT_3_1_2_25_oversized_qos1_message_is_dropped_as_if_sent(broker):
    """MQTT-3.1.2-25: it takes no place in the client's Receive Maximum and is
    not sent later."""
    watcher = subscribed(
        broker,
        "w",
        ("t", options(1)),
        properties={"maximum_packet_size": 64, "receive_maximum": 1,
                    "session_expiry_interval": 60},
                    version=V5,
    )
    client = connected(broker, "c", version=V5)
    client.send(publish("t", b"big" * 40, 1, 1), publish("t", b"small", 1, 2))
    data = raw(watcher)
    assert all(len(frame) <= 64 for frame in frames(data))
    [small] = publishes(decode5(data))
    assert small.payload == b"small"
    watcher.send(P.Puback(small.message_id))
    watcher.send(P.Disconnect())
    back = broker.client(connect5("w", clean_start=False, properties={"maximum_packet_size": 1000}))
    assert publishes(back.received()) == []

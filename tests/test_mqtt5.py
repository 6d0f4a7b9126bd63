"""
The broker's MQTT 5.0 behaviour on the wire, driven through fake transports
and a fake clock.  Each test is named after the normative statement of the
OASIS MQTT Version 5.0 standard it covers (``MQTT_3_1_2_4`` is
[MQTT-3.1.2-4]); further statements it covers are listed in its docstring.
tests/CONFORMANCE5.md maps the statements to these tests.
"""

import pytest

from mqttgw.broker.session import SessionLimits
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import Framer

NEVER = 0xFFFFFFFF
# The smallest CONNACK a default broker accepts with (Receive Maximum and
# Maximum Packet Size, the limits it holds the client to): a client that
# takes less is closed without one ([MQTT-3.1.2-24]).
SMALLEST_CONNACK = 13


# Helpers


def connect5(client_id, clean_start=True, keepalive=0, properties=None, **fields):
    """A 5.0 CONNECT (keep alive off unless asked, so the clock can run)."""
    return P.Connect(
        client_id,
        protocol_level=P.MQTT_5,
        clean_session=clean_start,
        keepalive=keepalive,
        properties=dict(properties or {}),
        **fields,
    )


def connected(broker, client_id, clean_start=True, keepalive=0, properties=None, **fields):
    """A 5.0 client whose CONNECT was accepted; its CONNACK is ``.connack``."""
    client = broker.client(connect5(client_id, clean_start, keepalive, properties, **fields))
    packets = client.received()
    assert len(packets) == 1 and isinstance(packets[0], P.Connack), packets
    assert packets[0].return_code == R.SUCCESS, packets
    client.connack = packets[0]
    return client


def connected311(broker, client_id, clean_session=True):
    client = broker.client(P.Connect(client_id, clean_session=clean_session))
    assert client.received() == [P.Connack(0)]
    return client


def options(qos=0, no_local=False, retain_as_published=False, retain_handling=0):
    """A SUBSCRIBE's options byte."""
    return qos | 4 * no_local | 8 * retain_as_published | 16 * retain_handling


def subscribe(client, *filters, mid=1, **properties):
    """SUBSCRIBE ``(filter, options byte)`` pairs; the SUBACK."""
    client.send(P.Subscribe(mid, list(filters), properties))
    split = frames(raw(client))
    assert split, "no SUBACK"
    [suback] = decode5(split[0])
    assert isinstance(suback, P.Suback), suback
    # What follows it (retained messages) is left for the test to read.
    client.transport.write(b"".join(split[1:]))
    return suback


def subscribed(broker, client_id, *filters, clean_start=True, properties=None, **sub_props):
    client = connected(broker, client_id, clean_start, properties=properties)
    suback = subscribe(client, *filters, **sub_props)
    assert all(code < 0x80 for code in suback.granted_qos), suback
    return client


def publish(topic, payload=b"x", qos=0, mid=None, retain=False, **properties):
    """A 5.0 PUBLISH from a client."""
    return P.Publish(topic, payload, qos, retain, message_id=mid, properties=properties)


def publishes(packets):
    return [p for p in packets if isinstance(p, P.Publish)]


def payloads(packets):
    return [p.payload for p in publishes(packets)]


def disconnect_of(client):
    """The DISCONNECT the broker sent (it must be the last packet), its connection closed."""
    packets = client.received()
    assert packets and isinstance(packets[-1], P.Disconnect), packets
    assert client.closed
    return packets[-1]


def raw(client):
    """The bytes the broker has written since the last read."""
    client.broker.clock.advance(0)
    data = client.transport.value()
    client.transport.clear()
    return data


def frames(data):
    """Split wire bytes into whole frames (fixed header included)."""
    out = []
    offset = 0
    while offset < len(data):
        pos = offset + 1
        length = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        out.append(data[offset : pos + length])
        offset = pos + length
    return out


def decode5(data):
    framer = Framer(P.MAX_REMAINING_LENGTH + 5)
    framer.from_client = False
    framer.v5 = True
    return list(framer.feed(data))


# 3.1 CONNECT and 3.2 CONNACK


def test_MQTT_3_1_4_5_accepted_connect_gets_connack_0x00(broker):
    """MQTT-3.1.4-5, MQTT-3.2.2-1, MQTT-3.2.2-2, MQTT-2.2.2-1 (a packet's properties
    are present even when empty), MQTT-4.12.0-6."""
    client = broker.client(connect5("c"))
    data = raw(client)
    [frame] = frames(data)
    assert frame[0] == 0x20
    # Connect Acknowledge Flags: bits 7-1 are 0; no session (Clean Start 1).
    assert frame[2] == 0x00
    assert frame[3] == R.SUCCESS
    [connack] = decode5(data)
    assert connack.session_present is False
    assert "authentication_method" not in connack.properties
    assert not client.closed


def test_MQTT_3_2_0_2_one_connack_per_connection(broker):
    """MQTT-3.2.0-2, MQTT-3.1.0-2: a second CONNECT is a Protocol Error, not
    answered with another CONNACK."""
    client = connected(broker, "c")
    client.send(connect5("c"))
    packets = client.received()
    assert not any(isinstance(p, P.Connack) for p in packets)
    assert packets[-1].reason_code == R.PROTOCOL_ERROR
    assert client.closed


def test_MQTT_3_1_0_1_first_packet_must_be_connect(broker):
    """MQTT-3.1.0-1, MQTT-3.14.0-1: no DISCONNECT before a CONNACK."""
    client = broker.client()
    client.send(P.Pingreq())
    assert client.closed
    assert client.received() == []


def test_MQTT_3_1_2_2_unsupported_protocol_version_is_refused(broker):
    """MQTT-3.1.2-2, MQTT-3.1.2-1: CONNACK (if any) reports failure, then the
    connection is closed."""
    client = broker.client(P.Connect("c", protocol_name="MQTT", protocol_level=6))
    packets = client.received()
    assert all(isinstance(p, P.Connack) and p.return_code != 0 for p in packets)
    assert client.closed


def test_MQTT_3_1_2_3_reserved_connect_flag_closes_without_accepting(broker):
    """MQTT-3.1.2-3, MQTT-3.1.4-1, MQTT-3.14.0-1."""
    wire = bytearray(connect5("c").encode())
    # 2-byte fixed header, "\x00\x04MQTT", the level: then the flags.
    assert wire[2:9] == b"\x00\x04MQTT\x05"
    wire[9] |= 0x01
    client = broker.client()
    client.send_bytes(bytes(wire))
    assert client.closed
    packets = decode5(raw(client))
    assert all(isinstance(p, P.Connack) and p.return_code >= 0x80 for p in packets)


def test_MQTT_3_1_2_12_will_qos_3_is_malformed(broker):
    """MQTT-3.1.2-12, MQTT-3.1.4-1."""
    wire = bytearray(connect5("c", will_topic="w", will_message=b"m", will_qos=1).encode())
    wire[9] |= 0x18  # Will QoS 3
    client = broker.client()
    client.send_bytes(bytes(wire))
    assert client.closed
    packets = decode5(raw(client))
    assert all(isinstance(p, P.Connack) and p.return_code >= 0x80 for p in packets)


def test_MQTT_3_1_2_4_clean_start_discards_the_session(broker):
    """MQTT-3.1.2-4, MQTT-3.1.4-4, MQTT-3.2.2-2."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": 60}
    )
    client.lose_connection()
    publisher = connected(broker, "p")
    publisher.send(publish("t", b"queued", 1, 1))
    again = connected(broker, "c", clean_start=True, properties={"session_expiry_interval": 60})
    assert again.connack.session_present is False
    assert again.received() == []
    # The subscription went with the session.
    publisher.send(publish("t", b"after", 1, 2))
    assert again.received() == []


def test_MQTT_3_1_2_5_clean_start_0_resumes_the_session(broker):
    """MQTT-3.1.2-5, MQTT-3.2.2-3, MQTT-3.1.2-23, MQTT-3.1.3-2, MQTT-3.2.0-1 (CONNACK
    before the queued messages), MQTT-4.5.0-1."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": 60}
    )
    client.lose_connection()
    publisher = connected(broker, "p")
    publisher.send(publish("t", b"queued", 1, 1))
    again = broker.client(connect5("c", clean_start=False))
    packets = again.received()
    assert isinstance(packets[0], P.Connack)
    assert packets[0].return_code == 0 and packets[0].session_present is True
    assert payloads(packets[1:]) == [b"queued"]
    # The subscription is still there.
    publisher.send(publish("t", b"live", 1, 2))
    assert payloads(again.received()) == [b"live"]


def test_MQTT_3_1_2_6_clean_start_0_without_a_session_creates_one(broker):
    """MQTT-3.1.2-6, MQTT-3.2.2-3."""
    client = connected(
        broker, "new", clean_start=False, properties={"session_expiry_interval": 60}
    )
    assert client.connack.session_present is False
    subscribe(client, ("t", options(1)))
    client.lose_connection()
    again = connected(broker, "new", clean_start=False)
    assert again.connack.session_present is True


def test_MQTT_3_1_2_23_session_expiry_0_ends_the_session_with_the_connection(broker):
    """MQTT-3.1.2-23 (absent: 0), MQTT-4.1.0-2."""
    client = subscribed(broker, "c", ("t", options(1)))
    client.lose_connection()
    publisher = connected(broker, "p")
    publisher.send(publish("t", b"lost", 1, 1))
    again = connected(broker, "c", clean_start=False)
    assert again.connack.session_present is False
    assert again.received() == []


def test_MQTT_4_1_0_2_session_is_discarded_once_its_expiry_interval_has_passed(broker):
    """MQTT-4.1.0-2, MQTT-3.1.2-23."""
    keeper = subscribed(
        broker, "keeper", ("t", options(1)), properties={"session_expiry_interval": 10}
    )
    goner = subscribed(
        broker, "goner", ("t", options(1)), properties={"session_expiry_interval": 10}
    )
    keeper.lose_connection()
    goner.lose_connection()
    publisher = connected(broker, "p")
    publisher.send(publish("t", b"while away", 1, 1))
    broker.clock.advance(9.5)
    back = broker.client(connect5("keeper", clean_start=False))
    packets = back.received()
    assert packets[0].session_present is True
    assert payloads(packets) == [b"while away"]
    broker.clock.advance(1)
    late = connected(broker, "goner", clean_start=False)
    assert late.connack.session_present is False
    assert late.received() == []


def test_MQTT_4_1_0_1_session_is_kept_while_the_connection_is_open(broker):
    """MQTT-4.1.0-1."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": 5}
    )
    broker.clock.advance(100)
    publisher = connected(broker, "p")
    publisher.send(publish("t", b"still here", 1, 1))
    assert payloads(client.received()) == [b"still here"]


def test_MQTT_3_1_2_23_session_expiry_0xFFFFFFFF_never_expires(broker):
    """MQTT-3.1.2-23, MQTT-4.1.0-2: 0xFFFFFFFF means the session does not expire."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": NEVER}
    )
    client.lose_connection()
    broker.clock.advance(10 * 365 * 24 * 3600)
    again = connected(broker, "c", clean_start=False)
    assert again.connack.session_present is True


def test_MQTT_3_1_2_23_session_expiry_is_kept_across_a_restart(tmp_path):
    """MQTT-3.1.2-23, MQTT-4.1.0-2 with the sessions in the store."""
    broker = FakeBroker(store_dir=tmp_path)
    for client_id in ("early", "late"):
        client = subscribed(
            broker, client_id, ("t", options(1)), properties={"session_expiry_interval": 100}
        )
        client.lose_connection()
    forever = subscribed(
        broker, "forever", ("t", options(1)), properties={"session_expiry_interval": NEVER}
    )
    forever.lose_connection()
    broker.commit()
    broker = broker.restart()
    broker.clock.advance(90)
    early = connected(broker, "early", clean_start=False)
    assert early.connack.session_present is True
    broker.clock.advance(20)
    late = connected(broker, "late", clean_start=False)
    assert late.connack.session_present is False
    broker.clock.advance(10**6)
    kept = connected(broker, "forever", clean_start=False)
    assert kept.connack.session_present is True


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
@pytest.mark.parametrize("expiry", [0, 60], ids=["resumed-with-expiry-0", "resumed-with-expiry-60"])
def test_MQTT_3_1_2_5_session_begun_with_clean_start_resumes_from_the_store(tmp_path, expiry, restart):
    """MQTT-3.1.2-5, MQTT-3.1.2-23, MQTT-3.2.2-3: Clean Start 1 only says the
    session is new; its expiry keeps it, queued in the store.  Resumed with
    a Session Expiry Interval of 0, its messages are delivered all the
    same, and it ends with that connection (MQTT-4.1.0-2)."""
    broker = FakeBroker(store_dir=tmp_path)
    client = subscribed(
        broker, "c", ("q1", options(1)), ("q2", options(2)), clean_start=True,
        properties={"session_expiry_interval": 60},
    )
    client.lose_connection()
    publisher = connected(broker, "p")
    publisher.send(publish("q1", b"one", 1, 1), publish("q2", b"two", 2, 2), P.Pubrel(2))
    broker.commit()
    if restart:
        broker = broker.restart()
        publisher = connected(broker, "p")
    again = broker.client(
        connect5("c", clean_start=False, properties={"session_expiry_interval": expiry})
    )
    # A QoS 2 delivery goes out once its packet id is on disk.
    broker.commit()
    packets = again.received()
    assert not again.closed
    assert packets[0].session_present is True
    [one, two] = publishes(packets[1:])
    assert (one.payload, one.qos, two.payload, two.qos) == (b"one", 1, b"two", 2)
    again.send(P.Puback(one.message_id), P.Pubrec(two.message_id))
    broker.commit()
    assert again.received() == [P.Pubrel(two.message_id, 0, {})]
    again.send(P.Pubcomp(two.message_id))
    # While connected it is a session like any other.
    publisher.send(publish("q1", b"live", 1, 3))
    broker.commit()
    assert payloads(again.received()) == [b"live"]
    again.lose_connection()
    broker.commit()
    broker.clock.advance(30)
    if expiry:
        assert "c" in broker.router.sessions
    else:
        assert "c" not in broker.router.sessions
        assert broker.router.stats.persistent_sessions == 0
        # Nor does the store bring it back.
        assert "c" not in broker.restart().router.sessions


def test_MQTT_3_1_2_23_disconnect_with_expiry_0_ends_a_stored_session_with_messages_in_flight(tmp_path):
    """MQTT-3.1.2-23, MQTT-4.1.0-2, 3.14.2.2.2: a DISCONNECT setting the
    expiry to 0 ends a stored session holding deliveries in flight; its
    unacknowledged QoS 1 shared-subscription message goes to another
    member (4.8.2 allows it)."""
    broker = FakeBroker(store_dir=tmp_path)
    leaving = subscribed(
        broker, "leaving", ("$share/g/t", options(1)), properties={"session_expiry_interval": 60}
    )
    publisher = connected(broker, "p")
    publisher.send(publish("t", b"first", 1, 1))
    broker.commit()
    assert payloads(leaving.received()) == [b"first"]
    staying = subscribed(broker, "staying", ("$share/g/t", options(1)))
    leaving.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 0}))
    assert leaving.closed
    assert payloads(staying.received()) == [b"first"]
    assert "leaving" not in broker.router.sessions
    broker.commit()
    assert "leaving" not in broker.restart().router.sessions


def test_MQTT_3_1_3_6_empty_client_id_is_assigned_a_unique_one(broker):
    """MQTT-3.1.3-6, MQTT-3.1.3-7, MQTT-3.2.2-16."""
    one = connected(broker, "", properties={"session_expiry_interval": 60})
    two = connected(broker, "")
    assigned = one.connack.properties["assigned_client_identifier"]
    other = two.connack.properties["assigned_client_identifier"]
    assert assigned and other and assigned != other
    assert one.protocol.client_id == assigned
    # The CONNECT is handled as if that identifier had been sent: the
    # session is held under it.
    subscribe(one, ("t", options(1)))
    one.lose_connection()
    again = connected(broker, assigned, clean_start=False)
    assert again.connack.session_present is True
    assert "assigned_client_identifier" not in again.connack.properties


def test_MQTT_3_1_3_5_client_ids_of_1_to_23_alphanumerics_are_accepted(broker):
    """MQTT-3.1.3-5."""
    for client_id in ("a", "0123456789abcdefghijKLM"):
        connected(broker, client_id)


def test_MQTT_3_2_2_22_server_applies_the_client_keep_alive(broker):
    """MQTT-3.2.2-22, MQTT-3.1.2-22: no Server Keep Alive in CONNACK, and the
    connection is closed after one and a half keep alive periods of silence."""
    client = connected(broker, "c", keepalive=10)
    assert "server_keep_alive" not in client.connack.properties
    broker.clock.advance(14)
    assert not client.closed
    assert client.received() == []
    broker.clock.advance(1.5)
    assert disconnect_of(client).reason_code == R.KEEP_ALIVE_TIMEOUT


def test_MQTT_3_1_2_22_keep_alive_timeout_sends_disconnect_0x8D(broker):
    """MQTT-3.1.2-22, MQTT-3.14.4-2; a packet from the client restarts the wait."""
    client = connected(broker, "c", keepalive=4)
    broker.clock.advance(5)
    client.send(P.Pingreq())
    assert client.received() == [P.Pingresp()]
    broker.clock.advance(5)
    assert not client.closed
    broker.clock.advance(1.1)
    disconnect = disconnect_of(client)
    assert disconnect.reason_code == R.KEEP_ALIVE_TIMEOUT
    assert "session_expiry_interval" not in disconnect.properties


@pytest.mark.parametrize("keepalive", [0, 60])
def test_server_keep_alive_replaces_the_client_keep_alive(keepalive):
    """Server Keep Alive (3.2.2.3.14): the server's maximum is returned and is
    the keep alive the server applies."""
    broker = FakeBroker(max_keepalive=30)
    client = connected(broker, "c", keepalive=keepalive)
    assert client.connack.properties["server_keep_alive"] == 30
    broker.clock.advance(44)
    assert not client.closed
    broker.clock.advance(1.5)
    assert disconnect_of(client).reason_code == R.KEEP_ALIVE_TIMEOUT


def test_server_keep_alive_left_out_when_the_client_keep_alive_is_within_the_maximum():
    broker = FakeBroker(max_keepalive=30)
    client = connected(broker, "c", keepalive=20)
    assert "server_keep_alive" not in client.connack.properties


def test_MQTT_4_9_0_1_connack_receive_maximum_is_the_servers_window():
    """MQTT-4.9.0-1: the CONNACK states the server's Receive Maximum."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    client = connected(broker, "c")
    assert client.connack.properties["receive_maximum"] == 2


def test_MQTT_3_3_4_7_client_exceeding_the_receive_maximum_gets_disconnect_0x93():
    """MQTT-3.3.4-7, MQTT-4.13.1-1: QoS 2 publishes whose PUBREL never comes."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    client = connected(broker, "c")
    client.send(publish("t", b"1", 2, 1), publish("t", b"2", 2, 2))
    assert client.received() == [P.Pubrec(1, 0, {}), P.Pubrec(2, 0, {})]
    client.send(publish("t", b"3", 2, 3))
    assert disconnect_of(client).reason_code == R.RECEIVE_MAXIMUM_EXCEEDED


def test_MQTT_3_3_4_7_completed_flows_free_the_receive_maximum():
    """MQTT-3.3.4-7, MQTT-4.3.3-11."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=2))
    client = connected(broker, "c")
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
    client = connected(broker, "c", properties={"receive_maximum": 2})
    subscribe(client, ("t", options(1)))
    publisher = connected(broker, "p")
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


def test_MQTT_3_2_2_9_maximum_qos_is_stated_and_enforced(broker):
    """MQTT-3.2.2-9, MQTT-3.2.2-10, MQTT-3.2.2-11."""
    broker.router.max_qos = 1
    client = connected(broker, "c")
    assert client.connack.properties["maximum_qos"] == 1
    # SUBSCRIBE at QoS 2 is accepted, granted at most QoS 1.
    assert subscribe(client, ("t", options(2))).granted_qos == [1]
    client.send(publish("t", b"x", 2, 1))
    assert disconnect_of(client).reason_code == R.QOS_NOT_SUPPORTED


def test_MQTT_3_2_2_9_maximum_qos_left_out_when_qos_2_is_supported(broker):
    """MQTT-3.2.2-9."""
    client = connected(broker, "c")
    assert "maximum_qos" not in client.connack.properties


def test_MQTT_3_2_2_12_will_qos_above_the_maximum_is_refused(broker):
    """MQTT-3.2.2-12, MQTT-3.2.2-6, MQTT-3.2.2-7."""
    broker.router.max_qos = 1
    client = broker.client(connect5("c", will_topic="w", will_message=b"m", will_qos=2))
    [connack] = client.received()
    assert connack.return_code == R.QOS_NOT_SUPPORTED
    assert connack.session_present is False
    assert client.closed


def test_MQTT_3_2_2_14_retain_unavailable_is_stated_and_enforced():
    """MQTT-3.2.2-14."""
    broker = FakeBroker(retain_available=False)
    client = connected(broker, "c")
    assert client.connack.properties["retain_available"] == 0
    client.send(publish("t", b"x", 0, retain=True))
    assert disconnect_of(client).reason_code == R.RETAIN_NOT_SUPPORTED


def test_MQTT_3_2_2_13_will_retain_without_retain_available_is_refused():
    """MQTT-3.2.2-13, MQTT-3.2.2-7."""
    broker = FakeBroker(retain_available=False)
    client = broker.client(connect5("c", will_topic="w", will_message=b"m", will_retain=True))
    [connack] = client.received()
    assert connack.return_code == R.RETAIN_NOT_SUPPORTED
    assert connack.session_present is False
    assert client.closed


def test_MQTT_3_2_2_15_packet_over_the_servers_maximum_gets_disconnect_0x95():
    """MQTT-3.2.2-15, MQTT-4.13.1-1."""
    broker = FakeBroker(max_packet_size=100)
    client = connected(broker, "c")
    assert client.connack.properties["maximum_packet_size"] == 100
    client.send(publish("t", b"x" * 10))
    assert not client.closed
    client.send(publish("t", b"x" * 200))
    assert disconnect_of(client).reason_code == R.PACKET_TOO_LARGE


def test_MQTT_3_2_2_17_topic_alias_maximum_is_stated_and_enforced(broker):
    """MQTT-3.2.2-17, MQTT-3.3.2-9."""
    client = connected(broker, "c")
    maximum = client.connack.properties["topic_alias_maximum"]
    assert maximum == 10
    client.send(publish("t", b"x", topic_alias=maximum + 1))
    assert disconnect_of(client).reason_code == R.TOPIC_ALIAS_INVALID


def test_MQTT_3_2_2_18_no_topic_alias_maximum_means_no_aliases():
    """MQTT-3.2.2-18."""
    broker = FakeBroker(max_topic_alias=0)
    client = connected(broker, "c")
    assert client.connack.properties.get("topic_alias_maximum", 0) == 0
    client.send(publish("t", b"x", topic_alias=1))
    assert disconnect_of(client).reason_code == R.TOPIC_ALIAS_INVALID


def test_connack_feature_flags_are_left_out_when_available(broker):
    """Wildcard, Subscription Identifier and Shared Subscription Available:
    absent means available."""
    props = connected(broker, "c").connack.properties
    for name in (
        "wildcard_subscription_available",
        "subscription_identifier_available",
        "shared_subscription_available",
        "retain_available",
    ):
        assert props.get(name, 1) == 1


def test_wildcard_subscriptions_off_suback_0xA2():
    """Wildcard Subscription Available 0: a wildcard filter is refused with
    0xA2, a plain one granted (MQTT-3.9.3-2)."""
    broker = FakeBroker(wildcard_subscription_available=False)
    client = connected(broker, "c")
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
    client = connected(broker, "c")
    assert client.connack.properties["shared_subscription_available"] == 0
    suback = subscribe(client, ("$share/g/a", options(1)), ("a", options(1)))
    assert suback.granted_qos == [R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, 1]


def test_subscription_identifiers_off_disconnect_0xA1():
    """Subscription Identifier Available 0: a SUBSCRIBE with one is a Protocol
    Error, DISCONNECT 0xA1."""
    broker = FakeBroker(subscription_identifier_available=False)
    client = connected(broker, "c")
    assert client.connack.properties["subscription_identifier_available"] == 0
    assert subscribe(client, ("a", options(1))).granted_qos == [1]
    client.send(P.Subscribe(2, [("b", options(1))], {"subscription_identifier": 3}))
    assert disconnect_of(client).reason_code == R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED


def test_MQTT_3_1_2_28_response_information_only_when_requested():
    """MQTT-3.1.2-28; Response Information when the client asks for it."""
    broker = FakeBroker(response_information="replies/%c")
    asked = connected(broker, "c", properties={"request_response_information": 1})
    assert asked.connack.properties["response_information"] == "replies/c"
    not_asked = connected(broker, "d")
    assert "response_information" not in not_asked.connack.properties
    declined = connected(broker, "e", properties={"request_response_information": 0})
    assert "response_information" not in declined.connack.properties


def test_MQTT_3_1_2_28_no_response_information_configured(broker):
    client = connected(broker, "c", properties={"request_response_information": 1})
    assert "response_information" not in client.connack.properties


def test_MQTT_4_12_0_1_authentication_method_not_offered_gets_connack_0x8C(broker):
    """MQTT-4.12.0-1, MQTT-4.12.0-4, MQTT-3.2.2-6, MQTT-3.2.2-7, MQTT-3.1.4-2,
    MQTT-3.14.0-1 (no DISCONNECT after a refusing CONNACK)."""
    client = broker.client(connect5("c", properties={"authentication_method": "SCRAM-SHA-1"}))
    packets = client.received()
    assert len(packets) == 1
    [connack] = packets
    assert connack.return_code == R.BAD_AUTHENTICATION_METHOD
    assert connack.session_present is False
    assert client.closed


def test_MQTT_3_1_4_6_nothing_is_processed_after_a_refused_connect(broker):
    """MQTT-3.1.4-6."""
    watcher = subscribed(broker, "w", ("t", 0))
    client = broker.client()
    client.send(
        connect5("c", properties={"authentication_method": "nope"}),
        publish("t", b"sneaked in"),
        P.Pingreq(),
    )
    packets = client.received()
    assert [type(p) for p in packets] == [P.Connack]
    assert watcher.received() == []


def test_MQTT_4_12_0_7_auth_without_an_authentication_method_is_a_protocol_error(broker):
    """MQTT-4.12.0-7, MQTT-4.13.1-1."""
    client = connected(broker, "c")
    client.send(P.Auth(R.RE_AUTHENTICATE, {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_2_2_19_connack_reason_string_left_out_beyond_the_clients_maximum(broker):
    """MQTT-3.2.2-19, MQTT-3.2.2-20, MQTT-3.1.2-24."""
    client = broker.client()
    client.send(
        connect5("c", properties={"authentication_method": "nope", "maximum_packet_size": 8})
    )
    data = raw(client)
    assert len(data) <= 8
    [connack] = decode5(data)
    assert connack.return_code == R.BAD_AUTHENTICATION_METHOD
    assert "reason_string" not in connack.properties


def test_MQTT_3_1_2_24_connack_leaves_out_optional_properties_to_fit():
    """MQTT-3.1.2-24, MQTT-3.2.2-19, MQTT-3.2.2-18: the CONNACK drops
    Response Information, then Topic Alias Maximum (and the client may
    then use no alias); the limits the client is held to stay."""
    broker = FakeBroker(response_information="replies/%c")
    asked = {"request_response_information": 1}
    full = connected(broker, "full", properties=asked)
    assert "response_information" in full.connack.properties
    full_size = len(full.connack.encode())
    roomy = connected(broker, "roomy", properties={**asked, "maximum_packet_size": full_size - 1})
    assert "response_information" not in roomy.connack.properties
    assert roomy.connack.properties["topic_alias_maximum"] == 10
    assert len(roomy.connack.encode()) < full_size
    tight = connected(broker, "tight", properties={**asked, "maximum_packet_size": SMALLEST_CONNACK})
    assert len(tight.connack.encode()) <= SMALLEST_CONNACK
    props = tight.connack.properties
    assert props["receive_maximum"] == full.connack.properties["receive_maximum"]
    assert props["maximum_packet_size"] == full.connack.properties["maximum_packet_size"]
    assert "topic_alias_maximum" not in props and "response_information" not in props
    tight.send(publish("t", b"x", topic_alias=1))
    assert disconnect_of(tight).reason_code == R.TOPIC_ALIAS_INVALID


@pytest.mark.parametrize(
    "client_id, limit",
    [("c", SMALLEST_CONNACK - 1), ("c", 2), ("", SMALLEST_CONNACK + 2)],
    ids=["one-byte-short", "two-bytes", "assigned-id-does-not-fit"],
)
def test_MQTT_3_1_2_24_no_connack_when_the_smallest_does_not_fit(broker, client_id, limit):
    """MQTT-3.1.2-24: a client whose Maximum Packet Size is below the
    smallest CONNACK (an Assigned Client Identifier cannot be left out,
    MQTT-3.2.2-16) is closed without one, and nothing changes for the
    session it named: the connection holding it stays, its will unsent."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    holder = None
    if client_id:
        holder = _will_client(broker, client_id, expiry=60)
    client = broker.client(connect5(client_id, properties={"maximum_packet_size": limit}))
    assert raw(client) == b""
    assert client.closed
    client.lose_connection()
    assert broker.router.stats.connections_refused == 1
    if holder is not None:
        assert not holder.closed
        assert broker.router.sessions[client_id].connection is holder.protocol
    assert watcher.received() == []


def test_MQTT_3_1_2_24_no_refusal_connack_when_it_does_not_fit(broker):
    """MQTT-3.1.2-24, MQTT-3.2.2-19: a refusal's Reason String is left out;
    if even its CONNACK without properties (5 bytes) is too large, the
    connection closes without one."""
    refused = {"authentication_method": "nope"}
    fits = broker.client(connect5("a", properties={**refused, "maximum_packet_size": 5}))
    [connack] = decode5(raw(fits))
    assert connack.return_code == R.BAD_AUTHENTICATION_METHOD and connack.properties == {}
    too_small = broker.client(connect5("b", properties={**refused, "maximum_packet_size": 4}))
    assert raw(too_small) == b""
    assert too_small.closed


def test_MQTT_3_1_4_3_session_taken_over_gets_disconnect_0x8E(broker):
    """MQTT-3.1.4-3, MQTT-3.14.2-1, MQTT-3.14.2-2, MQTT-3.14.4-2."""
    first = connected(broker, "c")
    second = connected(broker, "c")
    disconnect = disconnect_of(first)
    assert disconnect.reason_code == R.SESSION_TAKEN_OVER
    assert "session_expiry_interval" not in disconnect.properties
    assert not second.closed


# 3.3 PUBLISH


def test_MQTT_3_3_4_1_publishes_are_acknowledged_as_their_qos_requires(broker):
    """MQTT-3.3.4-1, MQTT-2.2.1-5, MQTT-4.3.2-4, MQTT-4.3.3-8, MQTT-4.3.3-11."""
    client = connected(broker, "c")
    client.send(publish("t", b"0", 0), publish("t", b"1", 1, 7), publish("t", b"2", 2, 8))
    assert client.received() == [P.Puback(7, 0, {}), P.Pubrec(8, 0, {})]
    client.send(P.Pubrel(8))
    assert client.received() == [P.Pubcomp(8, 0, {})]


def test_MQTT_4_3_3_10_repeated_qos2_publish_is_not_delivered_twice(broker):
    """MQTT-4.3.3-10, MQTT-4.3.3-12."""
    watcher = subscribed(broker, "w", ("t", options(2)))
    client = connected(broker, "c")
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
    watcher = subscribed(broker, "w", ("t", options(1)))
    client = connected(broker, "c")
    client.send(publish("t", b"a", 1, 3))
    client.send(publish("t", b"b", 1, 3))
    assert client.received() == [P.Puback(3, 0, {}), P.Puback(3, 0, {})]
    assert payloads(watcher.received()) == [b"a", b"b"]


def test_pubrel_for_an_unknown_id_gets_pubcomp_0x92(broker):
    """PUBCOMP reason 0x92 (Packet Identifier not found), MQTT-3.7.2-1."""
    client = connected(broker, "c")
    client.send(P.Pubrel(9))
    [pubcomp] = client.received()
    assert pubcomp.message_id == 9
    assert pubcomp.reason_code == R.PACKET_IDENTIFIER_NOT_FOUND


def test_MQTT_3_3_2_17_message_properties_are_forwarded_unchanged_in_order(broker):
    """MQTT-3.3.2-17, MQTT-3.3.2-18, MQTT-3.3.2-4, MQTT-3.3.2-15, MQTT-3.3.2-16,
    MQTT-3.3.2-20."""
    watcher = subscribed(broker, "w", ("t", options(1)))
    client = connected(broker, "c")
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
    watchers = [subscribed(broker, f"w{i}", ("t/#", 0)) for i in range(3)]
    client = connected(broker, "c")
    users = [("b", "1"), ("a", "2")]
    client.send(publish("t/x", b"p", user_property=users, content_type="text/plain"))
    for watcher in watchers:
        [delivered] = publishes(watcher.received())
        assert delivered.properties["user_property"] == users
        assert delivered.properties["content_type"] == "text/plain"


def test_5_0_properties_are_dropped_for_a_3_1_1_subscriber(broker):
    """A 3.1.1 subscriber gets a 3.1.1 PUBLISH: topic and payload, nothing else."""
    watcher = connected311(broker, "old")
    watcher.send(P.Subscribe(1, [("t", 1)]))
    assert watcher.received() == [P.Suback(1, [1])]
    client = connected(broker, "c")
    client.send(
        publish("t", b"payload", 1, 1, user_property=[("k", "v")], content_type="x",
                message_expiry_interval=100)
    )
    assert watcher.received() == [P.Publish("t", b"payload", 1, message_id=1)]


def test_3_1_1_publishers_message_reaches_a_5_0_subscriber_without_properties(broker):
    watcher = subscribed(broker, "w", ("t", options(1)))
    old = connected311(broker, "old")
    old.send(P.Publish("t", b"from 3.1.1", 1, message_id=1))
    assert old.received() == [P.Puback(1)]
    [delivered] = publishes(watcher.received())
    assert delivered.payload == b"from 3.1.1"
    assert delivered.properties == {}


def test_MQTT_3_3_1_3_forwarded_dup_does_not_follow_the_incoming_dup(broker):
    """MQTT-3.3.1-3, MQTT-4.3.2-2, MQTT-2.2.1-4."""
    watcher = subscribed(broker, "w", ("t", options(1)))
    client = connected(broker, "c")
    client.send(P.Publish("t", b"x", 1, dup=True, message_id=4, properties={}))
    [delivered] = publishes(watcher.received())
    assert delivered.dup is False
    assert delivered.qos == 1 and delivered.message_id


def test_MQTT_2_2_1_2_qos0_delivery_has_no_packet_id_and_no_dup(broker):
    """MQTT-2.2.1-2, MQTT-3.3.1-2, MQTT-4.3.1-1, MQTT-3.8.4-8."""
    watcher = subscribed(broker, "w", ("t", options(0)))
    client = connected(broker, "c")
    client.send(publish("t", b"x", 1, 1))
    [delivered] = publishes(watcher.received())
    assert delivered.qos == 0 and delivered.message_id is None and delivered.dup is False


def test_MQTT_3_3_2_6_forwarded_expiry_interval_is_reduced_by_the_wait(broker):
    """MQTT-3.3.2-6."""
    watcher = subscribed(
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}
    )
    watcher.lose_connection()
    client = connected(broker, "c")
    client.send(publish("t", b"x", 1, 1, message_expiry_interval=10))
    broker.clock.advance(4)
    back = broker.client(connect5("w", clean_start=False))
    [delivered] = publishes(back.received())
    assert delivered.properties["message_expiry_interval"] == 6


def test_MQTT_3_3_2_6_message_delivered_at_once_keeps_its_expiry_interval(broker):
    watcher = subscribed(broker, "w", ("t", options(1)))
    client = connected(broker, "c")
    client.send(publish("t", b"x", 1, 1, message_expiry_interval=10))
    [delivered] = publishes(watcher.received())
    assert delivered.properties["message_expiry_interval"] == 10


def test_MQTT_3_3_2_5_expired_message_is_not_delivered_from_the_offline_queue(broker):
    """MQTT-3.3.2-5."""
    watcher = subscribed(
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}
    )
    watcher.lose_connection()
    client = connected(broker, "c")
    client.send(publish("t", b"short", 1, 1, message_expiry_interval=5))
    client.send(publish("t", b"long", 1, 2, message_expiry_interval=50))
    client.send(publish("t", b"forever", 1, 3))
    broker.clock.advance(6)
    back = broker.client(connect5("w", clean_start=False))
    assert payloads(back.received()) == [b"long", b"forever"]


def test_MQTT_3_3_2_5_expired_message_is_not_delivered_from_the_inflight_queue(broker):
    """MQTT-3.3.2-5: queued behind the client's Receive Maximum."""
    watcher = subscribed(broker, "w", ("t", options(1)), properties={"receive_maximum": 1})
    client = connected(broker, "c")
    client.send(publish("t", b"first", 1, 1, message_expiry_interval=5))
    client.send(publish("t", b"second", 1, 2, message_expiry_interval=5))
    client.send(publish("t", b"third", 1, 3, message_expiry_interval=50))
    [first] = publishes(watcher.received())
    broker.clock.advance(6)
    watcher.send(P.Puback(first.message_id))
    [third] = publishes(watcher.received())
    assert third.payload == b"third"
    assert third.properties["message_expiry_interval"] == 44


def test_MQTT_3_3_2_5_expired_retained_message_is_not_sent(broker):
    """MQTT-3.3.2-5 for a retained message."""
    client = connected(broker, "c")
    client.send(publish("r", b"soon gone", 0, retain=True, message_expiry_interval=5))
    broker.clock.advance(3)
    early = subscribed(broker, "early", ("r", 0))
    [retained] = publishes(early.received())
    assert retained.properties["message_expiry_interval"] == 2
    broker.clock.advance(3)
    late = subscribed(broker, "late", ("r", 0))
    assert publishes(late.received()) == []


def test_MQTT_3_3_2_12_every_topic_alias_up_to_the_maximum_is_accepted(broker):
    """MQTT-3.3.2-12: an alias is set by a PUBLISH with topic and alias, and
    used by one with an empty topic."""
    watcher = subscribed(broker, "w", ("t/#", 0))
    client = connected(broker, "c")
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
    watcher = subscribed(broker, "w", ("#", 0))
    client = connected(broker, "c")
    client.send(publish("a", b"1", topic_alias=1), publish("b", b"2", topic_alias=1))
    client.send(publish("", b"3", topic_alias=1))
    assert [(p.topic, p.payload) for p in publishes(watcher.received())] == [
        ("a", b"1"), ("b", b"2"), ("b", b"3")
    ]


def test_unknown_topic_alias_is_a_protocol_error(broker):
    """An empty topic with an alias that has no mapping: DISCONNECT 0x82."""
    client = connected(broker, "c")
    client.send(publish("", b"x", topic_alias=2))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_3_2_7_topic_aliases_do_not_carry_over_to_a_new_connection(broker):
    """MQTT-3.3.2-7."""
    client = connected(broker, "c", properties={"session_expiry_interval": 60})
    client.send(publish("t", b"x", topic_alias=1))
    client.send(P.Disconnect())
    again = connected(broker, "c", clean_start=False)
    again.send(publish("", b"y", topic_alias=1))
    assert disconnect_of(again).reason_code == R.PROTOCOL_ERROR


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


def test_MQTT_3_3_2_11_server_sends_topic_aliases_within_the_clients_maximum(broker):
    """MQTT-3.3.2-11, MQTT-3.1.2-26, MQTT-3.3.2-8 (no alias 0)."""
    watcher = subscribed(
        broker, "w", ("t/#", options(1)), properties={"topic_alias_maximum": 2}
    )
    client = connected(broker, "c")
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
    absent = subscribed(broker, "absent", ("t/#", options(1)))
    zero = subscribed(broker, "zero", ("t/#", options(1)), properties={"topic_alias_maximum": 0})
    client = connected(broker, "c")
    for i in range(4):
        client.send(publish("t/a", b"x", 0), publish("t/b", b"x", 1, i + 1))
    for watcher in (absent, zero):
        packets = publishes(watcher.received())
        assert len(packets) == 8
        for p in packets:
            assert p.topic
            assert "topic_alias" not in p.properties


def test_MQTT_3_1_2_24_message_larger_than_the_clients_maximum_is_not_sent(broker):
    """MQTT-3.1.2-24, MQTT-3.1.2-25."""
    watcher = subscribed(
        broker, "w", ("t", options(0)), properties={"maximum_packet_size": 64}
    )
    client = connected(broker, "c")
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
    )
    client = connected(broker, "c")
    client.send(publish("t", b"big" * 40, 1, 1), publish("t", b"small", 1, 2))
    data = raw(watcher)
    assert all(len(frame) <= 64 for frame in frames(data))
    [small] = publishes(decode5(data))
    assert small.payload == b"small"
    watcher.send(P.Puback(small.message_id))
    watcher.send(P.Disconnect())
    back = broker.client(connect5("w", clean_start=False, properties={"maximum_packet_size": 1000}))
    assert publishes(back.received()) == []


def test_MQTT_3_2_2_11_publish_above_maximum_qos_gets_disconnect_0x9B(broker):
    """MQTT-3.2.2-11, MQTT-4.13.1-1."""
    broker.router.max_qos = 0
    watcher = subscribed(broker, "w", ("t", 0))
    client = connected(broker, "c")
    assert client.connack.properties["maximum_qos"] == 0
    client.send(publish("t", b"x", 1, 1))
    assert disconnect_of(client).reason_code == R.QOS_NOT_SUPPORTED
    assert publishes(watcher.received()) == []


def test_MQTT_3_4_2_1_denied_publish_gets_puback_0x87():
    """MQTT-3.4.2-1, MQTT-3.5.2-1; the message is not routed."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    watcher = subscribed(broker, "w", ("#", options(2)))
    client = connected(broker, "c")
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
    watcher = subscribed(broker, "w", ("#", options(2)))
    client = connected(broker, "c")
    client.send(publish("closed/y", b"refused", 2, 2))
    [pubrec] = client.received()
    assert pubrec.reason_code == R.NOT_AUTHORIZED
    client.send(publish("open/y", b"accepted", 2, 2))
    assert client.received() == [P.Pubrec(2, 0, {})]
    assert payloads(watcher.received()) == [b"accepted"]


def test_MQTT_3_1_2_29_no_reason_string_on_puback_when_problem_information_is_off():
    """MQTT-3.1.2-29 for PUBACK and PUBREC."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(broker, "c", properties={"request_problem_information": 0})
    client.send(publish("closed/x", b"x", 1, 1), publish("closed/y", b"y", 2, 2))
    puback, pubrec = client.received()
    assert puback.reason_code == R.NOT_AUTHORIZED
    assert pubrec.reason_code == R.NOT_AUTHORIZED
    for ack in (puback, pubrec):
        assert "reason_string" not in ack.properties
        assert "user_property" not in ack.properties


def test_MQTT_3_1_2_29_no_reason_string_on_suback_when_problem_information_is_off():
    """MQTT-3.1.2-29 for SUBACK."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    asked = connected(broker, "a")
    suback = subscribe(asked, ("closed/#", 0))
    assert suback.granted_qos == [R.NOT_AUTHORIZED]
    assert suback.properties.get("reason_string")
    declined = connected(broker, "d", properties={"request_problem_information": 0})
    suback = subscribe(declined, ("closed/#", 0), ("a/#/b", 0))
    assert suback.granted_qos == [R.NOT_AUTHORIZED, R.TOPIC_FILTER_INVALID]
    assert "reason_string" not in suback.properties
    assert "user_property" not in suback.properties


def test_MQTT_3_1_2_29_disconnect_may_carry_a_reason_string_all_the_same(broker):
    """MQTT-3.1.2-29: DISCONNECT is one of the packets allowed a Reason String."""
    client = connected(broker, "c", properties={"request_problem_information": 0})
    client.send(publish("", b"x", topic_alias=2))
    disconnect = disconnect_of(client)
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert disconnect.properties.get("reason_string")


def test_MQTT_3_4_2_2_puback_reason_string_left_out_beyond_the_clients_maximum():
    """MQTT-3.4.2-2, MQTT-3.4.2-3, MQTT-3.5.2-2, MQTT-3.5.2-3, MQTT-3.1.2-24."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(broker, "c", properties={"maximum_packet_size": SMALLEST_CONNACK})
    client.send(publish("closed/x", b"x", 1, 1), publish("closed/y", b"y", 2, 2))
    data = raw(client)
    assert all(len(frame) <= SMALLEST_CONNACK for frame in frames(data))
    puback, pubrec = decode5(data)
    assert puback.reason_code == pubrec.reason_code == R.NOT_AUTHORIZED


def test_MQTT_3_9_2_1_suback_reason_string_left_out_beyond_the_clients_maximum():
    """MQTT-3.9.2-1, MQTT-3.9.2-2."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(broker, "c", properties={"maximum_packet_size": SMALLEST_CONNACK})
    client.send(P.Subscribe(1, [("closed/#", 0)], {}))
    data = raw(client)
    assert all(len(frame) <= SMALLEST_CONNACK for frame in frames(data))
    [suback] = decode5(data)
    assert suback.granted_qos == [R.NOT_AUTHORIZED]


def test_MQTT_3_14_2_3_disconnect_reason_string_left_out_beyond_the_clients_maximum(broker):
    """MQTT-3.14.2-3, MQTT-3.14.2-4."""
    client = connected(broker, "c", properties={"maximum_packet_size": SMALLEST_CONNACK})
    client.send(publish("", b"x", topic_alias=2))
    data = raw(client)
    assert all(len(frame) <= SMALLEST_CONNACK for frame in frames(data))
    [disconnect] = decode5(data)
    # Its CONNACK, that small, had no room for a Topic Alias Maximum: so
    # no alias is valid ([MQTT-3.2.2-18]).
    assert disconnect.reason_code == R.TOPIC_ALIAS_INVALID
    assert client.closed


def test_MQTT_3_3_4_6_subscription_identifier_from_a_client_is_a_protocol_error(broker):
    """MQTT-3.3.4-6."""
    client = connected(broker, "c")
    client.send(publish("t", b"x", subscription_identifier=5))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_3_2_2_wildcard_in_topic_name_gets_disconnect_0x90(broker):
    """MQTT-3.3.2-2, MQTT-4.7.0-1."""
    client = connected(broker, "c")
    client.send(publish("a/+", b"x"))
    assert disconnect_of(client).reason_code == R.TOPIC_NAME_INVALID


def test_MQTT_4_7_2_1_wildcards_at_the_start_do_not_match_dollar_topics(broker):
    """MQTT-4.7.2-1, MQTT-3.3.2-3."""
    hash_ = subscribed(broker, "h", ("#", 0))
    plus = subscribed(broker, "p", ("+/x", 0))
    explicit = subscribed(broker, "e", ("$data/#", 0))
    client = connected(broker, "c")
    client.send(publish("$data/x", b"x"))
    assert publishes(hash_.received()) == []
    assert publishes(plus.received()) == []
    assert [p.topic for p in publishes(explicit.received())] == ["$data/x"]


def test_MQTT_4_4_0_1_unacknowledged_publish_is_not_resent_on_a_live_connection(broker):
    """MQTT-4.4.0-1: re-sending happens on session resumption and at no other
    time."""
    watcher = subscribed(broker, "w", ("t", options(2)))
    client = connected(broker, "c")
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
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}
    )
    client = connected(broker, "c")
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
        broker, "w", ("t", options(2)), properties={"session_expiry_interval": 60}
    )
    client = connected(broker, "c")
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
        broker, "w", ("t", options(2)), properties={"session_expiry_interval": 60}
    )
    client = connected(broker, "c")
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
        broker, "w", ("t", options(1)), properties={"session_expiry_interval": 60}
    )
    client = connected(broker, "c")
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
        broker, "w", ("t", options(2)), properties={"session_expiry_interval": 600}
    )
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1, message_expiry_interval=5), P.Pubrel(1))
    [first] = publishes(watcher.received())
    watcher.lose_connection()
    broker.clock.advance(10)
    back = broker.client(connect5("w", clean_start=False))
    [again] = publishes(back.received())
    assert again.message_id == first.message_id and again.dup is True


# Retained messages and subscription options


def test_MQTT_3_3_1_5_retained_message_replaces_the_previous_one(broker):
    """MQTT-3.3.1-5, MQTT-3.3.1-8."""
    client = connected(broker, "c")
    client.send(publish("r", b"one", retain=True), publish("r", b"two", retain=True))
    client.send(publish("r", b"not retained"))
    watcher = subscribed(broker, "w", ("r", 0))
    [retained] = publishes(watcher.received())
    assert retained.payload == b"two" and retained.retain is True


def test_MQTT_3_3_1_6_empty_retained_message_clears_the_topic(broker):
    """MQTT-3.3.1-6, MQTT-3.3.1-7."""
    live = subscribed(broker, "live", ("r", 0))
    client = connected(broker, "c")
    client.send(publish("r", b"value", retain=True), publish("r", b"", retain=True))
    assert payloads(live.received()) == [b"value", b""]
    watcher = subscribed(broker, "w", ("r", 0))
    assert publishes(watcher.received()) == []


def test_MQTT_3_3_1_9_retain_handling_0_sends_retained_on_every_subscribe(broker):
    """MQTT-3.3.1-9, MQTT-3.8.4-3, MQTT-3.8.4-4."""
    client = connected(broker, "c")
    client.send(publish("r/1", b"kept", 1, 1, retain=True))
    client.received()
    watcher = connected(broker, "w")
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
    client = connected(broker, "c")
    client.send(publish("r/1", b"kept", retain=True))
    watcher = connected(broker, "w")
    subscribe(watcher, ("r/#", options(1, retain_handling=1)))
    assert payloads(watcher.received()) == [b"kept"]
    subscribe(watcher, ("r/#", options(1, retain_handling=1)), mid=2)
    assert publishes(watcher.received()) == []


def test_MQTT_3_3_1_11_retain_handling_2_sends_no_retained(broker):
    """MQTT-3.3.1-11."""
    client = connected(broker, "c")
    client.send(publish("r/1", b"kept", retain=True))
    watcher = connected(broker, "w")
    subscribe(watcher, ("r/#", options(1, retain_handling=2)))
    assert publishes(watcher.received()) == []
    client.send(publish("r/1", b"live"))
    assert payloads(watcher.received()) == [b"live"]


def test_MQTT_3_3_1_12_retain_as_published_0_clears_retain_on_forwarding(broker):
    """MQTT-3.3.1-12."""
    watcher = subscribed(broker, "w", ("r", options(0)))
    client = connected(broker, "c")
    client.send(publish("r", b"x", retain=True))
    [delivered] = publishes(watcher.received())
    assert delivered.retain is False


def test_MQTT_3_3_1_13_retain_as_published_1_keeps_retain_on_forwarding(broker):
    """MQTT-3.3.1-13."""
    watcher = subscribed(broker, "w", ("r", options(0, retain_as_published=True)))
    client = connected(broker, "c")
    client.send(publish("r", b"kept", retain=True), publish("r", b"plain"))
    first, second = publishes(watcher.received())
    assert first.retain is True
    assert second.retain is False


def test_MQTT_3_8_3_3_no_local_keeps_a_clients_own_messages_from_it(broker):
    """MQTT-3.8.3-3."""
    client = subscribed(broker, "c", ("t", options(1, no_local=True)))
    other = subscribed(broker, "o", ("t", options(1, no_local=True)))
    client.send(publish("t", b"mine", 1, 1))
    assert publishes(client.received()) == []
    assert payloads(other.received()) == [b"mine"]
    other.send(publish("t", b"theirs", 0))
    assert payloads(client.received()) == [b"theirs"]


def test_MQTT_3_8_3_3_no_local_on_one_filter_leaves_the_others(broker):
    """MQTT-3.8.3-3 with an overlapping subscription without No Local."""
    client = subscribed(
        broker, "c", ("t/#", options(1, no_local=True)), ("t/+", options(0))
    )
    client.send(publish("t/x", b"mine", 1, 1))
    [delivered] = publishes([p for p in client.received() if isinstance(p, P.Publish)])
    assert delivered.payload == b"mine" and delivered.qos == 0


def test_MQTT_3_3_4_2_overlapping_subscriptions_deliver_at_the_highest_qos(broker):
    """MQTT-3.3.4-2, MQTT-3.3.4-3, MQTT-3.3.4-4."""
    watcher = connected(broker, "w")
    subscribe(watcher, ("a/#", options(0)), subscription_identifier=7)
    subscribe(watcher, ("a/b", options(2)), mid=2, subscription_identifier=9)
    subscribe(watcher, ("+/b", options(1)), mid=3)
    client = connected(broker, "c")
    client.send(publish("a/b", b"x", 2, 1))
    [delivered] = publishes(watcher.received())
    assert delivered.qos == 2
    assert sorted(delivered.properties["subscription_identifier"]) == [7, 9]


def test_MQTT_3_3_4_3_subscription_identifier_is_sent_with_each_message(broker):
    """MQTT-3.3.4-3; a SUBSCRIBE that changes the identifier replaces it, and
    one without an identifier removes it."""
    watcher = connected(broker, "w")
    subscribe(watcher, ("s/#", options(1)), subscription_identifier=1)
    subscribe(watcher, ("u", options(1)), mid=2)
    client = connected(broker, "c")
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
    client = connected(broker, "c")
    client.send(publish("r", b"kept", retain=True))
    watcher = connected(broker, "w")
    subscribe(watcher, ("r", options(0)), subscription_identifier=42)
    [retained] = publishes(watcher.received())
    assert retained.properties["subscription_identifier"] == [42]


def test_MQTT_3_8_4_6_suback_has_one_code_per_filter_in_order():
    """MQTT-3.8.4-6, MQTT-3.8.4-5, MQTT-3.8.4-7, MQTT-3.9.3-1, MQTT-3.9.3-2,
    MQTT-3.8.4-1, MQTT-3.8.4-2, MQTT-2.2.1-6: 0x8F invalid filter, 0x87 not
    authorized, granted QoS otherwise."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(broker, "c")
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
    client = connected(broker, "c")
    client.send(P.Subscribe(5, [("a", 1)], {}))
    assert raw(client) == b"\x90\x04\x00\x05\x00\x01"
    client.send(P.Unsubscribe(6, ["a"], {}))
    assert raw(client) == b"\xb0\x04\x00\x06\x00\x00"


def test_suback_0x97_when_the_subscription_quota_is_reached():
    """Quota exceeded: the filters beyond max_subscriptions are refused; one
    already held may still be replaced."""
    broker = FakeBroker(SessionLimits(max_subscriptions=2))
    client = connected(broker, "c")
    suback = subscribe(client, ("a", 1), ("b", 1), ("c", 1))
    assert suback.granted_qos == [1, 1, R.QUOTA_EXCEEDED]
    assert subscribe(client, ("a", 0), mid=2).granted_qos == [0]


def test_MQTT_3_8_3_4_no_local_on_a_shared_subscription_is_a_protocol_error(broker):
    """MQTT-3.8.3-4."""
    client = connected(broker, "c")
    client.send(P.Subscribe(1, [("$share/g/t", options(1, no_local=True))], {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_8_3_5_reserved_subscription_option_bits_are_malformed(broker):
    """MQTT-3.8.3-5, MQTT-4.13.1-1: DISCONNECT 0x81."""
    client = connected(broker, "c")
    client.send(P.Subscribe(1, [("t", 0x40 | 1)], {}))
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


def test_MQTT_3_8_1_1_subscribe_with_bad_fixed_header_flags_is_malformed(broker):
    """MQTT-3.8.1-1, MQTT-2.1.3-1."""
    client = connected(broker, "c")
    wire = bytearray(P.Subscribe(1, [("t", 1)], {}).encode())
    wire[0] = 0x80
    client.send_bytes(bytes(wire))
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


def test_MQTT_3_8_3_2_subscribe_without_filters_is_a_protocol_error(broker):
    """MQTT-3.8.3-2."""
    client = connected(broker, "c")
    client.send(P.Subscribe(1, [], {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_10_3_2_unsubscribe_without_filters_is_a_protocol_error(broker):
    """MQTT-3.10.3-2."""
    client = connected(broker, "c")
    client.send(P.Unsubscribe(1, [], {}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR


def test_MQTT_3_11_3_1_unsuback_has_one_code_per_filter_in_order(broker):
    """MQTT-3.11.3-1, MQTT-3.11.3-2, MQTT-3.10.4-1, MQTT-3.10.4-4, MQTT-3.10.4-5,
    MQTT-3.10.4-6, MQTT-3.10.4-2: 0x00 removed, 0x11 none existed."""
    client = subscribed(broker, "c", ("a", 1), ("b/+", 1))
    client.send(P.Unsubscribe(0x4321, ["a", "x", "b/+", "b/#"], {}))
    [unsuback] = client.received()
    assert unsuback.message_id == 0x4321
    assert unsuback.reason_codes == [
        R.SUCCESS,
        R.NO_SUBSCRIPTION_EXISTED,
        R.SUCCESS,
        R.NO_SUBSCRIPTION_EXISTED,
    ]
    publisher = connected(broker, "p")
    publisher.send(publish("a", b"x", 1, 1), publish("b/c", b"y", 1, 2))
    assert publishes(client.received()) == []


def test_MQTT_3_10_4_6_unsubscribe_naming_a_filter_twice_is_two_unsubscribes(broker):
    """MQTT-3.10.4-6, MQTT-3.11.3-1: as a sequence of UNSUBSCRIBEs, the second
    finds no subscription (0x11)."""
    client = subscribed(broker, "c", ("a", 1))
    client.send(P.Unsubscribe(2, ["a", "a"], {}))
    [unsuback] = client.received()
    assert unsuback.reason_codes == [R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED]


def test_MQTT_3_8_4_5_subscribe_naming_a_filter_twice_is_two_subscribes(broker):
    """MQTT-3.8.4-5, MQTT-3.3.1-10: with Retain Handling 1 the second finds the
    subscription made by the first, so the retained message comes once."""
    client = connected(broker, "c")
    client.send(publish("r", b"kept", retain=True))
    watcher = connected(broker, "w")
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
    watcher = subscribed(broker, "w", ("t", options(2)))
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1), P.Pubrel(1))
    [delivered] = publishes(watcher.received())
    watcher.send(P.Unsubscribe(2, ["t"], {}))
    assert watcher.received() == [P.Unsuback(2, [R.SUCCESS], {})]
    watcher.send(P.Pubrec(delivered.message_id))
    assert watcher.received() == [P.Pubrel(delivered.message_id, 0, {})]
    watcher.send(P.Pubcomp(delivered.message_id))
    assert not watcher.closed


def test_MQTT_3_12_4_1_pingreq_gets_pingresp(broker):
    """MQTT-3.12.4-1."""
    client = connected(broker, "c")
    client.send(P.Pingreq())
    assert client.received() == [P.Pingresp()]


def test_MQTT_3_8_4_1_subscribe_in_the_same_read_as_connect_is_answered(broker):
    """MQTT-3.8.4-1, MQTT-4.2-1: packets that follow a 5.0 CONNECT in the same
    read are decoded as 5.0 packets."""
    client = broker.client()
    client.send(connect5("c"), P.Subscribe(1, [("t", options(1))], {"subscription_identifier": 4}))
    packets = client.received()
    assert [type(p) for p in packets] == [P.Connack, P.Suback], packets
    assert packets[1].granted_qos == [1]
    assert not client.closed


# Shared subscriptions


@pytest.mark.parametrize("version", ["5.0", "3.1.1"])
def test_MQTT_4_8_2_1_shared_subscription_gives_each_message_to_one_member(broker, version):
    """MQTT-4.8.2-1, MQTT-4.8.2-2; round robin among the members."""
    members = []
    for name in ("a", "b"):
        if version == "5.0":
            members.append(subscribed(broker, name, ("$share/g/t/#", options(1))))
        else:
            member = connected311(broker, name)
            member.send(P.Subscribe(1, [("$share/g/t/#", 1)]))
            assert member.received() == [P.Suback(1, [1])]
            members.append(member)
    client = connected(broker, "c")
    for i in range(6):
        client.send(publish("t/x", b"%d" % i, 1, i + 1))
    got = []
    for member in members:
        got.append(payloads(member.received()))
    assert sorted(got[0] + got[1]) == [b"%d" % i for i in range(6)]
    assert got == [[b"0", b"2", b"4"], [b"1", b"3", b"5"]]


def test_shared_subscription_mixes_5_0_and_3_1_1_members(broker):
    five = subscribed(broker, "five", ("$share/g/t", options(1)))
    old = connected311(broker, "old")
    old.send(P.Subscribe(1, [("$share/g/t", 1)]))
    old.received()
    plain = subscribed(broker, "plain", ("t", options(1)))
    client = connected(broker, "c")
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
    low = subscribed(broker, "low", ("$share/g/t", options(0)))
    high = subscribed(broker, "high", ("$share/g/t", options(2)))
    client = connected(broker, "c")
    client.send(publish("t", b"1", 2, 1), publish("t", b"2", 2, 2))
    [to_low] = publishes(low.received())
    [to_high] = publishes(high.received())
    assert to_low.qos == 0
    assert to_high.qos == 2


def test_shared_qos1_message_in_flight_goes_to_another_member_when_the_connection_drops(broker):
    """4.8.2: a QoS 1 message a member did not acknowledge before its session
    ended is sent to another member."""
    first = subscribed(broker, "a", ("$share/g/t", options(1)))
    second = subscribed(broker, "b", ("$share/g/t", options(1)))
    client = connected(broker, "c")
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
        broker, "a", ("$share/g/t", options(2)), properties={"session_expiry_interval": 60}
    )
    second = subscribed(broker, "b", ("$share/g/t", options(2)))
    client = connected(broker, "c")
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
    first = subscribed(broker, "a", ("$share/g/t", options(2)))
    second = subscribed(broker, "b", ("$share/g/t", options(2)))
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1))
    [got] = publishes(first.received())
    assert got.qos == 2
    first.lose_connection()
    assert publishes(second.received()) == []


def test_MQTT_4_8_2_5_shared_qos2_message_goes_to_no_other_member_after_expiry(broker):
    """MQTT-4.8.2-5: the member's session expires before it reconnects."""
    first = subscribed(
        broker, "a", ("$share/g/t", options(2)), properties={"session_expiry_interval": 10}
    )
    second = subscribed(broker, "b", ("$share/g/t", options(2)))
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1))
    [got] = publishes(first.received())
    assert got.qos == 2
    first.lose_connection()
    broker.clock.advance(11)
    assert publishes(second.received()) == []


def test_MQTT_4_8_2_6_failed_puback_from_a_member_discards_the_message(broker):
    """MQTT-4.8.2-6."""
    first = subscribed(broker, "a", ("$share/g/t", options(1)))
    second = subscribed(broker, "b", ("$share/g/t", options(1)))
    client = connected(broker, "c")
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
    client = connected(broker, "c")
    suback = subscribe(client, (topic_filter, options(1)), ("ok", options(1)))
    assert suback.granted_qos == [R.TOPIC_FILTER_INVALID, 1]
    assert not client.closed


def test_retained_messages_are_not_sent_to_a_shared_subscription(broker):
    """4.8.2: retained messages are not sent when a shared subscription is made."""
    client = connected(broker, "c")
    client.send(publish("t", b"kept", retain=True))
    member = connected(broker, "m")
    subscribe(member, ("$share/g/t", options(1)))
    assert publishes(member.received()) == []
    client.send(publish("t", b"live", retain=True))
    [live] = publishes(member.received())
    assert live.payload == b"live"


# Will


def _will_client(broker, client_id="c", delay=0, expiry=0, retain=False, **will_props):
    if delay:
        will_props["will_delay_interval"] = delay
    properties = {"session_expiry_interval": expiry} if expiry else {}
    return connected(
        broker,
        client_id,
        properties=properties,
        will_topic="will",
        will_message=b"gone",
        will_qos=1,
        will_retain=retain,
        will_properties=will_props,
    )


def test_MQTT_3_1_2_8_will_is_published_after_the_will_delay(broker):
    """MQTT-3.1.2-8, MQTT-3.1.2-7."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=5, expiry=60)
    client.lose_connection()
    broker.clock.advance(4.9)
    assert watcher.received() == []
    broker.clock.advance(0.2)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_2_8_will_without_delay_is_published_at_once(broker):
    """MQTT-3.1.2-8."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, expiry=60)
    client.lose_connection()
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_3_9_no_will_when_the_client_comes_back_within_the_delay(broker):
    """MQTT-3.1.3-9, MQTT-3.1.2-8."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=10, expiry=60)
    client.lose_connection()
    broker.clock.advance(5)
    back = connected(broker, "c", clean_start=False)
    assert back.connack.session_present is True
    broker.clock.advance(100)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_will_is_published_when_the_session_ends_before_the_delay(broker):
    """MQTT-3.1.2-8, MQTT-4.1.0-2."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=30, expiry=5)
    client.lose_connection()
    broker.clock.advance(4.9)
    assert watcher.received() == []
    broker.clock.advance(0.2)
    assert payloads(watcher.received()) == [b"gone"]
    broker.clock.advance(60)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_will_delay_with_session_expiry_0_publishes_at_once(broker):
    """MQTT-3.1.2-8: the session ends with the connection."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=30)
    client.lose_connection()
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_2_8_clean_start_reconnection_within_the_delay_sends_no_will(broker):
    """MQTT-3.1.2-8: a new Network Connection for the Client Identifier
    within the delay, even one that starts a new session (Clean Start 1,
    which ends the old one), means no will."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=30, expiry=60)
    client.lose_connection()
    broker.clock.advance(10)
    again = connected(broker, "c", clean_start=True)
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
    watcher = subscribed(broker, "w", ("will", options(0)))
    first = _will_client(broker, delay=5, expiry=expiry)
    second = connected(broker, "c", clean_start=clean_start, properties={"session_expiry_interval": 60})
    assert disconnect_of(first).reason_code == R.SESSION_TAKEN_OVER
    assert second.connack.session_present is (not clean_start and expiry > 0)
    broker.clock.advance(100)
    assert watcher.received() == []


def test_MQTT_3_1_2_8_takeover_without_a_delay_sends_the_will_when_the_session_ends(broker):
    """MQTT-3.1.2-8, MQTT-3.1.4-3: with no delay, a session that ends at
    the takeover (Clean Start 1) publishes the will of the connection it
    closed; one that goes on (Clean Start 0) does not."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    _will_client(broker, expiry=60)
    connected(broker, "c", clean_start=False, properties={"session_expiry_interval": 60})
    assert watcher.received() == []
    _will_client(broker, expiry=60)
    connected(broker, "c", clean_start=True)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_2_8_a_311_connection_within_the_delay_sends_no_will(broker):
    """MQTT-3.1.2-8: a new connection for the Client Identifier in any
    protocol version comes within the delay."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=30, expiry=60)
    client.lose_connection()
    broker.clock.advance(10)
    connected311(broker, "c", clean_session=True)
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
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=5, expiry=60)
    client.send(P.Disconnect(R.NORMAL_DISCONNECTION))
    assert client.closed
    broker.clock.advance(100)
    assert watcher.received() == []


def test_disconnect_0x04_publishes_the_will(broker):
    """DISCONNECT with Will Message (0x04): the will is published."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker)
    client.send(P.Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE))
    assert client.closed
    assert payloads(watcher.received()) == [b"gone"]


def test_disconnect_0x04_publishes_the_will_after_its_delay(broker):
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker, delay=5, expiry=60)
    client.send(P.Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE))
    broker.clock.advance(4)
    assert watcher.received() == []
    broker.clock.advance(2)
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_1_3_10_will_properties_are_published_in_order(broker):
    """MQTT-3.1.3-10; the will's message properties travel with it."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    users = [("z", "1"), ("a", "2"), ("z", "3")]
    client = _will_client(
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
    client = _will_client(broker, retain=False)
    client.lose_connection()
    watcher = subscribed(broker, "w", ("will", 0))
    assert publishes(watcher.received()) == []


def test_MQTT_3_1_2_15_will_retain_1_is_retained(broker):
    """MQTT-3.1.2-15."""
    client = _will_client(broker, retain=True)
    client.lose_connection()
    watcher = subscribed(broker, "w", ("will", 0))
    [will] = publishes(watcher.received())
    assert will.payload == b"gone" and will.retain is True


# DISCONNECT


def test_MQTT_4_13_1_1_malformed_packet_gets_disconnect_0x81(broker):
    """MQTT-4.13.1-1, MQTT-3.3.1-4 (QoS 3), MQTT-3.14.4-1: nothing after the
    DISCONNECT."""
    client = connected(broker, "c")
    client.send_bytes(b"\x36\x05\x00\x01t\x00\x01" + P.Pingreq().encode())
    packets = client.received()
    assert packets == [packets[-1]] and isinstance(packets[0], P.Disconnect), packets
    assert packets[0].reason_code == R.MALFORMED_PACKET
    assert client.closed


def test_MQTT_3_6_1_1_pubrel_with_bad_flags_is_malformed(broker):
    """MQTT-3.6.1-1, MQTT-2.1.3-1."""
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1))
    client.received()
    client.send_bytes(b"\x60\x02\x00\x01")
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


def test_MQTT_3_14_1_1_disconnect_with_reserved_flags_gets_disconnect_0x81(broker):
    """MQTT-3.14.1-1; the will is published (not a normal disconnection)."""
    watcher = subscribed(broker, "w", ("will", options(0)))
    client = _will_client(broker)
    client.send_bytes(b"\xe1\x00")
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET
    assert payloads(watcher.received()) == [b"gone"]


def test_MQTT_3_15_1_1_auth_with_reserved_flags_is_malformed(broker):
    """MQTT-3.15.1-1."""
    client = connected(broker, "c")
    client.send_bytes(b"\xf1\x00")
    assert client.closed
    packets = client.received()
    assert all(isinstance(p, P.Disconnect) and p.reason_code >= 0x80 for p in packets)


def test_MQTT_4_13_2_1_packet_too_large_gets_disconnect_0x95_and_close():
    """MQTT-4.13.2-1, MQTT-3.2.2-15, MQTT-3.14.2-2."""
    broker = FakeBroker(max_packet_size=64)
    client = connected(broker, "c")
    client.send(P.Subscribe(1, [("t" * 100, 0)], {}))
    disconnect = disconnect_of(client)
    assert disconnect.reason_code == R.PACKET_TOO_LARGE
    assert "session_expiry_interval" not in disconnect.properties


def test_disconnect_setting_a_session_expiry_after_connect_had_0_is_a_protocol_error(broker):
    """3.14.2.2.2: a non-zero Session Expiry Interval in DISCONNECT after 0 in
    CONNECT is a Protocol Error; the session is not kept."""
    client = subscribed(broker, "c", ("t", options(1)))
    client.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 60}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR
    again = connected(broker, "c", clean_start=False)
    assert again.connack.session_present is False


def test_disconnect_may_change_a_nonzero_session_expiry(broker):
    """3.14.2.2.2: CONNECT set an expiry; DISCONNECT may change it (to 0: the
    session ends now)."""
    shortened = subscribed(
        broker, "s", ("t", options(1)), properties={"session_expiry_interval": 600}
    )
    shortened.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 0}))
    assert shortened.closed
    again = connected(broker, "s", clean_start=False)
    assert again.connack.session_present is False
    lengthened = subscribed(
        broker, "l", ("t", options(1)), properties={"session_expiry_interval": 5}
    )
    lengthened.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 100}))
    broker.clock.advance(50)
    again = connected(broker, "l", clean_start=False)
    assert again.connack.session_present is True


def test_MQTT_3_14_0_1_no_disconnect_before_connack(broker):
    """MQTT-3.14.0-1: a malformed CONNECT is closed without a DISCONNECT."""
    client = broker.client()
    client.send_bytes(b"\x10\x05\x00\x04MQ")
    client.send_bytes(b"TT\x05")
    assert client.closed
    assert not any(isinstance(p, P.Disconnect) for p in decode5(raw(client)))


# Data representation and CONNECT validation


def _connect_with_flags(set_bits=0, clear_bits=0, **fields):
    """A 5.0 CONNECT's wire bytes with Connect Flags bits changed."""
    wire = bytearray(connect5("c", **fields).encode())
    assert wire[1] < 128 and wire[2:9] == b"\x00\x04MQTT\x05"
    wire[9] = (wire[9] | set_bits) & ~clear_bits
    return bytes(wire)


_BAD_CONNECTS = {
    # Will Flag 1 with no Will Properties, Topic or Payload.
    "3.1.2-9": _connect_with_flags(0x04),
    # Will QoS or Will Retain without the Will Flag.
    "3.1.2-11": _connect_with_flags(0x08),
    "3.1.2-13": _connect_with_flags(0x20),
    # User Name Flag 0 with a User Name; 1 without one.
    "3.1.2-16": _connect_with_flags(clear_bits=0x80, username="u"),
    "3.1.2-17": _connect_with_flags(0x80),
    # The same for the password.
    "3.1.2-18": _connect_with_flags(clear_bits=0x40, password=b"p"),
    "3.1.2-19": _connect_with_flags(0x40),
    # Ill-formed UTF-8: the Client Identifier, Will Topic, User Name.
    "3.1.3-4": connect5(b"\xc3\x28").encode(),
    "3.1.3-11": connect5("c", will_topic=b"\xed\xa0\x80", will_message=b"m").encode(),
    "3.1.3-12": connect5("c", username=b"\xff").encode(),
    # No Client Identifier at all: the payload is empty.
    "3.1.3-3": b"\x10\x0b\x00\x04MQTT\x05\x02\x00\x00\x00",
    # U+0000 in the Client Identifier.
    "1.5.4-2": connect5("a\x00b").encode(),
    # A Property Length not minimally encoded.
    "1.5.5-1": b"\x10\x0f\x00\x04MQTT\x05\x02\x00\x00\x80\x00\x00\x01c",
}
# (The last: a well-formed CONNECT is the same with a Property Length of
# one byte, 0x00.)


@pytest.mark.parametrize("statement", sorted(_BAD_CONNECTS))
def test_MQTT_3_1_4_1_connect_breaking_section_3_1_is_closed(broker, statement):
    """MQTT-3.1.4-1 and the CONNECT rules named by each case: MQTT-3.1.2-9,
    MQTT-3.1.2-11, MQTT-3.1.2-13, MQTT-3.1.2-16 to 19, MQTT-3.1.3-3, MQTT-3.1.3-4,
    MQTT-3.1.3-11, MQTT-3.1.3-12, MQTT-1.5.4-1, MQTT-1.5.4-2, MQTT-1.5.5-1."""
    wire = _BAD_CONNECTS[statement]
    client = broker.client()
    client.send_bytes(wire)
    assert client.closed
    packets = decode5(raw(client))
    assert all(isinstance(p, P.Connack) and p.return_code >= 0x80 for p in packets), packets
    assert "c" not in broker.router.sessions


def test_MQTT_3_1_4_1_well_formed_variants_are_accepted(broker):
    """The CONNECT cases above, made well-formed, are accepted (5.0 allows a
    password without a user name)."""
    connected(broker, "w", will_topic="w", will_message=b"m", will_qos=2, will_retain=True)
    connected(broker, "u", username="u", password=b"p")
    connected(broker, "p", password=b"p")


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
    watcher = subscribed(broker, "w", ("#", 0))
    client = connected(broker, "c")
    client.send_bytes(wire)
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET
    assert publishes(watcher.received()) == []


def test_MQTT_1_5_4_3_byte_order_mark_is_kept(broker):
    """MQTT-1.5.4-3, MQTT-4.7.3-4: U+FEFF is part of the topic; nothing is
    stripped or normalised in matching."""
    bom = subscribed(broker, "bom", ("\ufeffa/b", 0))
    plain = subscribed(broker, "plain", ("a/b", 0))
    client = connected(broker, "c")
    client.send(publish("\ufeffa/b", b"1"), publish("a/b", b"2"))
    assert [(p.topic, p.payload) for p in publishes(bom.received())] == [("\ufeffa/b", b"1")]
    assert [(p.topic, p.payload) for p in publishes(plain.received())] == [("a/b", b"2")]


def test_MQTT_4_7_3_4_topics_are_matched_without_normalisation(broker):
    """MQTT-4.7.3-4, MQTT-3.3.2-3."""
    watcher = subscribed(broker, "w", ("a/b", 0), ("Caf\u00e9", 0))
    client = connected(broker, "c")
    for topic in ("A/b", "a//b", "a/b/", "/a/b", "Cafe\u0301", "a/b", "Caf\u00e9"):
        client.send(publish(topic, topic.encode()))
    assert [p.topic for p in publishes(watcher.received())] == ["a/b", "Caf\u00e9"]


@pytest.mark.parametrize("topic_filter", ["", "a#", "a/#/b", "a/b+", "+a/b", "#/"])
def test_MQTT_4_7_1_1_invalid_filters_get_suback_0x8F(broker, topic_filter):
    """MQTT-4.7.1-1, MQTT-4.7.1-2, MQTT-4.7.3-1."""
    client = connected(broker, "c")
    suback = subscribe(client, (topic_filter, options(1)), ("ok/+/#", options(1)))
    assert suback.granted_qos == [R.TOPIC_FILTER_INVALID, 1]


def test_MQTT_4_7_3_1_empty_topic_without_an_alias_is_a_protocol_error(broker):
    """MQTT-4.7.3-1."""
    client = connected(broker, "c")
    client.send(publish("", b"x"))
    disconnect = disconnect_of(client)
    assert disconnect.reason_code in (R.PROTOCOL_ERROR, R.TOPIC_NAME_INVALID)


# Outbound flows and ordering


def test_MQTT_2_2_1_4_server_packet_ids_are_nonzero_and_unused(broker):
    """MQTT-2.2.1-4, MQTT-4.3.2-1, MQTT-4.3.2-2, MQTT-4.3.3-1, MQTT-4.3.3-2."""
    watcher = subscribed(broker, "w", ("t", options(2)))
    client = connected(broker, "c")
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


def test_MQTT_4_3_3_4_outbound_qos2_flow(broker):
    """MQTT-4.3.3-3, MQTT-4.3.3-4, MQTT-4.3.3-5, MQTT-2.2.1-5, MQTT-3.6.2-1: PUBLISH, PUBREC,
    PUBREL with the same id, PUBCOMP; the id is then free."""
    watcher = subscribed(broker, "w", ("t", options(2)))
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1), P.Pubrel(1))
    [delivered] = publishes(watcher.received())
    mid = delivered.message_id
    watcher.send(P.Pubrec(mid))
    assert watcher.received() == [P.Pubrel(mid, 0, {})]
    watcher.send(P.Pubcomp(mid))
    assert watcher.received() == []
    assert not broker.router.sessions["w"].inflight


def test_MQTT_4_6_0_5_messages_keep_their_order_per_publisher():
    """MQTT-4.6.0-5, MQTT-4.6.0-6."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=200))
    watcher = subscribed(broker, "w", ("t/#", options(2)))
    first = connected(broker, "p1")
    second = connected(broker, "p2")
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
    client = connected(broker, "c")
    client.send(publish("t", b"x", 2, 1, message_expiry_interval=1))
    assert client.received() == [P.Pubrec(1, 0, {})]
    broker.clock.advance(5)
    client.send(P.Pubrel(1))
    assert client.received() == [P.Pubcomp(1, 0, {})]


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
    client = subscribed(broker, "c", ("a/#", 0))
    client.send_bytes(wire)
    assert disconnect_of(client).reason_code == R.MALFORMED_PACKET


# Rows of tests/CONFORMANCE5.md that earlier tests did not reach


def test_MQTT_3_3_2_14_a_response_topic_with_a_wildcard_is_a_protocol_error(broker):
    client = connected(broker, "c")
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


def test_MQTT_3_1_3_8_a_client_identifier_refused_is_connack_0x85_then_the_close(broker):
    # The one client identifier refused over 5.0 holds U+0000, which no
    # UTF-8 string of MQTT may ([MQTT-1.5.4-2]): the CONNECT is malformed,
    # and the connection closes without a CONNACK (which is optional).
    client = broker.client(connect5("bad\x00id"))
    assert client.received() == []
    assert client.closed
    assert "bad\x00id" not in broker.router.sessions


def test_MQTT_3_2_2_8_connack_reason_codes_come_from_the_connect_table():
    """Every refusing CONNACK the server can send names a code of the CONNACK table."""
    import ast
    from pathlib import Path

    from mqttgw.transports import protocol

    table = {
        0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
        0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
    }
    # Every module of the protocol's, wherever its refusals are.
    trees = [ast.parse(path.read_text()) for path in sorted(Path(protocol.__file__).parent.glob("*.py"))]
    codes = set()
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "_refuse":
            for arg in ast.walk(node.args[0]):
                if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "R":
                    codes.add(getattr(R, arg.attr))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "code" for t in ast.walk(node.targets[0])):
            for arg in ast.walk(node.value):
                if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "R":
                    codes.add(getattr(R, arg.attr))
    assert len(codes) >= 10, codes
    assert codes <= table, {hex(c) for c in codes - table}
    # What an authentication method gives is held to the table too.
    assert protocol.connack_refusal(R.TOPIC_ALIAS_INVALID) == R.NOT_AUTHORIZED
    assert protocol.connack_refusal(R.BAD_USER_NAME_OR_PASSWORD) == R.BAD_USER_NAME_OR_PASSWORD


def test_MQTT_3_6_2_2_3_7_2_2_3_11_2_1_no_reason_string_or_user_property_past_the_maximum_packet_size(broker):
    """
    Also [MQTT-3.6.2-3], [MQTT-3.7.2-3], [MQTT-3.11.2-2]: PUBREL, PUBCOMP
    and UNSUBACK to a client with a small maximum packet size carry no
    property at all (the server sends reason strings on none of them).
    """
    client = connected(broker, "c", properties={"maximum_packet_size": 16, "request_problem_information": 1})
    client.send(P.Unsubscribe(1, ["never/subscribed"], {}))
    client.send(P.Pubrel(9))
    sub = connected(broker, "s", properties={"maximum_packet_size": 64})
    sub.send(P.Subscribe(1, [("q2", 2)], {}))
    sub.received()
    pub = connected311(broker, "p")
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
    sub = connected(broker, "s")
    sub.send(P.Subscribe(1, [("#", 0)], {}))
    sub.received()
    pub = connected(broker, "p")
    longest = "t" * 65535
    pub.send(P.Publish(longest, b"x", 0, properties={}))
    [message] = [p for p in sub.received() if isinstance(p, P.Publish)]
    assert message.topic == longest
    # One byte more has no encoding: the length field is 16 bits.
    with pytest.raises(ValueError):
        P.Publish(longest + "t", b"x", 0, properties={}).encode()

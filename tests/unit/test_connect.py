"""
CONNECT and CONNACK: the checks of a CONNECT, client identifiers, sessions
(Clean Session / Clean Start, expiry, take-over), keep alive, what a CONNACK
states and the DISCONNECT that ends a session, driven through fake
transports and a fake clock.

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
    frames,
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
from tests.wills import will_client, will_watcher
from tests.versions import both_versions, every_version


NEVER = 0xFFFFFFFF


# The smallest CONNACK a default broker accepts with (Receive Maximum and
# Maximum Packet Size, the limits it holds the client to): a client that
# takes less is closed without one ([MQTT-3.1.2-24]).
SMALLEST_CONNACK = 13


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
# What the gateway logs for each (a flag that promises a field that is not
# there leaves the packet short; one that leaves out a field that is there,
# bytes over).
_BAD_CONNECT_REASONS = {
    "3.1.2-9": "variable byte integer runs past end of packet",
    "3.1.2-11": "will QoS or retain set without will flag",
    "3.1.2-13": "will QoS or retain set without will flag",
    "3.1.2-16": "CONNECT has bytes after its payload",
    "3.1.2-17": "packet truncated",
    "3.1.2-18": "CONNECT has bytes after its payload",
    "3.1.2-19": "packet truncated",
    "3.1.3-4": "string is not valid UTF-8",
    "3.1.3-11": "string is not valid UTF-8",
    "3.1.3-12": "string is not valid UTF-8",
    "3.1.3-3": "packet truncated",
    "1.5.4-2": "string contains U+0000",
    "1.5.5-1": "variable byte integer is not minimally encoded",
}


# MQTT 3.1 and 3.1.1


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


@pytest.mark.parametrize(
    "first",
    [P.Publish("a", b"x"), P.Pingreq(), P.Subscribe(1, [("a", 0)])],
    ids=["publish", "pingreq", "subscribe"],
)
def test_MQTT_3_1_0_1_first_packet_must_be_connect(broker, logged, first):
    """MQTT-3.1.0-1, MQTT-3.14.0-1: closed, with no DISCONNECT before a
    CONNACK (and no version known to write one in)."""
    client = broker.client()
    client.send(first)
    assert client.received() == []
    first_byte = first.encode()[0]
    assert close_reason(client, logged()) == f"first packet is not CONNECT (byte {first_byte:#04x})"


@every_version
def test_second_connect_closes_the_connection(broker, logged, version):
    client = connected(broker, "c", version=version)
    client.send(P.Connect(client_id="c"))
    if version is V5:
        assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR
    assert close_reason(client, logged()) == "second CONNECT"


def no_connect_in_time(client, lines):
    """Whether the broker closed ``client`` for want of a CONNECT, and logged it."""
    peer = client.transport.getPeer()
    return client.closed and f"no CONNECT from {peer.host}:{peer.port} in time: closing" in lines


def test_no_connect_within_timeout_closes(broker, logged):
    client = broker.client()
    broker.clock.advance(9.9)
    assert not client.closed
    broker.clock.advance(0.2)
    assert no_connect_in_time(client, logged())


def test_connect_timeout_is_configurable(logged):
    broker = FakeBroker(connect_timeout=2)
    client = broker.client()
    broker.clock.advance(1.9)
    assert not client.closed
    broker.clock.advance(0.2)
    assert no_connect_in_time(client, logged())


@every_version
def test_connect_in_time_stops_the_connect_timer(broker, version):
    client = connected(broker, "c", keepalive=0, version=version)
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


def test_connections_closed_before_connect_are_not_held_until_their_deadline(broker, logged):
    deadlines = broker.factory.flusher.connects
    for _ in range(1000):
        broker.client().lose_connection()
    # Rebuilt without them as they closed, not kept for ten seconds.
    assert deadlines._held < 200
    waiting = broker.client()
    broker.clock.advance(10.1)
    assert no_connect_in_time(waiting, logged())


@every_version
def test_connect_and_subscribe_in_one_chunk_are_both_handled(broker, version):
    client = broker.client()
    client.send(connect("c", version), P.Subscribe(1, [("a", 1)]))
    connack, suback = client.received()
    assert (connack.return_code, connack.session_present) == (0, False)
    assert suback == in_version(version, P.Suback(1, [1]))


@every_version
def test_user_name_and_password_are_accepted_without_authentication(broker, version):
    client = connected(broker, "c", version, username="u", password=b"p")
    assert not client.connack.session_present


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
    assert deliveries(clean.received()) == []
    clean.send(P.Disconnect())
    clean.finish_close()
    assert "s" not in broker.router.sessions


@every_version
def test_clean_session_state_is_dropped_when_the_connection_ends(broker, version):
    sub = subscribed(broker, "s", ("a", 0), version=version)
    sub.lose_connection()
    assert "s" not in broker.router.sessions
    assert broker.router.subscriptions.count == 0


@every_version
def test_persistent_session_keeps_subscriptions_and_queues_qos12_while_offline(broker, version):
    # A 5.0 session outlives its connection for its expiry interval.
    kept = {"session_expiry_interval": 60} if version is V5 else None
    sub = subscribed(broker, "s", ("a/#", 2), clean_session=False, version=version, properties=kept)
    sub.lose_connection()
    pub = connected(broker, "pub")
    pub.send(
        P.Publish("a/0", b"zero", 0),
        P.Publish("a/1", b"one", 1, message_id=1),
        P.Publish("a/2", b"two", 2, message_id=2),
    )
    back = broker.client(connect("s", version, clean_session=False, properties=kept))
    packets = back.received()
    assert (packets[0].return_code, packets[0].session_present) == (0, version is not V31)
    # QoS 0 is not queued for an offline session.
    assert deliveries(packets) == [("a/1", b"one", 1), ("a/2", b"two", 2)]


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


@both_versions
def test_takeover_closes_the_old_connection_before_the_new_connack(broker, version):
    old = connected(broker, "c", will_topic="will/c", will_message=b"gone", version=version)
    watcher = subscribed(broker, "w", ("will/#", 0), version=version)
    order = []
    old.transport.abortConnection = lambda: order.append("old closed")
    new = broker.client()
    new.transport.write = lambda data: order.append(("new got", data))
    new.send(P.Connect(client_id="c"))
    assert order == ["old closed", ("new got", b"\x20\x02\x00\x00")]
    # Take-over is not a DISCONNECT: the old connection's will is published.
    assert deliveries(watcher.received()) == [("will/c", b"gone", 0)]
    assert broker.router.sessions["c"].connection is new.protocol


def test_takeover_of_persistent_session_keeps_its_subscriptions(broker):
    subscribed(broker, "s", ("a", 1), clean_session=False)
    new = broker.client(client_id="s", clean_session=False)
    assert new.received() == [P.Connack(0, True)]
    pub = connected(broker, "pub")
    pub.send(P.Publish("a", b"x", 1, message_id=1))
    assert deliveries(new.received()) == [("a", b"x", 1)]


@every_version
def test_old_connection_lost_after_takeover_does_not_disturb_the_new_one(broker, version):
    old = connected(broker, "c", version=version)
    new = connected(broker, "c", version=version)
    old.lose_connection()
    assert broker.router.sessions["c"].connection is new.protocol


def keepalive_expired(client, version, lines):
    """The log line of ``client``'s keep alive expiring (5.0: after a DISCONNECT 0x8D)."""
    if version is V5:
        assert disconnect_of(client).reason_code == R.KEEP_ALIVE_TIMEOUT
    else:
        assert client.closed and client.received() == []
    [line] = [line for line in lines if "keepalive expired" in line]
    return line


@every_version
def test_keepalive_expires_after_one_and_a_half_times_the_interval(broker, logged, version):
    client = connected(broker, "c", keepalive=10, version=version)
    broker.clock.advance(14.9)
    assert not client.closed
    broker.clock.advance(0.2)
    assert keepalive_expired(client, version, logged()) == "client c keepalive expired (15.0s silent)"


@every_version
def test_any_packet_resets_the_keepalive(broker, logged, version):
    client = connected(broker, "c", keepalive=10, version=version)
    for _ in range(5):
        broker.clock.advance(10)
        client.send(P.Pingreq())
        assert client.received() == [P.Pingresp()]
    broker.clock.advance(14)
    assert not client.closed
    broker.clock.advance(1.1)
    assert keepalive_expired(client, version, logged()) == "client c keepalive expired (15.0s silent)"


@every_version
def test_bytes_of_an_unfinished_packet_do_not_reset_the_keepalive(broker, logged, version):
    client = connected(broker, "c", keepalive=10, version=version)
    data = P.Publish("t", b"x" * 100).encode()
    for i in range(14):
        broker.clock.advance(1)
        client.send_bytes(data[i : i + 1])
    broker.clock.advance(1.1)
    assert keepalive_expired(client, version, logged()) == "client c keepalive expired (15.0s silent)"


@every_version
def test_keepalive_zero_means_no_timeout(broker, version):
    client = connected(broker, "c", keepalive=0, version=version)
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
    assert deliveries(watcher.received()) == []
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
    assert deliveries(watcher.received()) == [("will/silent", b"gone", 0)]
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


def test_control_characters_in_a_client_id_are_escaped_in_log_lines(broker, logged):
    # MQTT 3.1 has no rule against them (3.1.1 connections are closed).
    client = connected(broker, "a\nb\x1b[31mc\x85", version=V31)
    client.lose_connection()
    lines = [line for line in logged() if "a\\x0ab" in line]
    assert lines and all("\x1b" not in line and "\n" not in line for line in lines)
    assert any("a\\x0ab\\x1b[31mc\\x85 connected" in line for line in lines)


def test_max_connections_refuses_beyond_the_limit():
    broker = FakeBroker(max_connections=2)
    broker.client()
    broker.client()
    assert broker.factory.buildProtocol(None) is None
    assert broker.router.stats.connections_refused == 1


def test_keepalive_expiry_keeps_a_persistent_sessions_subscriptions(broker, logged):
    sub = subscribed(broker, "s", ("a", 1), clean_session=False)
    sub.protocol.keepalive = 0
    expiring = connected(broker, "e", clean_session=False, keepalive=2)
    expiring.send(P.Subscribe(1, [("a", 1)]))
    assert isinstance(expiring.received()[0], P.Suback)
    broker.clock.advance(3.1)
    assert keepalive_expired(expiring, V311, logged()) == "client e keepalive expired (3.0s silent)"
    assert broker.router.sessions["e"].subscriptions == {"a": 1}


@every_version
def test_disconnect_of_a_clean_session_discards_its_state(broker, version):
    client = subscribed(broker, "c", ("a", 1), version=version)
    client.send(P.Disconnect())
    assert client.closed
    assert "c" not in broker.router.sessions
    assert broker.router.subscriptions.match("a") == ()


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


# MQTT 5.0


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
    client = connected(broker, "c", version=V5)
    client.send(connect5("c"))
    packets = client.received()
    assert not any(isinstance(p, P.Connack) for p in packets)
    assert packets[-1].reason_code == R.PROTOCOL_ERROR
    assert client.closed


def test_MQTT_3_1_2_2_unsupported_protocol_version_is_refused(broker, logged):
    """MQTT-3.1.2-2, MQTT-3.1.2-1: CONNACK (if any) reports failure, then the
    connection is closed. The version unknown, the CONNACK is 3.1.1's 0x01
    (0x84 in 5.0's table)."""
    client = broker.client(P.Connect("c", protocol_name="MQTT", protocol_level=6))
    assert client.received() == [P.Connack(1)]
    assert close_reason(client, logged()) == "unsupported protocol 'MQTT' level 6"


def test_MQTT_3_1_2_3_reserved_connect_flag_closes_without_accepting(broker, logged):
    """MQTT-3.1.2-3, MQTT-3.1.4-1, MQTT-3.14.0-1."""
    wire = bytearray(connect5("c").encode())
    # 2-byte fixed header, "\x00\x04MQTT", the level: then the flags.
    assert wire[2:9] == b"\x00\x04MQTT\x05"
    wire[9] |= 0x01
    client = broker.client()
    client.send_bytes(bytes(wire))
    # Malformed: closed without a CONNACK.
    assert decode5(raw(client)) == []
    assert close_reason(client, logged()) == "CONNECT reserved flag is set"


def test_MQTT_3_1_2_4_clean_start_discards_the_session(broker):
    """MQTT-3.1.2-4, MQTT-3.1.4-4, MQTT-3.2.2-2."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": 60}, version=V5
    )
    client.lose_connection()
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("t", b"queued", 1, 1))
    again = connected(
        broker,
        "c",
        clean_start=True,
        properties={"session_expiry_interval": 60},
        version=V5,
    )
    assert again.connack.session_present is False
    assert again.received() == []
    # The subscription went with the session.
    publisher.send(publish("t", b"after", 1, 2))
    assert again.received() == []


def test_MQTT_3_1_2_5_clean_start_0_resumes_the_session(broker):
    """MQTT-3.1.2-5, MQTT-3.2.2-3, MQTT-3.1.2-23, MQTT-3.1.3-2, MQTT-3.2.0-1 (CONNACK
    before the queued messages), MQTT-4.5.0-1."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": 60}, version=V5
    )
    client.lose_connection()
    publisher = connected(broker, "p", version=V5)
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
        broker, "new", clean_start=False, properties={"session_expiry_interval": 60}, version=V5
    )
    assert client.connack.session_present is False
    subscribe(client, ("t", options(1)))
    client.lose_connection()
    again = connected(broker, "new", clean_start=False, version=V5)
    assert again.connack.session_present is True


def test_MQTT_3_1_2_23_session_expiry_0_ends_the_session_with_the_connection(broker):
    """MQTT-3.1.2-23 (absent: 0), MQTT-4.1.0-2."""
    client = subscribed(broker, "c", ("t", options(1)), version=V5)
    client.lose_connection()
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("t", b"lost", 1, 1))
    again = connected(broker, "c", clean_start=False, version=V5)
    assert again.connack.session_present is False
    assert again.received() == []


def test_MQTT_4_1_0_2_session_is_discarded_once_its_expiry_interval_has_passed(broker):
    """MQTT-4.1.0-2, MQTT-3.1.2-23."""
    keeper = subscribed(
        broker, "keeper", ("t", options(1)), properties={"session_expiry_interval": 10}, version=V5
    )
    goner = subscribed(
        broker, "goner", ("t", options(1)), properties={"session_expiry_interval": 10}, version=V5
    )
    keeper.lose_connection()
    goner.lose_connection()
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("t", b"while away", 1, 1))
    broker.clock.advance(9.5)
    back = broker.client(connect5("keeper", clean_start=False))
    packets = back.received()
    assert packets[0].session_present is True
    assert payloads(packets) == [b"while away"]
    broker.clock.advance(1)
    late = connected(broker, "goner", clean_start=False, version=V5)
    assert late.connack.session_present is False
    assert late.received() == []


def test_MQTT_4_1_0_1_session_is_kept_while_the_connection_is_open(broker):
    """MQTT-4.1.0-1."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": 5}, version=V5
    )
    broker.clock.advance(100)
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("t", b"still here", 1, 1))
    assert payloads(client.received()) == [b"still here"]


def test_MQTT_3_1_2_23_session_expiry_0xFFFFFFFF_never_expires(broker):
    """MQTT-3.1.2-23, MQTT-4.1.0-2: 0xFFFFFFFF means the session does not expire."""
    client = subscribed(
        broker, "c", ("t", options(1)), properties={"session_expiry_interval": NEVER}, version=V5
    )
    client.lose_connection()
    broker.clock.advance(10 * 365 * 24 * 3600)
    again = connected(broker, "c", clean_start=False, version=V5)
    assert again.connack.session_present is True


def test_MQTT_3_1_2_23_session_expiry_is_kept_across_a_restart(tmp_path):
    """MQTT-3.1.2-23, MQTT-4.1.0-2 with the sessions in the store."""
    broker = FakeBroker(store_dir=tmp_path)
    for client_id in ("early", "late"):
        client = subscribed(
            broker,
            client_id,
            ("t", options(1)),
            properties={"session_expiry_interval": 100},
            version=V5,
        )
        client.lose_connection()
    forever = subscribed(
        broker,
        "forever",
        ("t", options(1)),
        properties={"session_expiry_interval": NEVER},
        version=V5,
    )
    forever.lose_connection()
    broker.commit()
    broker = broker.restart()
    broker.clock.advance(90)
    early = connected(broker, "early", clean_start=False, version=V5)
    assert early.connack.session_present is True
    broker.clock.advance(20)
    late = connected(broker, "late", clean_start=False, version=V5)
    assert late.connack.session_present is False
    broker.clock.advance(10**6)
    kept = connected(broker, "forever", clean_start=False, version=V5)
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
        version=V5,
    )
    client.lose_connection()
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("q1", b"one", 1, 1), publish("q2", b"two", 2, 2), P.Pubrel(2))
    broker.commit()
    if restart:
        broker = broker.restart()
        publisher = connected(broker, "p", version=V5)
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
        broker,
        "leaving",
        ("$share/g/t", options(1)),
        properties={"session_expiry_interval": 60},
        version=V5,
    )
    publisher = connected(broker, "p", version=V5)
    publisher.send(publish("t", b"first", 1, 1))
    broker.commit()
    assert payloads(leaving.received()) == [b"first"]
    staying = subscribed(broker, "staying", ("$share/g/t", options(1)), version=V5)
    leaving.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 0}))
    assert leaving.closed
    assert payloads(staying.received()) == [b"first"]
    assert "leaving" not in broker.router.sessions
    broker.commit()
    assert "leaving" not in broker.restart().router.sessions


def test_MQTT_3_1_3_6_empty_client_id_is_assigned_a_unique_one(broker):
    """MQTT-3.1.3-6, MQTT-3.1.3-7, MQTT-3.2.2-16."""
    one = connected(broker, "", properties={"session_expiry_interval": 60}, version=V5)
    two = connected(broker, "", version=V5)
    assigned = one.connack.properties["assigned_client_identifier"]
    other = two.connack.properties["assigned_client_identifier"]
    assert assigned and other and assigned != other
    assert one.protocol.client_id == assigned
    # The CONNECT is handled as if that identifier had been sent: the
    # session is held under it.
    subscribe(one, ("t", options(1)))
    one.lose_connection()
    again = connected(broker, assigned, clean_start=False, version=V5)
    assert again.connack.session_present is True
    assert "assigned_client_identifier" not in again.connack.properties


def test_MQTT_3_1_3_5_client_ids_of_1_to_23_alphanumerics_are_accepted(broker):
    """MQTT-3.1.3-5."""
    for client_id in ("a", "0123456789abcdefghijKLM"):
        connected(broker, client_id, version=V5)


def test_MQTT_3_2_2_22_server_applies_the_client_keep_alive(broker):
    """MQTT-3.2.2-22, MQTT-3.1.2-22: no Server Keep Alive in CONNACK, and the
    connection is closed after one and a half keep alive periods of silence."""
    client = connected(broker, "c", keepalive=10, version=V5)
    assert "server_keep_alive" not in client.connack.properties
    broker.clock.advance(14)
    assert not client.closed
    assert client.received() == []
    broker.clock.advance(1.5)
    assert disconnect_of(client).reason_code == R.KEEP_ALIVE_TIMEOUT


def test_MQTT_3_1_2_22_keep_alive_timeout_sends_disconnect_0x8D(broker):
    """MQTT-3.1.2-22, MQTT-3.14.4-2; a packet from the client restarts the wait."""
    client = connected(broker, "c", keepalive=4, version=V5)
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
    client = connected(broker, "c", keepalive=keepalive, version=V5)
    assert client.connack.properties["server_keep_alive"] == 30
    broker.clock.advance(44)
    assert not client.closed
    broker.clock.advance(1.5)
    assert disconnect_of(client).reason_code == R.KEEP_ALIVE_TIMEOUT


def test_server_keep_alive_left_out_when_the_client_keep_alive_is_within_the_maximum():
    broker = FakeBroker(max_keepalive=30)
    client = connected(broker, "c", keepalive=20, version=V5)
    assert "server_keep_alive" not in client.connack.properties


def test_connack_feature_flags_are_left_out_when_available(broker):
    """Wildcard, Subscription Identifier and Shared Subscription Available:
    absent means available."""
    props = connected(broker, "c", version=V5).connack.properties
    for name in (
        "wildcard_subscription_available",
        "subscription_identifier_available",
        "shared_subscription_available",
        "retain_available",
    ):
        assert props.get(name, 1) == 1


def test_MQTT_3_1_2_28_response_information_only_when_requested():
    """MQTT-3.1.2-28; Response Information when the client asks for it."""
    broker = FakeBroker(response_information="replies/%c")
    asked = connected(broker, "c", properties={"request_response_information": 1}, version=V5)
    assert asked.connack.properties["response_information"] == "replies/c"
    not_asked = connected(broker, "d", version=V5)
    assert "response_information" not in not_asked.connack.properties
    declined = connected(broker, "e", properties={"request_response_information": 0}, version=V5)
    assert "response_information" not in declined.connack.properties


def test_MQTT_3_1_2_28_no_response_information_configured(broker):
    client = connected(broker, "c", properties={"request_response_information": 1}, version=V5)
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
    watcher = subscribed(broker, "w", ("t", 0), version=V5)
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
    client = connected(broker, "c", version=V5)
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
    full = connected(broker, "full", properties=asked, version=V5)
    assert "response_information" in full.connack.properties
    full_size = len(full.connack.encode())
    roomy = connected(
        broker,
        "roomy",
        properties={**asked, "maximum_packet_size": full_size - 1},
        version=V5,
    )
    assert "response_information" not in roomy.connack.properties
    assert roomy.connack.properties["topic_alias_maximum"] == 10
    assert len(roomy.connack.encode()) < full_size
    tight = connected(
        broker,
        "tight",
        properties={**asked, "maximum_packet_size": SMALLEST_CONNACK},
        version=V5,
    )
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
def test_MQTT_3_1_2_24_no_connack_when_the_smallest_does_not_fit(broker, logged, client_id, limit):
    """MQTT-3.1.2-24: a client whose Maximum Packet Size is below the
    smallest CONNACK (an Assigned Client Identifier cannot be left out,
    MQTT-3.2.2-16) is closed without one, and nothing changes for the
    session it named: the connection holding it stays, its will unsent."""
    watcher = subscribed(broker, "w", ("will", options(0)), version=V5)
    holder = None
    if client_id:
        holder = will_client(broker, client_id, expiry=60)
    client = broker.client(connect5(client_id, properties={"maximum_packet_size": limit}))
    assert raw(client) == b""
    reason = close_reason(client, logged())
    assert reason == f"its maximum packet size {limit} is below the smallest CONNACK"
    client.lose_connection()
    assert broker.router.stats.connections_refused == 1
    if holder is not None:
        assert not holder.closed
        assert broker.router.sessions[client_id].connection is holder.protocol
    assert watcher.received() == []


def test_MQTT_3_1_2_24_no_refusal_connack_when_it_does_not_fit(broker, logged):
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
    # Refused for the same reason; refusals from one address are logged
    # once an interval, so the first one's line stands for both.
    assert broker.router.stats.connections_refused == 2
    assert close_reason(fits, logged()) == "authentication method 'nope' is not offered"


def test_MQTT_3_1_4_3_session_taken_over_gets_disconnect_0x8E(broker):
    """MQTT-3.1.4-3, MQTT-3.14.2-1, MQTT-3.14.2-2, MQTT-3.14.4-2."""
    first = connected(broker, "c", version=V5)
    second = connected(broker, "c", version=V5)
    disconnect = disconnect_of(first)
    assert disconnect.reason_code == R.SESSION_TAKEN_OVER
    assert "session_expiry_interval" not in disconnect.properties
    assert not second.closed


def test_MQTT_3_1_2_29_no_reason_string_on_puback_when_problem_information_is_off():
    """MQTT-3.1.2-29 for PUBACK and PUBREC."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(broker, "c", properties={"request_problem_information": 0}, version=V5)
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
    asked = connected(broker, "a", version=V5)
    suback = subscribe(asked, ("closed/#", 0))
    assert suback.granted_qos == [R.NOT_AUTHORIZED]
    assert suback.properties.get("reason_string")
    declined = connected(broker, "d", properties={"request_problem_information": 0}, version=V5)
    suback = subscribe(declined, ("closed/#", 0), ("a/#/b", 0))
    assert suback.granted_qos == [R.NOT_AUTHORIZED, R.TOPIC_FILTER_INVALID]
    assert "reason_string" not in suback.properties
    assert "user_property" not in suback.properties


def test_MQTT_3_1_2_29_disconnect_may_carry_a_reason_string_all_the_same(broker):
    """MQTT-3.1.2-29: DISCONNECT is one of the packets allowed a Reason String."""
    client = connected(broker, "c", properties={"request_problem_information": 0}, version=V5)
    client.send(publish("", b"x", topic_alias=2))
    disconnect = disconnect_of(client)
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert disconnect.properties.get("reason_string")


def test_MQTT_3_4_2_2_puback_reason_string_left_out_beyond_the_clients_maximum():
    """MQTT-3.4.2-2, MQTT-3.4.2-3, MQTT-3.5.2-2, MQTT-3.5.2-3, MQTT-3.1.2-24."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(
        broker,
        "c",
        properties={"maximum_packet_size": SMALLEST_CONNACK},
        version=V5,
    )
    client.send(publish("closed/x", b"x", 1, 1), publish("closed/y", b"y", 2, 2))
    data = raw(client)
    assert all(len(frame) <= SMALLEST_CONNACK for frame in frames(data))
    puback, pubrec = decode5(data)
    assert puback.reason_code == pubrec.reason_code == R.NOT_AUTHORIZED


def test_MQTT_3_9_2_1_suback_reason_string_left_out_beyond_the_clients_maximum():
    """MQTT-3.9.2-1, MQTT-3.9.2-2."""
    broker = FakeBroker(acl=["topic readwrite open/#"])
    client = connected(
        broker,
        "c",
        properties={"maximum_packet_size": SMALLEST_CONNACK},
        version=V5,
    )
    client.send(P.Subscribe(1, [("closed/#", 0)], {}))
    data = raw(client)
    assert all(len(frame) <= SMALLEST_CONNACK for frame in frames(data))
    [suback] = decode5(data)
    assert suback.granted_qos == [R.NOT_AUTHORIZED]


def test_MQTT_3_14_2_3_disconnect_reason_string_left_out_beyond_the_clients_maximum(broker):
    """MQTT-3.14.2-3, MQTT-3.14.2-4."""
    client = connected(
        broker,
        "c",
        properties={"maximum_packet_size": SMALLEST_CONNACK},
        version=V5,
    )
    client.send(publish("", b"x", topic_alias=2))
    data = raw(client)
    assert all(len(frame) <= SMALLEST_CONNACK for frame in frames(data))
    [disconnect] = decode5(data)
    # Its CONNACK, that small, had no room for a Topic Alias Maximum: so
    # no alias is valid ([MQTT-3.2.2-18]).
    assert disconnect.reason_code == R.TOPIC_ALIAS_INVALID
    assert client.closed


def test_MQTT_3_12_4_1_pingreq_gets_pingresp(broker):
    """MQTT-3.12.4-1."""
    client = connected(broker, "c", version=V5)
    client.send(P.Pingreq())
    assert client.received() == [P.Pingresp()]


def test_disconnect_setting_a_session_expiry_after_connect_had_0_is_a_protocol_error(broker):
    """3.14.2.2.2: a non-zero Session Expiry Interval in DISCONNECT after 0 in
    CONNECT is a Protocol Error; the session is not kept."""
    client = subscribed(broker, "c", ("t", options(1)), version=V5)
    client.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 60}))
    assert disconnect_of(client).reason_code == R.PROTOCOL_ERROR
    again = connected(broker, "c", clean_start=False, version=V5)
    assert again.connack.session_present is False


def test_disconnect_may_change_a_nonzero_session_expiry(broker):
    """3.14.2.2.2: CONNECT set an expiry; DISCONNECT may change it (to 0: the
    session ends now)."""
    shortened = subscribed(
        broker, "s", ("t", options(1)), properties={"session_expiry_interval": 600}, version=V5
    )
    shortened.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 0}))
    assert shortened.closed
    again = connected(broker, "s", clean_start=False, version=V5)
    assert again.connack.session_present is False
    lengthened = subscribed(
        broker, "l", ("t", options(1)), properties={"session_expiry_interval": 5}, version=V5
    )
    lengthened.send(P.Disconnect(R.NORMAL_DISCONNECTION, {"session_expiry_interval": 100}))
    broker.clock.advance(50)
    again = connected(broker, "l", clean_start=False, version=V5)
    assert again.connack.session_present is True


def test_MQTT_3_14_0_1_no_disconnect_before_connack(broker, logged):
    """MQTT-3.14.0-1: a malformed CONNECT is closed without a DISCONNECT."""
    client = broker.client()
    client.send_bytes(b"\x10\x05\x00\x04MQ")
    client.send_bytes(b"TT\x05")
    assert decode5(raw(client)) == []
    assert close_reason(client, logged()) == "string runs past end of packet"


@pytest.mark.parametrize("statement", sorted(_BAD_CONNECTS))
def test_MQTT_3_1_4_1_connect_breaking_section_3_1_is_closed(broker, logged, statement):
    """MQTT-3.1.4-1 and the CONNECT rules named by each case: MQTT-3.1.2-9,
    MQTT-3.1.2-11, MQTT-3.1.2-13, MQTT-3.1.2-16 to 19, MQTT-3.1.3-3, MQTT-3.1.3-4,
    MQTT-3.1.3-11, MQTT-3.1.3-12, MQTT-1.5.4-1, MQTT-1.5.4-2, MQTT-1.5.5-1."""
    wire = _BAD_CONNECTS[statement]
    client = broker.client()
    client.send_bytes(wire)
    # Malformed: closed without a CONNACK.
    assert decode5(raw(client)) == []
    assert close_reason(client, logged()) == _BAD_CONNECT_REASONS[statement]
    assert "c" not in broker.router.sessions


def test_MQTT_3_1_4_1_well_formed_variants_are_accepted(broker):
    """The CONNECT cases above, made well-formed, are accepted (5.0 allows a
    password without a user name)."""
    connected(
        broker,
        "w",
        will_topic="w",
        will_message=b"m",
        will_qos=2,
        will_retain=True,
        version=V5,
    )
    connected(broker, "u", username="u", password=b"p", version=V5)
    connected(broker, "p", password=b"p", version=V5)


def test_MQTT_3_1_3_8_a_client_identifier_refused_is_connack_0x85_then_the_close(broker, logged):
    # The one client identifier refused over 5.0 holds U+0000, which no
    # UTF-8 string of MQTT may ([MQTT-1.5.4-2]): the CONNECT is malformed,
    # and the connection closes without a CONNACK (which is optional).
    client = broker.client(connect5("bad\x00id"))
    assert client.received() == []
    assert close_reason(client, logged()) == "string contains U+0000"
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
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "refuse":
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

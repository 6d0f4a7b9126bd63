"""
Protocol edge cases, from the MQTT 3.1 specification and the 3.1.1
differences: wire bytes in, wire bytes or a close out, for both versions,
fed whole and one byte at a time.  A client that breaks the protocol is
disconnected; a client that follows it never is.
"""

import pytest

from mqttgw.testing import FakeBroker, close_reason
from mqttgw.wire import packets as P

V31, V311 = P.MQTT_31, P.MQTT_311
NAMES = {V31: b"\x00\x06MQIsdp\x03", V311: b"\x00\x04MQTT\x04"}
both_versions = pytest.mark.parametrize("version", [V31, V311], ids=["3.1", "3.1.1"])
fed = pytest.mark.parametrize("split", [False, True], ids=["whole", "byte-by-byte"])


def frame(first, body):
    return bytes((first,)) + P.encode_remaining_length(len(body)) + body


def string(s):
    raw = s.encode() if isinstance(s, str) else s
    return len(raw).to_bytes(2, "big") + raw


def connect_bytes(version, flags=0x02, payload=None, fixed=0x10, client_id="c"):
    """A CONNECT built by hand, so any bit can be set."""
    body = NAMES[version] + bytes((flags,)) + b"\x00\x00"
    body += payload if payload is not None else string(client_id)
    return frame(fixed, body)


def send(client, data, split):
    if split:
        for i in range(len(data)):
            client.send_bytes(data[i : i + 1])
    else:
        client.send_bytes(data)
    return client.received()


def opened(broker, version, split, **fields):
    client = broker.client()
    assert send(client, P.Connect(client_id="c", protocol_level=version,
                                  protocol_name="MQTT" if version == V311 else "MQIsdp",
                                  **fields).encode(), split) == [P.Connack(0)]
    return client


# CONNECT checks, in the order 3.1.1 section 3.1 gives them.


@fed
def test_v311_connect_with_fixed_header_flags_is_closed_without_connack(broker, logged, split):
    client = broker.client()
    assert send(client, connect_bytes(V311, fixed=0x12), split) == []
    assert close_reason(client, logged()) == "CONNECT fixed header flags 0x2 are reserved"


@fed
def test_v31_connect_fixed_header_flags_are_not_checked(broker, split):
    client = broker.client()
    assert send(client, connect_bytes(V31, fixed=0x12), split) == [P.Connack(0)]


@fed
@pytest.mark.parametrize("name", [b"MQTX", b"mqtt", b"HTTP/1.1"])
def test_unknown_protocol_name_is_closed_without_connack(broker, logged, split, name):
    client = broker.client()
    body = string(name) + b"\x04\x02\x00\x00" + string("c")
    assert send(client, frame(0x10, body), split) == []
    assert close_reason(client, logged()) == f"unknown protocol name {name.decode()!r}"


@fed
@pytest.mark.parametrize("name,level", [(b"MQTT", 3), (b"MQTT", 6), (b"MQIsdp", 4)])
def test_known_name_with_unsupported_level_gets_connack_1(broker, logged, split, name, level):
    client = broker.client()
    body = string(name) + bytes((level,)) + b"\x02\x00\x00" + string("c")
    assert send(client, frame(0x10, body), split) == [P.Connack(1)]
    reason = close_reason(client, logged())
    assert reason == f"unsupported protocol {name.decode()!r} level {level}"


@fed
@pytest.mark.parametrize(
    "flags,payload,what",
    [
        (0x03, string("c"), "CONNECT reserved flag is set"),
        (0x02 | 0x08, string("c"), "will QoS or retain set without will flag"),
        (0x02 | 0x20, string("c"), "will QoS or retain set without will flag"),
        (0x02 | 0x40, string("c") + string(b"pw"), "password flag set without user name flag"),
    ],
)
def test_v311_connect_flag_rules_close_without_connack(broker, logged, split, flags, payload, what):
    client = broker.client()
    assert send(client, connect_bytes(V311, flags, payload), split) == [], what
    assert close_reason(client, logged()) == what


@fed
@pytest.mark.parametrize(
    "flags,payload",
    [
        (0x03, string("c")),
        (0x02 | 0x08, string("c")),
        (0x02 | 0x20, string("c")),
        (0x02 | 0x40, string("c") + string(b"pw")),
    ],
)
def test_v31_has_no_such_connect_flag_rules(broker, split, flags, payload):
    client = broker.client()
    assert send(client, connect_bytes(V31, flags, payload), split) == [P.Connack(0)]


@fed
@both_versions
def test_will_qos_3_is_closed_without_connack(broker, logged, split, version):
    client = broker.client()
    payload = string("c") + string("will") + string(b"bye")
    assert send(client, connect_bytes(version, 0x02 | 0x04 | 0x18, payload), split) == []
    assert close_reason(client, logged()) == "will QoS 3 is reserved"


# Strings in MQTT 3.1.1: control characters and non-characters.

BAD_TEXT = ["a\x01b", "a\x1fb", "a\x7fb", "a\x85b", "a\ufdd0b", "a\ufffeb", "a\U0010ffffb"]


@fed
@pytest.mark.parametrize("bad", BAD_TEXT)
@pytest.mark.parametrize("where", ["client id", "user name", "will topic"])
def test_v311_connect_strings_with_control_characters_are_closed(broker, logged, split, bad, where):
    fields = {"client_id": "c"}
    if where == "client id":
        fields["client_id"] = bad
    elif where == "user name":
        fields["username"] = bad
    else:
        fields.update(will_topic=bad, will_message=b"x")
    client = broker.client()
    assert send(client, P.Connect(**fields).encode(), split) == []
    assert close_reason(client, logged()) == f"string contains U+{ord(bad[1]):04X}"


@fed
@pytest.mark.parametrize("bad", BAD_TEXT)
def test_v311_topic_names_and_filters_with_control_characters_are_closed(broker, logged, split, bad):
    for packet in (P.Publish(bad, b"x"), P.Subscribe(1, [(bad, 0)]), P.Unsubscribe(1, [bad])):
        client = opened(broker, V311, False)
        assert send(client, packet.encode(), split) == []
        assert close_reason(client, logged()) == f"string contains U+{ord(bad[1]):04X}"


@fed
@pytest.mark.parametrize("bad", ["a\x01b", "a\x85b", "a\ufffeb"])
def test_v31_strings_may_hold_control_characters(broker, split, bad):
    client = broker.client()
    connect = P.Connect(client_id="c", protocol_name="MQIsdp", protocol_level=V31, username=bad)
    assert send(client, connect.encode(), split) == [P.Connack(0)]
    client.send(P.Subscribe(1, [(bad, 0)]))
    client.send(P.Publish(bad, b"x"))
    assert client.received() == [P.Suback(1, [0]), P.Publish(bad, b"x")]


@fed
def test_control_characters_can_be_allowed_for_legacy_fleets(logged, split):
    broker = FakeBroker(reject_control_characters=False)
    client = broker.client()
    assert send(client, P.Connect(client_id="dev\x01").encode(), split) == [P.Connack(0)]
    client.send(P.Subscribe(1, [("t\x7f", 0)]), P.Publish("t\x7f", b"x"))
    assert client.received() == [P.Suback(1, [0]), P.Publish("t\x7f", b"x")]
    # U+0000 is refused either way (a MUST in 3.1.1).
    client.send(P.Publish("t\x00", b"x"))
    assert close_reason(client, logged()) == "string contains U+0000"


# SUBSCRIBE and UNSUBSCRIBE.


@fed
@both_versions
@pytest.mark.parametrize(
    "body",
    [b"\x82\x02\x00\x01", b"\xa2\x02\x00\x01", b"\x82\x05\x00\x01\x00\x00\x00", b"\xa2\x04\x00\x01\x00\x00"],
    ids=["subscribe-none", "unsubscribe-none", "subscribe-empty-filter", "unsubscribe-empty-filter"],
)
def test_subscribe_or_unsubscribe_without_a_filter_or_with_an_empty_one_closes(
    broker, logged, split, version, body
):
    client = opened(broker, version, False)
    assert send(client, body, split) == []
    packet = "SUBSCRIBE" if body[0] == 0x82 else "UNSUBSCRIBE"
    problem = "no topics" if len(body) == 4 else "a zero-length topic filter"
    assert close_reason(client, logged()) == f"{packet} with {problem}"


@fed
def test_v311_unacceptable_filter_gets_0x80_and_keeps_the_connection(broker, split):
    client = opened(broker, V311, False)
    assert send(client, P.Subscribe(1, [("a/#/b", 0), ("ok", 1)]).encode(), split) == [
        P.Suback(1, [P.SUBACK_FAILURE, 1])
    ]
    assert not client.closed


@fed
def test_v31_unacceptable_filter_closes(broker, logged, split):
    client = opened(broker, V31, False)
    assert send(client, P.Subscribe(1, [("a/#/b", 0)]).encode(), split) == []
    reason = close_reason(client, logged())
    assert reason == "SUBSCRIBE: filter 'a/#/b': '#' must be the whole last level"


# The acknowledgement state machine.


def with_inflight(broker, version, qos):
    """A subscriber with one message in flight to it at ``qos``; its id."""
    sub = opened(broker, version, False)
    sub.send(P.Subscribe(1, [("t", 2)]))
    sub.received()
    other = broker.client(client_id="p", protocol_level=version,
                          protocol_name="MQTT" if version == V311 else "MQIsdp")
    other.received()
    other.send(P.Publish("t", b"x", qos, message_id=9))
    [message] = [p for p in sub.received() if isinstance(p, P.Publish)]
    assert message.qos == qos
    return sub, message.message_id


@fed
@both_versions
@pytest.mark.parametrize(
    "qos,ack,why",
    [
        (1, P.Pubrec, "PUBREC for message {}, in flight at QoS 1"),
        (1, P.Pubcomp, "PUBCOMP for message {}, in flight at QoS 1"),
        (2, P.Puback, "PUBACK for message {}, in flight at QoS 2"),
        (2, P.Pubcomp, "PUBCOMP for message {} before its PUBREC"),
    ],
    ids=["pubrec-for-qos1", "pubcomp-for-qos1", "puback-for-qos2", "pubcomp-before-pubrec"],
)
def test_acknowledgement_that_does_not_fit_the_flow_closes(broker, logged, split, version, qos, ack, why):
    sub, mid = with_inflight(broker, version, qos)
    assert send(sub, ack(mid).encode(), split) == []
    assert close_reason(sub, logged()) == why.format(mid)


@fed
@both_versions
def test_acknowledgements_for_ids_not_in_flight_are_late_duplicates(broker, split, version):
    client = opened(broker, version, False)
    # Ignored, or (PUBREC, PUBREL) answered so the peer can finish.
    assert send(client, P.Puback(77).encode() + P.Pubcomp(78).encode(), split) == []
    assert send(client, P.Pubrec(79).encode(), split) == [P.Pubrel(79)]
    assert send(client, P.Pubrel(80).encode(), split) == [P.Pubcomp(80)]
    assert not client.closed


@fed
@both_versions
def test_qos2_flow_in_order_completes(broker, split, version):
    sub, mid = with_inflight(broker, version, 2)
    assert send(sub, P.Pubrec(mid).encode(), split) == [P.Pubrel(mid)]
    assert send(sub, P.Pubcomp(mid).encode(), split) == []
    assert not sub.closed and broker.router.sessions["c"].inflight == {}


# Order on the wire.


@fed
@both_versions
@pytest.mark.parametrize("qos,ack", [(1, P.Puback), (2, P.Pubrec)])
def test_ack_goes_out_before_the_copy_routed_back_to_the_publisher(broker, split, version, qos, ack):
    client = opened(broker, version, False)
    client.send(P.Subscribe(1, [("self", qos)]))
    client.received()
    got = send(client, P.Publish("self", b"me", qos, message_id=5).encode(), split)
    assert got[0] == ack(5)
    assert isinstance(got[1], P.Publish) and got[1].payload == b"me"


def test_ack_waiting_for_the_store_may_follow_the_routed_copy(tmp_path):
    broker = FakeBroker(store_dir=tmp_path)
    persistent = broker.client(client_id="keeper", clean_session=False)
    persistent.send(P.Subscribe(1, [("self", 1)]))
    persistent.received()
    client = broker.client(client_id="c")
    client.send(P.Subscribe(1, [("self", 1)]))
    client.received()
    client.send(P.Publish("self", b"me", 1, message_id=5))
    # The message is stored for "keeper": the PUBACK waits for the commit.
    assert [type(p) for p in client.received()] == [P.Publish]
    broker.commit()
    assert client.received() == [P.Puback(5)]


# The will on take-over.


def will_case(broker, old_clean, new_clean):
    watcher = broker.client(client_id="w")
    watcher.send(P.Subscribe(1, [("will", 0)]))
    watcher.received()
    broker.client(client_id="dev", clean_session=old_clean, will_topic="will", will_message=b"gone")
    new = broker.client(client_id="dev", clean_session=new_clean)
    assert new.received()[0].return_code == 0
    return [p.payload for p in watcher.received() if isinstance(p, P.Publish)]


@pytest.mark.parametrize("old_clean,new_clean", [(True, True), (True, False), (False, True)])
def test_take_over_publishes_the_will_when_a_clean_session_is_involved(broker, old_clean, new_clean):
    assert will_case(broker, old_clean, new_clean) == [b"gone"]


def test_persistent_session_resumed_by_its_client_publishes_no_will(broker):
    assert will_case(broker, False, False) == []


# MQTT 3.1 client ids longer than 23 characters.


@fed
def test_v31_long_client_id_is_refused_by_default(broker, split):
    client = broker.client()
    assert send(client, connect_bytes(V31, client_id="x" * 24), split) == [P.Connack(2)]


@fed
def test_v31_long_client_ids_can_be_accepted(split):
    broker = FakeBroker(allow_long_client_ids=True)
    client = broker.client()
    assert send(client, connect_bytes(V31, client_id="x" * 64), split) == [P.Connack(0)]


# DISCONNECT followed by data.


@fed
@both_versions
def test_anything_after_disconnect_is_ignored_and_the_will_is_not_published(broker, split, version):
    watcher = broker.client(client_id="w")
    watcher.send(P.Subscribe(1, [("#", 0)]))
    watcher.received()
    client = opened(broker, version, False, will_topic="will", will_message=b"gone")
    after = P.Disconnect().encode() + P.Publish("late", b"x").encode() + b"\xff\xff garbage"
    assert send(client, after, split) == []
    assert client.closed
    client.finish_close()
    assert watcher.received() == []
    assert broker.router.stats.protocol_errors == 0


# How a connection closed for a violation ends, seen from a plain socket.


def test_refused_connect_ends_in_connack_then_an_orderly_eof(gateway_with):
    from bench import hostile

    gw = gateway_with()
    sock = hostile.connection(gw.port)
    # Level 7 gets CONNACK 1; the bytes after it are left unread by the
    # gateway, which once made it reset the connection.
    body = string(b"MQTT") + b"\x07\x02\x00\x00" + string("c")
    sock.sendall(frame(0x10, body) + b"\x30" * 4096)
    data = b""
    while True:
        chunk = sock.recv(4096)  # a reset would raise ConnectionResetError
        if not chunk:
            break
        data += chunk
    assert data == P.Connack(1).encode()
    sock.close()


def test_violation_after_connack_ends_in_an_orderly_eof(gateway_with):
    from bench import hostile

    gw = gateway_with()
    sock, framer = hostile.mqtt_connect(gw.port, "breaker")
    sock.sendall(P.Publish("a/+", b"wildcard in a topic name").encode() + b"more")
    assert sock.recv(4096) == b""
    sock.close()
    gw.wait_for_log("invalid topic name")


def test_peer_that_never_reads_or_closes_is_cut_off_after_the_grace_period(gateway_with):
    import json
    import time
    import urllib.request

    from bench import hostile
    from tests.network import endpoint, free_port

    ws = free_port()
    gw = gateway_with("--ws", endpoint(ws))
    sock = hostile.connection(gw.port)
    sock.setsockopt(hostile.socket.SOL_SOCKET, hostile.socket.SO_RCVBUF, 4096)
    body = string(b"MQTT") + b"\x07\x02\x00\x00" + string("c")
    sock.sendall(frame(0x10, body))
    # It keeps sending and never reads nor closes.
    hostile.send_for(sock, b"\x00" * 65536, 1.0)

    def connections():
        with urllib.request.urlopen(f"http://127.0.0.1:{ws}/healthz", timeout=5) as r:
            return json.load(r)["connections"]

    deadline = time.monotonic() + 10
    while connections() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert connections() == 0
    sock.close()

"""
Wire vectors (the specification's own examples among them) through the
framer, whole and one byte at a time; random bytes; encode/decode round
trips for every packet type.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer, ProtocolViolation


def feed_whole(data, strict=False, max_packet_size=P.MAX_REMAINING_LENGTH + 5):
    return list(Framer(max_packet_size, strict).feed(data))


def feed_bytewise(data, strict=False, max_packet_size=P.MAX_REMAINING_LENGTH + 5):
    framer = Framer(max_packet_size, strict)
    out = []
    for i in range(len(data)):
        out.extend(framer.feed(data[i : i + 1]))
    return out


both_ways = pytest.mark.parametrize("feed", [feed_whole, feed_bytewise])


# The spec's CONNECT example: protocol "MQIsdp" version 3, user name,
# password, clean session, will flag with will QoS 1, keepalive 10.
SPEC_CONNECT = (
    b"\x10\x2d"
    b"\x00\x06MQIsdp\x03\xce\x00\x0a"
    b"\x00\x07Example"
    b"\x00\x04will\x00\x04gone"
    b"\x00\x04user\x00\x04pass"
)

VECTORS = [
    (
        SPEC_CONNECT,
        P.Connect(
            client_id="Example",
            protocol_level=3,
            protocol_name="MQIsdp",
            clean_session=True,
            keepalive=10,
            will_topic="will",
            will_message=b"gone",
            will_qos=1,
            will_retain=False,
            username="user",
            password=b"pass",
        ),
    ),
    (b"\x20\x02\x00\x00", P.Connack(0)),
    (b"\x20\x02\x01\x00", P.Connack(0, session_present=True)),
    # The spec's PUBLISH variable header example: topic "a/b", message id 10.
    (b"\x32\x09\x00\x03a/b\x00\x0ahi", P.Publish("a/b", b"hi", 1, False, False, 10)),
    (b"\x31\x05\x00\x03a/b", P.Publish("a/b", b"", 0, True)),
    (b"\x3d\x07\x00\x03a/b\x00\x01", P.Publish("a/b", b"", 2, True, True, 1)),
    (b"\x40\x02\x00\x0a", P.Puback(10)),
    (b"\x50\x02\x00\x0a", P.Pubrec(10)),
    (b"\x62\x02\x00\x0a", P.Pubrel(10)),
    (b"\x70\x02\x00\x0a", P.Pubcomp(10)),
    # The spec's SUBSCRIBE example: id 10, "a/b" at QoS 1, "c/d" at QoS 2.
    (
        b"\x82\x0e\x00\x0a\x00\x03a/b\x01\x00\x03c/d\x02",
        P.Subscribe(10, [("a/b", 1), ("c/d", 2)]),
    ),
    # The spec's SUBACK example: granted QoS 0 and 2.
    (b"\x90\x04\x00\x0a\x00\x02", P.Suback(10, [0, 2])),
    # The spec's UNSUBSCRIBE example: "a/b" and "c/d".
    (b"\xa2\x0c\x00\x0a\x00\x03a/b\x00\x03c/d", P.Unsubscribe(10, ["a/b", "c/d"])),
    (b"\xb0\x02\x00\x0a", P.Unsuback(10)),
    (b"\xc0\x00", P.Pingreq()),
    (b"\xd0\x00", P.Pingresp()),
    (b"\xe0\x00", P.Disconnect()),
]


@both_ways
@pytest.mark.parametrize("wire,packet", VECTORS, ids=[type(p).__name__ for _, p in VECTORS])
def test_vector_decodes_to_packet(feed, wire, packet):
    assert feed(wire) == [packet]


@pytest.mark.parametrize("wire,packet", VECTORS, ids=[type(p).__name__ for _, p in VECTORS])
def test_packet_encodes_to_vector(wire, packet):
    assert packet.encode() == wire


@both_ways
def test_stream_of_all_vectors_yields_every_packet_in_order(feed):
    wire = b"".join(w for w, _ in VECTORS)
    assert feed(wire) == [p for _, p in VECTORS]


@pytest.mark.parametrize(
    "n,encoded",
    [
        (0, b"\x00"),
        (64, b"\x40"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (321, b"\xc1\x02"),  # the spec's worked example: 65+128, then 2
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2097151, b"\xff\xff\x7f"),
        (2097152, b"\x80\x80\x80\x01"),
        (268435455, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length_encoding_matches_spec_table(n, encoded):
    assert P.encode_remaining_length(n) == encoded


@both_ways
def test_remaining_length_321_frames_a_321_byte_body(feed):
    payload = b"x" * (321 - 5)
    wire = b"\x30\xc1\x02\x00\x03a/b" + payload
    assert feed(wire) == [P.Publish("a/b", payload)]


def test_remaining_length_above_maximum_cannot_be_encoded():
    with pytest.raises(ValueError):
        P.encode_remaining_length(268435456)


@both_ways
def test_fifth_remaining_length_byte_is_a_violation(feed):
    with pytest.raises(ProtocolViolation, match="longer than 4 bytes"):
        feed(b"\x30\xff\xff\xff\xff\x01")


def test_packet_over_maximum_size_is_refused_before_its_body_arrives():
    framer = Framer(max_packet_size=100)
    with pytest.raises(ProtocolViolation, match="exceeds maximum packet size"):
        list(framer.feed(b"\x30\xe5\x00"))  # announces 101 bytes of body


def test_packet_at_maximum_size_is_accepted():
    body = b"\x00\x01a" + b"p" * 95
    wire = b"\x30" + P.encode_remaining_length(len(body)) + body
    assert len(wire) == 100
    assert list(Framer(max_packet_size=100).feed(wire)) == [P.Publish("a", b"p" * 95)]


@both_ways
@pytest.mark.parametrize("first", [b"\x00", b"\xf0"])
def test_reserved_packet_types_are_violations(feed, first):
    with pytest.raises(ProtocolViolation, match="reserved packet type"):
        feed(first + b"\x00")


@both_ways
def test_publish_with_qos_3_is_a_violation(feed):
    with pytest.raises(ProtocolViolation, match="QoS 3"):
        feed(b"\x36\x07\x00\x03a/b\x00\x01")


@both_ways
def test_invalid_utf8_topic_is_a_violation(feed):
    with pytest.raises(ProtocolViolation, match="UTF-8"):
        feed(b"\x30\x05\x00\x03a\xff\xfe")


@both_ways
def test_utf16_surrogate_in_string_is_a_violation(feed):
    # U+D800 encoded as if it were a scalar value is not valid UTF-8.
    with pytest.raises(ProtocolViolation, match="UTF-8"):
        feed(b"\x30\x05\x00\x03\xed\xa0\x80")


def test_nul_in_topic_is_a_violation_for_311_only():
    wire = b"\x30\x05\x00\x03a\x00b"
    with pytest.raises(ProtocolViolation, match="U\\+0000"):
        feed_whole(wire, strict=True)
    assert feed_whole(wire, strict=False)[0].topic == "a\x00b"


def test_multibyte_utf8_topic_length_counts_bytes():
    topic = "ŝensor/温度"
    packet = P.Publish(topic, b"1")
    assert feed_whole(packet.encode()) == [packet]


@both_ways
def test_message_id_zero_is_a_violation(feed):
    with pytest.raises(ProtocolViolation, match="message id 0"):
        feed(b"\x40\x02\x00\x00")


@both_ways
def test_string_running_past_packet_end_is_a_violation(feed):
    with pytest.raises(ProtocolViolation):
        feed(b"\x30\x03\x00\x09a")


@pytest.mark.parametrize(
    "wire",
    [
        b"\x63\x02\x00\x01",  # PUBREL without its QoS 1 bit pattern
        b"\x80\x06\x00\x01\x00\x01a\x00",  # SUBSCRIBE flags 0
        b"\xa0\x05\x00\x01\x00\x01a",  # UNSUBSCRIBE flags 0
        b"\xc1\x00",  # PINGREQ with a flag set
        b"\x4a\x02\x00\x01",  # PUBACK with DUP
        b"\xe8\x00",  # DISCONNECT with DUP
    ],
)
def test_reserved_fixed_header_flags_are_violations_for_311(wire):
    with pytest.raises(ProtocolViolation, match="reserved"):
        feed_whole(wire, strict=True)
    assert len(feed_whole(wire, strict=False)) == 1


def test_dup_on_qos0_publish_is_a_violation_for_311():
    with pytest.raises(ProtocolViolation, match="DUP"):
        feed_whole(b"\x38\x03\x00\x01a", strict=True)


@pytest.mark.parametrize("qos_byte", [b"\x03", b"\x04", b"\x81"])
def test_subscribe_reserved_qos_bits_are_violations_for_311(qos_byte):
    wire = b"\x82\x06\x00\x01\x00\x01a" + qos_byte
    with pytest.raises(ProtocolViolation, match="requested QoS"):
        feed_whole(wire, strict=True)


def test_subscribe_with_no_topics_is_a_violation():
    with pytest.raises(ProtocolViolation, match="no topics"):
        feed_whole(b"\x82\x02\x00\x01")


def test_unsubscribe_with_no_topics_is_a_violation():
    with pytest.raises(ProtocolViolation, match="no topics"):
        feed_whole(b"\xa2\x02\x00\x01")


def test_pingreq_with_a_body_is_a_violation():
    with pytest.raises(ProtocolViolation, match="must be empty"):
        feed_whole(b"\xc0\x01\x00")


def test_connect_reserved_flag_is_a_violation_for_311():
    wire = P.Connect(client_id="c").encode()
    wire = wire[:9] + bytes((wire[9] | 1,)) + wire[10:]
    with pytest.raises(ProtocolViolation, match="reserved flag"):
        feed_whole(wire)


def test_connect_will_qos_3_is_a_violation():
    wire = P.Connect(client_id="c", will_topic="w", will_message=b"", will_qos=1).encode()
    wire = wire[:9] + bytes((wire[9] | 0x18,)) + wire[10:]
    with pytest.raises(ProtocolViolation, match="will QoS 3"):
        feed_whole(wire)


def test_connect_will_retain_without_will_flag_is_a_violation_for_311():
    wire = P.Connect(client_id="c").encode()
    wire = wire[:9] + bytes((wire[9] | 0x20,)) + wire[10:]
    with pytest.raises(ProtocolViolation, match="without will flag"):
        feed_whole(wire)


def test_connect_password_without_user_name_is_a_violation_for_311():
    wire = P.Connect(client_id="c", password=b"pw").encode()
    with pytest.raises(ProtocolViolation, match="without user name"):
        feed_whole(wire)


def test_v31_connect_with_user_name_flag_but_no_string_reads_as_absent():
    # MQTT 3.1 clients exist that set the flags and omit the strings.
    body = b"\x00\x06MQIsdp\x03\xc2\x00\x3c\x00\x01c"
    connect = feed_whole(b"\x10" + bytes((len(body),)) + body)[0]
    assert connect.client_id == "c"
    assert connect.username is None and connect.password is None


def test_v31_connect_with_user_name_but_no_password_string():
    body = b"\x00\x06MQIsdp\x03\xc2\x00\x3c\x00\x01c\x00\x02me"
    connect = feed_whole(b"\x10" + bytes((len(body),)) + body)[0]
    assert connect.username == "me" and connect.password is None


def test_known_protocol_name_with_another_level_decodes_enough_to_refuse():
    body = b"\x00\x04MQTT\x07\x02\x00\x3c\xff"  # the rest may be anything
    connect = feed_whole(b"\x10" + bytes((len(body),)) + body)[0]
    assert (connect.protocol_name, connect.protocol_level) == ("MQTT", 7)


def test_unknown_protocol_name_is_a_violation():
    body = b"\x00\x04ABCD\x04\x02\x00\x3c"
    with pytest.raises(ProtocolViolation, match="unknown protocol name 'ABCD'"):
        feed_whole(b"\x10" + bytes((len(body),)) + body)


def test_strictness_can_change_between_packets_of_one_chunk():
    framer = Framer()
    wire = P.Connect(client_id="c").encode() + b"\xc1\x00"
    packets = framer.feed(wire)
    assert isinstance(next(packets), P.Connect)
    framer.strict = True
    with pytest.raises(ProtocolViolation):
        next(packets)


def test_partial_packet_is_kept_until_complete():
    framer = Framer()
    wire = P.Publish("t", b"payload", 1, message_id=5).encode()
    assert list(framer.feed(wire[:4])) == []
    assert list(framer.feed(wire[4:] + wire[:1])) == [
        P.Publish("t", b"payload", 1, message_id=5)
    ]
    assert list(framer.feed(wire[1:])) == [P.Publish("t", b"payload", 1, message_id=5)]


def test_a_decoded_qos0_publish_is_framed_as_the_bytes_it_came_in():
    wire = P.Publish("t", b"payload").encode()
    packet = next(Framer().feed(wire))
    # The frame a fan-out sends every QoS 0 subscriber.
    assert packet.frame0 == wire
    assert packet.frame(0) is packet.frame0
    # A QoS 1 one keeps its topic's bytes for the copies.
    packet = next(Framer().feed(P.Publish("t", b"payload", 1, message_id=3).encode()))
    assert packet.topic_wire == b"\x00\x01t"


def test_a_watched_publish_encodes_every_copy_and_says_so():
    copies = []
    watched = P.WatchedPublish("t", b"x")
    watched.copied = lambda: copies.append(1)
    plain = P.Publish("t", b"x")
    for _ in range(3):
        assert watched.frame(0) == plain.frame(0)
    assert len(copies) == 3 and watched.frame0 is None
    assert plain.frame0 == plain.frame(0)


# Properties

# Text any MQTT 3.1.1 connection may send: no control characters (Cc) or
# non-characters (among Cn, unassigned).
text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Cn")),
    max_size=20,
)
topic = text.filter(lambda s: len(s.encode()) < 100)
mid = st.integers(1, 65535)
qos = st.integers(0, 2)

packet_strategy = st.one_of(
    st.builds(
        P.Connect,
        client_id=text,
        protocol_level=st.sampled_from([3, 4]),
        clean_session=st.booleans(),
        keepalive=st.integers(0, 65535),
        username=st.none() | text,
    ).flatmap(
        lambda c: st.builds(
            lambda will, password: _with(c, will, password),
            st.none() | st.tuples(topic, st.binary(max_size=20), qos, st.booleans()),
            st.none() | st.binary(max_size=20),
        )
    ),
    st.builds(P.Connack, st.integers(0, 5), st.booleans()),
    st.builds(
        lambda t, p, q, r, d, m: P.Publish(t, p, q, r, d and q > 0, m if q else None),
        topic,
        st.binary(max_size=300),
        qos,
        st.booleans(),
        st.booleans(),
        mid,
    ),
    st.builds(P.Puback, mid),
    st.builds(P.Pubrec, mid),
    st.builds(P.Pubrel, mid),
    st.builds(P.Pubcomp, mid),
    st.builds(P.Subscribe, mid, st.lists(st.tuples(topic.filter(bool), qos), min_size=1, max_size=5)),
    st.builds(P.Suback, mid, st.lists(st.sampled_from([0, 1, 2, 0x80]), max_size=5)),
    st.builds(P.Unsubscribe, mid, st.lists(topic.filter(bool), min_size=1, max_size=5)),
    st.builds(P.Unsuback, mid),
    st.just(P.Pingreq()),
    st.just(P.Pingresp()),
    st.just(P.Disconnect()),
)


def _with(connect, will, password):
    if will is not None:
        (
            connect.will_topic,
            connect.will_message,
            connect.will_qos,
            connect.will_retain,
        ) = will
    if password is not None and connect.username is not None:
        connect.password = password
    connect.protocol_name = P.PROTOCOL_NAMES[connect.protocol_level]
    return connect


@settings(max_examples=400, deadline=None)
@given(st.lists(packet_strategy, min_size=1, max_size=6))
def test_every_packet_type_round_trips_whole_and_split(packets):
    wire = b"".join(p.encode() for p in packets)
    assert feed_whole(wire, strict=True) == packets
    assert feed_bytewise(wire, strict=True) == packets


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_random_bytes_raise_nothing_but_protocol_violation(data, strict):
    try:
        feed_whole(data, strict, max_packet_size=256)
    except ProtocolViolation:
        pass


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([w for w, _ in VECTORS]),
    st.integers(0, 60),
    st.integers(0, 255),
    st.booleans(),
)
def test_mutated_valid_packets_raise_nothing_but_protocol_violation(
    wire, position, value, strict
):
    data = bytearray(wire)
    data[position % len(data)] = value
    try:
        feed_bytewise(bytes(data), strict)
    except ProtocolViolation:
        pass


def test_subscribe_requested_qos_3_is_a_violation_for_v31_too():
    with pytest.raises(ProtocolViolation, match="requested QoS"):
        feed_whole(b"\x82\x06\x00\x01\x00\x01a\x03", strict=False)


def test_v31_tolerates_unused_bits_set_in_fixed_headers():
    # MQTT 3.1 says unused bits "should" be zero; old clients set DUP on acks.
    assert feed_whole(b"\x4a\x02\x00\x01", strict=False) == [P.Puback(1)]


def test_topic_name_over_64k_cannot_be_encoded():
    with pytest.raises(ValueError, match="65535"):
        P.Publish("x" * 65536).encode()


def test_a_packet_fed_byte_by_byte_is_joined_once_when_complete(monkeypatch):
    framer = Framer(1024 * 1024)
    data = P.Publish("t", bytes(256 * 1024)).encode()
    parses = 0
    parse = Framer._packets

    def counting(self):
        nonlocal parses
        parses += 1
        return parse(self)

    monkeypatch.setattr(Framer, "_packets", counting)
    out = []
    for i in range(len(data)):
        out.extend(framer.feed(data[i : i + 1]))
    assert out == [P.Publish("t", bytes(256 * 1024))]
    # Once per byte of the fixed header, then once when the packet is whole.
    assert parses <= 5
    assert framer.buffered == 0


def test_bytes_of_an_incomplete_packet_are_counted_as_buffered():
    framer = Framer()
    data = P.Publish("t", bytes(1000)).encode()
    assert list(framer.feed(data[:10])) == []
    assert list(framer.feed(data[10:500])) == []
    assert framer.buffered == 500
    assert list(framer.feed(data[500:] + data[:3])) == [P.Publish("t", bytes(1000))]
    assert framer.buffered == 3


@pytest.mark.parametrize("first", [0x30, 0x82, 0xC0, 0x20])
def test_a_stream_that_must_open_with_connect_is_refused_on_its_first_byte(first):
    framer = Framer(first_packet=P.CONNECT)
    with pytest.raises(ProtocolViolation, match="first packet is not CONNECT"):
        list(framer.feed(bytes((first,))))


def test_the_first_packet_has_its_own_size_bound():
    framer = Framer(1024 * 1024, first_packet=P.CONNECT, first_packet_size=100)
    with pytest.raises(ProtocolViolation, match="maximum CONNECT size 100"):
        list(framer.feed(P.Connect(client_id="x" * 200).encode()[:4]))
    framer = Framer(1024 * 1024, first_packet=P.CONNECT, first_packet_size=100)
    connect = P.Connect(client_id="ok").encode()
    big = P.Publish("t", bytes(1000)).encode()
    assert [p.packet_type for p in framer.feed(connect + big)] == [P.CONNECT, P.PUBLISH]


@given(st.integers(1, 65535))
def test_acknowledgement_bytes_are_the_packets_encoded(mid):
    assert P.puback_bytes(mid) == P.Puback(mid).encode()
    assert P.pubrec_bytes(mid) == P.Pubrec(mid).encode()
    assert P.pubrel_bytes(mid) == P.Pubrel(mid).encode()
    assert P.pubcomp_bytes(mid) == P.Pubcomp(mid).encode()
    # The same four bytes are a 5.0 success without properties.
    framer = Framer()
    framer.v5 = True
    packets = list(framer.feed(P.puback_bytes(mid) + P.pubrel_bytes(mid)))
    assert packets == [P.Puback(mid, 0, {}), P.Pubrel(mid, 0, {})]


@given(
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00+#"), min_size=1, max_size=40),
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
)
def test_a_decoded_publish_is_delivered_under_its_own_topic(topic, qos, retain, v5):
    """A decoded PUBLISH keeps its topic's wire bytes for its deliveries:
    they are the topic's, at every QoS, over 3.1.1 and 5.0."""
    sent = P.Publish(topic, b"data", qos, retain, message_id=qos and 9, properties={} if v5 else None)
    framer = Framer()
    framer.v5 = v5
    [decoded] = framer.feed(sent.encode())
    fresh = P.Publish(topic, b"data")
    for delivery_qos in (0, 1, 2):
        mid = delivery_qos and 7
        assert decoded.frame(delivery_qos, mid, retain) == fresh.frame(delivery_qos, mid, retain)
        assert decoded.frame5(delivery_qos, mid, retain) == fresh.frame5(delivery_qos, mid, retain)


def _outcome(decode):
    try:
        packet = decode()
    except (ProtocolViolation, IndexError, ValueError):
        # The framer turns a decoder's IndexError or ValueError into a violation.
        return "violation"
    return packet, getattr(packet, "frame0", None), getattr(packet, "topic_wire", None)


def _topic_bytes(raw):
    return len(raw).to_bytes(2, "big") + raw


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from([0, 2, 1, 3, 4, 8, 10]),
    st.one_of(
        # A topic (valid UTF-8, NUL and control characters included, or
        # not UTF-8 at all), a message id (0 among them) and a payload ...
        st.tuples(
            st.one_of(st.text(max_size=12).map(str.encode), st.binary(max_size=12)),
            st.one_of(st.just(0), st.integers(0, 65535)),
            st.binary(max_size=8),
        ).map(lambda t: _topic_bytes(t[0]) + t[1].to_bytes(2, "big") + t[2]),
        # ... a topic alone, the message id missing or cut short ...
        st.tuples(st.text(max_size=12).map(str.encode), st.binary(max_size=1)).map(
            lambda t: _topic_bytes(t[0]) + t[1]
        ),
        # ... or any body at all (a topic length past the end).
        st.binary(max_size=20),
    ),
    st.booleans(),
)
def test_the_framers_own_reading_of_a_publish_agrees_with_the_full_decoder(flags, body, strict):
    # Framer._packets reads a QoS 0/1 PUBLISH without flags itself rather
    # than through _decode_publish: the same packet, or the same refusal.
    from mqttgw.wire.framing import _decode_publish

    wire = bytes([0x30 | flags, len(body)]) + body
    framed = _outcome(lambda: feed_whole(wire, strict)[0])
    full = _outcome(lambda: _decode_publish(flags, wire, 0, 2, len(wire), strict))
    assert framed == full

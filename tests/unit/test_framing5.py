"""
MQTT 5.0 wire layer, property-based: properties and every 5.0 packet
round-trip (whole and split); malformed properties and packets are refused
with the reason code the standard names; arbitrary and mutated bytes make
the decoder raise nothing but ProtocolViolation, and make the server close
only with a DISCONNECT that says why, never with an internal error.
"""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import eventAsText, globalLogPublisher

from mqttgw.testing import FakeBroker
from mqttgw.transports.protocol import ConnectionLimits
from mqttgw.wire import framing
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.encoding import MAX_VARINT, encode_varint
from mqttgw.wire.framing import STRICT_TEXT, Framer, ProtocolViolation, decode_publish5
from mqttgw.wire.properties import (
    BINARY,
    BYTE,
    MAX_USER_PROPERTIES,
    PAIR,
    PROPERTIES,
    U16,
    U32,
    UTF8,
    VARINT,
    WILL,
    PropertyError,
    decode_properties,
    encode_properties,
)

# Where properties may appear: the packet types, and WILL for a CONNECT's
# will properties.
CONTEXTS = sorted({ctx for _, _, packets in PROPERTIES.values() for ctx in packets})
CONTEXT_NAMES = {**P.PACKET_NAMES, WILL: "WILL"}
NAMES = {name: ident for ident, (name, _, _) in PROPERTIES.items()}
TYPES = {name: type_ for name, type_, _ in PROPERTIES.values()}
# Every byte-valued property of 5.0 may only be 0 or 1.
BOOLEAN = sorted(name for name, type_, _ in PROPERTIES.values() if type_ == BYTE)
NOT_ZERO = ("receive_maximum", "maximum_packet_size", "topic_alias", "subscription_identifier")

ANY_SIZE = P.MAX_REMAINING_LENGTH + 5


def allowed(ctx):
    return [name for name, _, packets in PROPERTIES.values() if ctx in packets]


# Strategies

# Text a 5.0 connection (held to STRICT_TEXT) may send: no surrogates,
# control characters or non-characters (Cn covers those and unassigned).
text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Cn")), max_size=12)
topic_text = text.filter(lambda s: len(s.encode()) < 200)
nonempty_text = topic_text.filter(bool)
mid = st.integers(1, 0xFFFF)
reason_code = st.integers(0, 0xFF)
qos = st.integers(0, 2)

VARINT_EDGES = [1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MAX_VARINT]


def value_of(name, ctx):
    """Valid values of property ``name`` in ``ctx``."""
    type_ = TYPES[name]
    low = 1 if name in NOT_ZERO else 0
    if type_ == BYTE:
        return st.integers(0, 1)
    if type_ == U16:
        return st.integers(low, 0xFFFF)
    if type_ == U32:
        return st.integers(low, 0xFFFF_FFFF)
    if type_ == VARINT:
        one = st.sampled_from(VARINT_EDGES) | st.integers(low, MAX_VARINT)
        # A PUBLISH (to a client) may carry several: a list.
        return st.lists(one, min_size=1, max_size=4) if ctx == P.PUBLISH else one
    if type_ == UTF8:
        return text
    if type_ == BINARY:
        return st.binary(max_size=24)
    assert type_ == PAIR
    return st.lists(st.tuples(text, text), min_size=1, max_size=5)


def properties_of(ctx, without=()):
    """Valid property dicts for ``ctx``: any subset of what it allows."""
    return st.fixed_dictionaries(
        {}, optional={name: value_of(name, ctx) for name in allowed(ctx) if name not in without}
    )


# Encoding by hand (to say exactly which bytes are wrong)


def s(value):
    """A length-prefixed string or binary field."""
    if isinstance(value, str):
        value = value.encode()
    return len(value).to_bytes(2, "big") + value


SAMPLE_VALUE = {
    BYTE: b"\x01",
    U16: b"\x00\x01",
    U32: b"\x00\x00\x00\x01",
    VARINT: b"\x01",
    UTF8: s("x"),
    BINARY: s(b"x"),
    PAIR: s("k") + s("v"),
}


def prop(name, value=None):
    """One property's wire form: identifier, then ``value`` (bytes)."""
    return encode_varint(NAMES[name]) + (SAMPLE_VALUE[TYPES[name]] if value is None else value)


def props(*items, length=None):
    """A properties field: its length (``length`` if given), then ``items``."""
    body = b"".join(items)
    return encode_varint(len(body) if length is None else length) + body


def frame(first, body):
    return bytes((first,)) + P.encode_remaining_length(len(body)) + body


_ACK_FIRST = {P.PUBACK: 0x40, P.PUBREC: 0x50, P.PUBREL: 0x62, P.PUBCOMP: 0x70}


def with_props(ctx, raw):
    """A valid packet of ``ctx`` but that ``raw`` is its properties field."""
    if ctx == P.CONNECT:
        return frame(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + raw + s("c"))
    if ctx == WILL:
        return frame(0x10, s("MQTT") + b"\x05\x06\x00\x3c" + b"\x00" + s("c") + raw + s("w") + s(b"m"))
    if ctx == P.CONNACK:
        return frame(0x20, b"\x00\x00" + raw)
    if ctx == P.PUBLISH:
        return frame(0x30, s("t") + raw + b"payload")
    if ctx in _ACK_FIRST:
        return frame(_ACK_FIRST[ctx], b"\x00\x01\x00" + raw)
    if ctx == P.SUBSCRIBE:
        return frame(0x82, b"\x00\x01" + raw + s("t") + b"\x00")
    if ctx == P.SUBACK:
        return frame(0x90, b"\x00\x01" + raw + b"\x00")
    if ctx == P.UNSUBSCRIBE:
        return frame(0xA2, b"\x00\x01" + raw + s("t"))
    if ctx == P.UNSUBACK:
        return frame(0xB0, b"\x00\x01" + raw + b"\x00")
    if ctx == P.DISCONNECT:
        return frame(0xE0, b"\x00" + raw)
    assert ctx == P.AUTH
    return frame(0xF0, b"\x00" + raw)


def framer5(from_client=True):
    """A framer as the server has it after a 5.0 CONNECT."""
    framer = Framer(ANY_SIZE, strict=STRICT_TEXT)
    framer.v5 = True
    framer.from_client = from_client
    return framer


def decode(wire, from_client=True, chunks=None):
    framer = framer5(from_client)
    out = []
    for chunk in chunks if chunks is not None else [wire]:
        out.extend(framer.feed(chunk))
    return out


def decoded_props(wire, ctx, from_client=True):
    [packet] = decode(wire, from_client)
    return packet.will_properties if ctx == WILL else packet.properties


def refusal(wire, from_client=True):
    """The reason code the v5 framer refuses ``wire`` with."""
    with pytest.raises(ProtocolViolation) as e:
        decode(wire, from_client)
    return e.value.reason_code


def code_of(wire, from_client=True):
    """As refusal(), but None for bytes that decode."""
    try:
        decode(wire, from_client)
    except ProtocolViolation as e:
        return e.reason_code
    return None


def sender(ctx):
    """Whether a packet of ``ctx`` comes from a client (for the framer)."""
    return ctx not in (P.CONNACK, P.SUBACK, P.UNSUBACK)


# 1. Round trips: properties


@pytest.mark.parametrize(
    "name, ctx",
    [(name, ctx) for name, _, packets in PROPERTIES.values() for ctx in packets],
    ids=lambda v: CONTEXT_NAMES.get(v, v) if isinstance(v, int) else v,
)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_property_round_trips_in_every_packet_it_is_allowed_in(name, ctx, data):
    value = data.draw(value_of(name, ctx))
    wire = encode_properties({name: value})
    assert decode_properties(wire, 0, len(wire), ctx) == ({name: value}, len(wire))
    # And through the framer, inside a packet of its kind.
    from_client = sender(ctx) and name != "subscription_identifier"
    assert decoded_props(with_props(ctx, wire), ctx, from_client) == {name: value}


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(CONTEXTS).flatmap(lambda ctx: st.tuples(st.just(ctx), properties_of(ctx))),
    st.binary(max_size=8),
    st.binary(max_size=8),
)
def test_any_set_of_allowed_properties_round_trips(ctx_props, before, after):
    ctx, properties = ctx_props
    wire = encode_properties(properties)
    data = before + wire + after
    # The packet ends after ``after``: decoding stops at the properties' own end.
    assert decode_properties(data, len(before), len(data), ctx) == (
        properties,
        len(before) + len(wire),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(text, text), min_size=1, max_size=12), st.data())
def test_user_properties_keep_their_order_and_duplicates(pairs, data):
    # Some pairs again, some names again with other values.
    again = data.draw(st.lists(st.sampled_from(pairs), max_size=6))
    renamed = [(k, v + "'") for k, v in data.draw(st.lists(st.sampled_from(pairs), max_size=3))]
    pairs = data.draw(st.permutations(pairs + again + renamed))
    wire = encode_properties({"user_property": pairs})
    for ctx in (P.CONNECT, WILL, P.PUBLISH, P.PUBACK, P.SUBSCRIBE, P.DISCONNECT, P.AUTH):
        assert decode_properties(wire, 0, len(wire), ctx)[0] == {"user_property": pairs}
        assert decoded_props(with_props(ctx, wire), ctx, sender(ctx))["user_property"] == pairs


def test_exactly_max_user_properties_are_accepted():
    pairs = [(f"k{i}", "v") for i in range(MAX_USER_PROPERTIES)]
    wire = with_props(P.PUBLISH, encode_properties({"user_property": pairs}))
    assert decoded_props(wire, P.PUBLISH) == {"user_property": pairs}


@pytest.mark.parametrize(
    "field, error",
    [
        (b"\x02\x80\x01", "unknown property identifier 0x80"),
        (b"\x02\x81\x00", "variable byte integer is not minimally encoded"),
        (b"\x01\x80", "variable byte integer runs past end of packet"),
    ],
)
def test_a_property_identifier_of_two_bytes_is_read_as_a_variable_byte_integer(field, error):
    with pytest.raises(PropertyError) as e:
        decode_properties(field, 0, len(field), P.PUBLISH)
    assert str(e.value) == error and e.value.reason_code == R.MALFORMED_PACKET


# 1. Round trips: packets

subscription_options = st.builds(
    lambda q, no_local, rap, handling: q | no_local << 2 | rap << 3 | handling << 4,
    qos,
    st.integers(0, 1),
    st.integers(0, 1),
    st.integers(0, 2),
)


def _connect5(client_id, clean, keepalive, properties, will, username, password):
    connect = P.Connect(
        client_id=client_id,
        protocol_level=P.MQTT_5,
        protocol_name="MQTT",
        clean_session=clean,
        keepalive=keepalive,
        username=username,
        password=password,
        properties=properties,
    )
    if will is not None:
        (
            connect.will_topic,
            connect.will_message,
            connect.will_qos,
            connect.will_retain,
            connect.will_properties,
        ) = will
    return connect


connect5 = st.builds(
    _connect5,
    text,
    st.booleans(),
    st.integers(0, 0xFFFF),
    properties_of(P.CONNECT),
    st.none() | st.tuples(nonempty_text, st.binary(max_size=20), qos, st.booleans(), properties_of(WILL)),
    # 5.0 allows a password without a user name.
    st.none() | text,
    st.none() | st.binary(max_size=20),
)


def publish5(from_client):
    return st.builds(
        lambda t, payload, q, retain, dup, m, properties: P.Publish(
            t, payload, q, retain, dup and q > 0, m if q else None, properties
        ),
        topic_text,
        st.binary(max_size=100),
        qos,
        st.booleans(),
        st.booleans(),
        mid,
        # [MQTT-3.3.4-6]: subscription identifiers only to a client.
        properties_of(P.PUBLISH, without=("subscription_identifier",) if from_client else ()),
    )


acks5 = st.one_of(
    *(
        st.builds(cls, mid, reason_code, properties_of(cls.packet_type))
        for cls in (P.Puback, P.Pubrec, P.Pubrel, P.Pubcomp)
    )
)
disconnect5 = st.builds(P.Disconnect, reason_code, properties_of(P.DISCONNECT))
auth5 = st.builds(P.Auth, reason_code, properties_of(P.AUTH))

client_packets5 = st.one_of(
    connect5,
    publish5(from_client=True),
    acks5,
    st.builds(
        P.Subscribe,
        mid,
        st.lists(st.tuples(nonempty_text, subscription_options), min_size=1, max_size=4),
        properties_of(P.SUBSCRIBE),
    ),
    st.builds(
        P.Unsubscribe, mid, st.lists(nonempty_text, min_size=1, max_size=4), properties_of(P.UNSUBSCRIBE)
    ),
    st.just(P.Pingreq()),
    disconnect5,
    auth5,
)

server_packets5 = st.one_of(
    st.builds(P.Connack, reason_code, st.booleans(), properties_of(P.CONNACK)),
    publish5(from_client=False),
    acks5,
    st.builds(P.Suback, mid, st.lists(reason_code, min_size=1, max_size=4), properties_of(P.SUBACK)),
    st.builds(P.Unsuback, mid, st.lists(reason_code, min_size=1, max_size=4), properties_of(P.UNSUBACK)),
    st.just(P.Pingresp()),
    disconnect5,
    auth5,
)


def check_round_trip(packets, from_client):
    wire = b"".join(p.encode() for p in packets)
    assert decode(wire, from_client) == packets
    # One byte at a time.
    assert decode(wire, from_client, [wire[i : i + 1] for i in range(len(wire))]) == packets
    # In two pieces, split at every byte.
    for i in range(len(wire) + 1):
        assert decode(wire, from_client, [wire[:i], wire[i:]]) == packets, i


@settings(max_examples=200, deadline=None)
@given(st.lists(client_packets5, min_size=1, max_size=4))
def test_every_client_packet_round_trips_whole_and_split(packets):
    check_round_trip(packets, from_client=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(server_packets5, min_size=1, max_size=4))
def test_every_server_packet_round_trips_whole_and_split(packets):
    check_round_trip(packets, from_client=False)


def test_a_server_publish_may_carry_several_subscription_identifiers():
    wire = with_props(
        P.PUBLISH,
        props(prop("subscription_identifier", b"\x01"), prop("subscription_identifier", b"\x80\x01")),
    )
    assert decoded_props(wire, P.PUBLISH, from_client=False) == {"subscription_identifier": [1, 128]}


@pytest.mark.parametrize("ctx", CONTEXTS, ids=CONTEXT_NAMES.get)
def test_hand_built_packets_decode(ctx):
    # The builder the refusal tests below rely on makes valid packets.
    assert decoded_props(with_props(ctx, b"\x00"), ctx, sender(ctx)) == {}
    for name in allowed(ctx):
        if name == "subscription_identifier" and ctx == P.PUBLISH:
            continue
        value = decoded_props(with_props(ctx, props(prop(name))), ctx, sender(ctx))
        assert list(value) == [name]


# 2. Refusals, with the reason code the standard names


@pytest.mark.parametrize("ctx", CONTEXTS, ids=CONTEXT_NAMES.get)
def test_a_property_not_allowed_in_the_packet_is_malformed(ctx):
    wrong = {}
    for name, _, packets in PROPERTIES.values():
        if ctx not in packets:
            code = code_of(with_props(ctx, props(prop(name))), sender(ctx))
            if code != R.MALFORMED_PACKET:
                wrong[name] = code
    assert wrong == {}


@pytest.mark.parametrize("ctx", CONTEXTS, ids=CONTEXT_NAMES.get)
def test_a_property_twice_is_a_protocol_error(ctx):
    wrong = {}
    for name in allowed(ctx):
        if TYPES[name] == PAIR or (name == "subscription_identifier" and ctx == P.PUBLISH):
            continue
        code = code_of(with_props(ctx, props(prop(name), prop(name))), sender(ctx))
        if code != R.PROTOCOL_ERROR:
            wrong[name] = code
    assert wrong == {}


UNKNOWN_IDS = [i for i in range(0x80) if i not in PROPERTIES] + [0x80, 0x126, 0x3FFF, MAX_VARINT]


@pytest.mark.parametrize("ctx", CONTEXTS, ids=CONTEXT_NAMES.get)
def test_an_unknown_property_identifier_is_malformed(ctx):
    wrong = {}
    for ident in UNKNOWN_IDS:
        wire = with_props(ctx, props(encode_varint(ident) + b"\x00\x01x"))
        code = code_of(wire, sender(ctx))
        if code != R.MALFORMED_PACKET:
            wrong[hex(ident)] = code
    assert wrong == {}


def _body(field):
    """A properties field without its length."""
    return field[P.decode_remaining_length(field, 0)[0] :]


@pytest.mark.parametrize("ctx", CONTEXTS, ids=CONTEXT_NAMES.get)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_a_property_length_past_the_end_of_the_packet_is_malformed(ctx, data):
    properties = data.draw(properties_of(ctx, without=("subscription_identifier",)))
    field = encode_properties(properties)
    # The properties' body, without the length before it.
    inner = _body(field)
    wire = with_props(ctx, props(inner, length=len(inner) + data.draw(st.integers(100, 100_000))))
    assert refusal(wire, sender(ctx)) == R.MALFORMED_PACKET


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_property_cut_by_the_property_length_is_malformed(name):
    # Each property's value cut short by the properties length, though the
    # packet goes on (payload, topic filters, ...) past it.
    ident, type_ = NAMES[name], TYPES[name]
    value = {VARINT: b"\xc8\x01", U32: b"\x00\x01\x00\x01"}.get(type_, SAMPLE_VALUE[type_])
    ctx = PROPERTIES[ident][2][0]
    item = prop(name, value)
    wrong = {}
    for cut in range(1, len(value) + 1):
        for tail in (b"", b"\x00\x01t\x00"):
            # The length says where the properties end; the bytes after are
            # the rest of the packet, not the rest of the property.
            wire = with_props(ctx, encode_varint(len(item) - cut) + item + tail)
            code = code_of(wire, sender(ctx))
            if code != R.MALFORMED_PACKET:
                wrong[(cut, tail)] = code
    assert wrong == {}


NO_PAYLOAD = [P.CONNACK, P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP, P.DISCONNECT, P.AUTH]


@pytest.mark.parametrize("ctx", NO_PAYLOAD, ids=CONTEXT_NAMES.get)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_bytes_after_the_properties_of_a_packet_without_payload_are_malformed(ctx, data):
    # These packets end with their properties (MQTT 5.0 sections 3.2.3,
    # 3.4.3, 3.5.3, 3.6.3, 3.7.3, 3.14.3, 3.15.3: "no Payload").
    field = encode_properties(data.draw(properties_of(ctx)))
    extra = data.draw(st.binary(min_size=1, max_size=8))
    assert refusal(with_props(ctx, field + extra), sender(ctx)) == R.MALFORMED_PACKET


def varint_in(n, size):
    """``n`` as a Variable Byte Integer of ``size`` bytes (minimal or not)."""
    out = bytearray()
    for i in range(size):
        out.append((n >> 7 * i) & 0x7F | (0x80 if i < size - 1 else 0))
    assert n < 128**size
    return bytes(out)


def minimal_size(n):
    return len(encode_varint(n))


def padded(n):
    """Non-minimal encodings of ``n``."""
    return st.integers(minimal_size(n) + 1, 4).map(lambda size: varint_in(n, size))


@settings(max_examples=100, deadline=None)
@given(st.booleans(), st.integers(2, 4), st.sampled_from(CONTEXTS))
def test_a_non_minimal_property_length_is_malformed(empty, size, ctx):
    # The length of no properties, or of one, in two to four bytes.
    item = b"" if empty else prop("user_property")
    length = varint_in(len(item), size)
    assert refusal(with_props(ctx, length + item), sender(ctx)) == R.MALFORMED_PACKET


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(NAMES)).flatmap(lambda name: st.tuples(st.just(name), padded(NAMES[name]))))
def test_a_non_minimal_property_identifier_is_malformed(name_ident):
    name, ident = name_ident
    ctx = PROPERTIES[NAMES[name]][2][0]
    item = ident + SAMPLE_VALUE[TYPES[name]]
    assert refusal(with_props(ctx, props(item)), sender(ctx)) == R.MALFORMED_PACKET


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 128**3 - 1).flatmap(padded), st.booleans())
def test_a_non_minimal_subscription_identifier_is_malformed(value, in_publish):
    item = prop("subscription_identifier", value)
    if in_publish:
        code = refusal(with_props(P.PUBLISH, props(item)), from_client=False)
    else:
        code = refusal(with_props(P.SUBSCRIBE, props(item)))
    assert code == R.MALFORMED_PACKET


@pytest.mark.parametrize(
    "wire",
    [
        b"\xc0\x80\x00",  # PINGREQ, remaining length 0 in two bytes
        b"\xe0\x80\x80\x00",  # DISCONNECT, in three
        b"\x30\x87\x00" + s("t") + b"\x00pay",  # PUBLISH, 7 in two bytes
    ],
    ids=["pingreq", "disconnect", "publish"],
)
def test_a_non_minimal_remaining_length_is_malformed(wire):
    # [MQTT-1.5.5-1] holds for every Variable Byte Integer, Remaining
    # Length among them.
    assert refusal(wire) == R.MALFORMED_PACKET


BOOLEAN_PLACES = [(name, ctx) for name in BOOLEAN for ctx in PROPERTIES[NAMES[name]][2]]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(BOOLEAN_PLACES), st.integers(2, 0xFF))
def test_a_boolean_property_above_1_is_a_protocol_error(place, value):
    name, ctx = place
    wire = with_props(ctx, props(prop(name, bytes((value,)))))
    assert refusal(wire, sender(ctx)) == R.PROTOCOL_ERROR


ZERO_PLACES = [
    (name, ctx, from_client)
    for name in NOT_ZERO
    for ctx in PROPERTIES[NAMES[name]][2]
    for from_client in ((True, False) if ctx == P.PUBLISH else (sender(ctx),))
]


@pytest.mark.parametrize(
    "name, ctx, from_client",
    ZERO_PLACES,
    ids=[f"{n}-{CONTEXT_NAMES[c]}-{'client' if f else 'server'}" for n, c, f in ZERO_PLACES],
)
def test_a_zero_that_may_not_be_zero_is_a_protocol_error(name, ctx, from_client):
    zero = {U16: b"\x00\x00", U32: b"\x00\x00\x00\x00", VARINT: b"\x00"}[TYPES[name]]
    assert refusal(with_props(ctx, props(prop(name, zero))), from_client) == R.PROTOCOL_ERROR


def subscribe(*options, properties=b"\x00"):
    body = b"".join(s(f"t{i}") + bytes((o,)) for i, o in enumerate(options))
    return frame(0x82, b"\x00\x01" + properties + body)


@settings(max_examples=150, deadline=None)
@given(subscription_options, st.integers(1, 3), st.booleans())
def test_subscribe_options_with_reserved_bits_are_malformed(options, reserved, second):
    bad = options | reserved << 6
    wire = subscribe(0, bad) if second else subscribe(bad)
    assert refusal(wire) == R.MALFORMED_PACKET


@settings(max_examples=50, deadline=None)
@given(qos, st.integers(0, 3), st.booleans())
def test_subscribe_retain_handling_3_is_a_protocol_error(q, flags, second):
    bad = q | flags << 2 | 0x30
    wire = subscribe(0, bad) if second else subscribe(bad)
    assert refusal(wire) == R.PROTOCOL_ERROR


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 3), st.integers(0, 2), st.booleans())
def test_subscribe_maximum_qos_3_is_a_protocol_error(flags, handling, second):
    # MQTT 5.0 section 3.8.3.1: "It is a Protocol Error if the Maximum QoS
    # field has the value 3."
    bad = 3 | flags << 2 | handling << 4
    wire = subscribe(0, bad) if second else subscribe(bad)
    assert refusal(wire) == R.PROTOCOL_ERROR


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, MAX_VARINT), min_size=1, max_size=3), qos)
def test_a_client_publish_with_a_subscription_identifier_is_a_protocol_error(ids, q):
    # [MQTT-3.3.4-6]
    publish = P.Publish("t", b"x", q, message_id=1 if q else None, properties={"subscription_identifier": ids})
    wire = publish.encode()
    assert refusal(wire, from_client=True) == R.PROTOCOL_ERROR
    assert decode(wire, from_client=False) == [publish]


STRING_PLACES = [
    (name, part)
    for name, type_, _ in PROPERTIES.values()
    if type_ in (UTF8, PAIR)
    for part in ((0, 1) if type_ == PAIR else (0,))
]
# Byte sequences Python's (and the standard's) UTF-8 refuses: a stray
# continuation byte, overlong forms (of U+0000 among them), a surrogate, a
# code point past U+10FFFF, a sequence cut short, bytes never in UTF-8.
INVALID_UTF8 = [
    b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80",
    b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\xfe", b"\xff",
]


def string_property(name, part, raw):
    if TYPES[name] == PAIR:
        return prop(name, s(raw) + s("v") if part == 0 else s("k") + s(raw))
    return prop(name, s(raw))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(STRING_PLACES), text, st.sampled_from(INVALID_UTF8), text)
def test_invalid_utf8_in_a_string_property_is_malformed(place, before, bad, after):
    name, part = place
    raw = before.encode() + bad + after.encode()
    wrong = {}
    for ctx in PROPERTIES[NAMES[name]][2]:
        code = refusal(with_props(ctx, props(string_property(name, part, raw))), sender(ctx))
        if code != R.MALFORMED_PACKET:
            wrong[CONTEXT_NAMES[ctx]] = code
    assert wrong == {}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(STRING_PLACES), text, text)
def test_u0000_in_a_string_property_is_malformed(place, before, after):
    name, part = place
    raw = (before + "\x00" + after).encode()
    ctx = PROPERTIES[NAMES[name]][2][0]
    assert refusal(with_props(ctx, props(string_property(name, part, raw))), sender(ctx)) == (
        R.MALFORMED_PACKET
    )
    # decode_properties, whatever else it is told about text, refuses it too.
    field = props(string_property(name, part, raw))
    with pytest.raises(PropertyError) as e:
        decode_properties(field, 0, len(field), ctx)
    assert e.value.reason_code == R.MALFORMED_PACKET


@pytest.mark.parametrize("ctx", [P.CONNECT, WILL, P.PUBLISH, P.SUBSCRIBE, P.DISCONNECT])
def test_more_than_max_user_properties_are_refused(ctx):
    pairs = [(f"k{i}", "v") for i in range(MAX_USER_PROPERTIES + 1)]
    wire = with_props(ctx, encode_properties({"user_property": pairs}))
    assert refusal(wire, sender(ctx)) >= 0x80


# 3. The decoder, fuzzed


def outcome(data, from_client, chunks):
    """The packets decoded, and the reason code of the violation if any."""
    framer = framer5(from_client)
    framer.max_packet_size = 4096
    out = []
    try:
        for chunk in chunks:
            out.extend(framer.feed(chunk))
    except ProtocolViolation as e:
        assert e.reason_code >= 0x80, e
        return out, e.reason_code
    return out, None


def split(data, cuts):
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


# Random bytes, and random bodies behind a fixed header that fits them (so
# that they reach the decoder of each packet type).
framed_garbage = st.builds(frame, st.integers(0, 0xFF), st.binary(max_size=60))
garbage = st.lists(st.binary(min_size=1, max_size=80) | framed_garbage, min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=8), st.booleans())
def test_random_bytes_raise_nothing_but_protocol_violation(data, cuts, from_client):
    whole = outcome(data, from_client, [data])
    # However the bytes are split, the same packets and the same refusal.
    assert outcome(data, from_client, split(data, cuts)) == whole


@settings(max_examples=300, deadline=None)
@given(garbage, st.lists(st.integers(0, 300), max_size=8), st.booleans())
def test_random_packet_bodies_raise_nothing_but_protocol_violation(pieces, cuts, from_client):
    data = b"".join(pieces)
    whole = outcome(data, from_client, [data])
    assert outcome(data, from_client, split(data, cuts)) == whole


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CONTEXTS), st.binary(max_size=200), st.binary(max_size=4))
def test_random_properties_raise_nothing_but_property_error(ctx, data, length):
    # With and without a plausible length first.
    for field in (data, encode_varint(len(data)) + data, length + data):
        try:
            decode_properties(field, 0, len(field), ctx)
        except PropertyError as e:
            assert e.reason_code >= 0x80


mutation = st.tuples(st.integers(0, 10**6), st.integers(0, 0xFF))


@settings(max_examples=300, deadline=None)
@given(
    st.booleans().flatmap(
        lambda from_client: st.tuples(
            st.just(from_client),
            st.lists(client_packets5 if from_client else server_packets5, min_size=1, max_size=3),
        )
    ),
    st.lists(mutation, min_size=1, max_size=3),
    st.integers(0, 10**6),
    st.lists(st.integers(0, 10**6), max_size=4),
)
def test_mutated_valid_packets_raise_nothing_but_protocol_violation(sent, mutations, cut, cuts):
    from_client, packets = sent
    data = bytearray(b"".join(p.encode() for p in packets))
    for position, value in mutations:
        data[position % len(data)] = value
    # Sometimes cut short too.
    data = bytes(data[: len(data) - cut % 4]) if cut % 3 == 0 else bytes(data)
    whole = outcome(data, from_client, [data])
    assert outcome(data, from_client, split(data, cuts)) == whole


# 4. The server, fuzzed

CLIENT_SAMPLES = [
    P.Subscribe(1, [("a/#", 0x01), ("$share/g/b/+", 0x22)], {"subscription_identifier": 7}),
    P.Subscribe(2, [("a/b", 0x2E)], {"user_property": [("k", "v"), ("k", "w")]}),
    P.Publish("a/b", b"hello", 0, properties={
        "message_expiry_interval": 10, "content_type": "text/plain", "user_property": [("x", "y")],
    }),
    P.Publish("a/c", b"x", 1, message_id=2, properties={"topic_alias": 3, "payload_format_indicator": 1}),
    P.Publish("", b"y", 0, properties={"topic_alias": 3}),
    P.Publish("a/d", b"z", 2, message_id=3, properties={"response_topic": "r/s", "correlation_data": b"c"}),
    P.Pubrel(3, 0, {}),
    P.Puback(9, 0x10, {"reason_string": "why"}),
    P.Pubrec(9, 0x80, {}),
    P.Pubcomp(9, 0, {}),
    P.Unsubscribe(4, ["a/#", "x"], {"user_property": [("k", "v")]}),
    P.Pingreq(),
    P.Disconnect(0, {"session_expiry_interval": 0, "reason_string": "bye"}),
    P.Auth(0x18, {"authentication_method": "m", "authentication_data": b"d"}),
]


def client_disconnected(data):
    """Whether the server, reading ``data``, comes to a client DISCONNECT
    before anything it cannot decode."""
    framer = Framer(ConnectionLimits().max_packet_size, strict=STRICT_TEXT)
    framer.v5 = True
    seen = []
    try:
        for packet in framer.feed(data):
            seen.append(packet)
    except ProtocolViolation:
        pass
    return any(isinstance(p, P.Disconnect) for p in seen)


def check_server(chunks):
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        broker = FakeBroker()
        client = broker.client(P.Connect("c", protocol_level=5, properties={}))
        [connack] = client.received()
        assert isinstance(connack, P.Connack) and connack.return_code == 0
        received = []
        sent = b""
        for chunk in chunks:
            if client.closed:
                break
            client.send_bytes(chunk)
            sent += chunk
            received.extend(client.received())
        closed = client.closed
        client.finish_close()
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [eventAsText(e, includeTimestamp=False) for e in events]
    bad = [line for line in lines if "Traceback" in line or "internal error" in line]
    assert bad == [], bad
    if closed and not client_disconnected(sent):
        assert received, "closed without a DISCONNECT"
        last = received[-1]
        assert isinstance(last, P.Disconnect), received
        assert last.reason_code >= 0x80, last


@settings(max_examples=300, deadline=None)
@given(garbage)
def test_the_server_survives_random_bytes_after_connect(chunks):
    check_server(chunks)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(CLIENT_SAMPLES), min_size=1, max_size=6),
    mutation,
    st.lists(st.integers(0, 10**6), max_size=3),
)
def test_the_server_survives_valid_packets_with_one_byte_mutated(packets, change, cuts):
    data = bytearray(b"".join(p.encode() for p in packets))
    position, value = change
    data[position % len(data)] = value
    check_server(split(bytes(data), cuts))


@settings(max_examples=200, deadline=None)
@given(st.lists(client_packets5.filter(lambda p: not isinstance(p, P.Connect)), min_size=1, max_size=4))
def test_the_server_survives_generated_valid_packets(packets):
    check_server([b"".join(p.encode() for p in packets)])


@pytest.mark.parametrize(
    "wire, code",
    [
        (with_props(P.PUBLISH, props(prop("topic_alias"), prop("topic_alias"))), R.PROTOCOL_ERROR),
        (with_props(P.PUBLISH, props(prop("session_expiry_interval"))), R.MALFORMED_PACKET),
        (with_props(P.PUBLISH, props(prop("subscription_identifier"))), R.PROTOCOL_ERROR),
        (with_props(P.PUBLISH, props(prop("topic_alias", b"\x00\x00"))), R.PROTOCOL_ERROR),
        (subscribe(0x30), R.PROTOCOL_ERROR),
        (subscribe(0x40), R.MALFORMED_PACKET),
        (with_props(P.PUBLISH, props(prop("content_type", s(b"\xc0\x80")))), R.MALFORMED_PACKET),
    ],
    ids=["duplicate", "not-allowed", "subscription-id", "alias-0", "retain-handling-3",
         "reserved-bits", "overlong-nul"],
)
def test_the_server_disconnects_with_the_framers_reason_code(wire, code):
    broker = FakeBroker()
    client = broker.client(P.Connect("c", protocol_level=5, properties={}))
    client.received()
    client.send_bytes(wire)
    received = client.received()
    assert client.closed
    assert isinstance(received[-1], P.Disconnect) and received[-1].reason_code == code, received


# The inline decoding of the usual 5.0 PUBLISH (no properties, or a topic
# alias alone) against decode_publish5, which decodes every other one: the
# same packet or the same reason code, for any bytes.


def _decoded(result):
    if isinstance(result, tuple):
        return result
    return [(p.topic, p.payload, p.qos, p.retain, p.dup, p.message_id, p.properties) for p in result]


def _inline(packet, strict):
    framer = Framer(strict=strict)
    framer.v5 = True
    try:
        return _decoded(list(framer.feed(packet)))
    except ProtocolViolation as e:
        return ("violation", e.reason_code)


def _reference(packet, strict):
    pos, length = P.decode_remaining_length(packet, 1)
    try:
        return _decoded([decode_publish5(packet[0] & 15, packet, 0, pos, pos + length, strict, True)])
    except ProtocolViolation as e:
        return ("violation", e.reason_code)
    except (IndexError, ValueError, struct.error):
        return ("violation", R.MALFORMED_PACKET)


_PUBLISH_PARTS = st.tuples(
    st.integers(0, 15),
    st.sampled_from([b"", b"a", b"a/b", "é".encode(), b"\xff", b"\xed\xa0\x80", b"a\x00", b"a\x01", b"+", b"\xc2\x85"]),
    st.integers(-1, 1),
    st.sampled_from([b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\xff\xff"]),
    st.sampled_from([
        b"", b"\x00", b"\x03\x23\x00\x01", b"\x03\x23\x00\x00", b"\x03\x23\x00", b"\x03\x23", b"\x03",
        b"\x03\x01\x00\x01", b"\x02\x01\x01", b"\x05\x23\x00\x01\x01\x01", b"\x83\x00\x23\x00\x01",
        b"\x04\x23\x00\x01\x00", b"\x02\x0b\x05", b"\x01",
    ]),
    st.binary(max_size=4),
    st.sampled_from([framing.LAX, framing.STRICT, framing.STRICT_TEXT]),
)


@settings(max_examples=3000, deadline=None)
@given(_PUBLISH_PARTS)
def test_the_inline_5_0_publish_decoding_agrees_with_decode_publish5(parts):
    flags, topic, delta, mid, props, payload, strict = parts
    body = struct.pack(">H", max(0, len(topic) + delta)) + topic + mid + props + payload
    packet = bytes((0x30 | flags,)) + P.encode_remaining_length(len(body)) + body
    assert _inline(packet, strict) == _reference(packet, strict)


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 15), st.binary(max_size=12), st.sampled_from([framing.LAX, framing.STRICT, framing.STRICT_TEXT]))
def test_the_inline_5_0_publish_decoding_agrees_on_any_bytes(flags, body, strict):
    packet = bytes((0x30 | flags,)) + P.encode_remaining_length(len(body)) + body
    assert _inline(packet, strict) == _reference(packet, strict)

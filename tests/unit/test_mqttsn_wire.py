"""
The MQTT-SN 1.2 codec: vectors for every message written from the
specification's layouts (section 5.4), both forms of the Length field,
bytes an MQTT-SN client nobody here wrote sent, encode/decode round trips
for every message, and random or damaged datagrams, which decode or raise
MalformedDatagram and nothing else.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttgw.wire import mqttsn as S
from mqttgw.wire.mqttsn import constants as C

NORMAL, PREDEFINED, SHORT = C.NORMAL_TOPIC_ID, C.PREDEFINED_TOPIC_ID, C.SHORT_TOPIC_NAME

# (datagram, message): each written field by field from the layout in
# the specification, Length first (it counts itself), then MsgType.
SPEC_VECTORS = [
    # ADVERTISE: GwId 1, Duration 900 s.
    ("05 00 01 0384", S.Advertise(1, 900)),
    # SEARCHGW: Radius 1.
    ("03 01 01", S.SearchGw(1)),
    # GWINFO from a gateway: GwId alone; from a client: with GwAdd.
    ("03 02 05", S.GwInfo(5)),
    ("07 02 05 c0a80102", S.GwInfo(5, b"\xc0\xa8\x01\x02")),
    # CONNECT: Flags (CleanSession), ProtocolId, Duration 60, ClientId.
    ("0d 04 04 01 003c" + b"sensor1".hex(), S.Connect("sensor1", 60)),
    # ... with Will and without CleanSession.
    (
        "0d 04 08 01 003c" + b"sensor1".hex(),
        S.Connect("sensor1", 60, clean_session=False, will=True),
    ),
    # ... from a client speaking another protocol: kept for the refusal.
    ("07 04 04 02 0000 61", S.Connect("a", 0, protocol_id=2)),
    ("03 05 00", S.Connack(C.ACCEPTED)),
    ("03 05 01", S.Connack(C.REJECTED_CONGESTION)),
    ("03 05 03", S.Connack(C.REJECTED_NOT_SUPPORTED)),
    ("02 06", S.WillTopicReq()),
    # WILLTOPIC: Flags (QoS 1, Retain), WillTopic.
    ("06 07 30" + b"w/t".hex(), S.WillTopic("w/t", qos=1, retain=True)),
    # An empty WILLTOPIC (two octets) deletes the will.
    ("02 07", S.WillTopic()),
    ("02 08", S.WillMsgReq()),
    ("06 09" + b"gone".hex(), S.WillMsg(b"gone")),
    # REGISTER from a client: TopicId 0x0000, MsgId 1, TopicName.
    ("0b 0a 0000 0001" + b"a/b/c".hex(), S.Register(0, 1, "a/b/c")),
    # ... from the gateway, with the id it will publish under.
    ("0b 0a 0007 0009" + b"a/b/c".hex(), S.Register(7, 9, "a/b/c")),
    # REGACK: TopicId, MsgId, ReturnCode.
    ("07 0b 0001 0001 00", S.Regack(1, 1)),
    ("07 0b 0000 0001 02", S.Regack(0, 1, C.REJECTED_INVALID_TOPIC_ID)),
    # PUBLISH: Flags, TopicId, MsgId, Data.  QoS 1 on a normal topic id.
    ("09 0c 20 0001 0002" + b"hi".hex(), S.Publish(1, b"hi", qos=1, message_id=2)),
    # QoS -1 (0b11) on a pre-defined topic id.
    ("08 0c 61 0005 0000 78", S.Publish(5, b"x", qos=-1, topic_id_type=PREDEFINED)),
    # QoS 0, Retain, on the short topic name "ab".
    (
        "0a 0c 12 6162 0000" + b"abc".hex(),
        S.Publish(0x6162, b"abc", retain=True, topic_id_type=SHORT),
    ),
    # DUP, QoS 2, no data.
    ("07 0c c0 0003 0004", S.Publish(3, b"", qos=2, dup=True, message_id=4)),
    ("07 0d 0001 0002 00", S.Puback(1, 2)),
    ("07 0d 0001 0002 02", S.Puback(1, 2, C.REJECTED_INVALID_TOPIC_ID)),
    ("04 0e 0002", S.Pubcomp(2)),
    ("04 0f 0002", S.Pubrec(2)),
    ("04 10 0002", S.Pubrel(2)),
    # SUBSCRIBE: Flags, MsgId, TopicName (a filter with a wildcard) ...
    ("08 12 20 0003" + b"a/+".hex(), S.Subscribe(3, "a/+", qos=1)),
    # ... a pre-defined TopicId, QoS 2, DUP ...
    ("07 12 c1 0003 0005", S.Subscribe(3, topic_id=5, topic_id_type=PREDEFINED, qos=2, dup=True)),
    # ... a short topic name.
    ("07 12 02 0003 6162", S.Subscribe(3, "ab", topic_id_type=SHORT)),
    # SUBACK: Flags (granted QoS), TopicId, MsgId, ReturnCode.
    ("08 13 20 0001 0003 00", S.Suback(1, 3, qos=1)),
    ("08 13 00 0000 0003 00", S.Suback(0, 3)),
    ("08 13 00 0000 0003 03", S.Suback(0, 3, C.REJECTED_NOT_SUPPORTED)),
    # UNSUBSCRIBE: Flags (TopicIdType), MsgId, TopicName or TopicId.
    ("08 14 00 0004" + b"a/+".hex(), S.Unsubscribe(4, "a/+")),
    ("07 14 01 0004 0005", S.Unsubscribe(4, topic_id=5, topic_id_type=PREDEFINED)),
    ("07 14 02 0004 6162", S.Unsubscribe(4, "ab", topic_id_type=SHORT)),
    ("04 15 0004", S.Unsuback(4)),
    ("02 16", S.Pingreq()),
    # PINGREQ with a ClientId: a sleeping client awake.
    ("09 16" + b"sensor1".hex(), S.Pingreq("sensor1")),
    ("02 17", S.Pingresp()),
    ("02 18", S.Disconnect()),
    # DISCONNECT with a Duration: asleep for 300 s.
    ("04 18 012c", S.Disconnect(300)),
    ("06 1a 40" + b"w/t".hex(), S.WillTopicUpd("w/t", qos=2)),
    ("02 1a", S.WillTopicUpd()),
    ("03 1b 00", S.WillTopicResp()),
    ("06 1c" + b"bye!".hex(), S.WillMsgUpd(b"bye!")),
    ("03 1d 01", S.WillMsgResp(C.REJECTED_CONGESTION)),
    # Encapsulated message: Length (to the end of the Wireless Node Id),
    # 0xFE, Ctrl (Radius), Wireless Node Id, then the message.
    ("05 fe 00 abcd 02 16", S.Encapsulated(S.Pingreq(), b"\xab\xcd")),
    (
        "04 fe 01 07 0d 04 04 01 003c" + b"sensor1".hex(),
        S.Encapsulated(S.Connect("sensor1", 60), b"\x07", 1),
    ),
    ("03 fe 00 04 18 000a", S.Encapsulated(S.Disconnect(10))),
]


def wire(spaced_hex):
    return bytes.fromhex(spaced_hex.replace(" ", ""))


@pytest.mark.parametrize("hexdata, message", SPEC_VECTORS)
def test_each_message_of_the_specification_decodes_from_its_layout(hexdata, message):
    assert S.decode(wire(hexdata)) == message


@pytest.mark.parametrize("hexdata, message", SPEC_VECTORS)
def test_each_message_encodes_to_its_layout(hexdata, message):
    assert message.encode() == wire(hexdata)


def test_every_message_type_of_the_specification_has_a_vector():
    kinds = {message.message_type for _, message in SPEC_VECTORS}
    assert kinds == set(C.MESSAGE_NAMES)
    assert set(S.MESSAGE_CLASSES) | {C.ENCAPSULATED_MESSAGE} == set(C.MESSAGE_NAMES)


# Datagrams the PyPI client mqtt-sn-12 (1.0.9) sent, recorded on a UDP
# socket: its tools' CONNECT, REGISTER, QoS 0, 1, 2 and -1 PUBLISH, will,
# sleep, and a payload long enough for the three-byte Length.
CLIENT_DATAGRAMS = [
    ("0a040401001e70756231", S.Connect("pub1", 30)),
    ("0a040c0100026c696231", S.Connect("lib1", 2, will=True)),
    ("0b072077696c6c2f6c6962", S.WillTopic("will/lib", qos=1)),
    ("0509627965", S.WillMsg(b"bye")),
    ("120a0000000173656e736f72732f74656d70", S.Register(0, 1, "sensors/temp")),
    ("0b0c000001000032312e35", S.Publish(1, b"21.5")),
    ("0b0c200001000232312e35", S.Publish(1, b"21.5", qos=1, message_id=2)),
    ("0b0c400001000232312e35", S.Publish(1, b"21.5", qos=2, message_id=2)),
    ("04100002", S.Pubrel(2)),
    ("0c0c61000500006d696e7573", S.Publish(5, b"minus", qos=-1, topic_id_type=PREDEFINED)),
    ("0c0c62616200006d696e7573", S.Publish(0x6162, b"minus", qos=-1, topic_id_type=SHORT)),
    ("0e1220000173656e736f72732f2b", S.Subscribe(1, "sensors/+", qos=1)),
    ("07122100020004", S.Subscribe(2, topic_id=4, topic_id_type=PREDEFINED, qos=1)),
    ("07140200056162", S.Unsubscribe(5, "ab", topic_id_type=SHORT)),
    ("070b0002006700", S.Regack(2, 0x67)),
    ("0b1a2077696c6c2f6e6577", S.WillTopicUpd("will/new", qos=1)),
    ("061c62796532", S.WillMsgUpd(b"bye2")),
    ("030101", S.SearchGw(1)),
    ("0216", S.Pingreq()),
    ("04180014", S.Disconnect(20)),
    ("0218", S.Disconnect()),
    ("0101350c0000070000" + "78" * 300, S.Publish(7, b"x" * 300)),
]


@pytest.mark.parametrize("hexdata, message", CLIENT_DATAGRAMS)
def test_what_the_mqtt_sn_12_client_sends_decodes(hexdata, message):
    assert S.decode(bytes.fromhex(hexdata)) == message


def test_a_message_up_to_255_bytes_has_the_one_byte_length():
    message = S.Publish(1, b"x" * (255 - 7))
    data = message.encode()
    assert (len(data), data[0], data[1]) == (255, 255, C.PUBLISH)
    assert S.decode(data) == message


def test_a_message_of_256_bytes_or_more_has_0x01_and_two_bytes():
    # 249 data bytes make 256 in the short form, so the long form's 258.
    message = S.Publish(1, b"x" * 249)
    data = message.encode()
    assert data[:4] == b"\x01\x01\x02\x0c"
    assert len(data) == 258
    assert S.decode(data) == message


def test_the_longest_message_has_65535_bytes_and_one_more_cannot_be_encoded():
    longest = S.Publish(1, b"x" * (65535 - 9))
    data = longest.encode()
    assert data[:3] == b"\x01\xff\xff" and len(data) == 65535
    assert S.decode(data) == longest
    with pytest.raises(ValueError, match="longer than 65535"):
        S.Publish(1, b"x" * (65535 - 8)).encode()


@pytest.mark.parametrize(
    "long_form, message",
    [
        ("01 0004 16", S.Pingreq()),
        ("01 0006 18 012c", S.Disconnect(300)),
        ("01 0009 0d 0001 0002 00", S.Puback(1, 2)),
    ],
)
def test_the_three_byte_length_is_accepted_for_short_messages_too(long_form, message):
    # "Messages with lengths smaller than 256 octets may use the shorter
    # 1-octet format": may, so the longer one is no error.
    assert S.decode(wire(long_form)) == message


MALFORMED = [
    ("", "datagram of 0 bytes, shorter than any MQTT-SN message"),
    ("02", "datagram of 1 byte, shorter than any"),
    ("00 16", "Length field says 0, shorter than its own header"),
    ("03 16", "Length field says 3 bytes, the datagram has 2"),
    ("09 0c 20 0001 0002 68", "Length field says 9 bytes, the datagram has 8"),
    ("02 16 00", "Length field says 2 bytes, the datagram has 3"),
    ("01 00", "three-byte Length field truncated"),
    ("01 0003 16", "Length field says 3, shorter than its own header"),
    ("01 0009 16", "Length field says 9 bytes, the datagram has 4"),
    ("02 03", "unknown MsgType 0x03"),
    ("02 11", "unknown MsgType 0x11"),
    ("02 19", "unknown MsgType 0x19"),
    ("02 1e", "unknown MsgType 0x1e"),
    ("02 ff", "unknown MsgType 0xff"),
    ("04 00 01 03", "ADVERTISE: 2 bytes after the header, 3 expected"),
    ("02 01", "SEARCHGW: 0 bytes after the header, 1 expected"),
    ("02 02", "GWINFO: 0 bytes after the header, at least 1 expected"),
    ("05 04 04 01 00", "CONNECT: 3 bytes after the header, at least 4 expected"),
    ("07 04 04 01 003c ff", "CONNECT ClientId is not UTF-8"),
    ("04 05 00 00", "CONNACK: 2 bytes after the header, 1 expected"),
    ("03 06 00", "WILLTOPICREQ: 1 byte after the header, 0 expected"),
    ("05 07 00 c3 28", "WILLTOPIC WillTopic is not UTF-8"),
    ("05 0a 0000 00", "REGISTER: 3 bytes after the header, at least 4 expected"),
    ("07 0a 0000 0001 ff", "REGISTER TopicName is not UTF-8"),
    ("06 0b 0001 0001", "REGACK: 4 bytes after the header, 5 expected"),
    ("06 0c 00 0001 00", "PUBLISH: 4 bytes after the header, at least 5 expected"),
    ("07 0c 03 0001 0000", "PUBLISH: TopicIdType 0b11 is reserved"),
    ("08 0d 0001 0001 00 00", "PUBACK: 6 bytes after the header, 5 expected"),
    ("03 0e 00", "PUBCOMP: 1 byte after the header, 2 expected"),
    ("05 0f 0001 00", "PUBREC: 3 bytes after the header, 2 expected"),
    ("02 10", "PUBREL: 0 bytes after the header, 2 expected"),
    ("04 12 00 00", "SUBSCRIBE: 2 bytes after the header, at least 3 expected"),
    ("07 12 03 0001 0005", "SUBSCRIBE: TopicIdType 0b11 is reserved"),
    ("08 12 01 0001 000500", "SUBSCRIBE: a pre-defined topic id of 3 bytes, 2 expected"),
    ("06 12 02 0001 61", "SUBSCRIBE: a short topic name of 1 byte, 2 expected"),
    ("07 12 02 0001 ffff", "SUBSCRIBE TopicName is not UTF-8"),
    ("07 13 00 0001 0001", "SUBACK: 5 bytes after the header, 6 expected"),
    ("04 14 00 00", "UNSUBSCRIBE: 2 bytes after the header, at least 3 expected"),
    ("05 14 01 0001", "UNSUBSCRIBE: a pre-defined topic id of 0 bytes, 2 expected"),
    ("05 15 0001 00", "UNSUBACK: 3 bytes after the header, 2 expected"),
    ("03 16 ff", "PINGREQ ClientId is not UTF-8"),
    ("03 17 00", "PINGRESP: 1 byte after the header, 0 expected"),
    ("03 18 00", "DISCONNECT: 1 byte after the header, 2 expected"),
    ("05 18 000a 00", "DISCONNECT: 3 bytes after the header, 2 expected"),
    ("04 1b 00 00", "WILLTOPICRESP: 2 bytes after the header, 1 expected"),
    ("02 1d", "WILLMSGRESP: 0 bytes after the header, 1 expected"),
    ("02 fe", "Encapsulated message: Length 2, at least 3 expected"),
    ("03 fe 00", "Length 3 leaves no message in a datagram of 3 bytes"),
    ("05 fe 00 abcd", "Length 5 leaves no message"),
    ("03 fe 00 02", "datagram of 1 byte, shorter than any"),
    ("03 fe 00 03 16", "Length field says 3 bytes, the datagram has 2"),
    ("03 fe 00 02 ee", "unknown MsgType 0xee"),
    # One forwarder's message inside another's, and an Encapsulated
    # message with a three-byte Length: neither is in the specification.
    ("03 fe 00 03 fe 00", "Encapsulated message with a three-byte Length or inside another"),
    ("01 0004 fe", "Encapsulated message with a three-byte Length or inside another"),
]


@pytest.mark.parametrize("hexdata, says", MALFORMED)
def test_a_malformed_datagram_raises_malformed_datagram_naming_what_is_wrong(hexdata, says):
    with pytest.raises(S.MalformedDatagram) as raised:
        S.decode(wire(hexdata))
    assert says in str(raised.value)


def test_a_datagram_over_the_limit_is_refused_before_it_is_read():
    data = S.Publish(1, b"x" * 1000).encode()
    with pytest.raises(S.MalformedDatagram, match="datagram of 1009 bytes, more than 512"):
        S.decode(data, max_length=512)
    assert S.decode(data, max_length=1009) == S.Publish(1, b"x" * 1000)
    with pytest.raises(S.MalformedDatagram, match="more than 65535"):
        S.decode(b"\x01\xff\xff\x0c" + bytes(65536))


def test_flag_bits_a_message_does_not_use_are_ignored():
    # CONNECT uses Will and CleanSession alone; SUBACK the QoS alone;
    # UNSUBSCRIBE the TopicIdType alone; the Ctrl byte its Radius alone.
    assert S.decode(wire("07 04 f7 01 003c 61")) == S.Connect("a", 60, True, False)
    assert S.decode(wire("08 13 bf 0001 0003 00")) == S.Suback(1, 3, qos=1)
    assert S.decode(wire("07 14 fd 0004 0005")) == S.Unsubscribe(4, None, 5, PREDEFINED)
    assert S.decode(wire("03 fe fe 02 16")) == S.Encapsulated(S.Pingreq(), b"", 2)


def test_qos_minus_one_is_the_flags_0b11_both_ways():
    assert S.Publish(1, qos=-1).encode()[2] & C.QOS_BITS == 0x60
    assert S.decode(wire("07 0c 60 0001 0000")).qos == -1


def test_a_bytearray_or_memoryview_datagram_decodes_as_bytes_do():
    data = S.Publish(1, b"hi", qos=1, message_id=2).encode()
    assert S.decode(bytearray(data)) == S.decode(memoryview(data)) == S.decode(data)
    assert type(S.decode(bytearray(data)).data) is bytes


def test_short_topic_names_are_the_two_octets_of_the_topic_id():
    assert S.short_topic_id("ab") == 0x6162
    assert S.short_topic_name(0x6162) == "ab"
    # Two octets, not two characters.
    assert S.short_topic_name(S.short_topic_id("é")) == "é"
    with pytest.raises(ValueError, match="not two octets"):
        S.short_topic_id("abc")
    with pytest.raises(S.MalformedDatagram, match="short topic name is not UTF-8"):
        S.short_topic_name(0xFFFF)


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: S.Publish(70000), ValueError),
        (lambda: S.Publish("1"), TypeError),
        (lambda: S.Publish(1, "text"), TypeError),
        (lambda: S.Publish(1, qos=3), ValueError),
        (lambda: S.Publish(1, topic_id_type=3), ValueError),
        (lambda: S.Connect("c", -1), ValueError),
        (lambda: S.Subscribe(1), ValueError),
        (lambda: S.Subscribe(1, "a/b", topic_id=3), ValueError),
        (lambda: S.Subscribe(1, "abc", topic_id_type=SHORT), ValueError),
        (lambda: S.Unsubscribe(1, "a/b", topic_id_type=PREDEFINED), ValueError),
        (lambda: S.WillTopic(None, qos=1), ValueError),
        (lambda: S.Encapsulated(S.Encapsulated(S.Pingreq())), TypeError),
        (lambda: S.Encapsulated(b"\x02\x16"), TypeError),
        (lambda: S.Encapsulated(S.Pingreq(), b"x" * 253), ValueError),
        (lambda: S.Encapsulated(S.Pingreq(), radius=4), ValueError),
    ],
)
def test_a_message_with_a_field_out_of_its_range_cannot_be_made(make, error):
    with pytest.raises(error):
        make()


def test_messages_are_values():
    message = S.Publish(1, b"hi")
    with pytest.raises(AttributeError):
        message.qos = 1
    assert {message, S.Publish(1, b"hi")} == {message}
    assert S.Puback(1, 2) != S.Regack(1, 2)


# Every message, with fields over their whole ranges.

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
texts = st.text(max_size=40)
data = st.binary(max_size=600)
qos = st.sampled_from(C.QOS_LEVELS)
short_names = st.text(min_size=1, max_size=2).filter(lambda s: len(s.encode("utf-8")) == 2)
optional_u16 = st.none() | u16


def topic_choice(cls, **extra):
    named = st.builds(cls, message_id=u16, topic_name=texts, topic_id_type=st.just(NORMAL), **extra)
    short = st.builds(
        cls, message_id=u16, topic_name=short_names, topic_id_type=st.just(SHORT), **extra
    )
    predefined = st.builds(
        cls, message_id=u16, topic_id=u16, topic_id_type=st.just(PREDEFINED), **extra
    )
    return named | short | predefined


def will_topic(cls):
    return st.just(cls()) | st.builds(cls, texts, qos, st.booleans())


MESSAGES = st.one_of(
    st.builds(S.Advertise, u8, u16),
    st.builds(S.SearchGw, u8),
    st.builds(S.GwInfo, u8, st.binary(max_size=20)),
    st.builds(S.Connect, texts, u16, st.booleans(), st.booleans(), u8),
    st.builds(S.Connack, u8),
    st.just(S.WillTopicReq()),
    will_topic(S.WillTopic),
    st.just(S.WillMsgReq()),
    st.builds(S.WillMsg, data),
    st.builds(S.Register, u16, u16, texts),
    st.builds(S.Regack, u16, u16, u8),
    st.builds(
        S.Publish, u16, data, qos, st.booleans(), st.booleans(), u16,
        st.sampled_from(C.TOPIC_ID_TYPES),
    ),
    st.builds(S.Puback, u16, u16, u8),
    st.builds(S.Pubcomp, u16),
    st.builds(S.Pubrec, u16),
    st.builds(S.Pubrel, u16),
    topic_choice(S.Subscribe, qos=qos, dup=st.booleans()),
    st.builds(S.Suback, u16, u16, u8, qos),
    topic_choice(S.Unsubscribe),
    st.builds(S.Unsuback, u16),
    st.builds(S.Pingreq, st.none() | st.text(min_size=1, max_size=30)),
    st.just(S.Pingresp()),
    st.builds(S.Disconnect, optional_u16),
    will_topic(S.WillTopicUpd),
    st.builds(S.WillTopicResp, u8),
    st.builds(S.WillMsgUpd, data),
    st.builds(S.WillMsgResp, u8),
)

EVERY_MESSAGE = MESSAGES | st.builds(
    S.Encapsulated, MESSAGES, st.binary(max_size=S.packets.MAX_WIRELESS_NODE_ID), st.integers(0, 3)
)


@settings(max_examples=600)
@given(EVERY_MESSAGE)
def test_every_message_decodes_to_what_was_encoded(message):
    assert S.decode(message.encode()) == message


@settings(max_examples=300)
@given(MESSAGES)
def test_the_length_field_counts_the_whole_datagram_in_the_form_its_size_needs(message):
    data = message.encode()
    if len(data) <= 255:
        assert data[0] == len(data) and data[1] == message.message_type
    else:
        assert data[0] == 1 and int.from_bytes(data[1:3], "big") == len(data)
        assert data[3] == message.message_type


def decodes_or_is_malformed(data):
    try:
        message = S.decode(data)
    except S.MalformedDatagram as e:
        assert str(e)
        return None
    # What decodes is a message that encodes again, to the same message.
    assert S.decode(message.encode()) == message
    return message


@settings(max_examples=1500)
@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_malformed_datagram_and_nothing_else(data):
    decodes_or_is_malformed(data)


@settings(max_examples=1500)
@given(st.sampled_from([1, 2, 3, 4, 8, 0x20, 0xFF]), st.integers(0, 255), st.binary(max_size=80))
def test_bytes_behind_any_length_and_type_decode_or_raise_malformed_datagram(length, kind, rest):
    # Random bytes rarely hold a Length that agrees with their size; these
    # do more often, so the bodies of every type are reached.
    body = bytes((kind,)) + rest
    decodes_or_is_malformed(bytes((len(body) + 1,)) + body)
    decodes_or_is_malformed(bytes((length,)) + body)
    decodes_or_is_malformed(b"\x01" + (len(body) + 3).to_bytes(2, "big") + body)


@settings(max_examples=1000)
@given(EVERY_MESSAGE, st.data())
def test_a_damaged_message_decodes_or_raises_malformed_datagram(message, draw):
    data = bytearray(message.encode())
    damage = draw.draw(st.sampled_from(["truncate", "flip", "extend", "relength"]))
    where = draw.draw(st.integers(0, len(data) - 1))
    if damage == "truncate":
        del data[where:]
    elif damage == "flip":
        data[where] ^= draw.draw(st.integers(1, 255))
    elif damage == "extend":
        data[where:where] = draw.draw(st.binary(min_size=1, max_size=4))
    else:
        data[0] = draw.draw(st.integers(0, 255))
    decodes_or_is_malformed(bytes(data))


def fields_of(message):
    """What ``publish_fields`` gives for a decoded PUBLISH."""
    return (message.qos, message.retain, message.topic_id_type, message.topic_id, message.message_id, message.data)


@settings(max_examples=1500)
@given(st.integers(0, 255), st.binary(min_size=5, max_size=252))
def test_publish_fields_reads_what_decode_reads_or_leaves_the_datagram_to_it(flags, rest):
    # A PUBLISH's header with any flags, and random bytes with any Length.
    for data in (bytes((len(rest) + 3, C.PUBLISH, flags)) + rest, bytes((rest[0], C.PUBLISH, flags)) + rest[1:]):
        fields = S.publish_fields(data)
        if fields is None:
            continue
        assert fields == fields_of(S.decode(data))


@given(MESSAGES)
def test_publish_fields_reads_every_short_publish_and_nothing_else(message):
    data = message.encode()
    fields = S.publish_fields(data)
    if isinstance(message, S.Publish) and len(data) <= 255:
        assert fields == fields_of(message)
    else:
        assert fields is None


def test_publish_fields_leaves_the_reserved_topic_id_type_to_decode():
    data = bytes.fromhex("0a 0c 03 0001 0002") + b"abc"
    assert S.publish_fields(data) is None
    with pytest.raises(S.MalformedDatagram, match="reserved"):
        S.decode(data)

"""
The Sparkplug B codec (mqttgw/wire/sparkplug): every datatype of the
specification round-trips through bytes, and bytes that are not a payload
are refused with MalformedPayload, never another exception.
"""

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttgw.wire.sparkplug import payload as P
from mqttgw.wire.sparkplug import topics
from mqttgw.wire.sparkplug.payload import DataType as T

INTS = {
    T.Int8: st.integers(-(2**7), 2**7 - 1),
    T.Int16: st.integers(-(2**15), 2**15 - 1),
    T.Int32: st.integers(-(2**31), 2**31 - 1),
    T.Int64: st.integers(-(2**63), 2**63 - 1),
    T.UInt8: st.integers(0, 2**8 - 1),
    T.UInt16: st.integers(0, 2**16 - 1),
    T.UInt32: st.integers(0, 2**32 - 1),
    T.UInt64: st.integers(0, 2**64 - 1),
    T.DateTime: st.integers(0, 2**63 - 1),
}
FLOAT32 = st.floats(width=32, allow_nan=False)
TEXT = st.text(max_size=20)
SCALARS = {
    **INTS,
    T.Float: FLOAT32,
    T.Double: st.floats(allow_nan=False),
    T.Boolean: st.booleans(),
    T.String: TEXT,
    T.Text: TEXT,
    T.UUID: st.uuids().map(str),
    T.Bytes: st.binary(max_size=40),
    T.File: st.binary(max_size=40),
}
ARRAYS = {
    T.Int8Array: st.lists(INTS[T.Int8], max_size=8),
    T.Int16Array: st.lists(INTS[T.Int16], max_size=8),
    T.Int32Array: st.lists(INTS[T.Int32], max_size=8),
    T.Int64Array: st.lists(INTS[T.Int64], max_size=8),
    T.UInt8Array: st.lists(INTS[T.UInt8], max_size=8),
    T.UInt16Array: st.lists(INTS[T.UInt16], max_size=8),
    T.UInt32Array: st.lists(INTS[T.UInt32], max_size=8),
    T.UInt64Array: st.lists(INTS[T.UInt64], max_size=8),
    T.FloatArray: st.lists(FLOAT32, max_size=8),
    T.DoubleArray: st.lists(st.floats(allow_nan=False), max_size=8),
    T.BooleanArray: st.lists(st.booleans(), max_size=20),
    T.StringArray: st.lists(st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=8), max_size=6),
    T.DateTimeArray: st.lists(st.integers(0, 2**63 - 1), max_size=8),
}
# What a DataSet column and a property may hold.
DATASET_TYPES = [t for t in SCALARS if t not in (T.Bytes, T.File, T.UUID)]
PROPERTY_TYPES = DATASET_TYPES


def roundtrip(payload):
    return P.decode(P.encode(payload))


def same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("datatype", list(SCALARS) + list(ARRAYS), ids=lambda t: t.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_each_scalar_and_array_datatype_roundtrips(datatype, data):
    value = data.draw(SCALARS[datatype] if datatype in SCALARS else ARRAYS[datatype])
    payload = P.Payload(timestamp=1, seq=0)
    metric = payload.metrics.add(name="m", alias=7, datatype=datatype)
    P.set_value(metric, datatype, value)
    back = roundtrip(payload).metrics[0]
    assert back.datatype == datatype and back.alias == 7
    assert same(P.value_of(back, back.datatype), value)


@pytest.mark.parametrize("datatype", list(SCALARS) + list(ARRAYS), ids=lambda t: t.name)
def test_is_null_roundtrips_for_every_datatype(datatype):
    payload = P.Payload()
    metric = payload.metrics.add(name="m", datatype=datatype)
    P.set_value(metric, datatype, None)
    back = roundtrip(payload).metrics[0]
    assert back.is_null and P.value_of(back, back.datatype) is None


@st.composite
def datasets(draw):
    types = draw(st.lists(st.sampled_from(DATASET_TYPES), min_size=1, max_size=4))
    columns = [f"c{i}" for i in range(len(types))]
    rows = draw(
        st.lists(st.tuples(*[st.one_of(st.none(), SCALARS[t]) for t in types]).map(list), max_size=4)
    )
    return columns, types, rows


@settings(max_examples=60, deadline=None)
@given(datasets())
def test_dataset_roundtrips(ds):
    columns, types, rows = ds
    payload = P.Payload()
    metric = payload.metrics.add(name="table", datatype=T.DataSet)
    P.set_value(metric, T.DataSet, P.dataset(columns, types, rows))
    back = roundtrip(payload).metrics[0].dataset_value
    assert list(back.columns) == columns and list(back.types) == types
    assert back.num_of_columns == len(columns)
    assert same(P.dataset_rows(back), rows)




@st.composite
def property_set_items(draw, depth=2):
    items = []
    for key in draw(st.lists(TEXT, max_size=3)):
        choice = draw(st.integers(0, 2 if depth else 0))
        if choice == 0:
            datatype = draw(st.sampled_from(PROPERTY_TYPES))
            items.append((key, datatype, draw(st.one_of(st.none(), SCALARS[datatype]))))
        elif choice == 1:
            items.append((key, T.PropertySet, P.property_set(draw(property_set_items(depth - 1)))))
        else:
            nested = draw(st.lists(property_set_items(depth - 1), max_size=2))
            value = P.PropertySetList(propertyset=[P.property_set(i) for i in nested])
            items.append((key, T.PropertySetList, value))
    return items


@settings(max_examples=60, deadline=None)
@given(property_set_items())
def test_propertyset_and_propertysetlist_roundtrip(items):
    payload = P.Payload()
    metric = payload.metrics.add(name="m", datatype=T.Int32, int_value=1)
    metric.properties.CopyFrom(P.property_set(items))
    back = P.property_items(roundtrip(payload).metrics[0].properties)
    assert [(k, t) for k, t, _ in back] == [(k, t) for k, t, _ in items]
    for (_, t, want), (_, _, got) in zip(items, back):
        if t in (T.PropertySet, T.PropertySetList):
            assert got == want
        else:
            assert same(got, want)


@st.composite
def templates(draw, depth=1):
    template = P.Template(
        version=draw(TEXT), template_ref=draw(TEXT), is_definition=draw(st.booleans())
    )
    for i, datatype in enumerate(draw(st.lists(st.sampled_from(list(SCALARS)), max_size=3))):
        member = template.metrics.add(name=f"m{i}", datatype=datatype)
        P.set_value(member, datatype, draw(st.one_of(st.none(), SCALARS[datatype])))
    if depth and draw(st.booleans()):
        member = template.metrics.add(name="nested", datatype=T.Template)
        P.set_value(member, T.Template, draw(templates(depth - 1)))
    for i, datatype in enumerate(draw(st.lists(st.sampled_from(PROPERTY_TYPES), max_size=3))):
        parameter = template.parameters.add(name=f"p{i}", type=datatype)
        P.set_value(parameter, datatype, draw(SCALARS[datatype]))
    return template


@settings(max_examples=60, deadline=None)
@given(templates())
def test_template_roundtrips(template):
    payload = P.Payload()
    metric = payload.metrics.add(name="t", datatype=T.Template)
    P.set_value(metric, T.Template, template)
    back = P.value_of(roundtrip(payload).metrics[0], T.Template)
    assert back == template
    for want, got in zip(template.parameters, back.parameters):
        assert same(P.value_of(got, got.type), P.value_of(want, want.type))


def test_metadata_and_payload_fields_roundtrip():
    payload = P.Payload(timestamp=2**63, seq=255, uuid="u", body=b"\x00\x01")
    metric = payload.metrics.add(
        name="f", alias=2**64 - 1, timestamp=3, datatype=T.File,
        is_historical=True, is_transient=True, bytes_value=b"data",
    )
    metric.metadata.CopyFrom(P.MetaData(
        is_multi_part=True, content_type="text/plain", size=4, seq=1,
        file_name="a.txt", file_type="txt", md5="x", description="d",
    ))
    assert roundtrip(payload) == payload


def test_unknown_fields_and_extensions_are_kept():
    """Third-party extensions (field 6 on) pass through a decode and encode."""
    extra = bytes([6 << 3, 42])  # field 6, varint 42
    data = P.encode(P.Payload(seq=1)) + extra
    assert P.encode(P.decode(data)).endswith(extra)


def test_signed_values_are_twos_complement_as_other_implementations_write_them():
    # Eclipse Tahu writes an Int32 of -1 into the uint32 int_value as 0xFFFFFFFF.
    metric = P.Metric(datatype=T.Int32, int_value=0xFFFFFFFF)
    assert P.value_of(metric, T.Int32) == -1
    metric = P.Metric(datatype=T.Int64, long_value=2**64 - 2)
    assert P.value_of(metric, T.Int64) == -2


def test_uint32_is_read_from_either_integer_field():
    # The specification allows int_value or long_value for UInt32; Eclipse
    # Tahu's JavaScript client writes long_value.
    assert P.value_of(P.Metric(datatype=T.UInt32, long_value=2**32 - 1), T.UInt32) == 2**32 - 1
    assert P.value_of(P.Metric(datatype=T.UInt32, int_value=7), T.UInt32) == 7
    assert P.value_of(P.Metric(datatype=T.UInt32, is_null=True, long_value=3), T.UInt32) is None


def test_arrays_follow_the_specifications_examples():
    # Sparkplug 3.0, 6.4.17: Int16Array [-30000, 30000] and the BooleanArray example.
    assert P.pack_array(T.Int16Array, [-30000, 30000]) == bytes([0xD0, 0x8A, 0x30, 0x75])
    bits = [False, False, True, True, False, True, False, False, True, True, False, True]
    assert P.pack_array(T.BooleanArray, bits) == bytes([0x0C, 0, 0, 0, 0x34, 0xD0])
    assert P.pack_array(T.StringArray, ["ABC", "hello"]) == b"ABC\0hello\0"


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # a truncated varint key
        b"\x12\x05ab",  # metrics: 5 bytes promised, 2 given
        b"\x0f",  # wire type 7 does not exist
        b"\x12" + b"\xff" * 11,  # a length varint over 10 bytes
        b"\x12\x01\x0f",  # a metric holding a field of wire type 7
        bytes([0x12, 0x02, 0x0A, 0x80]),  # a metric name cut short
    ],
)
def test_malformed_payloads_are_refused_with_one_exception_type(data):
    with pytest.raises(P.MalformedPayload):
        P.decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_are_refused(data):
    try:
        P.decode(data)
    except P.MalformedPayload:
        pass


@pytest.mark.parametrize(
    "datatype, data",
    [
        (T.Int32Array, b"\x01\x02\x03"),  # not a whole number of values
        (T.BooleanArray, b"\x09\x00\x00\x00\xff"),  # 9 booleans in one byte
        (T.BooleanArray, b"\x01"),  # no count
        (T.StringArray, b"abc"),  # unterminated
        (T.StringArray, b"\xff\x00"),  # not UTF-8
    ],
)
def test_malformed_arrays_are_refused(datatype, data):
    with pytest.raises(P.MalformedPayload):
        P.value_of(P.Metric(datatype=datatype, bytes_value=data), datatype)


def test_deep_nesting_is_refused_not_a_crash():
    # Templates nested far past protobuf's recursion limit.
    inner = b""
    for _ in range(200):
        metric = b"\x92\x01" + _varint(len(inner)) + inner  # template_value (18)
        inner = b"\x12" + _varint(len(metric)) + metric  # Template.metrics (2)
    with pytest.raises(P.MalformedPayload):
        P.decode(inner)  # Payload.metrics (2) holds the outermost


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.parametrize(
    "topic, parsed",
    [
        ("spBv1.0/G/NBIRTH/E", ("G", "NBIRTH", "E", None)),
        ("spBv1.0/G/DDATA/E/D", ("G", "DDATA", "E", "D")),
        ("spBv1.0/STATE/host", None),
        ("spBv1.0/G/DBIRTH/E", None),
        ("spBv1.0/G/NBIRTH/E/D", None),
        ("spBv1.0//NBIRTH/E", None),
        ("spAv1.0/G/NBIRTH/E", None),
        ("spBv1.0/G/NBIRTH/E/D/x", None),
    ],
)
def test_topics_parse(topic, parsed):
    assert topics.parse(topic) == parsed


def test_the_codec_float_is_single_precision():
    metric = P.Metric(datatype=T.Float)
    P.set_value(metric, T.Float, 0.1)
    assert P.value_of(P.Metric.FromString(metric.SerializeToString()), T.Float) == struct.unpack(
        "<f", struct.pack("<f", 0.1)
    )[0]

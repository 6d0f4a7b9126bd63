"""
The aware server's seq reader against the codec: the same seq as protobuf
reads for every payload the codec writes, and malformed top levels refused
with MalformedSeq, never another exception.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttgw.wire.sparkplug import payload as codec
from mqttgw.wire.sparkplug.seq import MalformedSeq, seq_of


def build(seq, metrics, timestamp, uuid, body):
    p = codec.Payload()
    if timestamp is not None:
        p.timestamp = timestamp
    for name, value in metrics:
        m = p.metrics.add()
        m.name = name
        m.datatype = codec.DataType.Int64
        m.long_value = value
    if seq is not None:
        p.seq = seq
    if uuid is not None:
        p.uuid = uuid
    if body is not None:
        p.body = body
    return p.SerializeToString()


@settings(max_examples=300, deadline=None)
@given(
    seq=st.none() | st.integers(0, 2**64 - 1),
    metrics=st.lists(st.tuples(st.text(max_size=20), st.integers(0, 2**64 - 1)), max_size=5),
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    uuid=st.none() | st.text(max_size=10),
    body=st.none() | st.binary(max_size=50),
)
def test_the_seq_read_alone_is_the_one_protobuf_decodes(seq, metrics, timestamp, uuid, body):
    data = build(seq, metrics, timestamp, uuid, body)
    decoded = codec.decode(data)
    assert seq_of(data) == (decoded.seq if decoded.HasField("seq") else None)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_give_a_seq_none_or_malformed_seq(data):
    try:
        seq = seq_of(data)
    except MalformedSeq:
        return
    assert seq is None or 0 <= seq < 2**64


@pytest.mark.parametrize("data", [
    b"\xff\xff",  # a truncated varint
    b"\x18",  # seq's key, no value
    b"\x12\x05ab",  # a metric longer than what is left
    b"\x00\x01",  # field number 0
])
def test_malformed_top_levels_are_refused(data):
    with pytest.raises(MalformedSeq, match="not a Sparkplug B payload"):
        seq_of(data)

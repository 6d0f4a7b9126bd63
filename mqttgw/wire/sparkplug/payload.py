"""
The Sparkplug B payload (specification chapter 6, ``sparkplug_b.proto`` of
Sparkplug 3.0, package ``org.eclipse.tahu.protobuf``) through the
``protobuf`` package, and each datatype's value in and out of it.

The message classes are built at import with protobuf's runtime descriptor
API from the field table below, in a pool of their own: no generated
``_pb2`` module to keep in step with the protobuf release installed (its
generated code refuses older runtimes), and no clash with another
library's copy of the same ``.proto`` in the default pool.  The table
follows the specification's ``.proto`` field for field (names, numbers,
types, labels, oneofs, extension ranges); tests/unit/test_sparkplug_codec.py
checks it against what other implementations put on the wire.

Scalars are kept as the specification puts them: Int8 to Int32 in the
``uint32`` int_value and Int64 in the ``uint64`` long_value, two's
complement; arrays (Int8Array ... DateTimeArray) packed little-endian in
bytes_value, booleans as a count and bits (most significant first),
strings NUL-terminated.
"""

import enum
import struct

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, EncodeError

PACKAGE = "org.eclipse.tahu.protobuf"


class MalformedPayload(ValueError):
    """Bytes that are not a Sparkplug B payload; the message says why."""


class DataType(enum.IntEnum):
    Unknown = 0
    Int8 = 1
    Int16 = 2
    Int32 = 3
    Int64 = 4
    UInt8 = 5
    UInt16 = 6
    UInt32 = 7
    UInt64 = 8
    Float = 9
    Double = 10
    Boolean = 11
    String = 12
    DateTime = 13
    Text = 14
    UUID = 15
    DataSet = 16
    Bytes = 17
    File = 18
    Template = 19
    PropertySet = 20
    PropertySetList = 21
    Int8Array = 22
    Int16Array = 23
    Int32Array = 24
    Int64Array = 25
    UInt8Array = 26
    UInt16Array = 27
    UInt32Array = 28
    UInt64Array = 29
    FloatArray = 30
    DoubleArray = 31
    BooleanArray = 32
    StringArray = 33
    DateTimeArray = 34


# The messages of the specification's .proto, nested under Payload:
# name -> (first extension number or None, fields).  A field is
# "label type name number"; label "oneof" puts it in the oneof "value".
_EXTENSION_ONLY = (1, [])
_MESSAGES = {
    "Payload": (6, [
        "optional uint64 timestamp 1",
        "repeated Metric metrics 2",
        "optional uint64 seq 3",
        "optional string uuid 4",
        "optional bytes body 5",
    ]),
    "Payload.Template": (6, [
        "optional string version 1",
        "repeated Metric metrics 2",
        "repeated Template.Parameter parameters 3",
        "optional string template_ref 4",
        "optional bool is_definition 5",
    ]),
    "Payload.Template.Parameter": (None, [
        "optional string name 1",
        "optional uint32 type 2",
        "oneof uint32 int_value 3",
        "oneof uint64 long_value 4",
        "oneof float float_value 5",
        "oneof double double_value 6",
        "oneof bool boolean_value 7",
        "oneof string string_value 8",
        "oneof Template.Parameter.ParameterValueExtension extension_value 9",
    ]),
    "Payload.Template.Parameter.ParameterValueExtension": _EXTENSION_ONLY,
    "Payload.DataSet": (5, [
        "optional uint64 num_of_columns 1",
        "repeated string columns 2",
        "repeated uint32 types 3",
        "repeated DataSet.Row rows 4",
    ]),
    "Payload.DataSet.DataSetValue": (None, [
        "oneof uint32 int_value 1",
        "oneof uint64 long_value 2",
        "oneof float float_value 3",
        "oneof double double_value 4",
        "oneof bool boolean_value 5",
        "oneof string string_value 6",
        "oneof DataSet.DataSetValue.DataSetValueExtension extension_value 7",
    ]),
    "Payload.DataSet.DataSetValue.DataSetValueExtension": _EXTENSION_ONLY,
    "Payload.DataSet.Row": (2, [
        "repeated DataSet.DataSetValue elements 1",
    ]),
    "Payload.PropertyValue": (None, [
        "optional uint32 type 1",
        "optional bool is_null 2",
        "oneof uint32 int_value 3",
        "oneof uint64 long_value 4",
        "oneof float float_value 5",
        "oneof double double_value 6",
        "oneof bool boolean_value 7",
        "oneof string string_value 8",
        "oneof PropertySet propertyset_value 9",
        "oneof PropertySetList propertysets_value 10",
        "oneof PropertyValue.PropertyValueExtension extension_value 11",
    ]),
    "Payload.PropertyValue.PropertyValueExtension": _EXTENSION_ONLY,
    "Payload.PropertySet": (3, [
        "repeated string keys 1",
        "repeated PropertyValue values 2",
    ]),
    "Payload.PropertySetList": (2, [
        "repeated PropertySet propertyset 1",
    ]),
    "Payload.MetaData": (9, [
        "optional bool is_multi_part 1",
        "optional string content_type 2",
        "optional uint64 size 3",
        "optional uint64 seq 4",
        "optional string file_name 5",
        "optional string file_type 6",
        "optional string md5 7",
        "optional string description 8",
    ]),
    "Payload.Metric": (None, [
        "optional string name 1",
        "optional uint64 alias 2",
        "optional uint64 timestamp 3",
        "optional uint32 datatype 4",
        "optional bool is_historical 5",
        "optional bool is_transient 6",
        "optional bool is_null 7",
        "optional MetaData metadata 8",
        "optional PropertySet properties 9",
        "oneof uint32 int_value 10",
        "oneof uint64 long_value 11",
        "oneof float float_value 12",
        "oneof double double_value 13",
        "oneof bool boolean_value 14",
        "oneof string string_value 15",
        "oneof bytes bytes_value 16",
        "oneof DataSet dataset_value 17",
        "oneof Template template_value 18",
        "oneof Metric.MetricValueExtension extension_value 19",
    ]),
    "Payload.Metric.MetricValueExtension": _EXTENSION_ONLY,
}

# Extension ranges run "to max": field numbers end at 2**29 - 1.
_MAX_FIELD = 2**29


def _file_descriptor():
    F = descriptor_pb2.FieldDescriptorProto
    scalars = {
        "uint32": F.TYPE_UINT32,
        "uint64": F.TYPE_UINT64,
        "float": F.TYPE_FLOAT,
        "double": F.TYPE_DOUBLE,
        "bool": F.TYPE_BOOL,
        "string": F.TYPE_STRING,
        "bytes": F.TYPE_BYTES,
    }
    file = descriptor_pb2.FileDescriptorProto(
        name="mqttgw/sparkplug_b.proto", package=PACKAGE, syntax="proto2"
    )
    protos = {}
    for path, (extensions, fields) in _MESSAGES.items():
        *outer, name = path.split(".")
        parent = protos[".".join(outer)].nested_type if outer else file.message_type
        proto = protos[path] = parent.add(name=name)
        if extensions is not None:
            proto.extension_range.add(start=extensions, end=_MAX_FIELD)
        for field in fields:
            label, kind, name, number = field.split()
            f = proto.field.add(name=name, number=int(number), label=F.LABEL_OPTIONAL)
            if label == "repeated":
                f.label = F.LABEL_REPEATED
            elif label == "oneof":
                if not proto.oneof_decl:
                    proto.oneof_decl.add(name="value")
                f.oneof_index = 0
            if kind in scalars:
                f.type = scalars[kind]
            else:
                f.type = F.TYPE_MESSAGE
                f.type_name = f".{PACKAGE}.Payload.{kind}"
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file_descriptor())
Payload = message_factory.GetMessageClass(_pool.FindMessageTypeByName(PACKAGE + ".Payload"))
Metric = Payload.Metric
DataSet = Payload.DataSet
Template = Payload.Template
PropertySet = Payload.PropertySet
PropertySetList = Payload.PropertySetList
PropertyValue = Payload.PropertyValue
MetaData = Payload.MetaData


def decode(data):
    """The Payload in ``data`` (bytes), or MalformedPayload."""
    payload = Payload()
    try:
        payload.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as e:
        raise MalformedPayload(f"not a Sparkplug B payload: {e or type(e).__name__}") from None
    return payload


def encode(payload):
    """A Payload's bytes."""
    try:
        return payload.SerializeToString()
    except EncodeError as e:  # a required field unset; proto2 here has none
        raise MalformedPayload(str(e)) from None


def metric_named(payload, name):
    """The first metric called ``name`` in ``payload``, or None."""
    for metric in payload.metrics:
        if metric.name == name:
            return metric
    return None


# Values by datatype

_SIGNED = {DataType.Int8: 8, DataType.Int16: 16, DataType.Int32: 32, DataType.Int64: 64}
_FIELD = {
    DataType.Int8: "int_value",
    DataType.Int16: "int_value",
    DataType.Int32: "int_value",
    DataType.UInt8: "int_value",
    DataType.UInt16: "int_value",
    DataType.UInt32: "int_value",
    DataType.Int64: "long_value",
    DataType.UInt64: "long_value",
    DataType.DateTime: "long_value",
    DataType.Float: "float_value",
    DataType.Double: "double_value",
    DataType.Boolean: "boolean_value",
    DataType.String: "string_value",
    DataType.Text: "string_value",
    DataType.UUID: "string_value",
    DataType.Bytes: "bytes_value",
    DataType.File: "bytes_value",
    DataType.DataSet: "dataset_value",
    DataType.Template: "template_value",
    DataType.PropertySet: "propertyset_value",
    DataType.PropertySetList: "propertysets_value",
}
# Arrays of fixed-size numbers: their struct format, little-endian.
_PACKED = {
    DataType.Int8Array: "b",
    DataType.Int16Array: "h",
    DataType.Int32Array: "i",
    DataType.Int64Array: "q",
    DataType.UInt8Array: "B",
    DataType.UInt16Array: "H",
    DataType.UInt32Array: "I",
    DataType.UInt64Array: "Q",
    DataType.FloatArray: "f",
    DataType.DoubleArray: "d",
    DataType.DateTimeArray: "q",
}


def pack_array(datatype, values):
    """The bytes_value of an array datatype's ``values``."""
    fmt = _PACKED.get(datatype)
    if fmt is not None:
        return struct.pack(f"<{len(values)}{fmt}", *values)
    if datatype == DataType.BooleanArray:
        bits = bytearray((len(values) + 7) // 8)
        for i, value in enumerate(values):
            if value:
                bits[i // 8] |= 0x80 >> (i % 8)
        return struct.pack("<I", len(values)) + bytes(bits)
    if datatype == DataType.StringArray:
        return b"".join(v.encode() + b"\0" for v in values)
    raise ValueError(f"{datatype!r} is not an array datatype")


def unpack_array(datatype, data):
    """The values of an array datatype's bytes_value, or MalformedPayload."""
    try:
        fmt = _PACKED.get(datatype)
        if fmt is not None:
            return list(struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data))
        if datatype == DataType.BooleanArray:
            (count,) = struct.unpack_from("<I", data)
            if len(data) - 4 != (count + 7) // 8:
                raise ValueError(f"{count} booleans in {len(data) - 4} bytes")
            return [bool(data[4 + i // 8] & (0x80 >> (i % 8))) for i in range(count)]
        if datatype == DataType.StringArray:
            if data and not data.endswith(b"\0"):
                raise ValueError("unterminated string")
            return [part.decode() for part in data.split(b"\0")[:-1]]
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise MalformedPayload(f"{DataType(datatype).name}: {e}") from None
    raise ValueError(f"{datatype!r} is not an array datatype")


def _signed(value, bits):
    value &= (1 << bits) - 1 if bits == 64 else 0xFFFFFFFF
    top = 1 << (63 if bits == 64 else 31)
    return value - (top << 1) if value & top else value


def value_of(holder, datatype):
    """
    The value a Metric, PropertyValue, Template.Parameter or
    DataSet.DataSetValue holds as ``datatype``: an int, float, bool, str,
    bytes, list (arrays) or the nested message; None when it is null.
    """
    if getattr(holder, "is_null", False):
        return None
    datatype = DataType(datatype)
    if datatype in _PACKED or datatype in (DataType.BooleanArray, DataType.StringArray):
        return unpack_array(datatype, holder.bytes_value)
    field = _FIELD.get(datatype)
    if field is None or not holder.HasField(field):
        # The specification allows a UInt32 in either field; Eclipse
        # Tahu's JavaScript client writes long_value.
        if datatype != DataType.UInt32 or not holder.HasField("long_value"):
            return None
        field = "long_value"
    value = getattr(holder, field)
    bits = _SIGNED.get(datatype)
    if bits is not None:
        value = _signed(value, bits)
    return value


def set_value(holder, datatype, value):
    """
    Put ``value`` into a Metric, PropertyValue, Template.Parameter or
    DataSet.DataSetValue as ``datatype`` (None: null, where the holder has
    is_null).
    """
    datatype = DataType(datatype)
    if value is None:
        # A DataSet element or template parameter has no is_null: unset.
        if "is_null" in holder.DESCRIPTOR.fields_by_name:
            holder.is_null = True
        return
    if datatype in _PACKED or datatype in (DataType.BooleanArray, DataType.StringArray):
        holder.bytes_value = pack_array(datatype, value)
        return
    field = _FIELD[datatype]
    if field in ("dataset_value", "template_value", "propertyset_value", "propertysets_value"):
        getattr(holder, field).CopyFrom(value)
        return
    if datatype in _SIGNED:
        value &= 0xFFFFFFFFFFFFFFFF if datatype == DataType.Int64 else 0xFFFFFFFF
    setattr(holder, field, value)


def dataset(columns, types, rows):
    """A DataSet of ``rows`` (lists of values) under ``columns`` of ``types``."""
    ds = DataSet(num_of_columns=len(columns), columns=columns, types=types)
    for row in rows:
        out = ds.rows.add()
        for datatype, value in zip(types, row):
            set_value(out.elements.add(), datatype, value)
    return ds


def dataset_rows(ds):
    """A DataSet's rows as lists of values."""
    return [
        [value_of(element, datatype) for datatype, element in zip(ds.types, row.elements)]
        for row in ds.rows
    ]


def property_set(items):
    """A PropertySet of ``[(key, datatype, value)]``."""
    ps = PropertySet()
    for key, datatype, value in items:
        ps.keys.append(key)
        pv = ps.values.add(type=datatype)
        set_value(pv, datatype, value)
    return ps


def property_items(ps):
    """A PropertySet as ``[(key, datatype, value)]``."""
    return [(key, pv.type, value_of(pv, pv.type)) for key, pv in zip(ps.keys, ps.values)]

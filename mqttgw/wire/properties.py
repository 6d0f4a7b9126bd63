"""
MQTT 5.0 properties (section 2.2.2 of the standard): each identifier's
name, type and the packets it may appear in; decoding with every check the
standard asks of a receiver, and encoding.

Properties are a plain dict keyed by the standard's names in snake case
(``message_expiry_interval``).  ``user_property`` is a list of
``(name, value)`` pairs in the order they came; ``subscription_identifier``
is a list of integers (a PUBLISH to a client may carry several).
"""

import struct

from mqttgw.wire import reasons as R
from mqttgw.wire.encoding import encode_string, encode_varint

# Packet types (as in packets.py) and WILL for a CONNECT's will properties.
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH = 8, 9, 10, 11, 14, 15
WILL = 16

BYTE, U16, U32, VARINT, UTF8, BINARY, PAIR = range(7)

_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)
_WITH_REASON_STRING = (CONNACK, *_ACKS, SUBACK, UNSUBACK, DISCONNECT, AUTH)

# identifier: (name, type, packets it may appear in)
PROPERTIES = {
    0x01: ("payload_format_indicator", BYTE, (PUBLISH, WILL)),
    0x02: ("message_expiry_interval", U32, (PUBLISH, WILL)),
    0x03: ("content_type", UTF8, (PUBLISH, WILL)),
    0x08: ("response_topic", UTF8, (PUBLISH, WILL)),
    0x09: ("correlation_data", BINARY, (PUBLISH, WILL)),
    0x0B: ("subscription_identifier", VARINT, (PUBLISH, SUBSCRIBE)),
    0x11: ("session_expiry_interval", U32, (CONNECT, CONNACK, DISCONNECT)),
    0x12: ("assigned_client_identifier", UTF8, (CONNACK,)),
    0x13: ("server_keep_alive", U16, (CONNACK,)),
    0x15: ("authentication_method", UTF8, (CONNECT, CONNACK, AUTH)),
    0x16: ("authentication_data", BINARY, (CONNECT, CONNACK, AUTH)),
    0x17: ("request_problem_information", BYTE, (CONNECT,)),
    0x18: ("will_delay_interval", U32, (WILL,)),
    0x19: ("request_response_information", BYTE, (CONNECT,)),
    0x1A: ("response_information", UTF8, (CONNACK,)),
    0x1C: ("server_reference", UTF8, (CONNACK, DISCONNECT)),
    0x1F: ("reason_string", UTF8, _WITH_REASON_STRING),
    0x21: ("receive_maximum", U16, (CONNECT, CONNACK)),
    0x22: ("topic_alias_maximum", U16, (CONNECT, CONNACK)),
    0x23: ("topic_alias", U16, (PUBLISH,)),
    0x24: ("maximum_qos", BYTE, (CONNACK,)),
    0x25: ("retain_available", BYTE, (CONNACK,)),
    0x26: (
        "user_property",
        PAIR,
        (CONNECT, CONNACK, PUBLISH, WILL, *_ACKS, SUBSCRIBE, SUBACK,
         UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH),
    ),
    0x27: ("maximum_packet_size", U32, (CONNECT, CONNACK)),
    0x28: ("wildcard_subscription_available", BYTE, (CONNACK,)),
    0x29: ("subscription_identifier_available", BYTE, (CONNACK,)),
    0x2A: ("shared_subscription_available", BYTE, (CONNACK,)),
}
IDENTIFIERS = {name: (ident, type_) for ident, (name, type_, _) in PROPERTIES.items()}

# Properties a byte of which may only be 0 or 1.
_BOOLEAN = {
    "payload_format_indicator", "request_problem_information",
    "request_response_information", "maximum_qos", "retain_available",
    "wildcard_subscription_available", "subscription_identifier_available",
    "shared_subscription_available",
}
# Properties for which 0 is a Protocol Error.
_NOT_ZERO = {"receive_maximum", "maximum_packet_size", "topic_alias", "subscription_identifier"}

# Bounds the gateway sets on what one packet may carry: a packet within
# the maximum packet size could otherwise hold hundreds of thousands of
# tiny properties.
MAX_USER_PROPERTIES = 256

_unpack_u16 = struct.Struct(">H").unpack_from
_unpack_u32 = struct.Struct(">I").unpack_from
_pack_u16 = struct.Struct(">H").pack
_pack_u32 = struct.Struct(">I").pack


class PropertyError(ValueError):
    """Properties that break the standard; ``reason_code`` says how."""

    def __init__(self, message, reason_code=R.MALFORMED_PACKET):
        super().__init__(message)
        self.reason_code = reason_code


def decode_varint(data, offset, end):
    """A Variable Byte Integer at ``offset``: (value, offset after it)."""
    value = shift = 0
    for i in range(4):
        if offset >= end:
            raise PropertyError("variable byte integer runs past end of packet")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if i and not byte:
                # [MQTT-1.5.5-1] the fewest bytes that hold the value.
                raise PropertyError("variable byte integer is not minimally encoded")
            return value, offset
        shift += 7
    raise PropertyError("variable byte integer longer than 4 bytes")


def _utf8(data, offset, end, check_text):
    if offset + 2 > end:
        raise PropertyError("property runs past end of properties")
    n = _unpack_u16(data, offset)[0]
    offset += 2
    if offset + n > end:
        raise PropertyError("string runs past end of properties")
    try:
        s = data[offset : offset + n].decode("utf-8")
    except UnicodeDecodeError:
        raise PropertyError("string is not valid UTF-8") from None
    check_text(s)
    return s, offset + n


def _binary(data, offset, end):
    if offset + 2 > end:
        raise PropertyError("property runs past end of properties")
    n = _unpack_u16(data, offset)[0]
    offset += 2
    if offset + n > end:
        raise PropertyError("binary data runs past end of properties")
    return bytes(data[offset : offset + n]), offset + n


def _no_null(s):
    if "\x00" in s:
        raise PropertyError("string contains U+0000")


def _value(type_, name, data, offset, end, check_text):
    """Property ``name``'s value, of ``type_``, at ``offset``: (value, offset after it)."""
    if type_ == BYTE:
        if offset + 1 > end:
            raise PropertyError(f"property {name} runs past end of properties")
        return data[offset], offset + 1
    if type_ == U16:
        if offset + 2 > end:
            raise PropertyError(f"property {name} runs past end of properties")
        return _unpack_u16(data, offset)[0], offset + 2
    if type_ == U32:
        if offset + 4 > end:
            raise PropertyError(f"property {name} runs past end of properties")
        return _unpack_u32(data, offset)[0], offset + 4
    if type_ == VARINT:
        return decode_varint(data, offset, end)
    if type_ == UTF8:
        return _utf8(data, offset, end, check_text)
    if type_ == BINARY:
        return _binary(data, offset, end)
    key, offset = _utf8(data, offset, end, check_text)
    value, offset = _utf8(data, offset, end, check_text)
    return (key, value), offset


def decode_properties(data, offset, end, packet_type, check_text=_no_null):
    """
    The properties at ``offset`` (their length first), as allowed in
    ``packet_type``: ``(dict, offset after them)``.  ``check_text`` raises
    for characters a string may not hold.  Raises :class:`PropertyError`.
    """
    length, offset = decode_varint(data, offset, end)
    stop = offset + length
    if stop > end:
        raise PropertyError("properties run past end of packet")
    props = {}
    while offset < stop:
        # Every identifier the standard names fits in one byte: read
        # without a call, as the value's reading costs one.
        ident = data[offset]
        if ident & 0x80:
            ident, offset = decode_varint(data, offset, stop)
        else:
            offset += 1
        entry = PROPERTIES.get(ident)
        if entry is None:
            raise PropertyError(f"unknown property identifier {ident:#04x}")
        name, type_, packets = entry
        if packet_type not in packets:
            raise PropertyError(f"property {name} is not allowed here")
        value, offset = _value(type_, name, data, offset, stop, check_text)
        if name in _BOOLEAN and value > 1:
            raise PropertyError(f"property {name} must be 0 or 1, not {value}", R.PROTOCOL_ERROR)
        if name in _NOT_ZERO and value == 0:
            raise PropertyError(f"property {name} must not be 0", R.PROTOCOL_ERROR)
        if type_ == PAIR:
            pairs = props.setdefault(name, [])
            if len(pairs) >= MAX_USER_PROPERTIES:
                raise PropertyError(
                    f"more than {MAX_USER_PROPERTIES} user properties", R.IMPLEMENTATION_SPECIFIC_ERROR
                )
            pairs.append(value)
        elif name == "subscription_identifier" and packet_type == PUBLISH:
            props.setdefault(name, []).append(value)
        elif name in props:
            raise PropertyError(f"property {name} appears twice", R.PROTOCOL_ERROR)
        else:
            props[name] = value
    if offset != stop:
        raise PropertyError("property runs past end of properties")
    return props, stop


def encode_properties(props):
    """The wire form of ``props`` (a dict as decode gives), length first."""
    if not props:
        return b"\x00"
    body = encode_property_list(props)
    return encode_varint(len(body)) + body


def encode_property_list(props):
    """``props`` encoded one after another, without the length before them."""
    if not props:
        return b""
    out = []
    for name, value in props.items():
        ident, type_ = IDENTIFIERS[name]
        if type_ == PAIR:
            for key, val in value:
                out.append(bytes((ident,)) + encode_string(key) + encode_string(val))
            continue
        if type_ == VARINT and isinstance(value, (list, tuple)):
            for v in value:
                out.append(bytes((ident,)) + encode_varint(v))
            continue
        if type_ == BYTE:
            out.append(bytes((ident, value)))
        elif type_ == U16:
            out.append(bytes((ident,)) + _pack_u16(value))
        elif type_ == U32:
            out.append(bytes((ident,)) + _pack_u32(value))
        elif type_ == VARINT:
            out.append(bytes((ident,)) + encode_varint(value))
        else:
            out.append(bytes((ident,)) + encode_string(value))
    return b"".join(out)


# Properties of an application message that travel with it to subscribers
# ([MQTT-3.3.2-*]); topic alias and subscription identifiers are per hop.
MESSAGE_PROPERTIES = (
    "payload_format_indicator", "message_expiry_interval", "content_type",
    "response_topic", "correlation_data", "user_property",
)


def message_properties(props):
    """Of ``props``, those that travel with the message, or None."""
    if not props:
        return None
    if all(name in MESSAGE_PROPERTIES for name in props):
        return props
    return {k: v for k, v in props.items() if k in MESSAGE_PROPERTIES} or None


def problem_properties(props):
    """``props`` without reason string and user properties (a client that
    asked for no problem information gets none, [MQTT-3.1.2-29])."""
    if not props or ("reason_string" not in props and "user_property" not in props):
        return props
    return {k: v for k, v in props.items() if k not in ("reason_string", "user_property")}

"""
Incremental MQTT framing: bytes in, packet objects out.  Pure: no I/O, no
clock.  Anything that is not a well-formed packet raises
:class:`ProtocolViolation`, and nothing else.
"""

import re
import struct

from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.packets import Publish
from mqttgw.wire.properties import PropertyError, decode_properties

_unpack_u16 = struct.Struct(">H").unpack_from


class ProtocolViolation(Exception):
    """
    The peer sent bytes that are not a valid MQTT packet stream;
    ``reason_code`` is what a 5.0 DISCONNECT tells it (Malformed Packet
    unless the standard names another).
    """

    def __init__(self, message, reason_code=R.MALFORMED_PACKET):
        super().__init__(message)
        self.reason_code = reason_code


# How strictly strings and reserved bits are checked: MQTT 3.1 as written;
# MQTT 3.1.1's MUSTs (reserved bits, no U+0000); and 3.1.1 with its MAYs
# too: control characters and Unicode non-characters refused (3.1.1
# section 1.5.3), as current mosquitto does.
LAX, STRICT, STRICT_TEXT = 0, 1, 2

_NONCHARACTERS = "".join(
    f"{chr(plane | 0xFFFE)}{chr(plane | 0xFFFF)}" for plane in range(0x10000, 0x110000, 0x10000)
)
_REFUSED_TEXT = re.compile(f"[\x00-\x1f\x7f-\x9f\ufdd0-\ufdef\ufffe\uffff{_NONCHARACTERS}]")


def check_text(s, strict):
    """Raise ProtocolViolation for characters ``strict`` refuses in ``s``."""
    if strict == STRICT_TEXT:
        # ASCII without control characters is by far the common case.
        if (not s.isprintable() if s.isascii() else _REFUSED_TEXT.search(s) is not None):
            bad = _REFUSED_TEXT.search(s).group()
            raise ProtocolViolation(f"string contains U+{ord(bad):04X}")
    elif strict and "\x00" in s:
        raise ProtocolViolation("string contains U+0000")


def _u16(data, offset, end):
    if offset + 2 > end:
        raise ProtocolViolation("packet truncated")
    return _unpack_u16(data, offset)[0]


def _bytes_field(data, offset, end):
    """A length-prefixed field; returns (bytes, new offset)."""
    n = _u16(data, offset, end)
    offset += 2
    if offset + n > end:
        raise ProtocolViolation("string runs past end of packet")
    return data[offset : offset + n], offset + n


def _string(data, offset, end, strict):
    raw, offset = _bytes_field(data, offset, end)
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation("string is not valid UTF-8") from None
    check_text(s, strict)
    return s, offset


def _message_id(data, offset, end):
    mid = _u16(data, offset, end)
    if mid == 0:
        raise ProtocolViolation("message id 0 is reserved")
    return mid


def _decode_connect(flags, data, start, end, strict):
    """``strict``: the checks a 3.1.1 or 5.0 connection is held to (STRICT or STRICT_TEXT)."""
    name, o = _string(data, start, end, LAX)
    if name == "MQTT" and flags:
        raise ProtocolViolation(f"CONNECT fixed header flags {flags:#x} are reserved")
    if name not in ("MQIsdp", "MQTT"):
        # Not MQTT at all: closed without a CONNACK (3.1.1 section 3.1.2.1).
        raise ProtocolViolation(f"unknown protocol name {name!r}")
    if o + 4 > end:
        raise ProtocolViolation("CONNECT variable header truncated")
    level = data[o]
    cflags = data[o + 1]
    keepalive = _unpack_u16(data, o + 2)[0]
    o += 4
    connect = P.Connect(
        protocol_name=name,
        protocol_level=level,
        clean_session=bool(cflags & 0x02),
        keepalive=keepalive,
        flags=cflags,
    )
    if (name, level) not in (("MQIsdp", P.MQTT_31), ("MQTT", P.MQTT_311), ("MQTT", P.MQTT_5)):
        # The caller answers CONNACK 1; the rest of the packet may not parse.
        return connect
    v5 = level == P.MQTT_5
    strict = (strict or STRICT) if level != P.MQTT_31 else LAX
    if strict and cflags & 0x01:
        raise ProtocolViolation("CONNECT reserved flag is set")
    if v5:
        connect.properties, o = _properties(data, o, end, P.CONNECT, strict)
    connect.client_id, o = _string(data, o, end, strict)
    if cflags & 0x04:
        connect.will_qos = (cflags >> 3) & 0x03
        if connect.will_qos == 3:
            raise ProtocolViolation("will QoS 3 is reserved")
        connect.will_retain = bool(cflags & 0x20)
        if v5:
            connect.will_properties, o = _properties(data, o, end, _WILL, strict)
        connect.will_topic, o = _string(data, o, end, strict)
        connect.will_message, o = _bytes_field(data, o, end)
    elif strict and cflags & 0x38:
        raise ProtocolViolation("will QoS or retain set without will flag")
    # 5.0 allows a password without a user name ([MQTT-3.1.2-18]).
    if strict and not v5 and cflags & 0x40 and not cflags & 0x80:
        raise ProtocolViolation("password flag set without user name flag")
    # MQTT 3.1 tolerates a set flag with its string missing: treat as absent.
    if cflags & 0x80 and (strict or o < end):
        connect.username, o = _string(data, o, end, strict)
    if cflags & 0x40 and (strict or o < end):
        connect.password, o = _bytes_field(data, o, end)
    if v5 and o != end:
        raise ProtocolViolation("CONNECT has bytes after its payload")
    return connect


_WILL = 16


def _properties(data, offset, end, packet_type, strict):
    try:
        return decode_properties(data, offset, end, packet_type, lambda s: check_text(s, strict))
    except PropertyError as e:
        raise ProtocolViolation(str(e), e.reason_code) from None


def _decode_connack(flags, data, start, end, strict):
    if end - start != 2:
        raise ProtocolViolation("CONNACK must be 2 bytes")
    return P.Connack(return_code=data[start + 1], session_present=bool(data[start] & 1))


def _id_only(cls):
    # Every QoS 1 and 2 message has one of these: the id is read here
    # rather than through _message_id.
    def decode(flags, data, start, end, strict):
        if end - start != 2 and (strict or end - start < 2):
            if strict:
                raise ProtocolViolation(f"{cls.__name__.upper()} must be 2 bytes")
            raise ProtocolViolation("packet truncated")
        mid = (data[start] << 8) | data[start + 1]
        if not mid:
            raise ProtocolViolation("message id 0 is reserved")
        return cls(mid)

    return decode


# A SUBSCRIBE or UNSUBSCRIBE whose filters take more bytes than this is
# decoded a slice at a time, over reactor turns (see FiltersToDecode).
DECODE_IN_SLICES = 16 * 1024


class FiltersToDecode:
    """
    The topic filters of a large SUBSCRIBE or UNSUBSCRIBE, not decoded yet:
    ``step(count)`` decodes up to ``count`` more (raising ProtocolViolation
    as the whole decode would) and says whether all are done; ``decoded``
    holds them.  Decoding a hundred thousand filters at once would hold
    the reactor for tens of milliseconds.
    """

    __slots__ = ("decoded", "_decode", "_data", "_offset", "_end", "_strict", "_empty")

    def __init__(self, decode, data, offset, end, strict, empty):
        self.decoded = []
        self._decode = decode
        self._data = data
        self._offset = offset
        self._end = end
        self._strict = strict
        # (packet name, reason code) for the violation when there are none.
        self._empty = empty

    def step(self, count):
        self._offset = self._decode(
            self._data, self._offset, self._end, self._strict, self.decoded, count
        )
        if self._offset < self._end:
            return False
        _none_is_malformed(self.decoded, self._empty)
        self._data = None
        return True


def _none_is_malformed(topics, empty):
    if not topics:
        name, reason_code = empty
        raise ProtocolViolation(f"{name} with no topics", reason_code)


def _with_filters(cls, decode_filters, v5):
    """
    The decoder of a SUBSCRIBE or UNSUBSCRIBE (``cls``), 5.0's with its
    properties: its filters all at once, or a FiltersToDecode when many.
    """
    # 3.1.1's refusals carry no reason code; 5.0 names Protocol Error.
    empty = (P.PACKET_NAMES[cls.packet_type], R.PROTOCOL_ERROR if v5 else R.MALFORMED_PACKET)

    def decode(flags, data, start, end, strict):
        mid = _message_id(data, start, end)
        o = start + 2
        if v5:
            props, o = _properties(data, o, end, cls.packet_type, strict)
        if end - o > DECODE_IN_SLICES:
            topics = FiltersToDecode(decode_filters, data, o, end, strict, empty)
        else:
            topics = []
            decode_filters(data, o, end, strict, topics, end)
            _none_is_malformed(topics, empty)
        return cls(mid, topics, props) if v5 else cls(mid, topics)

    return decode


def _subscribe_filters(data, o, end, strict, topics, count):
    """Up to ``count`` (filter, QoS) from ``o`` into ``topics``; the new offset."""
    append = topics.append
    # Inline rather than through _string: a SUBSCRIBE may hold a great
    # many filters, and this is the whole of its decoding cost.
    while o < end and count > 0:
        count -= 1
        if o + 2 > end:
            raise ProtocolViolation("packet truncated")
        s = o + 2
        e = s + ((data[o] << 8) | data[o + 1])
        if e >= end:
            if e > end:
                raise ProtocolViolation("string runs past end of packet")
            raise ProtocolViolation("SUBSCRIBE topic without requested QoS")
        if e == s:
            raise ProtocolViolation("SUBSCRIBE with a zero-length topic filter")
        try:
            topic = data[s:e].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("string is not valid UTF-8") from None
        qos = data[e]
        if (qos > 2) if strict else (qos & 0x03) == 3:
            raise ProtocolViolation("SUBSCRIBE requested QoS is invalid")
        if strict:
            check_text(topic, strict)
        append((topic, qos & 0x03))
        o = e + 1
    return o


def _decode_suback(flags, data, start, end, strict):
    return P.Suback(_message_id(data, start, end), list(data[start + 2 : end]))


def _unsubscribe_filters(data, o, end, strict, topics, count):
    while o < end and count > 0:
        count -= 1
        topic, o = _string(data, o, end, strict)
        if not topic:
            raise ProtocolViolation("UNSUBSCRIBE with a zero-length topic filter")
        topics.append(topic)
    return o


def _empty(cls):
    def decode(flags, data, start, end, strict):
        if end != start:
            raise ProtocolViolation(f"{cls.__name__.upper()} must be empty")
        return cls()

    return decode


_DECODERS = {
    P.CONNECT: _decode_connect,
    P.CONNACK: _decode_connack,
    P.PUBLISH: None,  # the hot path: Framer._packets calls _decode_publish itself
    P.PUBACK: _id_only(P.Puback),
    P.PUBREC: _id_only(P.Pubrec),
    P.PUBREL: _id_only(P.Pubrel),
    P.PUBCOMP: _id_only(P.Pubcomp),
    P.SUBSCRIBE: _with_filters(P.Subscribe, _subscribe_filters, v5=False),
    P.SUBACK: _decode_suback,
    P.UNSUBSCRIBE: _with_filters(P.Unsubscribe, _unsubscribe_filters, v5=False),
    P.UNSUBACK: _id_only(P.Unsuback),
    P.PINGREQ: _empty(P.Pingreq),
    P.PINGRESP: _empty(P.Pingresp),
    P.DISCONNECT: _empty(P.Disconnect),
}

# The packets the loop hands straight to their version's table (those of
# a session under way); the others are checked first (Framer._decode).
_TABLED = frozenset(range(P.PUBACK, P.DISCONNECT + 1))

# MQTT 5.0: reason codes and properties after the message id.


def _decode_connack5(flags, data, start, end, strict):
    if end - start < 2:
        raise ProtocolViolation("CONNACK truncated")
    if data[start] & 0xFE:
        raise ProtocolViolation("CONNACK reserved flags are set")
    if end - start == 2 and data[start + 1] in R.CONNACK_FROM_V3:
        # A 3.1/3.1.1 server's refusal of a 5.0 CONNECT, in its own terms.
        return P.Connack(R.CONNACK_FROM_V3[data[start + 1]], False, {})
    props, o = _properties(data, start + 2, end, P.CONNACK, strict)
    if o != end:
        raise ProtocolViolation("CONNACK has bytes after its properties")
    return P.Connack(data[start + 1], bool(data[start] & 1), props)


def _subscribe5_filters(data, o, end, strict, topics, count):
    while o < end and count > 0:
        count -= 1
        topic, o = _string(data, o, end, strict)
        if o >= end:
            raise ProtocolViolation("SUBSCRIBE topic without subscription options")
        options = data[o]
        o += 1
        if options & 0xC0:
            raise ProtocolViolation("SUBSCRIBE options reserved bits are set")
        if options & 0x03 == 3:
            raise ProtocolViolation("SUBSCRIBE requested QoS is invalid", R.PROTOCOL_ERROR)
        if options & 0x30 == 0x30:
            raise ProtocolViolation("SUBSCRIBE retain handling 3 is reserved", R.PROTOCOL_ERROR)
        topics.append((topic, options))
    return o


def _decode_suback5(flags, data, start, end, strict):
    mid = _message_id(data, start, end)
    props, o = _properties(data, start + 2, end, P.SUBACK, strict)
    return P.Suback(mid, list(data[o:end]), props)


def _unsubscribe5_filters(data, o, end, strict, topics, count):
    while o < end and count > 0:
        count -= 1
        topic, o = _string(data, o, end, strict)
        topics.append(topic)
    return o


def _decode_unsuback5(flags, data, start, end, strict):
    mid = _message_id(data, start, end)
    props, o = _properties(data, start + 2, end, P.UNSUBACK, strict)
    return P.Unsuback(mid, list(data[o:end]), props)


def _reason5(cls, with_id):
    """
    PUBACK, PUBREC, PUBREL, PUBCOMP (``with_id``: a message id first),
    DISCONNECT and AUTH: a reason code and properties, either left out
    when they are 0 and none.
    """

    def decode(flags, data, start, end, strict):
        head = ()
        if with_id:
            head = (_message_id(data, start, end),)
            start += 2
        if end == start:
            return cls(*head, 0, {})
        code = data[start]
        if end - start == 1:
            return cls(*head, code, {})
        props, o = _properties(data, start + 1, end, cls.packet_type, strict)
        if o != end:
            raise ProtocolViolation(f"{cls.__name__.upper()} has bytes after its properties")
        return cls(*head, code, props)

    return decode


def decode_publish5(flags, data, offset, start, end, strict, from_client=True):
    """A 5.0 PUBLISH; its topic may be empty when it names a topic alias."""
    qos = (flags >> 1) & 3
    if qos == 3:
        raise ProtocolViolation("PUBLISH with QoS 3")
    if qos == 0 and flags & 8:
        raise ProtocolViolation("DUP set on a QoS 0 PUBLISH")
    topic, o = _string(data, start, end, strict)
    mid = None
    if qos:
        mid = _message_id(data, o, end)
        o += 2
    props, o = _properties(data, o, end, P.PUBLISH, strict)
    if from_client and "subscription_identifier" in props:
        # [MQTT-3.3.4-6]
        raise ProtocolViolation("PUBLISH from a client holds a subscription identifier", R.PROTOCOL_ERROR)
    return Publish(topic, data[o:end], qos, flags & 1 == 1, flags & 8 == 8, mid, props)


_DECODERS5 = {
    P.CONNECT: _decode_connect,
    P.CONNACK: _decode_connack5,
    P.PUBLISH: None,
    P.PUBACK: _reason5(P.Puback, True),
    P.PUBREC: _reason5(P.Pubrec, True),
    P.PUBREL: _reason5(P.Pubrel, True),
    P.PUBCOMP: _reason5(P.Pubcomp, True),
    P.SUBSCRIBE: _with_filters(P.Subscribe, _subscribe5_filters, v5=True),
    P.SUBACK: _decode_suback5,
    P.UNSUBSCRIBE: _with_filters(P.Unsubscribe, _unsubscribe5_filters, v5=True),
    P.UNSUBACK: _decode_unsuback5,
    P.PINGREQ: _empty(P.Pingreq),
    P.PINGRESP: _empty(P.Pingresp),
    P.DISCONNECT: _reason5(P.Disconnect, False),
    P.AUTH: _reason5(P.Auth, False),
}


# MQTT 3.1.1 fixes the low four bits of every fixed header but PUBLISH's.
_REQUIRED_FLAGS = {t: 0 for t in _DECODERS5}
_REQUIRED_FLAGS.update({P.PUBREL: 2, P.SUBSCRIBE: 2, P.UNSUBSCRIBE: 2})
del _REQUIRED_FLAGS[P.PUBLISH]


def _remaining_length(first, data, pos, size, v5):
    """
    A Remaining Length of more than one byte, least significant group
    first, its first byte ``first`` and the rest from ``pos``: (length,
    the offset after it), or None while its bytes are still arriving.
    """
    length = first & 0x7F
    shift = 7
    while pos < size:
        byte = data[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if not byte and v5:
                # [MQTT-1.5.5-1] the fewest bytes that hold it.
                raise ProtocolViolation("remaining length is not minimally encoded")
            return length, pos
        shift += 7
        if shift > 21:
            raise ProtocolViolation("remaining length longer than 4 bytes")
    return None


def _reserved_flags(packet_type, flags):
    return ProtocolViolation(f"{P.PACKET_NAMES[packet_type]} fixed header flags {flags:#x} are reserved")


def _decode_publish(flags, data, offset, start, end, strict):
    """
    A PUBLISH of 3.1 or 3.1.1 from ``offset`` (its fixed header) to
    ``end``: the hot path, so its fields are read here rather than
    through the helpers above.
    """
    qos = (flags >> 1) & 3
    tend = start + 2 + ((data[start] << 8) | data[start + 1])
    if tend > end:
        raise ProtocolViolation("topic runs past end of packet")
    try:
        topic = data[start + 2 : tend].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation("string is not valid UTF-8") from None
    if qos == 0:
        if flags & 8 and strict:
            raise ProtocolViolation("DUP set on a QoS 0 PUBLISH")
        packet = Publish(topic, data[tend:end], 0, flags & 1 == 1)
        if flags == 0:
            # Forwarded at QoS 0, the packet is these very bytes.
            packet.frame0 = data[offset:end]
    else:
        if qos == 3:
            raise ProtocolViolation("PUBLISH with QoS 3")
        if tend + 2 > end:
            raise ProtocolViolation("packet truncated")
        mid = (data[tend] << 8) | data[tend + 1]
        if mid == 0:
            raise ProtocolViolation("message id 0 is reserved")
        packet = Publish(topic, data[tend + 2 : end], qos, flags & 1 == 1, flags & 8 == 8, mid)
        # Its deliveries carry the topic as it came.
        packet.topic_wire = data[start:tend]
    # ASCII without control characters, the usual topic, passes every
    # check without a call.
    if strict and not (topic.isascii() and topic.isprintable()):
        check_text(topic, strict)
    return packet


def _decode_publish5_plain(flags, data, offset, start, end, strict, from_client):
    """
    A 5.0 PUBLISH without properties, or with a topic alias alone (the
    usual ones), decoded as the 3.1.1 one is; any other by
    decode_publish5.
    """
    qos = (flags >> 1) & 3
    tend = start + 2 + ((data[start] << 8) | data[start + 1])
    props_at = tend + 2 if qos else tend
    props = None
    if props_at < end and qos != 3 and (qos or not flags & 8):
        plen = data[props_at]
        if plen == 0:
            if tend > start + 2:
                props = {}
                body = props_at + 1
        elif plen == 3 and data[props_at + 1] == 0x23 and props_at + 4 <= end:
            # A topic alias alone.
            alias = (data[props_at + 2] << 8) | data[props_at + 3]
            if alias:
                props = {"topic_alias": alias}
                body = props_at + 4
    if props is None:
        return decode_publish5(flags, data, offset, start, end, strict, from_client)
    try:
        topic = data[start + 2 : tend].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation("string is not valid UTF-8") from None
    mid = None
    if qos:
        mid = (data[tend] << 8) | data[tend + 1]
        if mid == 0:
            raise ProtocolViolation("message id 0 is reserved")
    packet = Publish(topic, data[body:end], qos, flags & 1 == 1, flags & 8 == 8, mid, props)
    if topic:
        packet.topic_wire = data[start:tend]
    if strict and topic and not (topic.isascii() and topic.isprintable()):
        check_text(topic, strict)
    return packet


class Framer:
    """
    Splits a byte stream into packets.  ``feed(data)`` buffers the bytes and
    returns an iterator of the complete packets; iterate it before feeding
    more.  ``strict`` turns on the MQTT 3.1.1 reserved-bit checks and may be
    changed between packets (the CONNECT decides it).

    With ``first_packet`` set, the stream must begin with a packet of that
    type, checked on its first byte, and that packet may be at most
    ``first_packet_size`` bytes: a server learns at once that a peer is not
    speaking MQTT, and buffers little for a peer that has not connected.
    """

    # Slots: one per connection.
    __slots__ = (
        "max_packet_size", "strict", "strict_for_311", "_first", "_first_size",
        "_buffer", "_chunks", "_have", "_need", "v5", "from_client",
    )

    def __init__(
        self,
        max_packet_size=1024 * 1024,
        strict=LAX,
        first_packet=None,
        first_packet_size=None,
        strict_for_311=STRICT_TEXT,
    ):
        if not 0 < max_packet_size <= P.MAX_REMAINING_LENGTH + 5:
            raise ValueError("max_packet_size out of range")
        self.max_packet_size = max_packet_size
        self.strict = strict
        # What a CONNECT of MQTT 3.1.1 is held to (a CONNECT is decoded
        # before the connection's version is known).
        self.strict_for_311 = strict_for_311
        # The packets after CONNECT are 5.0's (set by whoever reads the CONNECT).
        self.v5 = False
        # Whether the peer is a client (a server's framer), not a server.
        self.from_client = True
        self._first = first_packet
        self._first_size = first_packet_size or max_packet_size
        self._buffer = b""
        # A packet whose length is known but whose bytes are still arriving
        # is kept as a list of chunks, joined once when complete: however
        # finely it is split, reassembly stays linear.
        self._chunks = None
        self._have = 0
        self._need = 0

    def feed(self, data):
        if self._chunks is not None:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return ()
            data = b"".join(self._chunks)
            self._chunks = None
        elif self._buffer:
            data = self._buffer + data
        self._buffer = data
        return self._packets()

    @property
    def buffered(self):
        """Bytes held of packets not yet complete."""
        return self._have if self._chunks is not None else len(self._buffer)

    def _packets(self):
        data = self._buffer
        offset = 0
        size = len(data)
        need = 0
        try:
            while size - offset >= 1:
                first = data[offset]
                max_packet_size = self.max_packet_size if self._first is None else self._first_packet_size(first)
                if size - offset < 2:
                    break
                length = data[offset + 1]
                pos = offset + 2
                if length & 0x80:
                    longer = _remaining_length(length, data, pos, size, self.v5)
                    if longer is None:
                        return
                    length, pos = longer
                end = pos + length
                if end - offset > max_packet_size:
                    raise self._too_large(end - offset, max_packet_size)
                if end > size:
                    need = end - offset
                    return
                packet_type, flags = first >> 4, first & 0x0F
                # The version is looked at per packet: a CONNECT may make the rest 5.0.
                if packet_type != P.PUBLISH:
                    if packet_type in _TABLED and self._first is None and (not self.strict or flags == _REQUIRED_FLAGS[packet_type]):
                        packet = (_DECODERS5 if self.v5 else _DECODERS)[packet_type](flags, data, pos, end, self.strict)
                    else:
                        packet = self._decode(packet_type, flags, data, pos, end)
                else:
                    tend = pos + 2 + ((data[pos] << 8) | data[pos + 1])
                    if self.v5:
                        packet = _decode_publish5_plain(flags, data, offset, pos, end, self.strict, self.from_client)
                    elif flags & 0xD or tend + flags > end:
                        # Retained, DUP, QoS 2, or short: decoded in full.
                        packet = _decode_publish(flags, data, offset, pos, end, self.strict)
                    else:
                        # QoS 0 or 1 without flags, nearly every PUBLISH: read here.
                        topic = data[pos + 2 : tend].decode("utf-8")
                        if flags:
                            mid = (data[tend] << 8) | data[tend + 1]
                            if not mid:
                                raise ProtocolViolation("message id 0 is reserved")
                            packet = Publish(topic, data[tend + 2 : end], 1, False, False, mid)
                            packet.topic_wire = data[pos:tend]
                        else:
                            packet = Publish(topic, data[tend:end], 0, False)
                            packet.frame0 = data[offset:end]
                        if self.strict and not (topic.isascii() and topic.isprintable()):
                            check_text(topic, self.strict)
                offset = end
                yield packet
        except UnicodeDecodeError:
            raise ProtocolViolation("string is not valid UTF-8") from None
        except (IndexError, ValueError, struct.error) as e:
            raise ProtocolViolation(f"malformed packet: {e}") from None
        finally:
            self._keep(data, offset, need)

    def _keep(self, data, offset, need):
        """What is left of ``data`` from ``offset``: a packet ``need`` bytes long begun, or the start of one."""
        rest = self._buffer = data[offset:] if offset else data
        if need > len(rest):
            self._chunks = [rest]
            self._have = len(rest)
            self._need = need

    def _decode(self, packet_type, flags, data, start, end):
        """
        A packet other than PUBLISH from ``start`` (its variable header) to
        ``end``.  The first packet (of the type the stream must begin
        with, never a PUBLISH) comes here, and ends that bound.
        """
        self._first = None
        if packet_type == 0 or packet_type == P.AUTH and not self.v5:
            raise ProtocolViolation(f"reserved packet type {packet_type}")
        if self.strict and flags != _REQUIRED_FLAGS[packet_type]:
            raise _reserved_flags(packet_type, flags)
        if packet_type == P.CONNECT:
            return _decode_connect(flags, data, start, end, self.strict_for_311)
        decoders = _DECODERS5 if self.v5 else _DECODERS
        return decoders[packet_type](flags, data, start, end, self.strict)

    def _first_packet_size(self, first):
        """The first packet's size bound, once its first byte ``first`` shows it of the type expected."""
        if first >> 4 != self._first:
            raise ProtocolViolation(
                f"first packet is not {P.PACKET_NAMES[self._first]} (byte {first:#04x})"
            )
        return self._first_size

    def _too_large(self, size, max_packet_size):
        return ProtocolViolation(
            f"packet of {size} bytes exceeds maximum"
            f" {'CONNECT' if self._first else 'packet'} size {max_packet_size}",
            R.PACKET_TOO_LARGE,
        )

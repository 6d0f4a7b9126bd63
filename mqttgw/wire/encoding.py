"""
The data representations every version shares (section 1.5 of the 5.0
standard, 2.5 of 3.1): a string with its 16-bit length, and the variable
byte integer of the Remaining Length and 5.0's property lengths.
"""

import struct

MAX_VARINT = 268_435_455

_pack_u16 = struct.Struct(">H").pack
_SMALL = [bytes((n,)) for n in range(128)]


def encode_varint(n):
    """A Variable Byte Integer: 7 bits per byte, least significant first."""
    if 0 <= n < 128:
        return _SMALL[n]
    if not 0 <= n <= MAX_VARINT:
        raise ValueError(f"{n} cannot be a variable byte integer (at most {MAX_VARINT})")
    out = bytearray()
    while n:
        digit = n & 0x7F
        n >>= 7
        out.append(digit | 0x80 if n else digit)
    return bytes(out)


def encode_string(s):
    """A UTF-8 string (or raw bytes) with its 16-bit big-endian length."""
    if isinstance(s, str):
        s = s.encode("utf-8")
    if len(s) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _pack_u16(len(s)) + s

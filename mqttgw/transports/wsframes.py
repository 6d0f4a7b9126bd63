"""
The WebSocket frames a client sends in the common case, read from bytes
alone (no I/O, no autobahn state): masked binary frames within the size
limits, whole messages or fragments (MQTT is a byte stream, so where
messages end does not matter), and pings and pongs.  Anything else
(close, text, compressed, an unmasked or malformed frame) stops the scan
where it begins, for autobahn's full parser.  Also the server's own
frame header.
"""

from autobahn.websocket.xormasker import create_xor_masker

# Work per connection per reactor turn, in frames of a packet or more:
# 256, as the MQTT side takes 256 packets a turn.  A frame too small for
# any packet but PINGREQ and DISCONNECT costs about as much to take as
# one of a packet, so it counts for more (a packet dripped a byte a frame
# must not take a whole turn).
FRAMES_PER_TURN = 256
TINY_FRAME = 4
TINY_FRAME_COST = 4
# Below this many bytes a frame is unmasked with one integer XOR, above it
# by autobahn's native masker (whose set-up costs more than small frames).
SMALL_FRAME = 2048
# First bytes of the frames taken here: outside a message, a binary one,
# whole or its first fragment; inside one, its continuations; ping and
# pong (always final, never compressed) anywhere.
_OUTSIDE = frozenset((0x82, 0x02, 0x89, 0x8A))
_INSIDE = frozenset((0x00, 0x80, 0x89, 0x8A))


def unmask(payload, mask):
    """A frame's payload unmasked with its 4-byte key."""
    n = len(payload)
    if n > SMALL_FRAME:
        return create_xor_masker(mask, n).process(bytes(payload))
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def _unmask_all(masked, keys):
    """Small frames' payloads, each beside its key: unmasked with one XOR."""
    payload = b"".join(masked)
    n = len(payload)
    return (int.from_bytes(payload, "little") ^ int.from_bytes(b"".join(keys), "little")).to_bytes(n, "little")


def frame_header(n):
    """A final, unmasked binary frame's header (a server's frames are not masked)."""
    if n < 126:
        return bytes((0x82, n))
    if n < 65536:
        return b"\x82\x7e" + n.to_bytes(2, "big")
    return b"\x82\x7f" + n.to_bytes(8, "big")


class Scan:
    """
    What one scan found: ``payload``, the data frames' payloads unmasked
    and joined (None if there were none); ``pings``, each ping's payload
    unmasked, to answer; ``at``, the offset of the first frame left (or
    the end); ``frames``, their cost against FRAMES_PER_TURN;
    ``fragment``, the bytes so far of a message still fragmented, or
    None; ``cut``, a frame the data ends inside, to complete with the
    next read: (its offset, the bytes it needs), or None.
    """

    __slots__ = ("payload", "pings", "at", "frames", "fragment", "cut")

    def __init__(self, payload, pings, at, frames, fragment, cut):
        self.payload = payload
        self.pings = pings
        self.at = at
        self.frames = frames
        self.fragment = fragment
        self.cut = cut


def scan(data, at, limit, fragment, budget=FRAMES_PER_TURN):
    """
    The frames of ``data`` from ``at`` taken here, up to ``budget`` frames'
    cost; one over ``limit`` bytes (0: none is) stops the scan; ``fragment``
    as Scan's.  Small data frames' payloads since the last large one stay
    masked beside their keys, to be unmasked together.
    """
    size, view = len(data), memoryview(data)
    payloads, pings, masked, keys, frames, cut = [], [], [], [], 0, None
    while frames < budget and at < size:
        first = data[at]
        if (first != 0x82 or fragment is not None) and first not in (_OUTSIDE if fragment is None else _INSIDE):
            break
        if at + 2 > size:
            cut = (at, 6)
            break
        length = data[at + 1] ^ 0x80
        header = 6
        if length >= 126:
            if length == 126:
                header, minimum = 8, 126
            elif length == 127:
                header, minimum = 14, 65536
            else:  # not masked
                break
            if first >= 0x89:
                break
        if at + header > size:
            cut = (at, header)
            break
        if header != 6:
            length = int.from_bytes(view[at + 2 : at + header - 4], "big")
            if length < minimum:
                break
        if limit and (length > limit or (fragment is not None and fragment + length > limit)):
            break
        if at + header + length > size:
            # A small frame, or a fragment of a message begun here (autobahn
            # could not take it up halfway): kept whole.  Larger: autobahn's.
            if header + length <= SMALL_FRAME or fragment is not None:
                cut = (at, header + length)
            break
        start = at + header
        at = start + length
        frames += 1 if length >= TINY_FRAME else TINY_FRAME_COST
        if first >= 0x89:
            if first == 0x89:
                pings.append(unmask(view[start:at], data[start - 4 : start]))
            continue
        if length > SMALL_FRAME:
            if masked:
                payloads.append(_unmask_all(masked, keys))
                masked, keys = [], []
            payloads.append(unmask(view[start:at], data[start - 4 : start]))
        else:
            masked.append(view[start:at])
            keys.append((data[start - 4 : start] * ((length >> 2) + 1))[:length])
        if first != 0x82:
            fragment = None if first & 0x80 else (fragment or 0) + length
    return Scan(_joined(payloads, masked, keys), pings, at, frames, fragment, cut)


def _joined(payloads, masked, keys):
    """The payloads unmasked, in order, as one: None if there are none."""
    if masked:
        payloads.append(_unmask_all(masked, keys))
    if not payloads:
        return None
    return payloads[0] if len(payloads) == 1 else b"".join(payloads)

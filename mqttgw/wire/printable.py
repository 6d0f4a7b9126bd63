"""
Text from the network made safe for a log line: control characters (C0,
DEL, C1) are escaped, so a client id cannot forge log lines, move the
terminal, or make ``grep`` take the log for binary.
"""

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


def printable(text):
    """``text`` with its control characters as ``\\xNN`` escapes."""
    if text is None:
        return None
    if text.isascii() and text.isprintable():
        return text  # the common case, without a copy
    return text.translate(_ESCAPES)

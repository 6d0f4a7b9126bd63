"""
How a session delivers, where a bridge differs from a client: a bridge is
not sent back what it brought in (no local), keeps the RETAIN flag as
published, drains what waited while its link was down at a set pace, and
sends no higher QoS than its upstream takes.  A client's session has the
default policy; a bridge supplies its own.
"""

import attr


class Pacer:
    """
    A token bucket for draining what waited: at most ``messages`` messages and
    ``payload_bytes`` payload bytes a second (0: that one unbounded), a
    second's worth at once.
    """

    __slots__ = ("messages", "payload_bytes", "_m", "_b", "_at", "call")

    def __init__(self, messages=0, payload_bytes=0):
        self.messages = messages
        self.payload_bytes = payload_bytes
        self._m = float(messages)
        self._b = float(payload_bytes)
        self._at = None
        # The pump it has scheduled, while it makes the paced queue wait.
        self.call = None

    def take(self, size, now):
        """0 when a message of ``size`` bytes may go now (and is counted),
        else the seconds until it may."""
        if self._at is not None:
            elapsed = now - self._at
            if self.messages:
                self._m = min(float(self.messages), self._m + elapsed * self.messages)
            if self.payload_bytes:
                self._b = min(float(max(self.payload_bytes, size)), self._b + elapsed * self.payload_bytes)
        self._at = now
        wait = 0.0
        if self.messages and self._m < 1.0:
            wait = (1.0 - self._m) / self.messages
        if self.payload_bytes and self._b < size:
            wait = max(wait, (size - self._b) / self.payload_bytes)
        if wait:
            return wait
        if self.messages:
            self._m -= 1.0
        if self.payload_bytes:
            self._b -= size
        return 0.0


@attr.s(frozen=True, slots=True)
class DeliveryPolicy:
    # Not sent its own messages back (a bridge: that would loop).
    no_local = attr.ib(default=False)
    # Given the RETAIN flag as it was published, not as 3.1.1 says.
    retain_as_published = attr.ib(default=False)
    # What waited while the receiver was away drains at this Pacer's
    # rate, while what comes meanwhile goes first; None: all at once.
    pacer = attr.ib(default=None)
    # The highest QoS the receiver takes (a bridge's 5.0 upstream).
    max_qos = attr.ib(default=2)


CLIENT = DeliveryPolicy()

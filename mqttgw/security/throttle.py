"""
The login throttle: refusals answered later the more often an address has
been refused.
"""

from collections import OrderedDict


class Throttle:
    """
    Refusals from one address are answered after a delay that doubles with
    each failure (from ``first`` up to ``longest`` seconds), so guessing
    passwords is slow; a success forgets the address.  Bounded in size.
    """

    def __init__(self, first=0.1, longest=10.0, size=10_000):
        self.first = first
        self.longest = longest
        self.size = size
        self._failures = OrderedDict()

    def failed(self, host):
        """The delay before this refusal is answered."""
        n = self._failures.pop(host, 0)
        self._failures[host] = n + 1
        if len(self._failures) > self.size:
            self._failures.popitem(last=False)
        return min(self.first * 2**n, self.longest)

    def succeeded(self, host):
        self._failures.pop(host, None)

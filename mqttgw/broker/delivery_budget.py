"""
A dashboard page's share of the broker: what it may read, and at most so
many messages a second, whatever flows.
"""


class DeliveryBudget:
    """
    What a dashboard page may read: ``may_read`` (the ACL), and at most
    ``rate`` messages a second.  The page shows each topic's latest value,
    and an open page would otherwise cost the gateway a second delivery of
    every message.  Once a second's budget is spent the page's filters
    leave the subscription trie until the second ends, so what it misses
    costs the router nothing.  Retained messages are read through
    ``__wrapped__``: never held back.
    """

    def __init__(self, may_read, rate, router, session, clock):
        self.__wrapped__ = may_read
        self.rate = rate
        self.router = router
        self.session = session
        self.clock = clock
        self.left = rate
        self.window_end = clock.seconds() + 1.0
        self._resume = None

    def __call__(self, topic):
        may_read = self.__wrapped__
        if may_read is not None and not may_read(topic):
            return False
        self.left -= 1
        if self.left > 0:
            return True
        now = self.clock.seconds()
        if now >= self.window_end:
            self.window_end = now + 1.0
            self.left = self.rate
            return True
        if self.left == 0:
            self._pause()
            return True
        return False

    def _pause(self):
        self.router.stop_routing(self.session)
        if self._resume is None:
            self._resume = self.clock.callLater(
                max(0.0, self.window_end - self.clock.seconds()), self._resumed
            )

    def _resumed(self):
        self._resume = None
        session = self.session
        self.left = self.rate
        self.window_end = self.clock.seconds() + 1.0
        self.router.resume_routing(session)

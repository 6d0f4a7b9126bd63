"""
A dashboard page's share of the broker: at most so many messages a
second, whatever flows.
"""


class DeliveryBudget:
    """
    At most ``rate`` messages a second routed to a dashboard page's
    session, asked after its ACL check (``session.budget``).  The page
    shows each topic's latest value, and an open page would otherwise cost
    the gateway a second delivery of every message.  Once a second's
    budget is spent the page's filters leave the subscription trie until
    the second ends, so what it misses costs the router nothing.  Retained
    messages are not counted: never held back.
    """

    def __init__(self, rate, router, session, clock):
        self.rate = rate
        self.router = router
        self.session = session
        self.clock = clock
        self.left = rate
        self.window_end = clock.seconds() + 1.0
        self._resume = None

    def __call__(self):
        """Whether one more message may go to the page (it is counted)."""
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

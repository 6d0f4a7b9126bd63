"""
The connection messages (``log.connection_messages``, as mosquitto's):
a line for each client's connect and disconnect while they come a few at
a time, and during a burst (a site's devices all coming back after a
restart) one line a second with how many there were, so logging does not
become most of the gateway's work when it can least afford it.
"""

from twisted.logger import Logger

from mqttgw.wire import reasons as R

log = Logger()

CONNECTED, DISCONNECTED, LOST = "connected", "disconnected", "lost"


class ConnectionMessages:
    """
    Past ``BURST`` lines in one ``INTERVAL`` the rest are counted, not
    logged, and each interval ends with one line of the counts; the
    first interval with no more than ``BURST`` of them ends the burst,
    and lines go out one by one again.
    """

    BURST = 50
    INTERVAL = 1.0

    def __init__(self, clock, logger=log):
        self.clock = clock
        self.logger = logger
        self._window_end = 0.0
        self._lines = 0
        # While a burst lasts: its start, and the counts of this interval.
        self._burst_since = None
        self._counts = None
        self._timer = None

    def info(self, kind, format, **fields):
        """A line of ``kind`` (CONNECTED, DISCONNECTED or LOST)."""
        counts = self._counts
        if counts is None:
            now = self.clock.seconds()
            if now >= self._window_end:
                self._window_end = now + self.INTERVAL
                self._lines = 0
            self._lines += 1
            if self._lines <= self.BURST:
                self.logger.info(format, **fields)
                return
            counts = self._counts = {CONNECTED: 0, DISCONNECTED: 0, LOST: 0}
            self._burst_since = now
            self._timer = self.clock.callLater(max(0.0, self._window_end - now), self._summarise)
        counts[kind] += 1

    def disconnected(self, client_id, reason_code=0):
        """A client's DISCONNECT (``reason_code``, 5.0's: 0 for a normal one)."""
        if reason_code:
            self.info(
                DISCONNECTED, "client {client_id} disconnected: {reason}", client_id=client_id,
                reason=R.name(reason_code),
            )
        else:
            self.info(DISCONNECTED, "client {client_id} disconnected", client_id=client_id)

    def lost(self, client_id, reason):
        """A connected client's connection went away; ``reason``, why in words."""
        self.info(LOST, "client {client_id} connection lost: {reason}", client_id=client_id, reason=reason)

    def _summarise(self):
        counts = self._counts
        now = self.clock.seconds()
        total = sum(counts.values())
        if total:
            self.logger.info(
                "connection burst: {connected} clients connected, {disconnected} disconnected"
                " and {lost} connections lost in the last {interval:.0f}s, not logged one by one"
                " (log.connection_messages); {seconds:.0f}s since it began",
                connected=counts[CONNECTED],
                disconnected=counts[DISCONNECTED],
                lost=counts[LOST],
                interval=self.INTERVAL,
                seconds=now - self._burst_since,
            )
        if total > self.BURST:
            self._counts = {CONNECTED: 0, DISCONNECTED: 0, LOST: 0}
            self._timer = self.clock.callLater(self.INTERVAL, self._summarise)
            return
        self._timer = self._counts = self._burst_since = None
        self._window_end = now + self.INTERVAL
        self._lines = 0
        self.logger.info("connection burst over: connects and disconnects logged one by one again")

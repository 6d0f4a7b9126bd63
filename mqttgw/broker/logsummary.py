"""
Warnings that a flood of misbehaving clients could repeat many times a
second, summarised rather than repeated, so no client can fill the log.
"""

import time

from twisted.logger import LogLevel


class RateLimited:
    """
    A warning that may repeat many times a second (a full queue, a flood
    of bad clients): at most ``burst`` lines per ``interval`` seconds,
    then one line with how many were left out.
    """

    def __init__(self, logger, interval=60.0, burst=10, clock=time.monotonic):
        self.logger = logger
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._window_end = 0.0
        self._logged = 0
        self.suppressed = 0

    def emit(self, level, format, **fields):
        now = self.clock()
        if now >= self._window_end:
            if self.suppressed:
                self.logger.warn(
                    "{suppressed} more warnings like the last were not logged in {interval:.0f}s",
                    suppressed=self.suppressed,
                    interval=self.interval,
                )
            self._window_end = now + self.interval
            self._logged = 0
            self.suppressed = 0
        if self._logged >= self.burst:
            self.suppressed += 1
            return
        self._logged += 1
        if self._logged == self.burst:
            format += " (further ones are counted for {interval:.0f}s, not logged)"
            fields["interval"] = self.interval
        self.logger.emit(level, format, **fields)

    def warn(self, format, **fields):
        self.emit(LogLevel.warn, format, **fields)

    def info(self, format, **fields):
        self.emit(LogLevel.info, format, **fields)


class BySource:
    """
    A line that every connection from one address could repeat (a refused
    CONNECT under a flood): the first from an address is logged, the rest
    are counted, and once per ``interval`` one line per address says how
    many there were.  At most ``size`` addresses are told apart; the rest
    are counted together.
    """

    OTHERS = "other addresses"

    def __init__(self, logger, clock, summary, interval=10.0, size=1000):
        self.logger = logger
        # What the line of an interval says, of {count}, {source},
        # {interval} and the last line's fields.
        self.summary = summary
        self.clock = clock
        self.interval = interval
        self.size = size
        # source: [count left out, last fields]
        self._counts = {}
        self._timer = None

    def info(self, key, format, **fields):
        """A line from ``key`` (an address)."""
        counts = self._counts
        entry = counts.get(key)
        if entry is None:
            if len(counts) >= self.size:
                key = self.OTHERS
                entry = counts.get(key)
            if entry is None:
                counts[key] = [0, fields]
                if self._timer is None:
                    self._timer = self.clock.callLater(self.interval, self._summarise)
                self.logger.info(format, **fields)
                return
        entry[0] += 1
        entry[1] = fields

    def _summarise(self):
        self._timer = None
        counts, self._counts = self._counts, {}
        for source, (count, fields) in counts.items():
            if count:
                self.logger.info(
                    self.summary,
                    **dict(fields, count=count, source=source, interval=self.interval),
                )
        # A source still busy gets a line of its own in the next interval.
        if any(count for count, _ in counts.values()):
            self._counts = {source: [0, fields] for source, (count, fields) in counts.items() if count}
            self._timer = self.clock.callLater(self.interval, self._summarise)

    def stop(self):
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

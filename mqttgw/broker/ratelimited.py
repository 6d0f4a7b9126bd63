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

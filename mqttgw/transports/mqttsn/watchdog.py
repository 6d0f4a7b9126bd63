"""
The keep-alive and sleep deadlines of a listener's clients, on one timer:
clients wait in buckets of whole seconds, and each bucket, when its second
comes, loses those whose deadline has passed and moves on the others
(whose datagrams moved their deadline, an addition each, not a timer).
Ten thousand idle clients hold ten thousand set entries, not as many
timers.
"""

import heapq
import math

# Entries skipped where they wait (clients gone or moved on) tolerated
# beside one per watched client before the buckets are swept of them.
SLACK = 1024


class Watchdog:
    """
    Calls ``client.overdue()`` for each watched client whose ``deadline``
    (clock time, or None: not watched) has passed, within a second.
    """

    __slots__ = ("clock", "buckets", "seconds", "entries", "waiting", "_call", "_next")

    def __init__(self, clock):
        self.clock = clock
        self.buckets = {}  # whole second -> clients due then
        # The buckets' seconds, soonest first (some may have emptied since).
        self.seconds = []
        # Entries in the buckets, and clients watched (one entry each is live).
        self.entries = 0
        self.waiting = 0
        self._call = None
        self._next = None

    def watch(self, client):
        """``client.deadline`` was set: it is checked then (moved earlier if need be)."""
        second = math.ceil(client.deadline)
        bucket = client.watched
        if bucket is not None and bucket <= second:
            # Checked then, and moved on if its deadline is later.
            return
        # An entry left in a later bucket is skipped there: its client
        # waits in this one (lists, not sets: 8 bytes an entry).
        if bucket is None:
            self.waiting += 1
        client.watched = second
        clients = self.buckets.get(second)
        if clients is None:
            clients = self.buckets[second] = []
            heapq.heappush(self.seconds, second)
        clients.append(client)
        self.entries += 1
        if self.entries > 2 * self.waiting + SLACK:
            self._sweep()
        if self._next is None or second < self._next:
            self._schedule(second)

    def unwatch(self, client):
        """Not checked any more (its entry is skipped where it waits)."""
        if client.watched is not None:
            client.watched = None
            self.waiting -= 1

    def _sweep(self):
        """
        The buckets without their skipped entries: a flood of clients that
        come and go (a CONNECT costs a spoofed address nothing) would
        otherwise hold every one gone until its keep alive or sleep (up to
        18 hours) x 1.5 ran out.
        """
        buckets = {}
        for second, clients in self.buckets.items():
            kept = {id(c): c for c in clients if c.watched == second}
            if kept:
                buckets[second] = list(kept.values())
        self.buckets = buckets
        # A sorted list is a heap (changed in place: _due may be walking it).
        self.seconds[:] = sorted(buckets)
        self.entries = sum(len(clients) for clients in buckets.values())

    def _schedule(self, second):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._next = second
        self._call = self.clock.callLater(max(0.0, second - self.clock.seconds()), self._due)

    def _due(self):
        self._call = self._next = None
        now = self.clock.seconds()
        seconds = self.seconds
        while seconds and seconds[0] <= now:
            second = heapq.heappop(seconds)
            clients = self.buckets.pop(second, ())
            self.entries -= len(clients)
            for client in clients:
                if client.watched != second:
                    continue
                client.watched = None
                self.waiting -= 1
                deadline = client.deadline
                if deadline is None:
                    continue
                if deadline > now:
                    self.watch(client)
                else:
                    client.overdue()
        while seconds and seconds[0] not in self.buckets:
            heapq.heappop(seconds)
        if seconds and self._next is None:
            self._schedule(seconds[0])

    def stop(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = self._next = None

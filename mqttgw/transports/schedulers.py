"""
Work for every connection under one timer each, rather than a timer per
connection: keepalive deadlines, CONNECT deadlines, and the per-turn
flush of output and admission of new connections.
"""

import heapq
from collections import deque

from twisted.logger import Logger

from mqttgw.transports.connlog import ConnectionMessages
from mqttgw.transports.handshake import BEFORE_CONNACK, CLOSED

log = Logger()


class Stalls:
    """
    Spans of time in which the reactor did not run: the process was stopped
    (SIGSTOP, a suspended machine), a turn took that long, or the clock
    jumped forward.  Nothing a client sent meanwhile could be read, so a
    span is nobody's silence: keepalive and CONNECT deadlines are moved on
    by it.  A timer that fires more than ``LATE`` seconds after it was due
    finds one, reaching back to the last moment the reactor was seen at
    work (:meth:`alive`).
    """

    LATE = 1.0
    # Spans kept: an older one only counts for clients silent since.
    KEPT = 16

    def __init__(self, clock):
        self.clock = clock
        self.last = clock.seconds()
        self._spans = deque(maxlen=self.KEPT)

    def alive(self, now):
        """The reactor was at work at ``now``."""
        self.last = now

    def late(self, due, now):
        """
        How long the reactor stalled, if a timer due at ``due`` that fires
        at ``now`` found a stall (recorded, and logged once), else 0.
        Neither read nor judged meanwhile: from the timer's due time, or
        the last sign of work if earlier, to now.
        """
        if now - due <= self.LATE:
            self.last = now
            return 0.0
        start, self.last = min(self.last, due), now
        spans = self._spans
        if spans and start <= spans[-1][1]:
            # Another timer found this one already.
            start = min(start, spans[-1][0])
            spans[-1] = (start, now)
            return now - start
        spans.append((start, now))
        log.warn(
            "the gateway did not run for {seconds:.1f}s (stopped, or the clock jumped):"
            " what clients sent meanwhile is read before keepalive is judged",
            seconds=now - start,
        )
        return now - start

    def since(self, moment):
        """Seconds of stall after ``moment``."""
        if not self._spans:
            return 0.0
        return sum(end - max(start, moment) for start, end in self._spans if end > moment)


class KeepaliveTimers:
    """
    Every connection's keepalive deadline in one heap under one timer, set
    for the earliest: a DelayedCall per connection cost an idle client
    some 450 bytes, a heap entry a fifth of that.  Entries of connections
    that closed are dropped when they come due.

    A check that comes late (see :class:`Stalls`) judges nobody: it runs
    again on the next turn, once the reactor has read what is waiting, and
    the stall is not counted as any client's silence.
    """

    def __init__(self, clock, stalls=None):
        self.clock = clock
        self.stalls = stalls if stalls is not None else Stalls(clock)
        self._heap = []
        self._call = None
        self._order = 0
        self._closed = 0

    def closed(self):
        """
        A connection with a deadline here closed.  Once they are most of
        the heap (a reconnect storm), it is rebuilt without them rather
        than holding them until they come due.
        """
        self._closed += 1
        if self._closed > 64 and self._closed * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[2].state is not CLOSED]
            heapq.heapify(self._heap)
            self._closed = 0

    def add(self, connection, due):
        self._order += 1
        heapq.heappush(self._heap, (due, self._order, connection))
        if self._call is None or due < self._call.getTime():
            if self._call is not None:
                self._call.cancel()
            self._call = self.clock.callLater(max(0.0, due - self.clock.seconds()), self._fire)

    def _fire(self):
        due_at = self._call.getTime()
        self._call = None
        heap = self._heap
        now = self.clock.seconds()
        stalls = self.stalls
        if stalls.late(due_at, now):
            self._call = self.clock.callLater(0, self._fire)
            return
        while heap and heap[0][0] <= now:
            _, _, connection = heapq.heappop(heap)
            try:
                due = connection.keepalive_due(now, stalls)
            except Exception:
                log.failure("keepalive check of {client_id} failed", client_id=connection.log_id)
                continue
            if due is not None:
                self._order += 1
                heapq.heappush(heap, (due, self._order, connection))
        if heap:
            self._call = self.clock.callLater(max(0.0, heap[0][0] - now), self._fire)


class ConnectDeadlines:
    """
    The CONNECT deadlines of new connections under one timer.  They come in
    the order they are due (one timeout for all), so they are kept in
    buckets of those due within ``GRAIN`` seconds of each other: a
    connection costs a slot in a list, where a timer made and cancelled for
    each was some 450 bytes and a tenth of a connect's time.  A bucket
    fires at its last member's deadline: no connection is closed early, and
    none more than ``GRAIN`` late.  (A timeout shortened by a reload waits
    for the buckets before it.)
    """

    GRAIN = 0.1

    def __init__(self, clock, stalls=None):
        self.clock = clock
        self.stalls = stalls if stalls is not None else Stalls(clock)
        # [due, first member's due, connections]
        self._buckets = deque()
        self._call = None
        self._held = 0
        self._closed = 0

    def add(self, connection, timeout):
        now = self.clock.seconds()
        self.stalls.alive(now)
        due = now + timeout
        buckets = self._buckets
        if buckets and 0 <= due - buckets[-1][1] < self.GRAIN:
            bucket = buckets[-1]
            bucket[2].append(connection)
            if due > bucket[0]:
                bucket[0] = due
        else:
            buckets.append([due, due, [connection]])
        self._held += 1
        if self._call is None:
            self._call = self.clock.callLater(max(0.0, buckets[0][0] - self.clock.seconds()), self._fire)

    def closed(self):
        """
        A connection closed.  Once closed ones are most of those held (a
        reconnect storm), the buckets are rebuilt with only the connections
        still waiting for CONNECT, rather than holding the others until
        their deadline.
        """
        self._closed += 1
        if self._closed > 64 and self._closed * 2 > self._held:
            for bucket in self._buckets:
                bucket[2] = [c for c in bucket[2] if c.state in BEFORE_CONNACK]
            self._held = sum(len(bucket[2]) for bucket in self._buckets)
            self._closed = 0

    def _fire(self):
        due_at = self._call.getTime()
        self._call = None
        buckets = self._buckets
        now = self.clock.seconds()
        stalled = self.stalls.late(due_at, now)
        if stalled:
            # Those waiting could not be read meanwhile: their deadlines
            # move on by the stall, and none is judged before the next
            # turn has read what they sent.
            for bucket in buckets:
                bucket[0] += stalled
                bucket[1] += stalled
            if buckets:
                self._call = self.clock.callLater(max(0.0, buckets[0][0] - now), self._fire)
            return
        while buckets and buckets[0][0] <= now:
            _, _, connections = buckets.popleft()
            self._held -= len(connections)
            for connection in connections:
                if connection.state in BEFORE_CONNACK:
                    try:
                        connection.connect_due()
                    except Exception:
                        log.failure("CONNECT deadline of {peer} failed", peer=connection.peer)
        if buckets:
            self._call = self.clock.callLater(max(0.0, buckets[0][0] - now), self._fire)


class Flusher:
    """
    Work shared out per reactor turn, one for every listener.  Connections
    with output waiting are flushed on the next turn: all the reads of one
    turn cost each subscriber a single transport write, rather than one per
    message.

    New connections are read from at most ``OPENINGS`` at a time until their
    first bytes are read: a storm of clients connecting at once (whose
    CONNECTs tend to arrive together, a moment after their connections were
    accepted) then has at most that many CONNECTs read and answered a poll,
    instead of hundreds in one long turn that holds up everyone else.  A
    connection that sends nothing keeps its place ``OPENING_HOLD`` seconds
    at most, so idle sockets cannot keep others out.  While the store is
    behind (see :meth:`hold_reading`), no connection is read from: those
    with data wait in the same line and are taken in as new ones are once
    it has caught up.
    """

    OPENINGS = 32
    OPENING_HOLD = 0.01

    def __init__(self, clock):
        self.clock = clock
        self.stalls = Stalls(clock)
        self.keepalives = KeepaliveTimers(clock, self.stalls)
        self.connects = ConnectDeadlines(clock, self.stalls)
        # Every listener's connects and disconnects, summed up in a burst.
        self.connection_messages = ConnectionMessages(clock)
        self.pending = []
        self._call = None
        # Connections admitted and not yet read from (``opening`` set on
        # each), and when each was admitted, oldest first.
        self._opening = 0
        self._openings = deque()
        self._waiting = deque()
        # Listening ports stopped for want of room (see tcp.Port).
        self._ports = []
        self._admit_call = None
        self.reading_held = False

    def hold_reading(self, held):
        """The store's congestion (``Store.congestion_listeners``): stop or restart reading."""
        self.reading_held = held
        if not held and (self._waiting or self._ports):
            self._schedule_admissions(0)

    def admit(self, connection):
        """Whether ``connection`` may be read from now; if not, it is told later."""
        if not self._waiting and not self.reading_held and self._free():
            self._hold(connection)
            return True
        self._waiting.append(connection)
        if not self.reading_held:
            self._schedule_admissions()
        return False

    def room(self):
        """How many new connections a stopped listening port may accept now."""
        if self.reading_held:
            return 0
        free = self._free()
        # Connections waiting (WebSocket's and TLS's, admitted after
        # their handshake) have half of it: see _admit_turn.
        return free // 2 if self._waiting else free

    def wait_for_room(self, port):
        """
        ``port`` has connections waiting for room (it stopped reading, or
        holds sockets it took in): it is told once there is (``startReading``).
        """
        if port not in self._ports:
            self._ports.append(port)
        if not self.reading_held:
            self._schedule_admissions()

    def opened(self, connection):
        """``connection`` (``opening``) was read from, or closed: its place is free."""
        connection.opening = False
        self._opening -= 1
        if (self._waiting or self._ports) and not self.reading_held:
            self._schedule_admissions(0)

    def _free(self):
        """Places free now, those held too long by connections that sent nothing freed."""
        if self._opening >= self.OPENINGS:
            self._expire(self.clock.seconds())
        return self.OPENINGS - self._opening

    def _hold(self, connection):
        now = self.clock.seconds()
        # Entries behind a silent connection's would otherwise pile up
        # (and keep their connections alive) until it closes.
        self._expire(now)
        connection.opening = True
        self._opening += 1
        self._openings.append((now, connection))

    # Clock readings are floats: a call due at a place's expiry may read a
    # hair before it.
    _EPSILON = 1e-6

    def _expire(self, now):
        """Places held longer than OPENING_HOLD by connections that sent nothing are freed."""
        openings = self._openings
        while openings:
            admitted_at, connection = openings[0]
            if connection.opening:
                if now - admitted_at < self.OPENING_HOLD - self._EPSILON:
                    return
                connection.opening = False
                self._opening -= 1
            openings.popleft()

    def _schedule_admissions(self, delay=None):
        """An admission turn in ``delay`` seconds; by default as soon as a place is free."""
        now = self.clock.seconds()
        if delay is None:
            delay = 0.0
            if not self._free():
                delay = max(0.0, self._openings[0][0] + self.OPENING_HOLD - now)
        call = self._admit_call
        if call is not None:
            if call.getTime() <= now + delay:
                return
            call.cancel()
        self._admit_call = self.clock.callLater(delay, self._admit_turn)

    def _admit_turn(self):
        self._admit_call = None
        if self.reading_held:
            return
        waiting = self._waiting
        # While a listening port waits for room, those waiting take half of
        # the free places and the port the rest, so that neither a storm of
        # WebSocket or TLS clients nor one of TCP clients shuts the other out.
        free = self._free()
        budget = (free + 1) // 2 if self._ports else free
        while waiting and budget > 0 and not self.reading_held:
            connection = waiting.popleft()
            if connection.state is CLOSED:
                continue
            budget -= 1
            # One whose reading the store held (see hold_reading) was read
            # from already: it takes no place.
            if connection.unread:
                self._hold(connection)
            connection.admitted()
        if self._ports and self._free():
            ports, self._ports = self._ports, []
            for port in ports:
                if port.listening():
                    port.startReading()
        if (waiting or self._ports) and not self.reading_held:
            self._schedule_admissions()

    def mark(self, connection):
        self.pending.append(connection)
        if self._call is None:
            self._call = self.clock.callLater(0, self._run)

    def alone(self, connection):
        """Whether ``connection`` is the only one with output this turn."""
        return self.pending == [connection]

    def _run(self):
        self._call = None
        self.stalls.alive(self.clock.seconds())
        self.flush()

    def flush(self):
        while self.pending:
            pending, self.pending = self.pending, []
            for connection in pending:
                try:
                    connection.flush()
                except Exception:
                    # One connection's failure must not keep the others'
                    # output from leaving.
                    connection.flush_failed()

"""
Ack means safe: the acknowledgements of one connection held back, in the
order their packets came, until what they acknowledge is committed (or
acknowledged by every receiver of a stored copy), and told when the
commit failed instead.
"""

from collections import deque
from functools import partial


class Held:
    """
    A routed publish whose acknowledgement waits for the store.  It may go
    before the commit once every copy written for it has been acknowledged
    by its receiver: then there is nothing left that a crash could lose.
    A retained message, or a QoS 0 copy kept for a receiver that is away,
    is ``blocked``: its ack waits for the commit.
    """

    __slots__ = ("pending", "blocked", "release")

    def __init__(self):
        # Stored copies in flight, not yet acknowledged by their receivers.
        self.pending = 0
        self.blocked = False
        self.release = None

    def delivered(self):
        self.pending -= 1
        if not self.pending and not self.blocked and self.release is not None:
            self.release()


class OrderedAcks:
    """
    Ack means safe: an ack for a message written to the store waits for
    its commit (or, see Held, for its receivers' acks), and every later ack
    of the same connection waits behind it, since acks go out in the order
    their packets came in.
    """

    def __init__(self, store, write):
        self._store = store
        self._write = write
        # [ack, ready, held] in the order the packets came: while it is
        # empty, an ack that need not wait may be written directly.
        self.queue = deque()

    def send(self, ack, durable, held=None):
        if self._store is None or not (durable or self.queue):
            self._write(ack)
            return
        entry = [ack, not durable, held]
        self.queue.append(entry)
        if durable:
            self._store.after_commit(self._release, entry, failed=self._failed)
            if held is not None:
                held.release = partial(self._release, entry)

    @property
    def waiting(self):
        """Acks held back."""
        return len(self.queue)

    def _release(self, entry):
        entry[1] = True
        if entry[2] is not None:
            # Its copies may wait in queues for long: they keep no hold on
            # this connection.
            entry[2].release = entry[2] = None
        queue = self.queue
        while queue and queue[0][1]:
            self._write(queue.popleft()[0])

    # Called, once per failed commit, instead of _release: with the error.
    on_failure = None

    def _failed(self, error):
        if self.on_failure is not None:
            self.on_failure(error)

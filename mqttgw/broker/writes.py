"""
What the reactor hands the store, and how the writer thread turns a batch
of it into as few statements as give the same end state.

The reactor only appends small tuples (an op code and the values); rows
and SQL are made here, off the reactor.  A batch commits as one
transaction, so only its end state matters: a delivery added and removed
within one batch (a message delivered and acknowledged before its commit)
never reaches the disk, an added delivery's later changes are folded into
its row, and removals of one session's consecutive deliveries go as one
range.  Statements on other tables keep their order.
"""

from mqttgw.wire.properties import encode_properties

# Op codes: the first item of each op.
ADD = 0  # (ADD, client_id, seq, message, qos, retain, message_id, state)
UPDATE = 1  # (UPDATE, client_id, seq, message_id, state)
DELETE = 2  # (DELETE, client_id, seq)
SENT = 3  # (SENT, client_id, seq): queued deliveries up to seq went out
PUBREL_ADD = 4  # (PUBREL_ADD, client_id, message_id)
PUBREL_DELETE = 5  # (PUBREL_DELETE, client_id, message_id)
DROP_SESSION = 6  # (DROP_SESSION, client_id)
SQL = 7  # (SQL, statement, args): anything else, in order

_INSERT = "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_UPDATE = "UPDATE deliveries SET message_id = ?, state = ? WHERE client_id = ? AND seq = ?"
_DELETE_RANGE = "DELETE FROM deliveries WHERE client_id = ? AND seq BETWEEN ? AND ?"
_SENT = (
    "UPDATE sessions SET sent_seq = max(coalesce(sent_seq, 0), ?) WHERE client_id = ?"
)
_PUBREL_ADD = "INSERT OR IGNORE INTO awaiting_pubrel VALUES (?, ?)"
_PUBREL_DELETE = "DELETE FROM awaiting_pubrel WHERE client_id = ? AND message_id = ?"
_DROP_SESSION = [
    f"DELETE FROM {table} WHERE client_id = ?"
    for table in ("sessions", "subscriptions", "deliveries", "awaiting_pubrel")
]


# What a batch did to an awaiting_pubrel row.
_ADDED, _READDED, _REMOVED = "added", "re-added", "removed"


def delivery_row(client_id, seq, message, qos, retain, message_id, state):
    props = message.properties
    return [
        client_id, seq, message.topic, message.payload, qos, int(retain), message_id, state,
        encode_properties(props) if props else None, message.expiry,
    ]


def ranges(seqs):
    """Sorted ``seqs`` as (first, last) runs of consecutive numbers."""
    seqs = sorted(seqs)
    first = last = seqs[0]
    for seq in seqs[1:]:
        if seq != last + 1:
            yield first, last
            first = seq
        last = seq
    yield first, last


class Compaction:
    """One batch's ops, folded; ``statements()`` gives what to execute."""

    def __init__(self):
        # Statements in order: (sql, [args, ...]); runs of one statement
        # go to SQLite as one executemany.
        self._runs = []
        # Deliveries and QoS 2 ids, by key, in the order first added.
        self._inserts = {}
        self._updates = {}
        self._deletes = {}
        self._sent = {}
        self._pubrel = {}
        self.ops = 0
        self.folded = 0

    def add(self, ops):
        self.ops += len(ops)
        inserts = self._inserts
        for op in ops:
            code = op[0]
            if code == ADD:
                inserts[op[1], op[2]] = op
            elif code == DELETE:
                key = op[1], op[2]
                if inserts.pop(key, None) is not None:
                    self._updates.pop(key, None)
                    self.folded += 2
                else:
                    self._updates.pop(key, None)
                    deletes = self._deletes.get(op[1])
                    if deletes is None:
                        deletes = self._deletes[op[1]] = set()
                    deletes.add(op[2])
            elif code == UPDATE:
                key = op[1], op[2]
                added = inserts.get(key)
                if added is not None:
                    inserts[key] = (*added[:6], op[3], op[4])
                    self.folded += 1
                else:
                    self._updates[key] = op
            elif code == SENT:
                if op[2] > self._sent.get(op[1], 0):
                    self._sent[op[1]] = op[2]
            elif code == PUBREL_ADD:
                key = op[1], op[2]
                # Added again after a removal this batch: the committed
                # row must go if it is removed once more.
                self._pubrel[key] = _READDED if key in self._pubrel else _ADDED
            elif code == PUBREL_DELETE:
                key = op[1], op[2]
                if self._pubrel.get(key) is _ADDED:
                    del self._pubrel[key]
                    self.folded += 2
                else:
                    self._pubrel[key] = _REMOVED
            elif code == DROP_SESSION:
                self._drop(op[1])
            else:
                self._statement(op[1], op[2])

    def _statement(self, sql, args):
        runs = self._runs
        if runs and runs[-1][0] is sql:
            runs[-1][1].append(args)
        else:
            runs.append((sql, [args]))

    def _drop(self, client_id):
        """Everything of the session's so far in this batch is superseded."""
        for held in (self._inserts, self._updates, self._pubrel):
            for key in [k for k in held if k[0] == client_id]:
                del held[key]
        self._deletes.pop(client_id, None)
        self._sent.pop(client_id, None)
        # What comes later for the same client id (a new session) is
        # executed after the drop, since held ops go last.
        for sql in _DROP_SESSION:
            self._statement(sql, (client_id,))

    def statements(self):
        """(sql, [args, ...]) to execute, in order."""
        yield from self._runs
        if self._inserts:
            yield _INSERT, [delivery_row(*op[1:]) for op in self._inserts.values()]
        if self._updates:
            yield _UPDATE, [(op[3], op[4], op[1], op[2]) for op in self._updates.values()]
        if self._deletes:
            yield _DELETE_RANGE, [
                (client_id, first, last)
                for client_id, seqs in self._deletes.items()
                for first, last in ranges(seqs)
            ]
        if self._sent:
            yield _SENT, [(seq, client_id) for client_id, seq in self._sent.items()]
        if self._pubrel:
            added = [key for key, state in self._pubrel.items() if state is not _REMOVED]
            removed = [key for key, state in self._pubrel.items() if state is _REMOVED]
            if added:
                yield _PUBREL_ADD, added
            if removed:
                yield _PUBREL_DELETE, removed

"""
What the reactor hands the store, and how the writer thread turns a batch
of it into as few statements (sql.py's) as give the same end state.

The reactor only appends small tuples (an op code and the values); rows
and SQL are made here, off the reactor.  A batch commits as one
transaction, so only its end state matters: a delivery added and removed
within one batch (a message delivered and acknowledged before its commit)
never reaches the disk, an added delivery's later changes are folded into
its row, removals of one session's consecutive deliveries go as one
range, and only a retained topic's last value is written.  Statements on
other tables keep their order.
"""

from mqttgw.broker import sql
from mqttgw.wire.properties import encode_properties

# Op codes: the first item of each op.
ADD = 0  # (ADD, client_id, seq, message, qos, retain, message_id, state)
UPDATE = 1  # (UPDATE, client_id, seq, message_id, state)
DELETE = 2  # (DELETE, client_id, seq)
SENT = 3  # (SENT, client_id, seq): queued deliveries up to seq went out
PUBREL_ADD = 4  # (PUBREL_ADD, client_id, message_id)
PUBREL_DELETE = 5  # (PUBREL_DELETE, client_id, message_id)
DROP_SESSION = 6  # (DROP_SESSION, client_id)
SQL = 7  # (SQL, statement, args): one of sql.py's, in order
RETAIN = 8  # (RETAIN, topic, message or None to delete)

# What a batch did to an awaiting_pubrel row.
_ADDED, _READDED, _REMOVED = "added", "re-added", "removed"


def delivery_row(client_id, seq, message, qos, retain, message_id, state):
    return [
        client_id, seq, message.topic, message.payload, qos, int(retain), message_id, state,
        *_message_columns(message),
    ]


def retained_row(message):
    return (message.topic, message.payload, message.qos, *_message_columns(message))


def _message_columns(message):
    """A message's 5.0 properties (encoded) and expiry, as stored."""
    props = message.properties
    return (encode_properties(props) if props else None), message.expiry


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
        # Per client id, in the order first seen: deliveries added
        # {seq: op}, updated {seq: op} and deleted {seq}; queued deliveries
        # sent up to; QoS 2 ids {message_id: what the batch did to it}.
        self._inserts = {}
        self._updates = {}
        self._deletes = {}
        self._sent = {}
        self._pubrel = {}
        # Retained messages: topic -> message, or None to delete.
        self._retained = {}
        self.ops = 0
        self.folded = 0

    def add(self, ops):
        self.ops += len(ops)
        for op in ops:
            code = op[0]
            if code == ADD:
                _of(self._inserts, op[1])[op[2]] = op
            elif code == DELETE:
                client_id, seq = op[1], op[2]
                updates = self._updates.get(client_id)
                if updates:
                    updates.pop(seq, None)
                inserts = self._inserts.get(client_id)
                if inserts and inserts.pop(seq, None) is not None:
                    self.folded += 2
                else:
                    _of(self._deletes, client_id, set).add(seq)
            elif code == UPDATE:
                inserts = _of(self._inserts, op[1])
                added = inserts.get(op[2])
                if added is not None:
                    inserts[op[2]] = (*added[:6], op[3], op[4])
                    self.folded += 1
                else:
                    _of(self._updates, op[1])[op[2]] = op
            elif code == SENT:
                if op[2] > self._sent.get(op[1], 0):
                    self._sent[op[1]] = op[2]
            elif code == PUBREL_ADD:
                pubrel = _of(self._pubrel, op[1])
                # Added again after a removal this batch: the committed
                # row must go if it is removed once more.
                pubrel[op[2]] = _READDED if op[2] in pubrel else _ADDED
            elif code == PUBREL_DELETE:
                pubrel = _of(self._pubrel, op[1])
                if pubrel.get(op[2]) is _ADDED:
                    del pubrel[op[2]]
                    self.folded += 2
                else:
                    pubrel[op[2]] = _REMOVED
            elif code == RETAIN:
                self._retained[op[1]] = op[2]
            elif code == DROP_SESSION:
                self._drop(op[1])
            else:
                self._statement(op[1], op[2])

    def _statement(self, statement, args):
        runs = self._runs
        if runs and runs[-1][0] == statement:
            runs[-1][1].append(args)
        else:
            runs.append((statement, [args]))

    def _drop(self, client_id):
        """Everything of the session's so far in this batch is superseded."""
        for held in (self._inserts, self._updates, self._deletes, self._sent, self._pubrel):
            held.pop(client_id, None)
        # What comes later for the same client id (a new session) is
        # executed after the drop, since held ops go last.
        for statement in sql.SESSION_DROP:
            self._statement(statement, (client_id,))

    def statements(self):
        """(sql, [args, ...]) to execute, in order."""
        yield from self._runs
        inserts = [delivery_row(*op[1:]) for ops in self._inserts.values() for op in ops.values()]
        if inserts:
            yield sql.DELIVERY_ADD, inserts
        updates = [(op[3], op[4], op[1], op[2]) for ops in self._updates.values() for op in ops.values()]
        if updates:
            yield sql.DELIVERY_UPDATE, updates
        if self._deletes:
            yield sql.DELIVERIES_DELETE, [
                (client_id, first, last)
                for client_id, seqs in self._deletes.items()
                for first, last in ranges(seqs)
            ]
        if self._sent:
            yield sql.SESSION_SENT, [(seq, client_id) for client_id, seq in self._sent.items()]
        added = [
            (client_id, mid)
            for client_id, ids in self._pubrel.items()
            for mid, state in ids.items()
            if state is not _REMOVED
        ]
        if added:
            yield sql.PUBREL_ADD, added
        removed = [
            (client_id, mid)
            for client_id, ids in self._pubrel.items()
            for mid, state in ids.items()
            if state is _REMOVED
        ]
        if removed:
            yield sql.PUBREL_DELETE, removed
        kept = [retained_row(m) for m in self._retained.values() if m is not None]
        if kept:
            yield sql.RETAINED_SET, kept
        gone = [(topic,) for topic, m in self._retained.items() if m is None]
        if gone:
            yield sql.RETAINED_DELETE, gone


def _of(by_client, client_id, make=dict):
    """``by_client[client_id]``, made (a dict, or ``make()``) when missing."""
    held = by_client.get(client_id)
    if held is None:
        held = by_client[client_id] = make()
    return held

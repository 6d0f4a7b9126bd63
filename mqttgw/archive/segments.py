"""
The message archive: what the gateway carries, recorded as immutable
Parquet segments, ``DIR/date=YYYY-MM-DD/hour=HH/*.parquet``.  A segment is
written under ``DIR/_tmp/`` and renamed in when complete: every N seconds,
every N rows, at each hour boundary, and on shutdown.  The reactor only
appends rows to a list; a writer thread does the Parquet work.  If the
disk fails, routing goes on: the rows are dropped, counted and logged.
Each row names the kind of listener its client came through (``listener``).
"""

import os
import queue
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqttgw.broker.session import INTERNAL_PREFIX
from mqttgw.broker.subscriptions import SHARE_PREFIX, SharedGroup
from mqttgw.broker.topics import matches

log = Logger()

DIRECTIONS = ("in", "out", "bridge_in", "bridge_out")

SCHEMA = pa.schema(
    [
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("gateway_id", pa.string()),
        ("sequence", pa.int64()),
        ("direction", pa.string()),
        ("client_id", pa.string()),
        # tcp, tls, ws, wss, mqttsn; bridge; "" where no client is known.
        ("listener", pa.string()),
        ("topic", pa.string()),
        ("qos", pa.int8()),
        ("retain", pa.bool_()),
        ("payload", pa.binary()),
        ("payload_length", pa.int32()),
    ]
)

_STOP = object()


def partition(timestamp_us):
    """``date=YYYY-MM-DD/hour=HH`` of a microsecond UTC timestamp."""
    t = datetime.fromtimestamp(timestamp_us / 1e6, tz=timezone.utc)
    return f"date={t:%Y-%m-%d}/hour={t:%H}"


class Archive:
    """
    Records messages published into the router (``in``, ``bridge_in``),
    delivered to clients (``out``) and forwarded upstream (``bridge_out``).
    """

    def __init__(
        self,
        directory,
        reactor,
        gateway_id,
        include=("#",),
        exclude=(),
        directions=("in", "bridge_in", "bridge_out"),
        roll_seconds=60.0,
        roll_rows=100_000,
        flush_interval=0.5,
        clock=time.time,
    ):
        self.directory = Path(directory)
        self.reactor = reactor
        self.gateway_id = gateway_id
        self.include = list(include)
        self.exclude = list(exclude)
        self.directions = frozenset(directions)
        self.roll_seconds = roll_seconds
        self.roll_rows = roll_rows
        self.flush_interval = flush_interval
        self.clock = clock
        self.dropped = 0
        self.written = 0
        self._rows = []
        self._sequence = 0
        self._wanted = {}
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._flush_loop = None
        self._writer = None
        self._segments = 0
        self._failing = False

    @property
    def failing(self):
        """Whether the last write failed (rows are being dropped)."""
        return self._failing

    # The reactor side

    def set_filters(self, include, exclude):
        """
        From now on, record the topics one of ``include`` matches and none
        of ``exclude`` does.
        """
        self.include = list(include)
        self.exclude = list(exclude)
        # The answers cached under the old filters no longer hold.
        self._wanted.clear()

    def _topic_wanted(self, topic):
        wanted = self._wanted.get(topic)
        if wanted is None:
            wanted = any(matches(f, topic) for f in self.include) and not any(
                matches(f, topic) for f in self.exclude
            )
            if len(self._wanted) > 100_000:
                self._wanted.clear()
            self._wanted[topic] = wanted
        return wanted

    def record(self, direction, client_id, message, listener=""):
        """One row; ``listener``: the kind of listener ``client_id`` came through."""
        if direction not in self.directions or not self._topic_wanted(message.topic):
            return
        self._sequence += 1
        self._rows.append(
            (
                int(self.clock() * 1_000_000),
                self._sequence,
                direction,
                client_id,
                listener,
                message.topic,
                message.qos,
                message.retain,
                message.payload,
            )
        )

    def published(self, message, sender, subscribers):
        """
        The router's hook: one message routed to ``subscribers``.  The
        listener column is the session's ``listener_kind``, one attribute
        read: a will, or a copy queued for a client that is away, gets the
        kind of that client's last connection; the gateway's own messages
        (no sender), "".
        """
        if sender is None:
            self.record("in", "", message)
        elif sender.internal:
            self.record("bridge_in", sender.client_id.removeprefix(INTERNAL_PREFIX), message, "bridge")
        else:
            self.record("in", sender.client_id, message, sender.listener_kind)
        if "out" in self.directions:
            for session, _ in subscribers:
                if type(session) is SharedGroup:
                    # Its member is picked as it delivers: the row names the group.
                    self.record("out", f"{SHARE_PREFIX}{session.name}", message, "")
                elif not session.internal:
                    self.record("out", session.client_id, message, session.listener_kind)

    def _hand_off(self):
        if self._rows:
            rows, self._rows = self._rows, []
            self._queue.put(rows)

    def start(self):
        self._thread = threading.Thread(target=self._write_loop, name="mqttgw-archive", daemon=True)
        self._thread.start()
        self._flush_loop = LoopingCall(self._hand_off)
        self._flush_loop.clock = self.reactor
        self._flush_loop.start(self.flush_interval, now=False)

    def stop(self):
        """Write what is left and close the open segment (blocks)."""
        if self._flush_loop is not None and self._flush_loop.running:
            self._flush_loop.stop()
        self._hand_off()
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # The writer thread

    def _write_loop(self):
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._close_segment()
                return
            if item:
                self._write_rows(item)
            self._roll_if_due()

    def _write_rows(self, rows):
        # Rows of one batch may straddle an hour: each hour its own segment.
        start = 0
        while start < len(rows):
            hour = partition(rows[start][0])
            end = start
            while end < len(rows) and partition(rows[end][0]) == hour:
                end += 1
            self._write_hour(hour, rows[start:end])
            start = end

    def _write_hour(self, hour, rows):
        try:
            if self._writer is not None and self._writer["hour"] != hour:
                self._close_segment()
            while rows:
                if self._writer is None:
                    self._open_segment(hour, rows[0][0])
                room = self.roll_rows - self._writer["rows"]
                chunk, rows = rows[:room], rows[room:]
                self._writer["file"].write_table(self._table(chunk))
                self._writer["rows"] += len(chunk)
                self.written += len(chunk)
                if self._writer["rows"] >= self.roll_rows:
                    self._close_segment()
            if self._failing:
                self._failing = False
                self._log(log.info, "archive {dir}: writing again", dir=str(self.directory))
        except (OSError, pa.ArrowException) as e:
            self.dropped += len(rows)
            self._abandon_segment()
            if not self._failing:
                self._failing = True
                self._log(
                    log.error,
                    "archive {dir}: cannot write ({error}); dropping records",
                    dir=str(self.directory),
                    error=e,
                )
            self._log(
                log.debug, "archive dropped {n} records ({total} so far)", n=len(rows), total=self.dropped
            )

    def _table(self, rows):
        columns = list(zip(*rows))
        n = len(rows)
        payloads = columns[8]
        return pa.Table.from_arrays(
            [
                pa.array(columns[0], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array([self.gateway_id] * n, pa.string()),
                pa.array(columns[1], pa.int64()),
                pa.array(columns[2], pa.string()),
                pa.array(columns[3], pa.string()),
                pa.array(columns[4], pa.string()),
                pa.array(columns[5], pa.string()),
                pa.array(columns[6], pa.int8()),
                pa.array(columns[7], pa.bool_()),
                pa.array(payloads, pa.binary()),
                pa.array([len(p) for p in payloads], pa.int32()),
            ],
            schema=SCHEMA,
        )

    def _open_segment(self, hour, first_us):
        tmp = self.directory / "_tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        self._segments += 1
        name = f"{self.gateway_id}-{first_us}-{os.getpid()}-{self._segments}.parquet"
        path = tmp / name
        self._writer = {
            "hour": hour,
            "name": name,
            "path": path,
            "file": pq.ParquetWriter(path, SCHEMA, compression="zstd"),
            "rows": 0,
            "opened": time.monotonic(),
        }

    def _roll_if_due(self):
        if self._writer is not None and time.monotonic() - self._writer["opened"] >= self.roll_seconds:
            self._close_segment()

    def _close_segment(self):
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer["file"].close()
            final = self.directory / writer["hour"]
            final.mkdir(parents=True, exist_ok=True)
            # Complete segments appear whole, by rename, or not at all.
            os.replace(writer["path"], final / writer["name"])
        except OSError as e:
            self.dropped += writer["rows"]
            self._log(log.error, "archive {dir}: cannot close segment: {error}", dir=str(self.directory), error=e)

    def _abandon_segment(self):
        writer, self._writer = self._writer, None
        if writer is not None:
            self.dropped += writer["rows"]
            try:
                writer["file"].close()
                writer["path"].unlink()
            except Exception:
                pass

    def _log(self, method, *args, **kwargs):
        self.reactor.callFromThread(method, *args, **kwargs)

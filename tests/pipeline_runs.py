"""
Running the pipeline as users run it, and the archives and tables it
reads and writes, for the pipeline's tests.
"""

import json
import re
import subprocess
import sys
from datetime import datetime, timezone

import pyarrow.dataset as ds
from twisted.internet.task import Clock

from mqttgw.archive.segments import Archive
from mqttgw.wire import packets as P
from tests.gateway import gateway_env



def pipeline(*args, cwd, env=None):
    """``python -m mqttgw.pipeline ARGS``, which must succeed."""
    out = subprocess.run(
        [sys.executable, "-m", "mqttgw.pipeline", *args],
        capture_output=True, text=True, cwd=cwd, timeout=600, env=dict(gateway_env(), **(env or {})),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def table(path):
    """The rows of a table the pipeline wrote (none when it wrote none)."""
    if not path.exists():
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist()


class ThreadClock(Clock):
    """A fake reactor that the archive's writer thread may log through."""

    def callFromThread(self, f, *args, **kwargs):
        f(*args, **kwargs)


def write_segment(archive, start, topics, count, gateway_id="gw", payload=lambda i: b"x" * (i % 7)):
    """One archive segment of ``count`` rows from ``start`` (ISO, UTC) on."""
    now = [datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp()]

    def clock():
        now[0] += 1.5
        return now[0]

    a = Archive(archive, ThreadClock(), gateway_id, clock=clock)
    a.start()
    for i in range(count):
        a.record("in", f"c{i % 3}", P.Publish(topics[i % len(topics)], payload(i), i % 3, False))
    a.stop()


def snapshot(out):
    """Every table of a run, its rows as sorted JSON: two runs compared whole."""
    result = {}
    for name in ("topic_minute", "topic_hour", "client_hour", "last_value"):
        rows = table(out / name)
        result[name] = sorted(json.dumps(r, default=str, sort_keys=True) for r in rows)
    return result


def said(stderr):
    """The pipeline's own lines ("[12:00:00] ..."), without their time."""
    return [line[11:] for line in stderr.splitlines() if re.match(r"\[\d\d:\d\d:\d\d\] ", line)]

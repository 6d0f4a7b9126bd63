"""
How fast the pipeline is, against DuckDB as the single-machine yardstick:
for each archive size, a synthetic archive (24 hours, 1,000 topics, 300
clients, JSON payloads with a few dirty ones) is written in the gateway's
layout, then

- ``batch``: ``python -m mqttgw.pipeline batch`` over all of it (every
  table, one JSON field), wall clock including Spark's start;
- the same aggregations by DuckDB over the same Parquet files, written as
  Parquet the same way, in the same run;
- ``stream``: a first ``stream`` run over the archive, then one new hour
  of ``--hour-rows`` rows is added and the next ``stream`` run timed: the
  incremental step, whose cost should follow that hour, not the archive.

    python -m bench.pipeline [--rows 1000000 10000000 50000000] [--hour-rows 100000]

Results go to bench/results/pipeline.json and a table on stdout.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
START = datetime(2026, 11, 1, tzinfo=timezone.utc)
HOURS = 24
SEGMENT_ROWS = 1_000_000


def write_archive(archive, rows, first_hour=0, hours=HOURS, gateway_id="bench", seed=1):
    """``rows`` rows spread evenly over ``hours`` hours from START + first_hour."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mqttgw.data.archive import SCHEMA

    rng = np.random.default_rng(seed)
    # A pool of payloads, drawn from by index: mostly numbers, some dirty.
    pool = [json.dumps({"celsius": round(float(v), 1)}).encode() for v in rng.normal(20, 5, 2000)]
    pool += [b'{"celsius": "n/a"}', b'{"kelvin": 290}', b"offline", b""]
    pool = pa.array(pool, pa.binary())
    per_hour = rows // hours
    written = 0
    for h in range(hours):
        hour_start = START + timedelta(hours=first_hour + h)
        n_hour = per_hour if h < hours - 1 else rows - written
        for part, offset in enumerate(range(0, n_hour, SEGMENT_ROWS)):
            n = min(SEGMENT_ROWS, n_hour - offset)
            base_us = int(hour_start.timestamp() * 1_000_000)
            timestamps = np.sort(rng.integers(0, 3_600_000_000, n)) + base_us
            topics = rng.integers(0, 1000, n)
            clients = topics % 300
            payload = pool.take(pa.array(rng.integers(0, len(pool), n)))
            table = pa.Table.from_arrays(
                [
                    pa.array(timestamps, pa.timestamp("us", tz="UTC")),
                    pa.array(np.full(n, gateway_id, dtype=object), pa.string()),
                    pa.array(np.arange(written + offset, written + offset + n), pa.int64()),
                    pa.array(np.full(n, "in", dtype=object), pa.string()),
                    pa.array(np.char.add("dev-", clients.astype(str)), pa.string()),
                    pa.array(np.char.add("site/sensors/", topics.astype(str)), pa.string()),
                    pa.array(rng.integers(0, 2, n).astype(np.int8), pa.int8()),
                    pa.array(np.zeros(n, dtype=bool)),
                    payload,
                    pc.binary_length(payload).cast(pa.int32()),
                ],
                schema=SCHEMA,
            )
            directory = archive / f"date={hour_start:%Y-%m-%d}" / f"hour={hour_start:%H}"
            directory.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, directory / f"{gateway_id}-{base_us}-{part}.parquet")
        written += n_hour
    return written


# DuckDB takes most of the machine's memory by default; Spark's local
# driver gets 1 GiB unless told, and spills its cache to disk beyond it.
SPARK_MEMORY = "4g"


def pipeline(*args):
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "mqttgw.pipeline", *args, "--conf", f"spark.driver.memory={SPARK_MEMORY}"],
        capture_output=True, text=True, cwd=REPO,
    )
    if out.returncode:
        raise SystemExit(f"bench: pipeline {args[0]} failed:\n{out.stderr[-3000:]}")
    return time.monotonic() - started


_TOPIC_ROLLUP = """
        SELECT gateway_id, topic, date_trunc('{unit}', timestamp) AS window_start,
               count(*) AS messages, sum(payload_length) AS bytes, count(DISTINCT client_id) AS publishers,
               count(*) FILTER (qos = 0) AS qos0, count(*) FILTER (qos = 1) AS qos1,
               count(*) FILTER (qos = 2) AS qos2, count(*) FILTER (retain) AS retained,
               window_start + INTERVAL 1 {unit} AS window_end, date, CAST(hour AS INTEGER) AS hour
        FROM rows WHERE direction IN ('in', 'bridge_in') GROUP BY ALL"""

DUCKDB_TABLES = {
    "topic_minute": _TOPIC_ROLLUP.format(unit="minute"),
    "topic_hour": _TOPIC_ROLLUP.format(unit="hour"),
    "client_hour": """
        SELECT gateway_id, client_id, direction, date_trunc('hour', timestamp) AS window_start,
               count(*) AS messages, sum(payload_length) AS bytes, count(DISTINCT topic) AS topics,
               window_start + INTERVAL 1 HOUR AS window_end, date, CAST(hour AS INTEGER) AS hour
        FROM rows GROUP BY ALL""",
    "json_minute": """
        SELECT gateway_id, topic, date_trunc('minute', timestamp) AS window_start,
               count(value) AS count, count(*) - count(value) AS invalid,
               min(value) AS min, max(value) AS max, avg(value) AS avg,
               window_start + INTERVAL 1 MINUTE AS window_end, 'celsius' AS field, date, CAST(hour AS INTEGER) AS hour
        FROM (SELECT *, raw,
                     CASE WHEN regexp_full_match(raw, '-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?')
                          THEN TRY_CAST(raw AS DOUBLE) END AS value
              FROM (SELECT *, json_extract_string(TRY_CAST(CAST(payload AS VARCHAR) AS JSON), '$.celsius') AS raw
                    FROM rows WHERE direction IN ('in', 'bridge_in')))
        GROUP BY ALL HAVING count(raw) > 0""",
    "last_value": """
        SELECT gateway_id, topic, arg_max(timestamp, (timestamp, sequence)) AS last_timestamp,
               arg_max(sequence, (timestamp, sequence)) AS last_sequence,
               arg_max(client_id, (timestamp, sequence)) AS last_client_id,
               arg_max(qos, (timestamp, sequence)) AS qos, arg_max(retain, (timestamp, sequence)) AS retain,
               arg_max(payload, (timestamp, sequence)) AS payload
        FROM rows WHERE direction IN ('in', 'bridge_in') GROUP BY gateway_id, topic""",
}


def duckdb_batch(archive, out):
    """The same tables by DuckDB, from the same files, written as Parquet."""
    import duckdb

    started = time.monotonic()
    con = duckdb.connect()
    con.execute(
        f"CREATE VIEW rows AS SELECT * FROM read_parquet('{archive}/*/*/*.parquet', hive_partitioning = true,"
        " hive_types = {'date': VARCHAR, 'hour': VARCHAR})"
    )
    out.mkdir(parents=True)
    for name, query in DUCKDB_TABLES.items():
        target = out / name
        partitions = "" if name == "last_value" else ", PARTITION_BY (date, hour)"
        con.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet{partitions})")
    con.close()
    return time.monotonic() - started


def one_size(workdir, rows, hour_rows):
    archive, tables = workdir / "archive", workdir / "tables"
    t = time.monotonic()
    write_archive(archive, rows)
    made = time.monotonic() - t
    print(f"  {rows:,} rows written in {made:.1f}s", flush=True)
    batch = pipeline("batch", "--archive", str(archive), "--out", str(tables), "--json-field", "celsius")
    print(f"  spark batch {batch:.1f}s", flush=True)
    duck = duckdb_batch(archive, workdir / "duck")
    print(f"  duckdb {duck:.1f}s", flush=True)
    stream = ["stream", "--archive", str(archive), "--out", str(workdir / "stream"),
              "--checkpoint", str(workdir / "checkpoint"), "--json-field", "celsius"]
    first = pipeline(*stream)
    write_archive(archive, hour_rows, first_hour=HOURS, hours=1, seed=2)
    step = pipeline(*stream)
    # Spark's own start, for reading the figures: a run with nothing new.
    idle = pipeline(*stream)
    print(f"  stream first {first:.1f}s, one new hour {step:.1f}s, nothing new {idle:.1f}s", flush=True)
    return {
        "rows": rows, "spark_batch_s": batch, "duckdb_batch_s": duck, "stream_first_s": first,
        "stream_step_s": step, "stream_idle_s": idle, "hour_rows": hour_rows,
        "spark_rows_per_s": rows / batch, "duckdb_rows_per_s": rows / duck,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=float, nargs="+", default=[1e6, 1e7, 5e7])
    parser.add_argument("--hour-rows", type=int, default=100_000)
    parser.add_argument("--results", default=str(BENCH / "results" / "pipeline.json"))
    args = parser.parse_args(argv)
    results = []
    for rows in map(int, args.rows):
        print(f"{rows:,} rows", flush=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
        try:
            results.append(one_size(workdir, rows, args.hour_rows))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(f"{'rows':>12} {'spark batch':>12} {'duckdb':>10} {'spark/duckdb':>13} {'stream step':>12} {'idle step':>10}")
    for r in results:
        print(
            f"{r['rows']:>12,} {r['spark_batch_s']:>11.1f}s {r['duckdb_batch_s']:>9.1f}s"
            f" {r['spark_batch_s'] / r['duckdb_batch_s']:>12.2f}x {r['stream_step_s']:>11.1f}s {r['stream_idle_s']:>9.1f}s"
        )
    return results


if __name__ == "__main__":
    main()

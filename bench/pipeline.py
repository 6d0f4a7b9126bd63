"""
How fast the pipeline is, against DuckDB as the single-machine yardstick:
for each archive size, a synthetic archive (24 hours, 1,000 topics, 300
clients, JSON payloads with a few dirty ones) is written with the
archive's own schema and layout, then, each timed by wall clock
including Spark's start:

- ``batch``: ``python -m mqttgw.pipeline batch`` over all of it (every
  table, one JSON field) on ``local[*]``, and ``topic_minute`` alone;
- the same tables by DuckDB over the same Parquet files, written as
  Parquet the same way, in the same run, and ``topic_minute`` alone; the
  row counts of every table are checked to match;
- ``cluster``: the batch on a Spark standalone cluster of two workers
  (one core each) started here on 127.0.0.1 with the installed pyspark's
  ``spark-class`` (``--no-cluster`` to leave it out);
- ``stream``: a first ``stream`` run over the archive, then one new hour
  of ``--hour-rows`` rows is added and the next ``stream`` run timed: the
  incremental step, whose cost should follow that hour, not the archive
  (``--no-stream`` to leave it out);
- ``warm``: the same two batches, ``batch --remote`` through a resident
  Spark Connect server (``mqttgw-pipeline connect-server`` on 127.0.0.1,
  started once, then warmed by one run over a small archive), as hourly
  runs find it, each followed by DuckDB's again for its ratio; the
  server's start and that first run are reported apart (``--no-warm`` to
  leave it out, ``--warm-only`` for these rows and DuckDB's alone).

    python -m bench.pipeline [--rows 2000000 10000000] [--hour-rows 100000] [--warm-only]

Results go to bench/results/pipeline.json and a table on stdout.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
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

    from mqttgw.archive.segments import SCHEMA

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
                    pa.array(np.full(n, "tcp", dtype=object), pa.string()),
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


def pipeline(*args, driver_memory=SPARK_MEMORY):
    """The pipeline's own command, timed; ``driver_memory`` None for a driver it does not start."""
    started = time.monotonic()
    memory = ["--conf", f"spark.driver.memory={driver_memory}"] if driver_memory else []
    out = subprocess.run(
        [sys.executable, "-m", "mqttgw.pipeline", *args, *memory],
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
              -- decode: a BLOB cast to VARCHAR escapes '"' as \\x22 in DuckDB 2.
              FROM (SELECT *, json_extract_string(TRY_CAST(TRY(decode(payload)) AS JSON), '$.celsius') AS raw
                    FROM rows WHERE direction IN ('in', 'bridge_in')))
        GROUP BY ALL HAVING count(raw) > 0""",
    "last_value": """
        SELECT gateway_id, topic, arg_max(timestamp, (timestamp, sequence)) AS last_timestamp,
               arg_max(sequence, (timestamp, sequence)) AS last_sequence,
               arg_max(client_id, (timestamp, sequence)) AS last_client_id,
               arg_max(listener, (timestamp, sequence)) AS last_listener,
               arg_max(qos, (timestamp, sequence)) AS qos, arg_max(retain, (timestamp, sequence)) AS retain,
               arg_max(payload, (timestamp, sequence)) AS payload
        FROM rows WHERE direction IN ('in', 'bridge_in') GROUP BY gateway_id, topic""",
}


def duckdb_batch(archive, out, tables=tuple(DUCKDB_TABLES)):
    """The same tables by DuckDB, from the same files, written as Parquet."""
    import duckdb

    started = time.monotonic()
    con = duckdb.connect()
    con.execute(
        # By name: segments written before a column was added read it as null.
        f"CREATE VIEW rows AS SELECT * FROM read_parquet('{archive}/*/*/*.parquet', hive_partitioning = true,"
        " hive_types = {'date': VARCHAR, 'hour': VARCHAR}, union_by_name = true)"
    )
    out.mkdir(parents=True)
    for name in tables:
        query = DUCKDB_TABLES[name]
        target = out / name
        partitions = "" if name == "last_value" else ", PARTITION_BY (date, hour)"
        con.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet{partitions})")
    con.close()
    return time.monotonic() - started


def row_counts(tables):
    import duckdb

    con = duckdb.connect()
    counts = {}
    for name in DUCKDB_TABLES:
        path = tables / name
        # DuckDB writes an unpartitioned table as one file.
        files = [path] if path.is_file() else list(path.rglob("*.parquet"))
        if files:
            counts[name] = con.execute(f"SELECT count(*) FROM read_parquet({[str(f) for f in files]!r})").fetchone()[0]
        elif path.is_dir():
            counts[name] = 0
    con.close()
    return counts


class Cluster:
    """A standalone master and ``workers`` workers of one core on 127.0.0.1, as spark-class starts them."""

    def __init__(self, workdir, workers=2, memory="2g"):
        import pyspark

        spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
        port, web = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.processes = []
        logs = workdir / "cluster-logs"
        logs.mkdir()

        def start(name, *args):
            with open(logs / f"{name}.log", "wb") as log:
                self.processes.append(subprocess.Popen(
                    [spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                ))

        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(web))
        for i in range(workers):
            (workdir / f"work-{i}").mkdir()
            start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", memory, "--webui-port", str(free_port()), "--work-dir", str(workdir / f"work-{i}"), self.url)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/json/", timeout=5) as response:
                    if json.load(response)["aliveworkers"] == workers:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"bench: the cluster did not start (logs in {logs})")
            time.sleep(0.5)

    def stop(self):
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(15)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


class ConnectServer:
    """``mqttgw-pipeline connect-server`` on 127.0.0.1, as an operator keeps it running."""

    def __init__(self, workdir, memory=SPARK_MEMORY):
        port = free_port()
        self.url = f"sc://127.0.0.1:{port}"
        self.log = workdir / "connect-server.log"
        started = time.monotonic()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mqttgw.pipeline", "connect-server", "--port", str(port), "--",
                 "--driver-memory", memory, "--conf", f"spark.ui.port={free_port()}"],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while "Spark Connect server started" not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"bench: the Connect server did not start (log in {self.log})")
            time.sleep(0.2)
        self.start_s = time.monotonic() - started

    def stop(self):
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


WARMUP_ROWS = 20_000


def warm(workdir, archive, result):
    """The batches through a resident Connect server, after its start and one warm-up run."""
    server = ConnectServer(workdir)
    try:
        result["warm_server_start_s"] = server.start_s
        write_archive(workdir / "warmup-archive", WARMUP_ROWS, seed=3)
        remote = ["--remote", server.url]
        result["warm_warmup_s"] = pipeline(
            "batch", "--archive", str(workdir / "warmup-archive"), "--out", str(workdir / "warmup"),
            "--json-field", "celsius", *remote, driver_memory=None,
        )
        print(f"  connect server started in {result['warm_server_start_s']:.1f}s,"
              f" warm-up run ({WARMUP_ROWS:,} rows) {result['warm_warmup_s']:.1f}s", flush=True)
        batch = ["batch", "--archive", str(archive), *remote]
        # DuckDB again right after each: on a shared machine, the load
        # each ratio is taken under is the same for both.
        result["warm_batch_s"] = pipeline(
            *batch, "--out", str(workdir / "warm"), "--json-field", "celsius", driver_memory=None,
        )
        result["duckdb_beside_warm_batch_s"] = duckdb_batch(archive, workdir / "duck-warm")
        result["warm_topic_minute_s"] = pipeline(
            *batch, "--out", str(workdir / "warm-tm"), "--tables", "topic_minute", driver_memory=None,
        )
        result["duckdb_beside_warm_topic_minute_s"] = duckdb_batch(archive, workdir / "duck-warm-tm", ("topic_minute",))
    finally:
        server.stop()
    print(f"  warm: all {result['warm_batch_s']:.1f}s (duckdb right after {result['duckdb_beside_warm_batch_s']:.1f}s),"
          f" topic_minute {result['warm_topic_minute_s']:.1f}s"
          f" (duckdb right after {result['duckdb_beside_warm_topic_minute_s']:.1f}s)", flush=True)
    return row_counts(workdir / "warm")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def one_size(workdir, rows, hour_rows, cluster, stream, local=True, warm_rows=True):
    archive, tables = workdir / "archive", workdir / "tables"
    t = time.monotonic()
    write_archive(archive, rows)
    made = time.monotonic() - t
    print(f"  {rows:,} rows written in {made:.1f}s", flush=True)
    result = {"rows": rows, "hour_rows": hour_rows, "load_before": loadavg()}
    batch = ["batch", "--archive", str(archive)]
    if local:
        result["spark_batch_s"] = pipeline(*batch, "--out", str(tables), "--json-field", "celsius")
        print(f"  spark batch {result['spark_batch_s']:.1f}s", flush=True)
    result["duckdb_batch_s"] = duckdb_batch(archive, workdir / "duck")
    print(f"  duckdb {result['duckdb_batch_s']:.1f}s", flush=True)
    duck_counts = row_counts(workdir / "duck")
    spark_counts = row_counts(tables) if local else duck_counts
    if spark_counts != duck_counts:
        raise SystemExit(f"bench: Spark's and DuckDB's tables differ: {spark_counts} != {duck_counts}")
    if local:
        result["spark_topic_minute_s"] = pipeline(*batch, "--out", str(workdir / "tm"), "--tables", "topic_minute")
    result["duckdb_topic_minute_s"] = duckdb_batch(archive, workdir / "duck-tm", ("topic_minute",))
    print(f"  topic_minute alone: spark {result.get('spark_topic_minute_s', 0):.1f}s,"
          f" duckdb {result['duckdb_topic_minute_s']:.1f}s", flush=True)
    if warm_rows and warm(workdir, archive, result) != duck_counts:
        raise SystemExit("bench: the tables through the Connect server differ from DuckDB's")
    if cluster:
        c = Cluster(workdir)
        try:
            result["cluster_batch_s"] = pipeline(
                *batch, "--out", str(workdir / "cluster"), "--json-field", "celsius", "--master", c.url,
                "--conf", "spark.executor.memory=1536m", driver_memory="2g",
            )
        finally:
            c.stop()
        if row_counts(workdir / "cluster") != spark_counts:
            raise SystemExit("bench: the cluster's tables differ from local[*]'s")
        print(f"  2-worker cluster batch {result['cluster_batch_s']:.1f}s", flush=True)
    if stream:
        stream = ["stream", "--archive", str(archive), "--out", str(workdir / "stream"),
                  "--checkpoint", str(workdir / "checkpoint"), "--json-field", "celsius"]
        result["stream_first_s"] = pipeline(*stream)
        write_archive(archive, hour_rows, first_hour=HOURS, hours=1, seed=2)
        result["stream_step_s"] = pipeline(*stream)
        # Spark's own start, for reading the figures: a run with nothing new.
        result["stream_idle_s"] = pipeline(*stream)
        print(f"  stream first {result['stream_first_s']:.1f}s, one new hour {result['stream_step_s']:.1f}s,"
              f" nothing new {result['stream_idle_s']:.1f}s", flush=True)
    result["load_after"] = loadavg()
    for key in [k for k in result if k.endswith("_s")]:
        result[key[:-2] + "_rows_per_s"] = rows / result[key]
    return result


COLUMNS = [
    ("spark_batch_s", "spark all"), ("duckdb_batch_s", "duckdb all"), ("spark_topic_minute_s", "spark t_m"),
    ("duckdb_topic_minute_s", "duckdb t_m"), ("warm_batch_s", "warm all"), ("warm_topic_minute_s", "warm t_m"),
    ("cluster_batch_s", "cluster all"), ("stream_step_s", "stream step"),
]
# (title, Spark's time, DuckDB's time)
RATIOS = [
    ("all ratio", "spark_batch_s", "duckdb_batch_s"), ("t_m ratio", "spark_topic_minute_s", "duckdb_topic_minute_s"),
    ("warm all", "warm_batch_s", "duckdb_beside_warm_batch_s"),
    ("warm t_m", "warm_topic_minute_s", "duckdb_beside_warm_topic_minute_s"),
]


def print_table(results):
    def cell(r, key, text):
        return text if key in r else f"{'-':>12}"

    print()
    print(f"{'rows':>12} " + " ".join(f"{title:>12}" for _, title in COLUMNS)
          + " " + " ".join(f"{title:>10}" for title, _, _ in RATIOS))
    for r in results:
        print(
            f"{r['rows']:>12,} " + " ".join(cell(r, key, f"{r.get(key, 0):>11.1f}s") for key, _ in COLUMNS)
            + " " + " ".join(f"{r[a] / r[b]:>9.2f}x" if a in r else f"{'-':>10}" for _, a, b in RATIOS)
        )
    print(f"\n{'rows':>12} " + " ".join(f"{title:>12}" for _, title in COLUMNS[:-1]) + "  (rows per second)")
    for r in results:
        print(f"{r['rows']:>12,} " + " ".join(
            cell(r, key, f"{r.get(key[:-2] + '_rows_per_s', 0):>12,.0f}") for key, _ in COLUMNS[:-1]
        ))
    for r in results:
        if "warm_server_start_s" in r:
            print(f"{r['rows']:>12,} warm: server start {r['warm_server_start_s']:.1f}s, warm-up run"
                  f" {r['warm_warmup_s']:.1f}s (apart); load average {r['load_before']:.2f} before, {r['load_after']:.2f} after")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=float, nargs="+", default=[2e6, 1e7])
    parser.add_argument("--hour-rows", type=int, default=100_000)
    parser.add_argument("--no-cluster", dest="cluster", action="store_false", help="leave the 2-worker cluster out")
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="leave the streaming steps out")
    parser.add_argument("--no-warm", dest="warm", action="store_false", help="leave the resident Connect server out")
    parser.add_argument(
        "--warm-only", action="store_true", help="only the resident Connect server's rows and DuckDB's",
    )
    parser.add_argument("--results", default=str(BENCH / "results" / "pipeline.json"))
    args = parser.parse_args(argv)
    if args.warm_only and not args.warm:
        parser.error("--warm-only and --no-warm exclude each other")
    if args.warm_only:
        args.cluster = args.stream = False
    results = []
    for rows in map(int, args.rows):
        print(f"{rows:,} rows (load average {loadavg():.2f})", flush=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
        try:
            results.append(one_size(
                workdir, rows, args.hour_rows, args.cluster, args.stream, not args.warm_only, args.warm,
            ))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    return results


if __name__ == "__main__":
    main()

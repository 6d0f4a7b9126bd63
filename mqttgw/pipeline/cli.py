"""
``python -m mqttgw.pipeline``: the batch and streaming jobs, runnable as
they are (Spark on ``local[*]``) or through ``spark-submit`` on a cluster,
where the master is whatever spark-submit was given.
"""

import argparse
import json
import os
import socket
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path


def _parse_time(text):
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _parser():
    parser = argparse.ArgumentParser(prog="python -m mqttgw.pipeline", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("batch", "stream"):
        p = sub.add_parser(name)
        p.add_argument("--archive", required=True, help="the gateway's archive directory")
        p.add_argument("--out", required=True, help="where the tables are written")
        p.add_argument("--master", help="Spark master (default: local[*], or spark-submit's)")
        p.add_argument(
            "--json-field", action="append", default=[], metavar="FIELD",
            help="also min/max/avg of this numeric JSON field (repeatable; a name, or a JSON path such as $.sensors.t1)",
        )
        p.add_argument("--publish", metavar="HOST:PORT", help="publish the latest rollups to this broker as retained messages")
        p.add_argument("--prefix", default="$analytics", help="topic prefix of published rollups")
        p.add_argument("--tls", action="store_true", help="connect to --publish over TLS")
        p.add_argument("--ca", help="with --tls: the authorities the gateway's certificate is checked against (default: the system's)")
        p.add_argument(
            "--username", default="mqttgw-pipeline",
            help="user name for --publish (the password, if any, from $MQTTGW_PASSWORD);"
            " the gateway lets only auth.analytics_writers write $analytics/...",
        )
    batch = sub.choices["batch"]
    batch.add_argument("--since", type=_parse_time, help="first hour to recompute (ISO time, UTC)")
    batch.add_argument("--until", type=_parse_time, help="recompute up to this time (ISO time, UTC)")
    stream = sub.choices["stream"]
    stream.add_argument("--checkpoint", required=True, help="Structured Streaming checkpoint directory")
    stream.add_argument(
        "--trigger", default="available-now",
        help="'available-now' (process what is there, then stop) or an interval in seconds",
    )
    return parser


def _spark(master):
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("mqttgw-pipeline")
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        # Not under spark-submit: this machine's cores.
        builder = builder.master("local[*]")
    spark = (
        builder.config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.sql.session.timeZone", "UTC")
        # UTC instants as Parquet TIMESTAMP_MICROS (isAdjustedToUTC), which
        # every reader takes for what it is, rather than legacy INT96.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def say(text):
    print(f"[{datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def write_partitions(tables, out, stats=None):
    """
    Overwrite the tables' (date, hour) partitions (for json_minute: field,
    date, hour) that ``tables`` hold rows for; others stay.  Returns
    {table: rows written}.
    """
    from pyspark.sql import functions as F

    written = {}
    for name, frame in tables.items():
        frame = frame.cache()
        count = frame.count()
        if stats is not None and count:
            # For the run log, from the cached rollups (no second scan).
            if name == "client_hour":
                stats["rows_in"] = stats.get("rows_in", 0) + frame.agg(F.sum("messages")).first()[0]
            elif name == "json_minute":
                stats["invalid"] = stats.get("invalid", 0) + frame.agg(F.sum("invalid")).first()[0]
        say(f"writing {name}: {count} rows")
        # json_minute is partitioned by field too: computing one field
        # never replaces another's rows.
        columns = ("field", "date", "hour") if name == "json_minute" else ("date", "hour")
        frame.write.mode("overwrite").partitionBy(*columns).parquet(str(Path(out) / name))
        mark_complete(out, name)
        written[name] = count
        frame.unpersist()
    return written


def mark_complete(out, name):
    """
    ``TABLE/_SUCCESS``, renewed each time the table is written: Spark
    writes none when it overwrites partitions dynamically.
    """
    if "://" not in str(out):
        (Path(out) / name / "_SUCCESS").write_text(_now() + "\n")


def write_last_value(spark, rows, out):
    from mqttgw.pipeline.tables import last_value

    frame = last_value(rows).cache()
    count = frame.count()
    say(f"writing last_value: {count} rows")
    # Computed over the whole archive, so replacing the table is idempotent.
    frame.write.mode("overwrite").parquet(str(Path(out) / "last_value"))
    mark_complete(out, "last_value")
    frame.unpersist()
    return count


def run_batch(args, spark):
    from pyspark.sql import functions as F

    from mqttgw.pipeline import tables as T

    say(f"reading archive {args.archive}")
    rows = T.read_archive(spark, args.archive)
    selected = rows
    if args.since:
        since = args.since.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
        selected = selected.where(
            (F.col("date") > since.strftime("%Y-%m-%d"))
            | ((F.col("date") == since.strftime("%Y-%m-%d")) & (F.col("hour") >= since.strftime("%H")))
        )
    if args.until:
        until = args.until.astimezone(timezone.utc)
        if until.minute or until.second or until.microsecond:
            until = until.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        last = until - timedelta(hours=1)
        selected = selected.where(
            (F.col("date") < last.strftime("%Y-%m-%d"))
            | ((F.col("date") == last.strftime("%Y-%m-%d")) & (F.col("hour") <= last.strftime("%H")))
        )
    written = write_partitions(T.compute(selected, args.json_field), args.out, args.stats)
    written["last_value"] = write_last_value(spark, rows, args.out)
    return written


def run_stream(args, spark):
    from pyspark.sql import functions as F

    from mqttgw.pipeline import tables as T

    totals = {}

    def recompute(batch, batch_id):
        # The hours that new segments touched are recomputed from the whole
        # archive, so the tables equal a batch run, late segments included.
        touched = [(r["date"], r["hour"]) for r in batch.select("date", "hour").distinct().collect()]
        if not touched:
            return
        say(f"micro-batch {batch_id}: {len(touched)} hour(s) touched")
        rows = T.read_archive(spark, args.archive)
        wanted = F.lit(False)
        for date, hour in touched:
            wanted = wanted | ((F.col("date") == date) & (F.col("hour") == hour))
        for name, count in write_partitions(
            T.compute(rows.where(wanted), args.json_field), args.out, args.stats
        ).items():
            totals[name] = totals.get(name, 0) + count
        totals["last_value"] = write_last_value(spark, rows, args.out)

    stream = (
        spark.readStream.schema(T.ARCHIVE_SCHEMA)
        .option("basePath", args.archive)
        # Spark skips files whose modification time is older than this
        # (default 7 days) behind the newest it has seen: a gateway that was
        # offline for weeks, its archive copied with rsync -a, would lose
        # its segments.  Every segment counts, however old.
        .option("maxFileAge", "36500d")
        .parquet(args.archive)
        .writeStream.foreachBatch(recompute)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "available-now":
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{float(args.trigger)} seconds")
    say(f"streaming from {args.archive} (trigger {args.trigger})")
    query = stream.start()
    query.awaitTermination()
    return totals


def publish_rollups(spark, out, target, prefix, username="mqttgw-pipeline", tls=False, ca=None):
    """
    The latest minute and hour of each topic, as retained JSON messages on
    PREFIX/<topic>/1m and PREFIX/<topic>/1h, over MQTT (QoS 1).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from mqttgw import packets as P
    from mqttgw.framing import Framer

    messages = []
    for table, suffix in (("topic_minute", "1m"), ("topic_hour", "1h")):
        frame = spark.read.parquet(str(Path(out) / table))
        newest = Window.partitionBy("topic").orderBy(F.col("window_start").desc())
        for row in frame.withColumn("rank", F.row_number().over(newest)).where("rank = 1").collect():
            body = {
                "window_start": row["window_start"].replace(tzinfo=timezone.utc).isoformat(),
                **{k: row[k] for k in ("messages", "bytes", "publishers", "qos0", "qos1", "qos2", "retained")},
            }
            messages.append((f"{prefix}/{row['topic']}/{suffix}", json.dumps(body).encode()))
    host, _, port = target.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    if tls:
        import ssl

        # The gateway's certificate is checked, host name included.
        sock = ssl.create_default_context(cafile=ca).wrap_socket(sock, server_hostname=host)
    password = os.environ.get("MQTTGW_PASSWORD")
    sock.sendall(
        P.Connect(
            client_id=f"mqttgw-pipeline-{int(time.time())}"[:23],
            keepalive=0,
            username=username,
            password=password.encode() if password else None,
        ).encode()
    )
    framer = Framer()
    pending = set()
    data = b""
    connack = None
    while connack is None:
        for packet in framer.feed(sock.recv(4096)):
            connack = packet
    if connack.return_code:
        raise SystemExit(f"pipeline: {target} refused CONNECT (code {connack.return_code})")
    for mid, (topic, payload) in enumerate(messages, start=1):
        sock.sendall(P.Publish(topic, payload, 1, True, message_id=mid).encode())
        pending.add(mid)
    while pending:
        data = sock.recv(65536)
        if not data:
            raise SystemExit(f"pipeline: {target} closed the connection")
        for packet in framer.feed(data):
            if isinstance(packet, P.Puback):
                pending.discard(packet.message_id)
    sock.sendall(P.Disconnect().encode())
    sock.close()
    return len(messages)


def _now():
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def log_run(out, record):
    """
    One JSON line per run in ``OUT/_runs/runs.jsonl``: start, end, status,
    rows in and out per table, invalid JSON values (and the error of a
    failed run).  Files and directories starting with "_" are invisible
    to Spark and pyarrow readers of the tables.
    """
    if "://" in str(out):
        return  # a cluster file system: Spark's own logs tell
    path = Path(out) / "_runs"
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv=None):
    args = _parser().parse_args(argv)
    if not Path(args.archive).is_dir():
        print(f"pipeline: archive {args.archive} is not a directory", file=sys.stderr)
        return 2
    started = time.monotonic()
    args.stats = {}
    run = {
        "command": args.command,
        "start": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "archive": str(args.archive),
        "json_fields": list(args.json_field),
    }
    spark = _spark(args.master)
    try:
        written = run_batch(args, spark) if args.command == "batch" else run_stream(args, spark)
    except BaseException as e:
        log_run(args.out, dict(run, end=_now(), status="failed", error=f"{type(e).__name__}: {e}"[:2000]))
        spark.stop()
        raise
    log_run(
        args.out,
        dict(
            run, end=_now(), status="ok", seconds=round(time.monotonic() - started, 1),
            rows_out=written, rows_in=args.stats.get("rows_in", 0), invalid=args.stats.get("invalid", 0),
        ),
    )
    try:
        if args.publish:
            if not (Path(args.out) / "topic_minute").exists():
                say("nothing to publish yet")
            else:
                n = publish_rollups(
                    spark, args.out, args.publish, args.prefix, args.username, args.tls, args.ca
                )
                written["published"] = n
    finally:
        spark.stop()
    print(f"{args.command} done in {time.monotonic() - started:.1f}s; written to {args.out}:")
    for name, count in written.items():
        print(f"  {name}: {count} {'messages' if name == 'published' else 'rows'}")
    return 0

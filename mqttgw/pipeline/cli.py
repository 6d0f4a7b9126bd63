"""
``python -m mqttgw.pipeline``: the batch and streaming jobs, runnable as
they are (Spark on ``local[*]``), through ``spark-submit`` on a cluster,
or as a Spark Connect client (``--remote sc://...``).
"""

import argparse
import json
import os
import sys
import time
import tomllib
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from mqttgw.pipeline import classdata
from mqttgw.pipeline import settings as S
from mqttgw.pipeline import staging
from mqttgw.pipeline.console import say


def _parse_time(text):
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _tables(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _parser():
    parser = argparse.ArgumentParser(prog="python -m mqttgw.pipeline", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {
        "batch": "compute the tables from what the archive holds",
        "stream": "compute them with Structured Streaming as segments arrive (see --trigger)",
    }
    for name, text in commands.items():
        p = sub.add_parser(name, help=text)
        # Defaults are None here: the [pipeline] section, then S.KEYS, fill them.
        p.add_argument("--config", help="a TOML file whose [pipeline] section holds these options")
        p.add_argument(
            "--archive", action="append", metavar="DIR",
            help="an archive directory (repeatable: archives of several gateways, combined by gateway_id)",
        )
        p.add_argument("--out", help="where the tables are written")
        p.add_argument("--master", help="Spark master (default: spark-submit's, else the file's, else local[*])")
        p.add_argument(
            "--remote", metavar="sc://HOST:PORT",
            help="run through this Spark Connect server (default: $SPARK_REMOTE, else the file's)",
        )
        p.add_argument(
            "--conf", action="append", metavar="KEY=VALUE",
            help="a Spark setting, as spark-submit --conf takes it (repeatable)",
        )
        p.add_argument(
            "--json-field", action="append", dest="json_fields", metavar="FIELD",
            help="also min/max/avg of this numeric JSON field (repeatable; a name, or a JSON path such as $.sensors.t1)",
        )
        p.add_argument(
            "--tables", type=_tables, metavar="A,B",
            help=f"the tables to compute (default: all of {','.join(S.TABLES)})",
        )
        p.add_argument("--since", type=_parse_time, help="first hour to recompute (ISO time, UTC)")
        p.add_argument("--until", type=_parse_time, help="recompute up to this time (ISO time, UTC)")
        p.add_argument("--publish", metavar="HOST:PORT", help="publish the latest rollups to this broker as retained messages")
        p.add_argument("--prefix", help="topic prefix of what is published (default: $analytics)")
        p.add_argument("--tls", action="store_true", default=None, help="connect to --publish over TLS")
        p.add_argument("--ca", help="with --tls: the authorities the gateway's certificate is checked against (default: the system's)")
        p.add_argument(
            "--username",
            help="user name for --publish (default mqttgw-pipeline; the password, if any, from $MQTTGW_PASSWORD);"
            " the gateway lets only auth.analytics_writers write $analytics/...",
        )
        p.add_argument(
            "--no-class-cache", dest="class_cache", action="store_const", const=False,
            help="do not keep Spark's classes in ~/.cache/mqttgw/spark (a driver started here starts faster with them)",
        )
    stream = sub.choices["stream"]
    stream.add_argument("--checkpoint", help="Structured Streaming checkpoint directory")
    stream.add_argument(
        "--trigger", help="'available-now' (process what is there, then stop; the default) or an interval in seconds",
    )
    return parser


def resolve(args):
    """Flags, then the file's [pipeline] (and [archive] directory), then defaults."""
    # Which of master and remote came from the command line: those win
    # over spark-submit's and $SPARK_REMOTE, which win over the file's.
    args.given = {key: getattr(args, key) for key in ("master", "remote") if getattr(args, key)}
    from_file = {}
    if args.config:
        try:
            with open(args.config, "rb") as f:
                document = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise S.SettingsError(f"{args.config}: {getattr(e, 'strerror', None) or e}") from None
        from_file = S.check(document.get("pipeline", {}), args.config)
        directory = document.get("archive", {}).get("directory")
        if not from_file.get("archive") and directory:
            from_file["archive"] = [directory]
    for key, (_, default, _) in S.KEYS.items():
        flag = getattr(args, key, None)
        if flag is None:
            flag = from_file.get(key, default)
        setattr(args, key, flag)
    if not args.archive:
        raise S.SettingsError("no --archive given (nor a [pipeline] archive or [archive] directory in --config)")
    if not args.out:
        raise S.SettingsError("no --out given (nor a [pipeline] out in --config)")
    if len(args.given) == 2:
        raise S.SettingsError("--master and --remote exclude each other")
    for key in ("master", "remote"):
        if args.given and key not in args.given:
            setattr(args, key, "")  # the file's other one gives way to the flag
    if args.command == "stream" and not args.checkpoint:
        raise S.SettingsError("stream needs --checkpoint (or a [pipeline] checkpoint in --config)")
    args.conf = dict(args.conf) if isinstance(args.conf, dict) else dict(_setting(c) for c in args.conf)
    S.check_values(vars(args), "options")
    for archive in args.archive:
        if "://" not in archive and not Path(archive).is_dir():
            raise S.SettingsError(f"archive {archive} is not a directory")
    return args


def _setting(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise S.SettingsError(f"--conf takes KEY=VALUE, not {text!r}")
    return key, value


def where(args):
    """
    ``(kind, url)``: where Spark runs, from the first that names it of the
    pipeline's own --master/--remote, spark-submit's master or
    $SPARK_REMOTE, the settings file's master/remote; else ``local[*]``.
    ``kind`` is "remote" (Spark Connect), "master", or "submit" (what
    spark-submit gave, left as it is).
    """
    if args.given:
        [(kind, url)] = args.given.items()
        return kind, url
    if os.environ.get("SPARK_REMOTE"):
        return "remote", os.environ["SPARK_REMOTE"]
    submitted = _submitted_master()
    if submitted:
        return "submit", submitted
    if args.remote:
        return "remote", args.remote
    return "master", args.master or "local[*]"


def _submitted_master():
    """The master spark-submit started this driver with, if it did."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None  # not under spark-submit: no JVM to ask yet
    from pyspark import SparkConf, SparkContext

    # Before a SparkContext, SparkConf() is empty unless the JVM that
    # spark-submit started (and holds its settings) is connected to.
    SparkContext._ensure_initialized()
    return SparkConf().get("spark.master", None)


def connected(spark):
    """Is ``spark`` a Spark Connect session (whose driver is elsewhere)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _spark(args):
    """
    The session, and the class-data archive of a driver JVM started here
    (None where spark-submit or a Connect server runs the driver).
    """
    from pyspark.sql import SparkSession

    kind, url = where(args)
    builder = SparkSession.builder.appName("mqttgw-pipeline")
    classes = None
    if kind == "remote":
        builder = builder.remote(url)
    elif kind == "master":
        builder = builder.master(url)
        if url.startswith("local") and not os.environ.get("PYSPARK_PYTHON") and "spark.pyspark.python" not in args.conf:
            # Python workers (they decode Sparkplug payloads) on this
            # machine run this Python, which has what the driver has.
            os.environ["PYSPARK_PYTHON"] = sys.executable
        if args.class_cache and not _jvm_running():
            classes = classdata.ClassDataArchive(args.conf)
            key = "spark.driver.extraJavaOptions"
            args.conf[key] = classes.java_options(args.conf.get(key, ""))
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        # Where the tables cannot be staged and swapped (hdfs://, s3a://,
        # Spark Connect), rewriting only the recomputed partitions.
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        # UTC instants as Parquet TIMESTAMP_MICROS (isAdjustedToUTC), which
        # every reader takes for what it is, rather than legacy INT96.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.shuffle.partitions", "8")
        # A task writes the hours it holds through a writer each (up to
        # 32, then it sorts the rest) rather than sorting all its rows by
        # hour first: topic_minute at 10 M rows took 7% less CPU.
        .config("spark.sql.maxConcurrentOutputFileWriters", "32")
    )
    if kind != "remote":
        # A core setting: a Connect server's is its own.
        builder = builder.config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
    for key, value in args.conf.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    if not connected(spark):
        spark.sparkContext.setLogLevel("WARN")
    return spark, classes


def _jvm_running():
    """Has this process a JVM already (a session made before this run)?"""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def _unanswered(url, error):
    """One line for a Spark Connect server that refused this client, or could not be reached."""
    code = getattr(error, "getGrpcStatusCode", lambda: None)()
    name = getattr(code, "name", "")
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    if name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return f"Spark Connect {url} refused this client ({name}: is $SPARK_CONNECT_AUTHENTICATE_TOKEN its token?)"
    return f"Spark Connect {url} did not answer as a Connect server: {reason}"


def _stop(spark, classes):
    spark.stop()
    if classes is not None:
        classes.finish(say)


def describe(spark, args):
    """Where the run happens, for its first log line and its record."""
    if connected(spark):
        return {
            "remote": where(args)[1], "master": spark.conf.get("spark.master"),
            "application": spark.conf.get("spark.app.id"),
        }
    return {"master": spark.sparkContext.master, "application": spark.sparkContext.applicationId}


def _hour_range(args):
    """(first, last) hours asked for with --since/--until, as datetimes or None."""
    first = last = None
    if args.since:
        first = args.since.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    if args.until:
        until = args.until.astimezone(timezone.utc)
        if until.minute or until.second or until.microsecond:
            until = until.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        last = until - timedelta(hours=1)
    return first, last


def _in_range(rows, first, last):
    """Archive rows of the hours from ``first`` to ``last`` (partition pruning)."""
    from pyspark.sql import functions as F

    if first:
        rows = rows.where(
            (F.col("date") > first.strftime("%Y-%m-%d"))
            | ((F.col("date") == first.strftime("%Y-%m-%d")) & (F.col("hour") >= first.strftime("%H")))
        )
    if last:
        rows = rows.where(
            (F.col("date") < last.strftime("%Y-%m-%d"))
            | ((F.col("date") == last.strftime("%Y-%m-%d")) & (F.col("hour") <= last.strftime("%H")))
        )
    return rows


def staged(spark, out):
    """
    Are the tables staged and swapped in by this process?  Only where it
    can rename them: a local (or POSIX shared) directory, and a driver
    here rather than behind Spark Connect.
    """
    return staging.local(out) and not connected(spark)


def _previous_last_value(spark, out):
    """The last_value table to merge with, if there is one of today's shape."""
    path = Path(out) / "last_value"
    if not staged(spark, out) or not path.is_dir():
        return None
    previous = spark.read.parquet(str(path))
    if {"gateway_id", "last_sequence"} - set(previous.columns):
        say("last_value was written by an earlier version: recomputing it from the whole archive")
        return None
    if "last_listener" not in previous.columns:
        # Written before the archive had the column: its rows' is not known.
        from pyspark.sql import functions as F

        previous = previous.withColumn("last_listener", F.lit(None).cast("string"))
    return previous


def refresh(spark, args, selected, whole_archive, stats, everything=None, archive=None):
    """
    Compute the tables asked for from ``selected`` archive rows and
    publish them together.  ``whole_archive``: ``selected`` is all of it,
    so last_value is computed afresh rather than merged with the previous
    one, as it is from ``everything`` when given.  ``archive``: all of
    it, when ``selected`` is not (Sparkplug births and sessions).
    """
    from mqttgw.pipeline import tables as T

    # Not cached: each table reads only the columns it needs from the
    # Parquet files, which costs less than caching every column (the
    # payloads most of all) for all of them.
    rows = T.hours(selected)
    try:
        count = rows.count()
        stats["rows_in"] = stats.get("rows_in", 0) + count
        if not count:
            say("no archive rows to compute from")
            return {}
        frames = T.compute(rows, args.json_fields, args.tables)
        # Payloads the workers could not decode (not through Spark
        # Connect, which has no accumulators).
        malformed = None if connected(spark) else spark.sparkContext.accumulator(0)
        frames.update(T.sparkplug_tables(rows, None if whole_archive else archive, args.tables, malformed))
        if "last_value" in args.tables:
            if everything is not None:
                frames["last_value"] = T.last_value(T.hours(everything))
            else:
                frames["last_value"] = T.last_value(
                    rows, None if whole_archive else _previous_last_value(spark, args.out)
                )
        written = (_staged if staged(spark, args.out) else _direct)(spark, args, frames, stats)
        if malformed is not None and malformed.value:
            say(f"{malformed.value} spBv1.0 message(s) without a Sparkplug B payload: no metric rows")
            stats["sparkplug_malformed"] = stats.get("sparkplug_malformed", 0) + malformed.value
        return written
    finally:
        # The rows, and what the tables cached on the way (the session is
        # this run's own: nothing else of it is cached).
        spark.catalog.clearCache()


def _staged(spark, args, frames, stats):
    from mqttgw.pipeline import tables as T

    run = staging.Run(args.out, f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}")
    written = {}
    for name, frame in frames.items():
        say(f"computing {name}")
        writer = frame.write.mode("overwrite")
        if name not in T.WHOLE:
            # json_minute is partitioned by field too: computing one field
            # never replaces another's rows.
            writer = writer.partitionBy(*(("field", "date", "hour") if name == "json_minute" else ("date", "hour")))
        writer.parquet(run.path(name))
        # An empty table is a directory without data files: the schema is
        # given, not inferred.
        staged = spark.read.schema(frame.schema).parquet(run.path(name))
        written[name] = staged.count()  # from the files' footers
        if name == "json_minute" and written[name]:
            stats["invalid"] = stats.get("invalid", 0) + staged.agg({"invalid": "sum"}).first()[0]
        say(f"staged {name}: {written[name]} rows")
    moves = run.swap([n for n in frames if n not in T.WHOLE], [n for n in frames if n in T.WHOLE])
    say(f"published {len(frames)} table(s), {len(moves)} partition(s) replaced")
    return written


def _direct(spark, args, frames, stats):
    """
    Cluster file systems and Spark Connect: each table's recomputed
    partitions are replaced by Spark's own commit (dynamic partition
    overwrite), one table after the other.
    """
    from mqttgw.pipeline import tables as T

    written = {}
    for name, frame in frames.items():
        frame, observed = _observed(frame, name)
        target = _join(args.out, name)
        if name in T.WHOLE:
            frame.write.mode("overwrite").parquet(target)
        else:
            columns = ("field", "date", "hour") if name == "json_minute" else ("date", "hour")
            frame.write.mode("overwrite").partitionBy(*columns).parquet(target)
            # Replacing partitions leaves no _SUCCESS: an empty append,
            # committed as a whole job, writes it.
            frame.limit(0).write.mode("append").partitionBy(*columns).parquet(target)
        metrics = observed()
        written[name] = metrics["rows"]
        if name == "json_minute" and written[name]:
            stats["invalid"] = stats.get("invalid", 0) + (metrics["invalid"] or 0)
        say(f"written {name}: {written[name]} rows")
    return written


def _observed(frame, name):
    """
    ``frame``, counting its rows (and json_minute's invalid values) as it
    is written, and a function that returns those counts once it has
    been: one job per table, neither cached nor read twice.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    metrics = [F.count(F.lit(1)).alias("rows")]
    if name == "json_minute":
        metrics.append(F.sum("invalid").alias("invalid"))
    # Named apart from every other of the session (a stream's micro-batches share one).
    observation = Observation(f"{name}-written-{uuid.uuid4().hex[:8]}")
    try:
        observed = frame.observe(observation, *metrics)
    except NotImplementedError:
        # An older Spark Connect client: counted from a cache before.
        frame = frame.cache()
        counts = frame.agg(*metrics).first().asDict()
        return frame, lambda: counts
    return observed, lambda: observation.get


def _join(out, *names):
    return "/".join([str(out).rstrip("/"), *names])


def run_batch(args, spark, stats):
    from mqttgw.pipeline import tables as T

    first, last = _hour_range(args)
    say(f"reading {', '.join(args.archive)}")
    rows = T.read_archive(spark, args.archive)
    stats["hours"] = [first.isoformat() if first else None, last.isoformat() if last else None]
    if not (first or last):
        return refresh(spark, args, rows, True, stats)
    everything = None
    if "last_value" in args.tables and _previous_last_value(spark, args.out) is None:
        # Nothing to merge the chosen hours' last values with: they come
        # from the whole archive, this once.
        everything = rows
    return refresh(spark, args, _in_range(rows, first, last), False, stats, everything, rows)


def run_stream(args, spark, stats):
    from functools import reduce

    from pyspark.sql import functions as F

    from mqttgw.pipeline import tables as T

    totals = {}
    first, last = _hour_range(args)
    stats["hours"] = []

    def recompute(batch, batch_id):
        # The hours that new segments touched are recomputed from every
        # segment of those hours, so the tables equal a batch run, late
        # segments included; only those hours are read.
        touched = sorted({(r["date"], r["hour"]) for r in batch.select("date", "hour").distinct().collect()})
        touched = [
            (date, hour) for date, hour in touched
            if (not first or (date, hour) >= (first.strftime("%Y-%m-%d"), first.strftime("%H")))
            and (not last or (date, hour) <= (last.strftime("%Y-%m-%d"), last.strftime("%H")))
        ]
        if not touched:
            return
        say(f"micro-batch {batch_id}: {len(touched)} hour(s) touched")
        stats["hours"].extend(f"{date}T{hour}" for date, hour in touched)
        wanted = reduce(
            lambda a, b: a | b, [(F.col("date") == date) & (F.col("hour") == hour) for date, hour in touched]
        )
        archive = T.read_archive(spark, args.archive)
        for name, count in refresh(spark, args, archive.where(wanted), False, stats, archive=archive).items():
            totals[name] = totals.get(name, 0) + count

    sources = [
        spark.readStream.schema(T.ARCHIVE_SCHEMA)
        .option("basePath", archive)
        # Spark skips files whose modification time is older than this
        # (default 7 days) behind the newest it has seen: a gateway that was
        # offline for weeks, its archive copied with rsync -a, would lose
        # its segments.  Every segment counts, however old.
        .option("maxFileAge", "36500d")
        .parquet(archive)
        for archive in args.archive
    ]
    stream = (
        reduce(lambda a, b: a.unionByName(b), sources)
        .writeStream.foreachBatch(recompute)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "available-now":
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{float(args.trigger)} seconds")
    say(f"streaming from {', '.join(args.archive)} (trigger {args.trigger})")
    query = stream.start()
    query.awaitTermination()
    return totals


def _now():
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def log_run(spark, out, record):
    """
    One JSON line per run, in ``OUT/_runs/``: start, end, status, hours,
    rows in and out per table, invalid JSON values (and the error of a
    failed run).  Appended to ``runs.jsonl`` where the tables are staged
    here; elsewhere written by Spark, a file per run.
    """
    line = json.dumps(record)
    if staged(spark, out):
        path = Path(out) / "_runs"
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "runs.jsonl", "a") as f:
            f.write(line + "\n")
        return
    from pyspark.sql import functions as F

    # From the JVM side alone (no Python worker): one row, one file.
    spark.range(1).select(F.lit(line).alias("value")).coalesce(1).write.mode("append").text(_join(out, "_runs"))


def _run_command(args, spark, classes, run, stats):
    """
    The tables of a batch or stream: ``{name: rows written}``.  A failure
    is recorded in the runs' log, and Spark stopped, before it is raised.
    """
    try:
        return run_batch(args, spark, stats) if args.command == "batch" else run_stream(args, spark, stats)
    except BaseException as e:
        try:
            log_run(spark, args.out, dict(run, end=_now(), status="failed", error=f"{type(e).__name__}: {e}"[:2000]))
        except Exception as unrecorded:  # Spark itself failing: the run's own error is what tells
            say(f"the failed run could not be recorded: {type(unrecorded).__name__}")
        finally:
            _stop(spark, classes)
        raise


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        args = resolve(args)
    except S.SettingsError as e:
        print(f"pipeline: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    stats = {}
    run = {
        "command": args.command,
        "start": _now(),
        "archive": list(args.archive),
        "tables": list(args.tables),
        "json_fields": list(args.json_fields),
    }
    try:
        spark, classes = _spark(args)
        run.update(describe(spark, args))
    except Exception as e:
        if where(args)[0] != "remote":
            raise
        print(f"pipeline: {_unanswered(where(args)[1], e)}", file=sys.stderr)
        return 2
    if classes is not None and classes.state:
        run["class_data"] = classes.state
    say(
        (f"Spark Connect {run['remote']}: " if "remote" in run else "Spark ")
        + f"master {run['master']}, application {run['application']}"
    )
    if args.command == "stream" and connected(spark):
        _stop(spark, classes)
        print("pipeline: stream needs a Spark driver here (--master or spark-submit), not Spark Connect", file=sys.stderr)
        return 2
    if staged(spark, args.out):
        staging.recover(args.out, say)
    written = _run_command(args, spark, classes, run, stats)
    log_run(
        spark,
        args.out,
        dict(
            run, end=_now(), status="ok", seconds=round(time.monotonic() - started, 1), hours=stats.get("hours"),
            rows_out=written, rows_in=stats.get("rows_in", 0), invalid=stats.get("invalid", 0),
            sparkplug_malformed=stats.get("sparkplug_malformed", 0),
        ),
    )
    try:
        if args.publish:
            # Only now: the MQTT client (and attrs) is needed for this alone.
            from mqttgw.pipeline.publish import publish

            written["published"] = publish(spark, args)
    finally:
        _stop(spark, classes)
    print(f"{args.command} done in {time.monotonic() - started:.1f}s; written to {args.out}:")
    for name, count in written.items():
        print(f"  {name}: {count} {'messages' if name == 'published' else 'rows'}")
    return 0

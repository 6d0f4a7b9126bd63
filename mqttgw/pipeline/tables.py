"""
The tables, as Spark computations over archive rows.  Every rollup is
keyed by the archive partition (``date``, ``hour``) its rows came from, so
recomputing some partitions replaces exactly their rows, and by
``gateway_id``, so archives from many gateways combine.  SCHEMA.md
describes every column.
"""

import functools

from mqttgw.pipeline import sparkplug
from mqttgw.pipeline.console import say
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# The archive's columns (mqttgw.archive.segments.SCHEMA), and its partition
# columns, read by name: a segment written before ``listener`` gives null there.
ARCHIVE_SCHEMA = StructType(
    [
        StructField("timestamp", TimestampType()),
        StructField("gateway_id", StringType()),
        StructField("sequence", LongType()),
        StructField("direction", StringType()),
        StructField("client_id", StringType()),
        StructField("listener", StringType()),
        StructField("topic", StringType()),
        StructField("qos", ByteType()),
        StructField("retain", BooleanType()),
        StructField("payload", BinaryType()),
        StructField("payload_length", IntegerType()),
        StructField("date", StringType()),
        StructField("hour", StringType()),
    ]
)

# Messages that entered the gateway: the per-topic rollups count these.
PUBLISHED = ("in", "bridge_in")

PARTITIONED = ("topic_minute", "topic_hour", "client_hour", "json_minute", "sparkplug_metrics", "sparkplug_minute")
# Tables written whole, not by partition.
WHOLE = ("last_value", "sparkplug_sessions")
TABLES = PARTITIONED + WHOLE
SPARKPLUG = ("sparkplug_metrics", "sparkplug_minute", "sparkplug_sessions")


def read_archive(spark: SparkSession, archives) -> DataFrame:
    """
    The rows of one archive directory, or of several (one per gateway, or
    gathered copies): their rows are told apart by ``gateway_id``.
    """
    if isinstance(archives, str):
        archives = [archives]
    # Hive partitions as strings ("07", not 7): the filters that prune
    # them compare with the directories' names.
    frames = [
        spark.read.schema(ARCHIVE_SCHEMA).option("basePath", archive).parquet(archive)
        for archive in archives
    ]
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def hours(rows: DataFrame) -> DataFrame:
    """
    The archive's rows with ``hour`` as an integer: the archive names its
    directories ``hour=07``; the tables are partitioned ``hour=7``.
    """
    return rows.withColumn("hour", F.col("hour").cast("int"))


def _with_end(frame: DataFrame, unit: str) -> DataFrame:
    """``window_end``: the window's exclusive end, one ``unit`` after its start."""
    return frame.withColumn("window_end", F.col("window_start") + F.expr(f"INTERVAL 1 {unit.upper()}"))


TOPIC_KEY = ("gateway_id", "date", "hour", "topic")


def _by_topic(rows: DataFrame) -> DataFrame:
    """
    The rows shuffled once by gateway, hour and topic, so that every
    aggregation keyed by them (and by minute, publisher, ...) runs in the
    same stage with no exchange of its own: at a minute's grain partial
    aggregation gains little (there are nearly as many groups as rows),
    and the exchanges after it cost half the job.
    """
    return rows.repartition(*TOPIC_KEY)


def _per_publisher(rows: DataFrame) -> DataFrame:
    """
    Published messages per gateway, topic, minute and publisher: both
    topic rollups are sums over it, so the archive rows are grouped once
    and distinct publishers are counted over this much smaller frame.
    """
    published = _by_topic(
        rows.where(F.col("direction").isin(*PUBLISHED))
        .select(*TOPIC_KEY, "timestamp", "client_id", "qos", "retain", "payload_length")
    )
    return published.groupBy(*TOPIC_KEY, F.date_trunc("minute", "timestamp").alias("minute"), "client_id").agg(
        F.count("*").alias("messages"),
        F.sum("payload_length").cast("long").alias("bytes"),
        F.sum((F.col("qos") == 0).cast("long")).alias("qos0"),
        F.sum((F.col("qos") == 1).cast("long")).alias("qos1"),
        F.sum((F.col("qos") == 2).cast("long")).alias("qos2"),
        F.sum(F.col("retain").cast("long")).alias("retained"),
    )


def _distinct(column):
    """
    Distinct values per group as one aggregate, not a distinct
    aggregation (two more shuffles, through Spark's rewrite); the sets
    are small (a topic's publishers, a client's topics in an hour).
    """
    return F.size(F.collect_set(column)).cast("long")


def _topic_rollup(per_publisher: DataFrame, unit: str) -> DataFrame:
    bucket = F.date_trunc(unit, "minute")
    # A minute's per_publisher rows are one per publisher: counting them
    # counts the publishers.
    publishers = F.count(F.lit(1)).cast("long") if unit == "minute" else _distinct("client_id")
    return _with_end(per_publisher.groupBy("gateway_id", "date", "hour", "topic", bucket.alias("window_start")).agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        publishers.alias("publishers"),
        *(F.sum(k).alias(k) for k in ("qos0", "qos1", "qos2", "retained")),
    ), unit)


def topic_minute(rows):
    return _topic_rollup(_per_publisher(rows), "minute")


def topic_hour(rows):
    return _topic_rollup(_per_publisher(rows), "hour")


CLIENT_KEY = ("gateway_id", "date", "hour", "client_id", "direction", "window_start")


def client_hour(rows):
    """
    Messages and bytes per client, direction and hour, and its topics:
    summed per topic first, so that the topics are counted as rows of
    that much smaller frame (a client publishes on few topics), rather
    than collected into a set per group from every archive row.
    """
    per_topic = rows.groupBy(
        *CLIENT_KEY[:-1], F.date_trunc("hour", "timestamp").alias("window_start"), "topic"
    ).agg(
        F.count("*").alias("messages"),
        F.sum("payload_length").cast("long").alias("bytes"),
    )
    return _with_end(per_topic.groupBy(*CLIENT_KEY).agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.count("topic").cast("long").alias("topics"),
    ), "hour")


LAST_VALUE_KEY = ("gateway_id", "topic")


def last_value(rows, previous=None):
    """
    The last message published on each topic of each gateway, over the
    rows given, merged with the ``previous`` table when there is one: the
    archive only grows, so the newest of (previous, rows) is the newest of
    all, and a run reads only the hours it recomputes.
    """
    published = rows.where(F.col("direction").isin(*PUBLISHED)).select(
        "gateway_id",
        "topic",
        F.col("timestamp").alias("last_timestamp"),
        F.col("sequence").alias("last_sequence"),
        F.col("client_id").alias("last_client_id"),
        F.col("listener").alias("last_listener"),
        "qos",
        "retain",
        "payload",
    )
    if previous is not None:
        published = published.unionByName(previous.select(*published.columns))
    # The newest (timestamp, sequence) of each key: one aggregation, no sort.
    order = F.struct("last_timestamp", "last_sequence")
    newest = F.max_by(F.struct(*published.columns[2:]), order).alias("newest")
    return published.groupBy(*LAST_VALUE_KEY).agg(newest).select(*LAST_VALUE_KEY, "newest.*")


def json_minute(rows, field):
    """
    min/max/avg per topic and minute of a numeric JSON field, for the
    topics that carry it.  Messages on those topics whose value is not a
    number or text that is exactly one (text such as "n/a", true, an
    object, a missing field, a payload that is not JSON, binary or empty)
    are counted in ``invalid`` and left
    out of the figures: dirty data never stops a run.  ``try_cast`` gives
    null where a cast would raise under Spark's ANSI mode (on by default
    in Spark 4), without switching that mode off for everything else.
    """
    published = rows.where(F.col("direction").isin(*PUBLISHED))
    # A plain name is a top-level key; "$..." a JSON path into nested objects.
    path = field if field.startswith("$") else f"$.{field}"
    raw = F.get_json_object(F.col("payload").cast("string"), path)
    return (
        published.withColumn("raw", raw)
        # A JSON number, or text that is exactly one ("21.5", as some
        # devices send); not true, not "1e5x", not an object.
        .withColumn("value", F.expr("try_cast(raw AS DOUBLE)"))
        .withColumn(
            "value",
            F.when(F.col("raw").rlike(r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"), F.col("value")),
        )
        # The payload is parsed before the shuffle: only the value moves.
        .select(*TOPIC_KEY, "timestamp", F.col("raw").isNotNull().alias("present"), "value")
        .transform(_by_topic)
        .groupBy(*TOPIC_KEY, F.date_trunc("minute", "timestamp").alias("window_start"))
        .agg(
            F.count("value").alias("count"),
            (F.count(F.lit(1)) - F.count("value")).alias("invalid"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.avg("value").alias("avg"),
            F.sum(F.col("present").cast("long")).alias("_present"),
        )
        # Topics (and minutes) where the field never appears are not its.
        .where(F.col("_present") > 0)
        .drop("_present")
        .withColumn("field", F.lit(field))
        .transform(lambda frame: _with_end(frame, "minute"))
    )


def compute(rows, json_fields=(), tables=PARTITIONED):
    """{table name: DataFrame} for the partitioned tables asked for."""
    result = {}
    if "topic_minute" in tables or "topic_hour" in tables:
        per_publisher = _per_publisher(rows)
        if "topic_minute" in tables and "topic_hour" in tables:
            per_publisher = per_publisher.cache()
        for name, unit in (("topic_minute", "minute"), ("topic_hour", "hour")):
            if name in tables:
                result[name] = _topic_rollup(per_publisher, unit)
    if "client_hour" in tables:
        result["client_hour"] = client_hour(rows)
    if isinstance(json_fields, str):
        json_fields = [json_fields]
    frames = [json_minute(rows, field) for field in dict.fromkeys(json_fields)]
    if frames and "json_minute" in tables:
        result["json_minute"] = functools.reduce(lambda a, b: a.unionByName(b), frames)
    return result


def sparkplug_tables(rows, archive=None, tables=TABLES, malformed=None):
    """
    {table name: DataFrame} for the Sparkplug B tables asked for, from the
    ``rows`` of the hours recomputed; ``archive``: all the archive's rows
    when ``rows`` are only some of them (sparkplug_metrics reads its
    births, sparkplug_sessions the whole of it).  None when the rows hold
    no spBv1.0 topic.  ``malformed``: an accumulator of the payloads
    that are not Sparkplug B.
    """
    wanted = [name for name in SPARKPLUG if name in tables]
    if not wanted:
        return {}
    if not sparkplug.present(rows):
        say(f"no spBv1.0 topics in the rows read: {', '.join(wanted)} not computed")
        return {}
    result = {}
    if "sparkplug_metrics" in wanted or "sparkplug_minute" in wanted:
        metrics = sparkplug.metrics(rows, archive, malformed)
        if "sparkplug_minute" in wanted:
            if "sparkplug_metrics" in wanted:
                # Decoded once, in the Python workers, for both.
                metrics = metrics.cache()
            result["sparkplug_minute"] = sparkplug.minute(metrics)
        if "sparkplug_metrics" in wanted:
            result["sparkplug_metrics"] = metrics
    if "sparkplug_sessions" in wanted:
        result["sparkplug_sessions"] = sparkplug.sessions(rows if archive is None else archive)
    return result

"""
The tables, as Spark computations over archive rows.  Every rollup is
keyed by the archive partition (``date``, ``hour``) its rows came from, so
recomputing some partitions replaces exactly their rows.
"""

from pyspark.sql import DataFrame, SparkSession, Window
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

# The archive's columns (mqttgw.archive.SCHEMA), and its partition columns.
ARCHIVE_SCHEMA = StructType(
    [
        StructField("timestamp", TimestampType()),
        StructField("gateway_id", StringType()),
        StructField("sequence", LongType()),
        StructField("direction", StringType()),
        StructField("client_id", StringType()),
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

PARTITIONED = ("topic_minute", "topic_hour", "client_hour", "json_minute")


def read_archive(spark: SparkSession, archive: str) -> DataFrame:
    # Hive partitions as strings ("07", not 7): they name directories.
    return (
        spark.read.schema(ARCHIVE_SCHEMA)
        .option("basePath", archive)
        .parquet(archive)
    )


def _topic_rollup(rows: DataFrame, bucket) -> DataFrame:
    published = rows.where(F.col("direction").isin(*PUBLISHED))
    return published.groupBy("date", "hour", "topic", bucket.alias("window_start")).agg(
        F.count("*").alias("messages"),
        F.sum("payload_length").cast("long").alias("bytes"),
        F.countDistinct("client_id").alias("publishers"),
        F.sum((F.col("qos") == 0).cast("int")).alias("qos0"),
        F.sum((F.col("qos") == 1).cast("int")).alias("qos1"),
        F.sum((F.col("qos") == 2).cast("int")).alias("qos2"),
        F.sum(F.col("retain").cast("int")).alias("retained"),
    )


def topic_minute(rows):
    return _topic_rollup(rows, F.date_trunc("minute", "timestamp"))


def topic_hour(rows):
    return _topic_rollup(rows, F.date_trunc("hour", "timestamp"))


def client_hour(rows):
    return rows.groupBy(
        "date", "hour", "client_id", "direction", F.date_trunc("hour", "timestamp").alias("window_start")
    ).agg(
        F.count("*").alias("messages"),
        F.sum("payload_length").cast("long").alias("bytes"),
        F.countDistinct("topic").alias("topics"),
    )


def last_value(rows):
    """The last message published on each topic, over everything given."""
    published = rows.where(F.col("direction").isin(*PUBLISHED))
    latest = Window.partitionBy("topic").orderBy(
        F.col("timestamp").desc(), F.col("gateway_id").desc(), F.col("sequence").desc()
    )
    return (
        published.withColumn("rank", F.row_number().over(latest))
        .where("rank = 1")
        .select(
            "topic",
            F.col("timestamp").alias("last_timestamp"),
            F.col("client_id").alias("last_client_id"),
            "qos",
            "retain",
            "payload",
        )
    )


def json_minute(rows, field):
    """min/max/avg per topic and minute of a numeric JSON field."""
    published = rows.where(F.col("direction").isin(*PUBLISHED))
    value = F.get_json_object(F.col("payload").cast("string"), f"$.{field}").cast("double")
    return (
        published.withColumn("value", value)
        .where(F.col("value").isNotNull())
        .groupBy("date", "hour", "topic", F.date_trunc("minute", "timestamp").alias("window_start"))
        .agg(
            F.count("value").alias("count"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.avg("value").alias("avg"),
        )
        .withColumn("field", F.lit(field))
    )


def compute(rows, json_field=None):
    """{table name: DataFrame} for the partitioned tables."""
    tables = {
        "topic_minute": topic_minute(rows),
        "topic_hour": topic_hour(rows),
        "client_hour": client_hour(rows),
    }
    if json_field:
        tables["json_minute"] = json_minute(rows, json_field)
    return tables

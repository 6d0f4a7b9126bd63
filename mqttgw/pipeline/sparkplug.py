"""
The Sparkplug B tables: ``sparkplug_metrics`` (one row per metric value),
``sparkplug_sessions`` (births and deaths per edge node and device) and
``sparkplug_minute`` (numeric metrics per minute).  Payloads are decoded
in Spark's Python workers with the project's codec (``mapInArrow`` over
the rows of each edge node, in archive order), everything else in Spark
SQL.  SCHEMA.md describes every column.
"""

import functools

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mqttgw.wire.sparkplug import payload as codec
from mqttgw.wire.sparkplug import topics
from mqttgw.wire.sparkplug.payload import DataType

NAMESPACE = topics.PREFIX
BIRTHS = ("NBIRTH", "DBIRTH")
# Messages that carry the edge node's seq, after the NBIRTH that starts it.
SEQUENCED = frozenset({"NDATA", "DBIRTH", "DDATA", "DDEATH"})
NODE_KEY = ("gateway_id", "group_id", "edge_node_id")

_INTEGERS = frozenset({
    DataType.Int8, DataType.Int16, DataType.Int32, DataType.Int64,
    DataType.UInt8, DataType.UInt16, DataType.UInt32, DataType.UInt64, DataType.DateTime,
})
_FLOATS = frozenset({DataType.Float, DataType.Double})
_STRINGS = frozenset({DataType.String, DataType.Text, DataType.UUID})
# The datatypes sparkplug_minute takes figures of (not DateTime, not Boolean).
NUMERIC = sorted(t.name for t in (_INTEGERS - {DataType.DateTime}) | _FLOATS)
_INT64_MAX = 2**63 - 1

# What the workers read: the archive's published spBv1.0 rows, the topic split.
_IN = ("gateway_id", "group_id", "edge_node_id", "device_id", "message_type", "ts_us", "sequence",
       "payload", "date", "hour", "context")

METRICS_DDL = (
    "gateway_id string, group_id string, edge_node_id string, device_id string, message_type string,"
    " metric_name string, alias long, datatype string, long_value long, double_value double,"
    " boolean_value boolean, string_value string, bytes_value binary, is_null boolean,"
    " is_historical boolean, is_transient boolean, quality int, payload_ms long, ts_us long,"
    " sequence long, seq int, date string, hour int"
)
SESSIONS_DDL = (
    "gateway_id string, group_id string, edge_node_id string, device_id string, bd_seq long,"
    " birth_us long, birth_sequence long, death_us long, end_us long, ended_by string, last_us long,"
    " messages long, seq_gaps long, seq_missing long"
)


def published(rows: DataFrame) -> DataFrame:
    """
    The Sparkplug B messages among archive rows (published ones, on a
    topic of the namespace's shape), the topic split into its parts.
    """
    parts = F.split("topic", "/")
    kind = parts[2]
    shaped = (
        ((F.size(parts) == 4) & kind.isin(*topics.NODE_TYPES))
        | ((F.size(parts) == 5) & kind.isin(*topics.DEVICE_TYPES) & (parts[4] != ""))
    )
    return (
        rows.where(F.col("direction").isin("in", "bridge_in") & F.col("topic").startswith(NAMESPACE))
        .where(shaped & (parts[1] != "") & (parts[3] != ""))
        .select(
            "gateway_id", parts[1].alias("group_id"), parts[3].alias("edge_node_id"),
            F.when(F.size(parts) == 5, parts[4]).alias("device_id"), kind.alias("message_type"),
            F.unix_micros("timestamp").alias("ts_us"), "sequence", "payload", "date",
            F.col("hour").cast("int").alias("hour"),
        )
    )


def present(rows: DataFrame) -> bool:
    """Do the archive rows hold any Sparkplug B topic?"""
    return bool(rows.where(F.col("topic").startswith(NAMESPACE)).limit(1).count())


def _in_order(messages: DataFrame) -> DataFrame:
    """Each edge node's messages in one partition, in archive order."""
    return messages.repartition(*NODE_KEY).sortWithinPartitions(*NODE_KEY, "ts_us", "sequence", F.col("context").desc())


def metrics(selected: DataFrame, archive: DataFrame = None, malformed=None) -> DataFrame:
    """
    ``sparkplug_metrics`` of the ``selected`` archive rows.  ``archive``
    (the whole of it, when only some hours are selected): its BIRTH rows,
    which are few, are read too, so that aliases resolve through births
    of hours not recomputed; they give no rows of their own.  ``malformed``:
    an accumulator the workers count payloads that are not Sparkplug B in.
    """
    messages = published(selected).withColumn("context", F.lit(False))
    if archive is not None:
        messages = messages.unionByName(published(_births(archive)).withColumn("context", F.lit(True)))
    decoded = _in_order(messages.select(*_IN)).mapInArrow(functools.partial(_metric_batches, malformed), METRICS_DDL)
    return decoded.select(
        "gateway_id", "group_id", "edge_node_id", "device_id", "message_type", "metric_name",
        "alias", "datatype", "long_value", "double_value", "boolean_value", "string_value", "bytes_value", "is_null",
        "is_historical", "is_transient", "quality",
        F.timestamp_millis("payload_ms").alias("timestamp"), F.timestamp_micros("ts_us").alias("gateway_timestamp"),
        "sequence", "seq", "date", "hour",
    )


def _births(archive: DataFrame) -> DataFrame:
    """
    The archive's BIRTH rows: found by their topics alone, then read,
    payloads and all, from only the hours that hold one (the semi-join on
    the partition columns lets Spark prune the others).
    """
    keys = ("date", "hour", "gateway_id", "sequence")
    found = archive.where(
        F.col("direction").isin("in", "bridge_in") & F.col("topic").startswith(NAMESPACE)
        & F.split("topic", "/")[2].isin(*BIRTHS)
    ).select(*keys)
    return archive.join(found, list(keys), "left_semi")


def sessions(archive: DataFrame) -> DataFrame:
    """``sparkplug_sessions``, from every Sparkplug B message of the archive."""
    messages = published(archive).withColumn("context", F.lit(False))
    decoded = _in_order(messages.select(*_IN)).mapInArrow(_session_batches, SESSIONS_DDL)
    seconds = (F.coalesce("end_us", "last_us") - F.col("birth_us")) / 1e6
    return decoded.select(
        *NODE_KEY, "device_id", "bd_seq",
        F.timestamp_micros("birth_us").alias("birth_timestamp"), "birth_sequence",
        F.timestamp_micros("death_us").alias("death_timestamp"), F.timestamp_micros("end_us").alias("end_timestamp"),
        "ended_by", F.timestamp_micros("last_us").alias("last_timestamp"), seconds.alias("session_seconds"),
        "messages", "seq_gaps", "seq_missing",
    )


def minute(metric_rows: DataFrame) -> DataFrame:
    """``sparkplug_minute``: count, min, max, avg of numeric metrics per minute."""
    value = F.coalesce("double_value", F.col("long_value").cast("double"))
    return (
        metric_rows.where(F.col("datatype").isin(*NUMERIC) & F.col("metric_name").isNotNull())
        .groupBy(
            *NODE_KEY, "device_id", "metric_name", "date", "hour",
            F.date_trunc("minute", "gateway_timestamp").alias("window_start"),
        )
        .agg(F.count(value).alias("count"), F.min(value).alias("min"), F.max(value).alias("max"), F.avg(value).alias("avg"))
        .withColumn("window_end", F.col("window_start") + F.expr("INTERVAL 1 MINUTE"))
    )


# In the Python workers


def _messages(batches):
    """(row dict, decoded payload or None) of each archive row, in order."""
    for batch in batches:
        for row in batch.to_pylist():
            try:
                payload = codec.decode(row["payload"] or b"")
            except codec.MalformedPayload:
                payload = None  # carried as bytes by the gateway; no rows here
            yield row, payload


def _metric_batches(malformed, batches):
    schema = _arrow_schema(METRICS_DDL)
    births = {}  # (node key, device) -> {"aliases": {alias: metric}, "names": {name: metric}}
    out = []
    for row, payload in _messages(batches):
        if payload is None:
            if malformed is not None and not row["context"]:
                malformed.add(1)
            continue
        where = (row["gateway_id"], row["group_id"], row["edge_node_id"], row["device_id"])
        if row["message_type"] in BIRTHS:
            births[where] = _birth(payload)
        if row["context"]:
            continue
        birth = births.get(where, {"aliases": {}, "names": {}})
        for metric in payload.metrics:
            out.append(_metric_row(row, payload, metric, birth))
        if len(out) >= 4096:
            yield pa.RecordBatch.from_pylist(out, schema=schema)
            out = []
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=schema)


def _birth(payload):
    aliases, names = {}, {}
    for metric in payload.metrics:
        if metric.HasField("alias"):
            aliases[metric.alias] = metric
        names[metric.name] = metric
    return {"aliases": aliases, "names": names}


def _metric_row(row, payload, metric, birth):
    alias = metric.alias if metric.HasField("alias") else None
    known = birth["aliases"].get(alias) if alias is not None else None
    name = metric.name if metric.HasField("name") else (known.name if known is not None else None)
    if known is None and name is not None:
        known = birth["names"].get(name)
    datatype = metric.datatype or (known.datatype if known is not None else 0)
    stamp = metric.timestamp if metric.HasField("timestamp") else (
        payload.timestamp if payload.HasField("timestamp") else None)
    result = {k: row[k] for k in ("gateway_id", "group_id", "edge_node_id", "device_id", "message_type",
                                  "ts_us", "sequence", "date", "hour")}
    result.update(
        metric_name=name, alias=alias, datatype=_type_name(datatype), is_null=metric.is_null,
        is_historical=metric.is_historical, is_transient=metric.is_transient, quality=_quality(metric),
        payload_ms=stamp if stamp is None or stamp <= _INT64_MAX else None,
        seq=payload.seq if payload.HasField("seq") else None,
    )
    result.update(_typed(metric, datatype))
    return result


def _type_name(datatype):
    try:
        return DataType(datatype).name
    except ValueError:
        return str(datatype)  # a datatype of a later specification


# Which typed column a oneof field goes to when the datatype is unknown.
_BY_FIELD = {
    "int_value": "long_value", "long_value": "long_value", "float_value": "double_value",
    "double_value": "double_value", "boolean_value": "boolean_value", "string_value": "string_value",
}


def _typed(metric, datatype):
    """The metric's value in the column its datatype calls for."""
    if metric.is_null:
        return {}
    try:
        kind = DataType(datatype)
    except ValueError:
        kind = DataType.Unknown
    if kind in _INTEGERS or kind in _FLOATS or kind == DataType.Boolean or kind in _STRINGS:
        value = codec.value_of(metric, kind)
        if value is None:
            return {}
        if kind in _INTEGERS:
            # A UInt64 beyond int64 is kept exactly, as its digits.
            return {"long_value": value} if value <= _INT64_MAX else {"string_value": str(value)}
        if kind in _FLOATS:
            return {"double_value": float(value)}
        return {"boolean_value" if kind == DataType.Boolean else "string_value": value}
    field = metric.WhichOneof("value")
    if field is None:
        return {}
    value = getattr(metric, field)
    if kind == DataType.Unknown and field in _BY_FIELD:
        if field == "long_value" and value > _INT64_MAX:
            return {"string_value": str(value)}
        return {_BY_FIELD[field]: value}
    # Arrays and bytes as they are; DataSet, Template, ... as protobuf bytes.
    return {"bytes_value": value if isinstance(value, bytes) else value.SerializeToString()}


def _quality(metric):
    """The metric's "Quality" property (an integer), where it has one."""
    if not metric.HasField("properties"):
        return None
    for key, value in zip(metric.properties.keys, metric.properties.values):
        if key == "Quality":
            try:
                quality = codec.value_of(value, value.type)
            except (ValueError, codec.MalformedPayload):
                return None
            return quality if isinstance(quality, int) and -2**31 <= quality < 2**31 else None
    return None


def _session_batches(batches):
    schema = _arrow_schema(SESSIONS_DDL)
    node = None
    for row, payload in _messages(batches):
        key = (row["gateway_id"], row["group_id"], row["edge_node_id"])
        if node is None or node.key != key:
            if node is not None:
                yield pa.RecordBatch.from_pylist(node.finish(), schema=schema)
            node = NodeBirths(key)
        if payload is not None:
            node.message(row, payload)
    if node is not None:
        yield pa.RecordBatch.from_pylist(node.finish(), schema=schema)


class Birth:
    """One birth of an edge node or device, until its death or next birth."""

    def __init__(self, key, device, bd_seq, row):
        self.row = dict(zip(NODE_KEY, key), device_id=device, bd_seq=bd_seq, birth_us=row["ts_us"],
                        birth_sequence=row["sequence"], death_us=None, end_us=None, ended_by="open",
                        last_us=row["ts_us"], messages=1, seq_gaps=0, seq_missing=0)

    def seen(self, row, missing=0):
        self.row["last_us"] = row["ts_us"]
        self.row["messages"] += 1
        self.gap(missing)

    def gap(self, missing):
        if missing:
            self.row["seq_gaps"] += 1
            self.row["seq_missing"] += missing

    def end(self, row, how):
        self.row.update(end_us=row["ts_us"], ended_by=how, death_us=row["ts_us"] if how == "death" else None)


class NodeBirths:
    """The sessions of one edge node and its devices, from its messages in order."""

    def __init__(self, key):
        self.key = key
        self.node = None
        self.devices = {}
        self.seq = None
        self.done = []

    def message(self, row, payload):
        kind, device = row["message_type"], row["device_id"]
        missing = self._missing(kind, payload)
        if kind == "NBIRTH":
            self._end_all(row, "rebirth")
            self.node = Birth(self.key, None, _bd_seq(payload), row)
            self.seq = payload.seq if payload.HasField("seq") else 0
            return
        if kind == "NDEATH":
            bd_seq = _bd_seq(payload)
            if self.node is None or (None not in (bd_seq, self.node.row["bd_seq"]) and bd_seq != self.node.row["bd_seq"]):
                return  # a stale death (another session's bdSeq): ignored, as a host application does
            self.node.seen(row)
            self._end_all(row, "death")
            return
        if self.node is not None:
            self.node.seen(row, missing)
        if device is None:
            return
        current = self.devices.get(device)
        if kind == "DBIRTH":
            if current is not None:
                self._close(current, row, "rebirth")
            bd_seq = self.node.row["bd_seq"] if self.node is not None else None
            self.devices[device] = Birth(self.key, device, bd_seq, row)
            self.devices[device].gap(missing)
            return
        if current is not None:
            current.seen(row, missing)
            if kind == "DDEATH":
                self._close(current, row, "death")
                del self.devices[device]

    def _missing(self, kind, payload):
        """How many seq values were skipped before this message (0: none)."""
        if kind not in SEQUENCED or not payload.HasField("seq"):
            return 0
        seq, last = payload.seq % 256, self.seq
        self.seq = seq
        if last is None:
            return 0
        return (seq - (last + 1)) % 256

    def _close(self, session, row, how):
        session.end(row, how)
        self.done.append(session.row)

    def _end_all(self, row, how):
        for session in self.devices.values():
            self._close(session, row, how)
        self.devices = {}
        if self.node is not None:
            self._close(self.node, row, how)
            self.node = None

    def finish(self):
        """Every session, the open ones last."""
        still = [s.row for s in self.devices.values()] + ([self.node.row] if self.node is not None else [])
        return self.done + still


def _bd_seq(payload):
    metric = codec.metric_named(payload, "bdSeq")
    if metric is None:
        return None
    value = codec.value_of(metric, metric.datatype or DataType.UInt64)
    return value if isinstance(value, int) and -2**63 <= value <= _INT64_MAX else None


def _arrow_schema(ddl):
    kinds = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
             "boolean": pa.bool_(), "binary": pa.binary()}
    return pa.schema([pa.field(*part.split()[:1], kinds[part.split()[1]]) for part in ddl.split(",")])

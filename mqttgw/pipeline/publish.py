"""
What dashboards subscribe to: the newest figures of each topic, published
into a gateway as retained JSON messages (QoS 1) under a prefix:

- ``PREFIX/<topic>/_/1m`` and ``PREFIX/<topic>/_/1h``: the newest minute
  and hour of ``topic_minute`` and ``topic_hour``;
- ``PREFIX/<topic>/_/<field>/1m``: the newest minute of ``json_minute``;
- ``PREFIX/<topic>/_/last``: ``last_value``;
- ``PREFIX/spBv1.0/GROUP/NDATA/EDGE_NODE[/DEVICE]/_/metric/<metric>/1m``
  (``DDATA`` with a device): the newest minute of ``sparkplug_minute``,
  the metric name's ``%``, ``+``, ``#`` and NUL written ``%25``, ``%2B``,
  ``%23``, ``%00`` (its ``/`` are levels).

Names are one-to-one, so one topic's figures never overwrite another's:
a level of ``_`` alone separates the topic from the rollup, and a topic
level made only of underscores, the empty one included, gets two more
(``/a`` is ``__/a``, ``_`` is ``___``); the field is named as given.
``topic_of`` is the inverse, and ``metric_of`` gives a metric's name back.  Archives of several gateways are summed per
topic; each body carries the ``topic`` as it was.  Topics already under
the prefix (what an earlier run published, archived by the gateway) are
not published again.
"""

import base64
import json
import os
import socket
import time
from datetime import timezone

from mqttgw.pipeline.console import say
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer


SEPARATOR = "_"


def _level(level):
    return level + "__" if level.strip("_") == "" else level


def topic_name(prefix, topic, *rollup):
    """The name ``topic``'s ``rollup`` (``1m``; ``celsius``, ``1m``) is published on."""
    return "/".join([prefix, *(_level(level) for level in topic.split("/")), SEPARATOR, *rollup])


def topic_of(prefix, name):
    """``(topic, rollup levels)`` of a published name: ``topic_name``'s inverse."""
    levels = name[len(prefix) + 1:].split("/")
    cut = levels.index(SEPARATOR)
    return "/".join(level[:-2] if level.strip("_") == "" else level for level in levels[:cut]), levels[cut + 1:]


_ESCAPES = (("%", "%25"), ("+", "%2B"), ("#", "%23"), ("\0", "%00"))


def metric_levels(name):
    """The levels a Sparkplug metric's name takes in a published name."""
    for character, escaped in _ESCAPES:
        name = name.replace(character, escaped)
    return name.split("/")


def metric_of(rollup):
    """The metric name of ``topic_of``'s rollup levels ``["metric", ..., "1m"]``."""
    name = "/".join(rollup[1:-1])
    for character, escaped in reversed(_ESCAPES):
        name = name.replace(escaped, character)
    return name


def sparkplug_topic(group, node, device):
    """The DATA topic of a Sparkplug B edge node (device None) or device."""
    return "/".join(["spBv1.0", group, "DDATA" if device is not None else "NDATA", node, *([device] if device is not None else [])])


def _iso(t):
    return t.replace(tzinfo=timezone.utc).isoformat()


def _newest(frame, keys):
    """The rows of each key's newest window (of every gateway that has it)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    newest = F.max("window_start").over(Window.partitionBy(*keys))
    return frame.withColumn("_newest", newest).where(F.col("window_start") == F.col("_newest")).drop("_newest")


def messages(spark, out, prefix):
    """[(topic, payload)] for everything there is to publish."""
    from pyspark.sql import functions as F

    from pyspark.errors import AnalysisException

    def table(name):
        # Read by Spark, where the tables are (a Connect server's files
        # are not this process's).
        try:
            return spark.read.parquet("/".join([str(out).rstrip("/"), name]))
        except AnalysisException:
            return None  # not computed

    mine = f"{prefix}/"

    def unpublished(name):
        """Table ``name`` without the topics under the prefix, or None."""
        frame = table(name)
        return None if frame is None else frame.where(~F.col("topic").startswith(mine))

    result = []
    for name, suffix in (("topic_minute", "1m"), ("topic_hour", "1h")):
        result += _rollups(unpublished(name), prefix, suffix)
    result += _json_fields(unpublished("json_minute"), prefix)
    result += _sparkplug(table("sparkplug_minute"), prefix)
    result += _last_values(unpublished("last_value"), prefix)
    return [(topic, json.dumps(body).encode()) for topic, body in result]


def _rollups(frame, prefix, suffix):
    """The newest window of each topic of ``topic_minute`` or ``topic_hour``, summed over gateways."""
    if frame is None:
        return []
    from pyspark.sql import functions as F

    summed = _newest(frame, ["topic"]).groupBy("topic", "window_start", "window_end").agg(
        *(F.sum(k).alias(k) for k in ("messages", "bytes", "publishers", "qos0", "qos1", "qos2", "retained")),
        F.countDistinct("gateway_id").alias("gateways"),
    )
    result = []
    for row in summed.collect():
        body = {"topic": row["topic"], "window_start": _iso(row["window_start"]), "window_end": _iso(row["window_end"])}
        body.update((k, row[k]) for k in ("messages", "bytes", "publishers", "qos0", "qos1", "qos2", "retained", "gateways"))
        result.append((topic_name(prefix, row["topic"], suffix), body))
    return result


def _json_fields(frame, prefix):
    """The newest minute of each topic's JSON fields (``json_minute``), summed over gateways."""
    if frame is None:
        return []
    from pyspark.sql import functions as F

    summed = _newest(frame, ["topic", "field"]).groupBy("topic", "field", "window_start", "window_end").agg(
        F.sum("count").alias("count"),
        F.sum("invalid").alias("invalid"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        (F.sum(F.col("avg") * F.col("count")) / F.sum("count")).alias("avg"),
    )
    result = []
    for row in summed.collect():
        body = {"topic": row["topic"], "field": row["field"], "window_start": _iso(row["window_start"]),
                "window_end": _iso(row["window_end"])}
        body.update((k, row[k]) for k in ("count", "invalid", "min", "max", "avg"))
        result.append((topic_name(prefix, row["topic"], row["field"], "1m"), body))
    return result


def _last_values(frame, prefix):
    """Each topic's last message (``last_value``), the newest of any gateway's."""
    if frame is None:
        return []
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    latest = Window.partitionBy("topic").orderBy(F.col("last_timestamp").desc(), F.col("gateway_id").desc())
    result = []
    for row in frame.withColumn("_rank", F.row_number().over(latest)).where("_rank = 1").collect():
        body = {
            "topic": row["topic"], "timestamp": _iso(row["last_timestamp"]), "gateway_id": row["gateway_id"],
            "client_id": row["last_client_id"], "qos": row["qos"], "retain": row["retain"],
        }
        payload = bytes(row["payload"] or b"")
        try:
            body["payload"] = payload.decode("utf-8")
        except UnicodeDecodeError:
            body["payload_base64"] = base64.b64encode(payload).decode()
        result.append((topic_name(prefix, row["topic"], "last"), body))
    return result


def _sparkplug(frame, prefix):
    """The newest minute of each Sparkplug metric, summed over gateways."""
    if frame is None:
        return []
    from pyspark.sql import functions as F

    keys = ["group_id", "edge_node_id", "device_id", "metric_name"]
    summed = _newest(frame.withColumn("_device", F.coalesce("device_id", F.lit(""))),
                     [*keys[:2], "_device", keys[3]]).groupBy(*keys, "window_start", "window_end").agg(
        F.sum("count").alias("count"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        (F.sum(F.col("avg") * F.col("count")) / F.sum("count")).alias("avg"),
        F.countDistinct("gateway_id").alias("gateways"),
    )
    result = []
    for row in summed.collect():
        topic = sparkplug_topic(row["group_id"], row["edge_node_id"], row["device_id"])
        body = {"topic": topic, "metric": row["metric_name"], "window_start": _iso(row["window_start"]),
                "window_end": _iso(row["window_end"])}
        body.update((k, row[k]) for k in ("group_id", "edge_node_id", "device_id", "count", "min", "max", "avg", "gateways"))
        result.append((topic_name(prefix, topic, "metric", *metric_levels(row["metric_name"]), "1m"), body))
    return result


def publish(spark, args):
    """Publishes ``messages`` over MQTT; returns how many."""
    pending_messages = messages(spark, args.out, args.prefix)
    if not pending_messages:
        say("nothing to publish yet")
        return 0
    target = args.publish
    host, _, port = target.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    if args.tls:
        import ssl

        # The gateway's certificate is checked, host name included.
        sock = ssl.create_default_context(cafile=args.ca or None).wrap_socket(sock, server_hostname=host)
    password = os.environ.get("MQTTGW_PASSWORD")
    sock.sendall(
        P.Connect(
            client_id=f"mqttgw-pipeline-{int(time.time())}"[:23],
            keepalive=0,
            username=args.username,
            password=password.encode() if password else None,
        ).encode()
    )
    framer = Framer()
    connack = None
    while connack is None:
        data = sock.recv(4096)
        if not data:
            raise SystemExit(f"pipeline: {target} closed the connection before CONNACK")
        for packet in framer.feed(data):
            connack = packet
    if connack.return_code:
        raise SystemExit(f"pipeline: {target} refused CONNECT (code {connack.return_code})")
    # At most 20 unacknowledged, as a gateway's in-flight window allows.
    pending = set()
    queue = list(enumerate(pending_messages, start=1))
    while queue or pending:
        while queue and len(pending) < 20:
            mid, (topic, payload) = queue.pop(0)
            sock.sendall(P.Publish(topic, payload, 1, True, message_id=(mid - 1) % 65535 + 1).encode())
            pending.add((mid - 1) % 65535 + 1)
        data = sock.recv(65536)
        if not data:
            raise SystemExit(f"pipeline: {target} closed the connection")
        for packet in framer.feed(data):
            if isinstance(packet, P.Puback):
                pending.discard(packet.message_id)
    sock.sendall(P.Disconnect().encode())
    sock.close()
    say(f"published {len(pending_messages)} message(s) to {target}")
    return len(pending_messages)

"""
The pipeline's Sparkplug B tables (sparkplug_metrics, sparkplug_sessions,
sparkplug_minute), from the archive of a running gateway that Sparkplug
edge nodes published through (paho and the project's codec): checked
against values worked out here from what was published, read by DuckDB,
streaming equal to batch, and the minute rollups published back.
"""

import json
from collections import defaultdict
from datetime import datetime, timezone

import pytest

from mqttgw.archive.segments import Archive
from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import payload as S
from mqttgw.wire.sparkplug.payload import DataType as T
from tests.conftest import require_program
from tests.gateway import REPO, Gateway
from tests.paho import PahoClient
from tests.pipeline_runs import ThreadClock, pipeline, said, table

SPARKPLUG_TABLES = "sparkplug_metrics,sparkplug_minute,sparkplug_sessions"
BASE_MS = 1_795_000_000_000
# The typed column of each datatype the scenario uses.
COLUMN = {
    T.Int32: "long_value", T.Int64: "long_value", T.UInt32: "long_value", T.Double: "double_value",
    T.Boolean: "boolean_value", T.String: "string_value", T.Bytes: "bytes_value",
}
NUMERIC = {T.Int32, T.Int64, T.UInt32, T.Double}


@pytest.fixture(autouse=True)
def java():
    require_program("java")


def m(name, alias, datatype, value, wire="full", quality=None, stamp=None):
    """
    A metric as the test knows it.  ``wire``: "full" (name, alias and
    datatype sent, as in a BIRTH), "alias" (alias and value only, as in
    DATA after a BIRTH) or "unknown" (an alias no BIRTH defined: its name
    and datatype are unknown to a reader).
    """
    return dict(name=name, alias=alias, datatype=datatype, value=value, wire=wire, quality=quality, stamp=stamp)


def encode(seq, stamp, metrics):
    p = S.Payload(timestamp=stamp)
    if seq is not None:
        p.seq = seq
    for spec in metrics:
        metric = p.metrics.add()
        if spec["wire"] == "full":
            metric.name = spec["name"]
            metric.datatype = spec["datatype"]
        if spec["alias"] is not None:
            metric.alias = spec["alias"]
        if spec["stamp"] is not None:
            metric.timestamp = spec["stamp"]
        if spec["quality"] is not None:
            metric.properties.CopyFrom(S.property_set([("Quality", T.Int32, spec["quality"])]))
        if spec["datatype"] == T.UInt32 and spec["value"] is not None and spec["wire"] == "full":
            metric.long_value = spec["value"]  # as Eclipse Tahu's JavaScript client writes it
        else:
            S.set_value(metric, spec["datatype"], spec["value"])
    return S.encode(p)


def scenario():
    """
    (edge node session, message type, device, seq, metrics) in publishing
    order: births, data by alias only, a seq gap, a device death, the
    node's death by its will, a rebirth with other aliases, and a rebirth
    without a death (as after a Rebirth command).
    """
    uptime = lambda alias, v, **k: m("uptime", alias, T.Int64, v, **k)  # noqa: E731
    flow = lambda alias, v, **k: m("Inputs/flow", alias, T.Double, v, **k)  # noqa: E731
    count = lambda alias, v, **k: m("count", alias, T.UInt32, v, **k)  # noqa: E731
    return [
        (1, "NBIRTH", None, 0, [m("bdSeq", None, T.Int64, 0), m("Node Control/Rebirth", 1, T.Boolean, False),
                                uptime(2, 100), m("label", 3, T.String, "north")]),
        (1, "DBIRTH", "pump", 1, [flow(10, 3.5, quality=192), count(11, 7), m("level", 12, T.Int32, -7),
                                  m("raw", 13, T.Bytes, b"\x00\x01")]),
        (1, "DDATA", "pump", 2, [flow(10, 4.25, wire="alias", stamp=BASE_MS + 1500), count(11, 8, wire="alias"),
                                 m("level", 12, T.Int32, -3, wire="alias", quality=500)]),
        (1, "NDATA", None, 3, [uptime(2, 160, wire="alias"), m("label", 3, T.String, None, wire="alias")]),
        (1, "DDATA", "pump", 6, [flow(10, 5.0, wire="alias")]),  # seq 4 and 5 never came
        (1, "DDEATH", "pump", 7, []),
        (1, "NDEATH", None, None, [m("bdSeq", None, T.Int64, 0)]),  # the will
        (2, "NBIRTH", None, 0, [m("bdSeq", None, T.Int64, 1), uptime(20, 5), m("label", 21, T.String, "south")]),
        (2, "DBIRTH", "pump", 1, [flow(30, 1.0), count(31, 2)]),
        (2, "DDATA", "pump", 2, [flow(30, 1.5, wire="alias"), count(31, 3, wire="alias"),
                                 m(None, 10, T.Double, 9.9, wire="unknown")]),
        (2, "NDATA", None, 3, [uptime(20, 6, wire="alias")]),
        (2, "NBIRTH", None, 0, [m("bdSeq", None, T.Int64, 2), uptime(40, 7)]),
        (2, "NDATA", None, 1, [uptime(40, 8, wire="alias")]),
    ]


def topic_of(kind, device):
    return f"spBv1.0/plant/{kind}/E1" + (f"/{device}" if device else "")


def run_edge_node(port):
    """Publish the scenario through the gateway; [(topic, payload)] of what it archived, in order."""
    host = PahoClient(port, "host", "MQTTv311")
    host.connect()
    host.subscribe("spBv1.0/#", 1)
    sent = []
    received = 0  # by the host
    edge = None
    for i, (session, kind, device, seq, metrics) in enumerate(scenario()):
        payload = encode(seq, BASE_MS + 1000 * i, metrics)
        topic = topic_of(kind, device)
        if kind == "NDEATH":
            # The will, sent by the gateway when the edge node's link is lost.
            host.receive(len(sent) - received)
            edge.drop()
            [will] = host.receive(1)
            assert (will.topic, will.payload) == (topic, payload)
            sent.append((topic, payload))
            received = len(sent)
            edge = None
            continue
        if edge is None:
            bd_seq = [spec["value"] for spec in metrics if spec["name"] == "bdSeq"][0]
            death = encode(None, BASE_MS + 1000 * (i + 6), [m("bdSeq", None, T.Int64, bd_seq)])
            edge = PahoClient(port, f"edge-E1-{session}", "MQTTv311", will=(topic_of("NDEATH", None), death, 1, False))
            edge.connect()
        if (session, kind) == (2, "NBIRTH") and sent[-1][0] != topic_of("NDEATH", None):
            # Noise on the node's topics that gives no rows: a payload that
            # is not Sparkplug B, and the host's STATE.
            edge.publish(topic_of("NDATA", None), b"\xff\xff not protobuf", 1)
            edge.publish("spBv1.0/STATE/host", b'{"online": true}', 1, True)
            sent += [(topic_of("NDATA", None), b"\xff\xff not protobuf"), ("spBv1.0/STATE/host", b'{"online": true}')]
        edge.publish(topic, payload, 1)
        sent.append((topic, payload))
    edge.disconnect()  # a clean DISCONNECT: no will, the last session stays open
    host.receive(len(sent) - received)  # all of them went through
    host.disconnect()
    return sent


def expected_metrics(archived):
    """sparkplug_metrics' rows, from the scenario and the archive's times of its messages."""
    rows = []
    for i, (_, kind, device, seq, metrics) in enumerate(scenario()):
        when = archived[i]
        for spec in metrics:
            known = spec["wire"] != "unknown"
            row = dict(
                gateway_id="site-sp", group_id="plant", edge_node_id="E1", device_id=device, message_type=kind,
                metric_name=spec["name"], alias=spec["alias"], datatype=T(spec["datatype"]).name if known else "Unknown",
                long_value=None, double_value=None, boolean_value=None, string_value=None, bytes_value=None,
                is_null=spec["value"] is None, is_historical=False, is_transient=False, quality=spec["quality"],
                timestamp=spec["stamp"] or BASE_MS + 1000 * i, gateway_timestamp=when["timestamp"],
                sequence=when["sequence"], seq=seq, date=when["timestamp"].strftime("%Y-%m-%d"),
                hour=when["timestamp"].hour,
            )
            if spec["value"] is not None:
                row[COLUMN[spec["datatype"]]] = spec["value"]
            rows.append(row)
    return rows


def normal(row):
    row = dict(row)
    for key in ("timestamp", "gateway_timestamp"):
        if isinstance(row[key], datetime):
            row[key] = row[key].replace(tzinfo=timezone.utc) if row[key].tzinfo is None else row[key]
    if isinstance(row["timestamp"], datetime):
        row["timestamp"] = round(row["timestamp"].timestamp() * 1000)
    return row


def key(row):
    return (row["sequence"], row["metric_name"] or "", row["alias"] or 0)


# The sessions of the scenario, by hand (messages: a node's own and its
# devices', a device's own): device, bdSeq, and the scenario's indexes of
# the birth, the death, the end and the last message; how it ended,
# messages, seq gaps and seq values missing.
SESSIONS = [
    (None, 0, 0, 6, 6, 6, "death", 7, 1, 2),
    ("pump", 0, 1, 5, 5, 5, "death", 4, 1, 2),
    (None, 1, 7, None, 11, 10, "rebirth", 4, 0, 0),
    ("pump", 1, 8, None, 11, 9, "rebirth", 2, 0, 0),
    (None, 2, 11, None, None, 12, "open", 2, 0, 0),
]


def expected_sessions(archived):
    t = [r["timestamp"] for r in archived]
    at = lambda i: None if i is None else t[i]  # noqa: E731
    return [
        dict(
            gateway_id="site-sp", group_id="plant", edge_node_id="E1", device_id=device, bd_seq=bd_seq,
            birth_timestamp=t[birth], birth_sequence=archived[birth]["sequence"], death_timestamp=at(death),
            end_timestamp=at(end), ended_by=how, last_timestamp=t[last],
            session_seconds=(t[last if end is None else end] - t[birth]).total_seconds(),
            messages=messages, seq_gaps=gaps, seq_missing=missing,
        )
        for device, bd_seq, birth, death, end, last, how, messages, gaps, missing in SESSIONS
    ]


def expected_minutes(metric_rows):
    """{(device, metric, minute): [values]} of the numeric values whose name is known."""
    minutes = defaultdict(list)
    for row in metric_rows:
        if row["metric_name"] and not row["is_null"] and T[row["datatype"]] in NUMERIC:
            value = row["double_value"] if row["double_value"] is not None else row["long_value"]
            minute = row["gateway_timestamp"].replace(second=0, microsecond=0)
            minutes[(row["device_id"], row["metric_name"], minute)].append(value)
    return minutes


def check_read_by_duckdb(out, metric_rows, minutes):
    import duckdb

    db = duckdb.connect()

    def one(query, name, hive=True):
        source = f"read_parquet('{out / name}/**/*.parquet', hive_partitioning={str(hive).lower()})"
        return db.execute(query.format(source)).fetchone()

    assert one("select count(*) from {}", "sparkplug_metrics") == (len(metric_rows),)
    # UInt32 from long_value (births, as Tahu writes them) and int_value.
    query = "select list(long_value order by sequence) from {} where metric_name = 'count' and device_id = 'pump'"
    assert one(query, "sparkplug_metrics") == ([7, 8, 2, 3],)
    assert one("select sum(seq_missing), count(*) from {}", "sparkplug_sessions", hive=False) == (4, len(SESSIONS))
    # The partition columns too.
    assert one("select sum(count), max(hour), max(date) from {}", "sparkplug_minute") == (
        sum(map(len, minutes.values())), max(k[2].hour for k in minutes), max(k[2] for k in minutes).date())


def check_published(tmp_path, archive, minutes):
    """The newest minute of each metric, published back as retained messages."""
    from mqttgw.pipeline.publish import metric_of
    from mqttgw.pipeline.publish import topic_of as name_of

    newest = {}
    for (device, metric, window), values in minutes.items():
        if (device, metric) not in newest or newest[device, metric][0] < window:
            newest[device, metric] = (window, values)
    (tmp_path / "dashboard").mkdir()
    gw = Gateway(tmp_path / "dashboard", "--no-persistence")
    try:
        result = pipeline(
            "batch", "--archive", str(archive), "--out", str(tmp_path / "published"), "--tables", SPARKPLUG_TABLES,
            "--publish", f"127.0.0.1:{gw.port}", cwd=tmp_path,
        )
        assert f"published: {len(newest)} messages" in result.stdout
        dashboard = PahoClient(gw.port, "dashboard", "MQTTv311")
        dashboard.connect()
        dashboard.subscribe("$analytics/#", 1)
        got = {msg.topic: (json.loads(msg.payload), msg.retain) for msg in dashboard.receive(len(newest))}
        dashboard.nothing_more()
    finally:
        gw.stop()
    assert all(retain for _, retain in got.values())
    assert "$analytics/spBv1.0/plant/DDATA/E1/pump/_/metric/Inputs/flow/1m" in got
    for name, (body, _) in got.items():
        topic, rollup = name_of("$analytics", name)
        assert (topic, metric_of(rollup)) == (body["topic"], body["metric"])
        assert topic == "spBv1.0/plant/" + ("DDATA/E1/pump" if body["device_id"] else "NDATA/E1")
        window, values = newest[body["device_id"], body["metric"]]
        assert (body["window_start"], body["count"], body["min"], body["max"]) == (
            window.isoformat(), len(values), min(values), max(values))


def test_sparkplug_tables_from_a_gateways_archive(tmp_path):
    archive = tmp_path / "archive"
    gw = Gateway(tmp_path, "--archive", str(archive), "--no-persistence", "--gateway-id", "site-sp")
    try:
        sent = run_edge_node(gw.port)
    finally:
        gw.stop()  # closes the open segment
    rows = sorted(
        (r for r in table(archive) if r["topic"].startswith("spBv1.0/") and r["direction"] == "in"),
        key=lambda r: r["sequence"],
    )
    assert [(r["topic"], r["payload"]) for r in rows] == sent
    archived = [r for r in rows if r["payload"] != b"\xff\xff not protobuf" and "STATE" not in r["topic"]]
    for r in archived:
        r["timestamp"] = r["timestamp"].replace(tzinfo=timezone.utc)
    out = tmp_path / "tables"
    result = pipeline("batch", "--archive", str(archive), "--out", str(out), "--tables", SPARKPLUG_TABLES, cwd=tmp_path)
    # The payload that is not Sparkplug B is counted, and gives no rows.
    assert "1 spBv1.0 message(s) without a Sparkplug B payload: no metric rows" in said(result.stderr)
    [run] = [json.loads(line) for line in (out / "_runs" / "runs.jsonl").read_text().splitlines()]
    assert run["sparkplug_malformed"] == 1 and run["status"] == "ok"

    expected = expected_metrics(archived)
    got = [normal(r) for r in table(out / "sparkplug_metrics")]
    assert sorted(got, key=key) == sorted(expected, key=key)

    got = table(out / "sparkplug_sessions")
    for row in got:
        for k in ("birth_timestamp", "death_timestamp", "end_timestamp", "last_timestamp"):
            row[k] = row[k] and row[k].replace(tzinfo=timezone.utc)
    assert sorted(got, key=lambda r: r["birth_sequence"]) == expected_sessions(archived)

    minutes = expected_minutes(expected)
    got = {
        (r["device_id"], r["metric_name"], r["window_start"].replace(tzinfo=timezone.utc)): r
        for r in table(out / "sparkplug_minute")
    }
    assert set(got) == set(minutes)
    for k, values in minutes.items():
        r = got[k]
        assert (r["count"], r["min"], r["max"]) == (len(values), min(values), max(values)), k
        assert r["avg"] == pytest.approx(sum(values) / len(values)), k
        assert (r["window_end"] - r["window_start"]).total_seconds() == 60 and r["hour"] == r["window_start"].hour

    check_read_by_duckdb(out, expected, minutes)

    # SCHEMA.md names every column.
    import pyarrow.dataset as ds

    schema_doc = (REPO / "mqttgw" / "pipeline" / "SCHEMA.md").read_text()
    for name in SPARKPLUG_TABLES.split(","):
        [section] = [s for s in schema_doc.split("\n## ") if s.splitlines()[0] == name]
        for column in ds.dataset(out / name, format="parquet", partitioning="hive").schema.names:
            assert f"`{column}`" in section, (name, column)

    check_published(tmp_path, archive, minutes)


def write(archive, start, messages, gateway_id="gw"):
    """One archive segment of Sparkplug messages [(topic, payload)], a second apart from ``start``."""
    now = [datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp()]

    def clock():
        now[0] += 1.0
        return now[0]

    a = Archive(archive, ThreadClock(), gateway_id, clock=clock)
    a.start()
    for topic, payload in messages:
        a.record("in", "edge", P.Publish(topic, payload, 0, False))
    a.stop()


def snapshot(out):
    return {
        name: sorted(json.dumps(r, default=str, sort_keys=True) for r in table(out / name))
        for name in SPARKPLUG_TABLES.split(",")
    }


def test_sparkplug_streaming_equals_batch_with_births_of_earlier_hours(tmp_path):
    archive, out, checkpoint = tmp_path / "archive", tmp_path / "stream", tmp_path / "checkpoint"
    stream = ["stream", "--archive", str(archive), "--out", str(out), "--checkpoint", str(checkpoint),
              "--tables", SPARKPLUG_TABLES]
    births = [
        (topic_of("NBIRTH", None), encode(0, BASE_MS, [m("bdSeq", None, T.Int64, 0), m("uptime", 5, T.Int64, 1)])),
        (topic_of("DBIRTH", "pump"), encode(1, BASE_MS, [m("temp", 6, T.Double, 20.0)])),
    ]
    data = lambda seq, v: (topic_of("DDATA", "pump"), encode(seq, BASE_MS, [m("temp", 6, T.Double, v, wire="alias")]))  # noqa: E731
    write(archive, "2026-11-22T10:58:00", births)
    write(archive, "2026-11-22T11:10:00", [data(2, 21.0), data(3, 22.0)])
    pipeline(*stream, cwd=tmp_path)
    # A late segment of hour 11 and a new hour: the stream recomputes
    # those two hours alone, whose aliases the births of hour 10 define.
    write(archive, "2026-11-22T11:20:00", [data(4, 23.0)])
    write(archive, "2026-11-22T12:00:00", [data(5, 24.0), data(9, 25.0)])
    result = pipeline(*stream, cwd=tmp_path)
    assert "micro-batch 1: 2 hour(s) touched" in said(result.stderr)
    temps = sorted((r["gateway_id"], r["hour"], r["double_value"]) for r in table(out / "sparkplug_metrics")
                   if r["message_type"] == "DDATA" and r["metric_name"] == "temp" and r["datatype"] == "Double")
    assert temps == [("gw", 11, 21.0), ("gw", 11, 22.0), ("gw", 11, 23.0), ("gw", 12, 24.0), ("gw", 12, 25.0)]
    batch_out = tmp_path / "batch"
    # file://, as hdfs:// is written: Spark's own commit, nothing staged here.
    pipeline("batch", "--archive", str(archive), "--out", f"file://{batch_out}", "--tables", SPARKPLUG_TABLES, cwd=tmp_path)
    assert snapshot(out) == snapshot(batch_out)
    # The seq gap (5 to 9) is in the node's session.
    [session] = [r for r in table(out / "sparkplug_sessions") if r["device_id"] is None]
    assert (session["messages"], session["seq_gaps"], session["seq_missing"], session["ended_by"]) == (7, 1, 3, "open")


def test_metric_names_in_published_topics_are_one_to_one():
    """Without Spark: a metric's name, '/' and '+' and all, comes back from its published name."""
    from hypothesis import given
    from hypothesis import strategies as st

    from mqttgw.pipeline.publish import metric_levels, metric_of, topic_name, topic_of

    @given(st.text("a/_+#%0\0 ", max_size=10))
    def inverse(metric):
        name = topic_name("$analytics", "spBv1.0/G/DDATA/E/D", "metric", *metric_levels(metric), "1m")
        assert not set("+#\0") & set(name[len("$analytics"):])
        topic, rollup = topic_of("$analytics", name)
        assert (topic, metric_of(rollup)) == ("spBv1.0/G/DDATA/E/D", metric)

    inverse()


def test_the_submitted_zip_carries_the_sparkplug_codec(tmp_path):
    """Without Spark: spark-submit's --py-files zip has what the driver and workers import."""
    import zipfile

    from mqttgw.pipeline.command import package_zip

    names = zipfile.ZipFile(package_zip(tmp_path / "mqttgw.zip")).namelist()
    assert {"mqttgw/pipeline/sparkplug.py", "mqttgw/wire/sparkplug/payload.py", "mqttgw/wire/sparkplug/topics.py"} <= set(names)


def test_every_datatype_lands_in_its_column():
    """Without Spark: the workers' decoding of one DDATA, every kind of value, the birth before it."""
    import pyarrow as pa

    from mqttgw.pipeline import sparkplug

    ds = S.dataset(["a"], [T.Int32], [[1]])
    birth = S.Payload(seq=1)
    birth.metrics.add(name="big", alias=1, datatype=T.UInt64)
    data = S.Payload(seq=2, timestamp=BASE_MS)
    values = [
        ("i8", T.Int8, -3, "long_value", -3),
        ("u32", T.UInt32, 2**32 - 1, "long_value", 2**32 - 1),
        ("u64", T.UInt64, 2**64 - 1, "string_value", str(2**64 - 1)),
        ("when", T.DateTime, BASE_MS, "long_value", BASE_MS),
        ("f", T.Float, 0.5, "double_value", 0.5),
        ("b", T.Boolean, True, "boolean_value", True),
        ("s", T.Text, "x", "string_value", "x"),
        ("u", T.UUID, "0-1", "string_value", "0-1"),
        ("file", T.File, b"\x01", "bytes_value", b"\x01"),
        ("arr", T.Int16Array, [-1, 2], "bytes_value", S.pack_array(T.Int16Array, [-1, 2])),
        ("ds", T.DataSet, ds, "bytes_value", ds.SerializeToString()),  # its protobuf bytes
    ]
    for name, datatype, value, _, _ in values:
        S.set_value(data.metrics.add(name=name, datatype=datatype), datatype, value)
    data.metrics.add(alias=1, long_value=2**63)  # named and typed by the birth
    data.metrics.add(alias=9, long_value=2**64 - 2)  # by no birth: its field tells the column
    rows = [
        dict(gateway_id="gw", group_id="G", edge_node_id="E", device_id="D", message_type=kind, ts_us=i,
             sequence=i, payload=S.encode(p), date="2026-11-22", hour=10, context=False)
        for i, (kind, p) in enumerate([("DBIRTH", birth), ("DDATA", data)])
    ]
    [batch] = sparkplug._metric_batches(None, [pa.RecordBatch.from_pylist(rows)])
    got = [r for r in batch.to_pylist() if r["message_type"] == "DDATA"]
    columns = ("long_value", "double_value", "boolean_value", "string_value", "bytes_value")
    for row, (name, datatype, _, column, value) in zip(got, values):
        assert (row["metric_name"], row["datatype"]) == (name, T(datatype).name)
        assert {c: row[c] for c in columns if row[c] is not None} == {column: value}, name
        assert (row["payload_ms"], row["seq"]) == (BASE_MS, 2)
    assert [(r["metric_name"], r["datatype"], r["string_value"]) for r in got[-2:]] == [
        ("big", "UInt64", str(2**63)), (None, "Unknown", str(2**64 - 2))]

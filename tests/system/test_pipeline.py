"""
The PySpark pipeline, run as users run it (``python -m mqttgw.pipeline``):
tables from a gateway's archive checked against values computed here,
streaming equal to batch with a late segment, and rollups published back
into the gateway as retained messages.
"""

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from mqttgw.archive.segments import Archive
from mqttgw.wire import packets as P
from tests.conftest import require_program
from tests.gateway import REPO, Gateway, gateway_env
from tests.paho import PahoClient
from tests.pipeline_runs import ThreadClock, pipeline, said, snapshot, table, write_segment


@pytest.fixture(autouse=True)
def java():
    require_program("java")


def by(rows, *keys):
    return {tuple(r[k] for k in keys): r for r in rows}


# A known mix: (client, topic, payload, qos, retain), published in order.
MIX = (
    [("dev-1", "sensors/t1", json.dumps({"celsius": 20 + i}).encode(), 1, False) for i in range(6)]
    + [("dev-2", "sensors/t1", json.dumps({"celsius": 30}).encode(), 0, False)]
    + [("dev-2", "sensors/t2", json.dumps({"celsius": -5.5 + i}).encode(), 2, i == 2) for i in range(3)]
    + [("dev-3", "bin/blob", bytes(range(256)) * (i + 1), 1, False) for i in range(4)]
    + [("dev-3", "status/dev-3", b"online", 1, True)]
)


def test_batch_tables_match_what_was_published(tmp_path):
    archive = tmp_path / "archive"
    gateway_id = "field-7"
    gw = Gateway(tmp_path, "--archive", str(archive), "--no-persistence", "--gateway-id", gateway_id)
    clients = {}
    for client_id, topic, payload, qos, retain in MIX:
        if client_id not in clients:
            clients[client_id] = PahoClient(gw.port, client_id, "MQTTv311")
            clients[client_id].connect()
        clients[client_id].publish(topic, payload, qos, retain)
    gw.stop()
    out = tmp_path / "tables"
    result = pipeline("batch", "--archive", str(archive), "--out", str(out), "--json-field", "celsius", cwd=tmp_path)
    assert "topic_minute:" in result.stdout and "last_value:" in result.stdout

    # Independent: totals from MIX, minutes from the archive's own rows.
    expected = defaultdict(lambda: {"messages": 0, "bytes": 0, "publishers": set(), "qos": [0, 0, 0], "retained": 0})
    for client_id, topic, payload, qos, retain in MIX:
        e = expected[topic]
        e["messages"] += 1
        e["bytes"] += len(payload)
        e["publishers"].add(client_id)
        e["qos"][qos] += 1
        e["retained"] += retain
    hours = defaultdict(int)
    for row in table(archive):
        hours[row["topic"]] += 1
    for name in ("topic_hour", "topic_minute"):
        rows = table(out / name)
        totals = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
        for r in rows:
            t = totals[r["topic"]]
            for i, k in enumerate(("messages", "bytes", "qos0", "qos1", "qos2", "retained")):
                t[i] += r[k]
        assert set(totals) == set(expected), name
        for topic, e in expected.items():
            assert totals[topic] == [e["messages"], e["bytes"], *e["qos"], e["retained"]], (name, topic)
    minutes = defaultdict(int)
    for row in table(archive):
        minutes[(row["topic"], row["timestamp"].replace(second=0, microsecond=0))] += 1
    got = {(r["topic"], r["window_start"].replace(tzinfo=timezone.utc)): r["messages"] for r in table(out / "topic_minute")}
    assert got == dict(minutes)
    for name, width in (("topic_minute", 60), ("topic_hour", 3600), ("client_hour", 3600), ("json_minute", 60)):
        for r in table(out / name):
            assert (r["window_end"] - r["window_start"]).total_seconds() == width, name
            # Every rollup row names its gateway; hours are numbers.
            assert r["gateway_id"] == gateway_id and r["hour"] == r["window_start"].hour, name
        assert all(p.name == f"hour={int(p.name[5:])}" for p in (out / name).glob("date=*/hour=*")), name
    # UTC instants as Parquet TIMESTAMP_MICROS, not INT96.
    import pyarrow.parquet as pq

    [first, *_] = sorted((out / "topic_minute").rglob("*.parquet"))
    column = pq.ParquetFile(first).schema.column(pq.ParquetFile(first).schema_arrow.get_field_index("window_start"))
    assert column.physical_type == "INT64" and "isAdjustedToUTC=true" in str(column.logical_type)
    assert "timeUnit=microseconds" in str(column.logical_type)
    publishers = defaultdict(set)
    for row in table(archive):
        publishers[(row["topic"], row["timestamp"].replace(minute=0, second=0, microsecond=0))].add(row["client_id"])
    got = {(r["topic"], r["window_start"].replace(tzinfo=timezone.utc)): r["publishers"] for r in table(out / "topic_hour")}
    assert got == {k: len(v) for k, v in publishers.items()}

    clients_rows = defaultdict(lambda: [0, 0])
    for r in table(out / "client_hour"):
        assert r["direction"] == "in"
        clients_rows[r["client_id"]][0] += r["messages"]
        clients_rows[r["client_id"]][1] += r["bytes"]
    expected_clients = defaultdict(lambda: [0, 0])
    for client_id, _, payload, *_ in MIX:
        expected_clients[client_id][0] += 1
        expected_clients[client_id][1] += len(payload)
    assert dict(clients_rows) == dict(expected_clients)

    last = by(table(out / "last_value"), "topic")
    assert {r["gateway_id"] for r in last.values()} == {gateway_id}
    final = {}  # the last publish on each topic wins
    for client_id, topic, payload, qos, retain in MIX:
        final[topic] = (client_id, payload, qos, retain)
    assert {t: (r["last_client_id"], r["payload"], r["qos"], r["retain"]) for (t,), r in last.items()} == final

    # SCHEMA.md names every column of every table.
    schema_doc = (REPO / "mqttgw" / "pipeline" / "SCHEMA.md").read_text()
    for name in ("topic_minute", "topic_hour", "client_hour", "json_minute", "last_value"):
        [section] = [s for s in schema_doc.split("\n## ") if name in s.splitlines()[0].split(", ")]
        for column in ds.dataset(out / name, format="parquet", partitioning="hive").schema.names:
            assert f"`{column}`" in section or (column.startswith("qos") and "`qos0`, `qos1`, `qos2`" in section), (
                name, column)

    stats = defaultdict(list)
    for _, topic, payload, *_ in MIX:
        if topic.startswith("sensors/"):
            stats[topic].append(json.loads(payload)["celsius"])
    json_rows = defaultdict(lambda: [0, float("inf"), float("-inf"), 0.0])
    for r in table(out / "json_minute"):
        s = json_rows[r["topic"]]
        s[0] += r["count"]
        s[1] = min(s[1], r["min"])
        s[2] = max(s[2], r["max"])
        s[3] += r["avg"] * r["count"]
    assert set(json_rows) == set(stats)
    for topic, values in stats.items():
        count, low, high, total = json_rows[topic]
        assert (count, low, high) == (len(values), min(values), max(values))
        assert total / count == pytest.approx(sum(values) / len(values))


def test_dirty_values_are_counted_and_never_stop_a_run(tmp_path):
    archive = tmp_path / "archive"
    now = [datetime(2026, 11, 22, 10, 0, 5, tzinfo=timezone.utc).timestamp()]

    def clock():
        now[0] += 0.1
        return now[0]

    payloads = [
        b'{"celsius": 21.5}', b'{"celsius": "n/a"}', b'{"celsius": true}',
        b'{"celsius": {"inner": 1}}', b'{"kelvin": 290}', b"not json at all",
        b"", bytes(range(256)), b'{"celsius": -3}', b'{"celsius": "12"}', b'{"celsius": 1e2}',
    ]
    a = Archive(archive, ThreadClock(), "gw", clock=clock)
    a.start()
    for i, payload in enumerate(payloads):
        a.record("in", "dev", P.Publish("sensors/dirty", payload, 1, False))
    a.record("in", "dev", P.Publish("other/topic", b"plain text", 0, False))
    a.stop()
    out = tmp_path / "tables"
    result = pipeline("batch", "--archive", str(archive), "--out", str(out), "--json-field", "celsius", cwd=tmp_path)
    # The Sparkplug B tables, in the default set, skipped: no spBv1.0 topics.
    assert "no spBv1.0 topics in the rows read: sparkplug_metrics, sparkplug_minute, sparkplug_sessions not computed" in (
        said(result.stderr))
    assert not list(out.glob("sparkplug_*"))
    [row] = table(out / "json_minute")
    assert row["topic"] == "sensors/dirty"
    # 21.5, -3, 100 and "12" (text that is exactly a number, as some
    # devices send) count; "n/a", true, an object, a missing field, text,
    # empty and binary payloads do not.
    assert (row["count"], row["invalid"]) == (4, len(payloads) - 4)
    assert (row["min"], row["max"]) == (-3.0, 100.0)
    assert row["avg"] == pytest.approx((21.5 - 3 + 12 + 100) / 4)
    # The other tables count every message, dirty or not.
    assert sum(r["messages"] for r in table(out / "topic_minute")) == len(payloads) + 1
    # The run is logged, and each table marked complete.
    [run] = [json.loads(line) for line in (out / "_runs" / "runs.jsonl").read_text().splitlines()]
    assert run["status"] == "ok" and run["command"] == "batch" and run["json_fields"] == ["celsius"]
    assert (run["rows_in"], run["invalid"]) == (len(payloads) + 1, len(payloads) - 4)
    assert run["rows_out"]["json_minute"] == 1 and run["start"] <= run["end"]
    for name in ("topic_minute", "topic_hour", "client_hour", "json_minute", "last_value"):
        assert (out / name / "_SUCCESS").exists(), name


def test_a_driver_started_here_records_sparks_classes_once_and_maps_them_after(tmp_path):
    archive = tmp_path / "archive"
    a = Archive(archive, ThreadClock(), "gw", clock=lambda: datetime(2026, 11, 22, 10, tzinfo=timezone.utc).timestamp())
    a.start()
    for i in range(3):
        a.record("in", "dev", P.Publish("room/1", b"%d" % i, 1, False))
    a.stop()
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}

    def run(out, *extra):
        pipeline("batch", "--archive", str(archive), "--out", str(tmp_path / out), "--tables", "topic_minute",
                 *extra, cwd=tmp_path, env=env)
        [record] = [json.loads(line) for line in (tmp_path / out / "_runs" / "runs.jsonl").read_text().splitlines()]
        return record, sum(r["messages"] for r in table(tmp_path / out / "topic_minute"))

    first, counted = run("first")
    # The first run records as its JVM exits, and only a finished archive
    # is put in place: nothing half-written is left for a later JVM.
    [recorded] = list((cache / "mqttgw" / "spark").iterdir())
    assert recorded.suffix == ".jsa" and recorded.stat().st_size > 1_000_000
    assert (first["class_data"], counted) == ("recording", 3)
    second, counted = run("second")
    assert (second["class_data"], counted) == ("shared", 3)
    assert list((cache / "mqttgw" / "spark").iterdir()) == [recorded]
    off, counted = run("off", "--no-class-cache")
    assert ("class_data" not in off, counted) == (True, 3)


def test_each_json_field_keeps_its_own_rows(tmp_path):
    archive = tmp_path / "archive"
    now = [datetime(2026, 11, 22, 10, 0, 5, tzinfo=timezone.utc).timestamp()]

    def clock():
        now[0] += 1.0
        return now[0]

    a = Archive(archive, ThreadClock(), "gw", clock=clock)
    a.start()
    for i in range(4):
        payload = json.dumps({"celsius": i, "humidity": 50 + i, "sensors": {"t1": 7 * i}}).encode()
        a.record("in", "dev", P.Publish("room/1", payload, 1, False))
    a.stop()
    out = tmp_path / "tables"
    # file://, as hdfs:// and s3a:// are written: each table's partitions
    # replaced by Spark itself, nothing staged or renamed here.
    batch = ["batch", "--archive", str(archive), "--out", f"file://{out}"]
    pipeline(*batch, "--json-field", "celsius", cwd=tmp_path)
    pipeline(*batch, "--json-field", "humidity", "--json-field", "$.sensors.t1", cwd=tmp_path)
    got = {r["field"]: (r["count"], r["min"], r["max"]) for r in table(out / "json_minute")}
    assert got == {"celsius": (4, 0, 3), "humidity": (4, 50, 53), "$.sensors.t1": (4, 0, 21)}
    # Run records and _SUCCESS markers there too, written by Spark.
    assert not (out / "_staging").exists()
    runs = [json.loads(line) for f in sorted((out / "_runs").glob("part-*")) for line in f.read_text().splitlines()]
    assert sorted(tuple(r["json_fields"]) for r in runs) == [("celsius",), ("humidity", "$.sensors.t1")]
    assert all(r["status"] == "ok" and r["rows_in"] == 4 and r["rows_out"]["json_minute"] for r in runs)
    for name in ("topic_minute", "topic_hour", "client_hour", "json_minute", "last_value"):
        assert (out / name / "_SUCCESS").is_file(), name
        assert not list((out / name).glob("*.parquet")) or name == "last_value", name  # partitions only


def test_streaming_equals_batch_with_a_late_segment(tmp_path):
    archive, out, checkpoint = tmp_path / "archive", tmp_path / "stream", tmp_path / "checkpoint"
    stream = ["stream", "--archive", str(archive), "--out", str(out), "--checkpoint", str(checkpoint)]
    write_segment(archive, "2026-11-22T10:00:00", ["a", "b"], 40)
    pipeline(*stream, cwd=tmp_path)
    first = snapshot(out)
    assert first["topic_hour"]
    write_segment(archive, "2026-11-22T11:10:00", ["a", "c"], 30, gateway_id="gw2")
    # Late: a segment for the earlier hour arrives after it was processed,
    # with the modification time of 30 days ago that a gateway offline for
    # a month gives it when its archive is copied with rsync -a.
    before = set(archive.rglob("*.parquet"))
    write_segment(archive, "2026-11-22T10:40:00", ["b", "d"], 25, gateway_id="late")
    month_ago = time.time() - 30 * 86400
    late = set(archive.rglob("*.parquet")) - before
    assert late
    for segment in late:
        os.utime(segment, (month_ago, month_ago))
    result = pipeline(*stream, cwd=tmp_path)
    assert "hour(s) touched" in result.stderr
    batch_out = tmp_path / "batch"
    pipeline("batch", "--archive", str(archive), "--out", str(batch_out), cwd=tmp_path)
    assert snapshot(out) == snapshot(batch_out)
    assert table_hour_counts(out) == hour_counts([archive])
    assert sum(table_hour_counts(out).values()) == 95
    # Re-running is idempotent.
    pipeline("batch", "--archive", str(archive), "--out", str(batch_out), cwd=tmp_path)
    assert snapshot(out) == snapshot(batch_out)


def test_rollups_are_published_back_as_retained_messages(tmp_path):
    import trustme

    from mqttgw.passwd import main as passwd
    from mqttgw.pipeline.publish import topic_of
    from tests.network import endpoint, free_port

    archive = tmp_path / "archive"
    celsius = lambda i: json.dumps({"celsius": i, "sensors": {"t1": -i}}).encode()  # noqa: E731
    write_segment(archive, "2026-11-22T10:00:00", ["plant/a", "plant/b", "/plant/c"], 30, payload=celsius)
    # Topics whose names collided with those above before names were
    # made one-to-one: "_" was also what an empty level became, and a
    # topic's level "celsius" read as plant/a's field of that name.
    write_segment(archive, "2026-11-22T10:01:00", ["_/plant/c", "plant/a/celsius"], 4, payload=lambda i: b"%d" % (100 + i))
    # An earlier run's own messages, archived by the gateway: never
    # published again as $analytics/$analytics/...
    write_segment(archive, "2026-11-22T10:05:00", ["$analytics/plant/a/1m"], 2)
    # A gateway with TLS and a password file: the pipeline logs in.
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    passwd(["-c", "-b", str(tmp_path / "passwd"), "mqttgw-pipeline", "pipeline-pw"])
    passwd(["-b", str(tmp_path / "passwd"), "dashboard", "dash-pw"])
    tls_port = free_port()
    gw = Gateway(
        tmp_path, "--no-persistence", "--password-file", str(tmp_path / "passwd"),
        "--tls", endpoint(tls_port), "--cert", str(tmp_path / "server.pem"), "--key", str(tmp_path / "server.key"),
    )
    try:
        pipeline(
            "batch", "--archive", str(archive), "--out", str(tmp_path / "t"),
            "--json-field", "celsius", "--json-field", "$.sensors.t1",
            "--publish", f"localhost:{tls_port}", "--tls", "--ca", str(tmp_path / "ca.pem"),
            "--prefix", "$analytics", cwd=tmp_path, env={"MQTTGW_PASSWORD": "pipeline-pw"},
        )
        dashboard = PahoClient(gw.port, "dashboard", "MQTTv311")
        dashboard.client.username_pw_set("dashboard", "dash-pw")
        dashboard.connect()
        dashboard.subscribe("$analytics/#", 1)
        # "_" alone separates topic and rollup; a level of underscores
        # only (the empty one too) gets two more; fields as given.
        topics = {"plant/a": "plant/a", "plant/b": "plant/b", "/plant/c": "__/plant/c"}
        expected = {
            f"$analytics/{name}/_/{suffix}"
            for name in topics.values()
            for suffix in ("1m", "1h", "last", "celsius/1m", "$.sensors.t1/1m")
        }
        expected |= {
            f"$analytics/{name}/_/{suffix}" for name in ("___/plant/c", "plant/a/celsius") for suffix in ("1m", "1h", "last")
        }
        got = {m.topic: (json.loads(m.payload), m.retain) for m in dashboard.receive(len(expected))}
        assert set(got) == expected
        assert all(retain for _, retain in got.values())
        # Every name is its body's topic, and nothing else's.
        for name, (body, _) in got.items():
            assert topic_of("$analytics", name)[0] == body["topic"], name
        hour = got["$analytics/plant/a/_/1h"][0]
        assert (hour["topic"], hour["messages"], hour["window_start"]) == ("plant/a", 10, "2026-11-22T10:00:00+00:00")
        assert got["$analytics/__/plant/c/_/1m"][0]["topic"] == "/plant/c"
        assert got["$analytics/___/plant/c/_/1m"][0]["topic"] == "_/plant/c"
        assert got["$analytics/plant/a/celsius/_/1m"][0]["topic"] == "plant/a/celsius"
        # plant/a got celsius i = 0, 3, ..., 27, all in minute 10:00.
        values = list(range(0, 30, 3))
        stats = got["$analytics/plant/a/_/celsius/1m"][0]
        assert (stats["count"], stats["invalid"], stats["min"], stats["max"]) == (
            len(values), 0, min(values), max(values))
        assert stats["avg"] == pytest.approx(sum(values) / len(values))
        assert got["$analytics/plant/a/_/$.sensors.t1/1m"][0]["min"] == -max(values)
        last = got["$analytics/plant/b/_/last"][0]
        assert (last["topic"], last["payload"], last["gateway_id"]) == ("plant/b", celsius(28).decode(), "gw")
        assert not [t for t in got if t.startswith("$analytics/$analytics")]
    finally:
        gw.stop()


def test_rollup_names_are_one_to_one():
    """Without Spark: every (topic, rollup) has its own name, and the name gives them back."""
    from hypothesis import given
    from hypothesis import strategies as st

    from mqttgw.pipeline.publish import topic_name, topic_of

    rollups = st.one_of(
        st.sampled_from([("1m",), ("1h",), ("last",)]),
        st.tuples(st.text(st.characters(blacklist_characters="/+#\0"), min_size=1, max_size=4), st.just("1m")),
    )

    @given(st.text("_a/b", min_size=1, max_size=8), rollups)
    def inverse(topic, rollup):
        assert topic_of("$analytics", topic_name("$analytics", topic, *rollup)) == (topic, list(rollup))

    inverse()
    # The collisions names had: an empty level and "_", "a//b" and "a/_/b",
    # topic plant/a/celsius's 1m and topic plant/a's field celsius.
    pairs = [
        (("/legacy/boiler/temp", "1m"), ("_/legacy/boiler/temp", "1m")),
        (("a//b", "1m"), ("a/_/b", "1m")),
        (("plant/a/celsius", "1m"), ("plant/a", "celsius", "1m")),
        (("plant/a", "sensors.t1", "1m"), ("plant/a", "$.sensors.t1", "1m")),
    ]
    for one, other in pairs:
        assert topic_name("$analytics", *one) != topic_name("$analytics", *other), (one, other)


@pytest.mark.parametrize(
    "args, error",
    [
        (["--archive", "{tmp}/nope", "--out", "{tmp}/o"], "archive {tmp}/nope is not a directory"),
        (["--out", "{tmp}/o"], "no --archive given"),
        (["--archive", "{tmp}"], "no --out given"),
        (["--archive", "{tmp}", "--out", "{tmp}/o", "--tables", "topic_hour,nope"], "unknown table 'nope'"),
        (["--archive", "{tmp}", "--out", "{tmp}/o", "--conf", "spark.x"], "--conf takes KEY=VALUE"),
        (["--archive", "{tmp}", "--out", "{tmp}/o", "--json-field", "a/b"], "JSON field 'a/b' may not hold"),
        (["--archive", "{tmp}", "--out", "{tmp}/o", "--publish", "host"], "publish must be HOST:PORT"),
        (["--config", "{tmp}/missing.toml"], "missing.toml: No such file or directory"),
        (["--archive", "{tmp}", "--out", "{tmp}/o", "--master", "local", "--remote", "sc://h"], "exclude each other"),
    ],
)
def test_bad_options_are_one_clear_line(tmp_path, args, error):
    out = subprocess.run(
        [sys.executable, "-m", "mqttgw.pipeline", "batch", *(a.format(tmp=tmp_path) for a in args)],
        capture_output=True, text=True, env=gateway_env(), timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("pipeline: ") and error.format(tmp=tmp_path) in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_the_gateway_checks_the_pipeline_section(tmp_path):
    from mqttgw.service import config as C

    path = tmp_path / "mqttgw.toml"
    path.write_text('[pipeline]\ntables = ["topic_hour", "topic_day"]\n')
    with pytest.raises(C.ConfigError, match="unknown table 'topic_day'"):
        C.load_file(path)
    path.write_text('[pipeline]\nout = "/srv/tables"\nspeed = 3\n')
    with pytest.raises(C.ConfigError, match="unknown key pipeline.speed"):
        C.load_file(path)
    path.write_text('[pipeline]\nremote = "spark-connect:15002"\n')
    with pytest.raises(C.ConfigError, match="remote must be sc://HOST:PORT"):
        C.load_file(path)


def test_the_driver_imports_no_more_than_it_needs():
    """Without Spark running: attrs (for the MQTT client) only with --publish."""
    code = (
        "import sys; from mqttgw.pipeline import command, cli, tables, staging;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in ('attr', 'attrs', 'twisted')"
        " or m.startswith('mqttgw.') and m.split('.')[1] not in ('wire', 'pipeline')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=gateway_env(), timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_same_module_runs_under_spark_submit(tmp_path):
    """As the pipeline guide shows for a cluster; here with a local master."""
    import pyspark

    archive = tmp_path / "archive"
    write_segment(archive, "2026-11-22T10:00:00", ["x"], 12)
    package = tmp_path / "mqttgw.zip"
    subprocess.run([sys.executable, "-m", "zipfile", "-c", str(package), str(REPO / "mqttgw")], check=True, cwd=tmp_path)
    spark_home = Path(pyspark.__file__).parent
    env = dict(gateway_env(), SPARK_HOME=str(spark_home), PYSPARK_PYTHON=sys.executable)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    out = subprocess.run(
        [str(spark_home / "bin" / "spark-submit"), "--master", "local[2]", "--py-files", str(package),
         str(REPO / "mqttgw" / "pipeline" / "__main__.py"), "batch", "--archive", str(archive), "--out", str(tmp_path / "t")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert sum(r["messages"] for r in table(tmp_path / "t" / "topic_hour")) == 12
    # The master is spark-submit's (not local[*] forced over it), named
    # on the run's first line and in its record.
    [run] = [json.loads(line) for line in (tmp_path / "t" / "_runs" / "runs.jsonl").read_text().splitlines()]
    assert run["master"] == "local[2]" and run["application"].startswith("local-")
    # (spark-submit passes the driver's stderr on to its stdout.)
    assert said(out.stdout)[0] == f"Spark master local[2], application {run['application']}"


def hour_counts(archive_dirs):
    """messages per (gateway, topic, hour), from the archives themselves."""
    counts = defaultdict(int)
    for archive in archive_dirs:
        for row in table(archive):
            if row["direction"] in ("in", "bridge_in"):
                counts[(row["gateway_id"], row["topic"], row["timestamp"].hour)] += 1
    return dict(counts)


def table_hour_counts(out):
    return {(r["gateway_id"], r["topic"], r["hour"]): r["messages"] for r in table(out / "topic_hour")}


def test_a_killed_run_leaves_the_previous_tables_and_the_next_completes_them(tmp_path):
    import signal

    archive, out = tmp_path / "archive", tmp_path / "tables"
    batch = ["batch", "--archive", str(archive), "--out", str(out)]
    write_segment(archive, "2026-11-22T10:00:00", ["a", "b"], 40)
    pipeline(*batch, cwd=tmp_path)
    before = snapshot(out)
    assert table_hour_counts(out) == hour_counts([archive])
    # New rows for the hour already computed, and a new hour.
    write_segment(archive, "2026-11-22T10:30:00", ["a", "e"], 20, gateway_id="gw2")
    write_segment(archive, "2026-11-22T11:00:00", ["f"], 10)
    # The driver (Python and its JVM) is killed while the run stages its
    # tables, after topic_minute is done and before anything is swapped in.
    run = subprocess.Popen(
        [sys.executable, "-m", "mqttgw.pipeline", *batch], cwd=tmp_path, env=gateway_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list((out / "_staging").glob("*/topic_hour")):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
            time.sleep(0.02)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    [staged] = (out / "_staging").iterdir()
    assert not (staged / "_SWAP").exists()
    # Every table as it was, and readable.
    assert snapshot(out) == before
    result = pipeline(*batch, cwd=tmp_path)
    assert f"discarding interrupted run {staged.name}" in result.stderr
    assert not (out / "_staging").exists()
    assert table_hour_counts(out) == hour_counts([archive])
    last = by(table(out / "last_value"), "gateway_id", "topic")
    assert set(last) == {("gw", "a"), ("gw", "b"), ("gw", "f"), ("gw2", "a"), ("gw2", "e")}
    runs = [json.loads(line) for line in (out / "_runs" / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in runs] == ["ok", "ok"]  # the killed run never got to log


def test_a_swap_cut_short_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """No Spark: tables of plain files, and a rename that fails midway."""
    from mqttgw.pipeline import staging

    out = tmp_path / "out"
    for hour, text in ((7, "old 7"), (8, "old 8")):
        leaf = out / "topic_hour" / "date=2026-11-22" / f"hour={hour:02d}"  # an earlier version's name
        leaf.mkdir(parents=True)
        (leaf / "part-0.parquet").write_text(text)
    (out / "last_value").mkdir()
    (out / "last_value" / "part-0.parquet").write_text("old last")
    run = staging.Run(out, "run-1")
    for hour in (8, 9):
        leaf = Path(run.path("topic_hour")) / "date=2026-11-22" / f"hour={hour}"
        leaf.mkdir(parents=True)
        (leaf / "part-0.parquet").write_text(f"new {hour}")
    Path(run.path("last_value")).mkdir()
    (Path(run.path("last_value")) / "part-0.parquet").write_text("new last")
    renames = []
    real_rename = os.rename

    def rename(a, b):
        if len(renames) == 2:  # the journal, then hour 8 set aside: then the power fails
            raise OSError("killed")
        renames.append(b)
        real_rename(a, b)

    monkeypatch.setattr(staging.os, "rename", rename)
    with pytest.raises(OSError):
        run.swap(["topic_hour"], ["last_value"])
    monkeypatch.setattr(staging.os, "rename", real_rename)
    assert not (out / "topic_hour" / "date=2026-11-22" / "hour=08").exists()
    said = []
    staging.recover(out, said.append)
    assert said == ["finishing the swap of interrupted run run-1 (3 moves)"]
    files = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.parquet")}
    assert files == {
        "topic_hour/date=2026-11-22/hour=07/part-0.parquet": "old 7",
        "topic_hour/date=2026-11-22/hour=8/part-0.parquet": "new 8",
        "topic_hour/date=2026-11-22/hour=9/part-0.parquet": "new 9",
        "last_value/part-0.parquet": "new last",
    }
    assert (out / "topic_hour" / "_SUCCESS").exists() and (out / "last_value" / "_SUCCESS").exists()
    assert not (out / "_staging").exists()


def publish_through(gateway, topic, count):
    client = PahoClient(gateway.port, f"pub-{topic.replace('/', '-')}"[:23], "MQTTv311")
    client.connect()
    for i in range(count):
        client.publish(topic, json.dumps({"celsius": i}).encode(), 1, False)
    client.disconnect()


def test_archives_of_two_gateways_combine_by_gateway_id(tmp_path):
    """Path (a): each gateway archives locally; the archives are read together, or gathered into one."""
    import shutil

    archives = []
    for site, count in (("site-a", 7), ("site-b", 5)):
        (tmp_path / site).mkdir()
        archive = tmp_path / site / "archive"
        gw = Gateway(tmp_path / site, "--archive", str(archive), "--no-persistence", "--gateway-id", site)
        publish_through(gw, "sensors/t", count)
        gw.stop()  # closes the open segment
        archives.append(archive)
    expected = hour_counts(archives)
    assert {g for g, *_ in expected} == {"site-a", "site-b"}
    out = tmp_path / "both"
    pipeline("batch", "--archive", str(archives[0]), "--archive", str(archives[1]), "--out", str(out), cwd=tmp_path)
    assert table_hour_counts(out) == expected
    # Gathered with a copy (rsync) into one tree: segment names carry the
    # gateway's id, so they never collide.  Options from the [pipeline]
    # section of the gateway's own configuration file.
    gathered = tmp_path / "gathered"
    for archive in archives:
        shutil.copytree(archive, gathered, dirs_exist_ok=True)
    config = tmp_path / "mqttgw.toml"
    config.write_text(
        f'[archive]\ndirectory = "{gathered}"\n\n'
        f'[pipeline]\nout = "{tmp_path / "gathered-tables"}"\ntables = ["topic_hour", "last_value"]\n'
        'master = "local[1]"\n'
    )
    from mqttgw.service import config as C

    assert C.load_file(config)["pipeline"]["tables"] == ["topic_hour", "last_value"]
    result = pipeline("batch", "--config", str(config), cwd=tmp_path)
    assert said(result.stderr)[0].startswith("Spark master local[1], application local-")
    assert table_hour_counts(tmp_path / "gathered-tables") == expected
    assert sorted(p.name for p in (tmp_path / "gathered-tables").iterdir()) == ["_runs", "last_value", "topic_hour"]
    last = by(table(tmp_path / "gathered-tables" / "last_value"), "gateway_id", "topic")
    assert set(last) == {("site-a", "sensors/t"), ("site-b", "sensors/t")}


def test_field_gateways_bridging_to_an_archiving_central_give_per_site_rollups(tmp_path):
    """Path (b): field gateways bridge into a central mqttgw, which archives what they send."""
    archive = tmp_path / "central" / "archive"
    (tmp_path / "central").mkdir()
    central = Gateway(tmp_path / "central", "--archive", str(archive), "--no-persistence", "--gateway-id", "central")
    watcher = PahoClient(central.port, "watcher", "MQTTv311")
    watcher.connect()
    watcher.subscribe("field/+/sensors/#", 1)
    sites = {"site-a": 6, "site-b": 4}
    fields = []
    try:
        for site in sites:
            (tmp_path / site).mkdir()
            (tmp_path / site / "mqttgw.toml").write_text(
                f'[[bridge]]\nname = "central"\naddresses = ["127.0.0.1:{central.port}"]\nclient_id = "{site}"\n'
                f'rules = ["sensors/# out 1 \\"\\" field/{site}/"]\n'
            )
            fields.append(Gateway(tmp_path / site, "--config", str(tmp_path / site / "mqttgw.toml")))
        for gw in fields:
            gw.wait_for_log("bridge central: connected to", timeout=20)
        for site, gw in zip(sites, fields):
            publish_through(gw, "sensors/t", sites[site])
        received = watcher.receive(sum(sites.values()))
        assert sorted({m.topic for m in received}) == ["field/site-a/sensors/t", "field/site-b/sensors/t"]
    finally:
        for gw in fields:
            gw.stop()
        central.stop()
    out = tmp_path / "tables"
    pipeline("batch", "--archive", str(archive), "--out", str(out), "--json-field", "celsius", cwd=tmp_path)
    per_site = defaultdict(int)
    for r in table(out / "topic_hour"):
        assert r["gateway_id"] == "central"
        if "/sensors/" in r["topic"]:
            per_site[r["topic"].split("/")[1]] += r["messages"]
    assert dict(per_site) == sites
    # The bridges' client ids name the sites.
    by_client = defaultdict(int)
    for r in table(out / "client_hour"):
        by_client[r["client_id"]] += r["messages"]
    assert by_client["site-a"] >= 6 and by_client["site-b"] >= 4
    stats = defaultdict(lambda: [0, None])
    for r in table(out / "json_minute"):
        stats[r["topic"]][0] += r["count"]
        stats[r["topic"]][1] = max(r["max"], stats[r["topic"]][1] or r["max"])
    assert dict(stats) == {"field/site-a/sensors/t": [6, 5], "field/site-b/sensors/t": [4, 3]}


def write_rows(archive, start, rows, old=False):
    """One segment of (client, listener, topic) rows from ``start`` on; ``old``: without the listener column."""
    import pyarrow.parquet as pq

    from mqttgw.archive.segments import SCHEMA

    now = [datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp()]

    def clock():
        now[0] += 1.5
        return now[0]

    before = set(archive.rglob("*.parquet"))
    a = Archive(archive, ThreadClock(), "gw", clock=clock)
    a.start()
    for client_id, listener, topic in rows:
        a.record("in", client_id, P.Publish(topic, b"v", 1, False), listener)
    a.stop()
    [segment] = set(archive.rglob("*.parquet")) - before
    assert pq.read_schema(segment).names == SCHEMA.names
    if old:
        # As a gateway wrote it before the column.
        pq.write_table(pq.read_table(segment).drop_columns(["listener"]), segment)


def test_segments_without_the_listener_column_are_read_beside_new_ones(tmp_path):
    import pyarrow.parquet as pq

    archive, out, whole = tmp_path / "archive", tmp_path / "tables", tmp_path / "whole"
    write_rows(archive, "2026-11-22T10:00:00", [("old-dev", "", "a"), ("old-dev", "", "old/only")], old=True)
    write_rows(archive, "2026-11-22T10:30:00", [("ws-dev", "ws", "b")])
    assert sorted(len(pq.read_schema(p).names) for p in archive.rglob("*.parquet")) == [10, 11]
    tables = ["--tables", "topic_hour,client_hour,last_value"]
    pipeline("batch", "--archive", str(archive), "--out", str(out), *tables, cwd=tmp_path)
    # A last_value table as an earlier version wrote it, merged with the next hours.
    previous = ds.dataset(out / "last_value", format="parquet").to_table()
    assert previous.schema.names.index("last_listener") == previous.schema.names.index("last_client_id") + 1
    for part in (out / "last_value").glob("*.parquet"):
        part.unlink()
    pq.write_table(previous.drop_columns(["last_listener"]), out / "last_value" / "part-earlier.parquet")
    write_rows(archive, "2026-11-22T11:00:00", [("sn-dev", "mqttsn", "a"), ("sn-dev", "mqttsn", "new/only")])
    pipeline("batch", "--archive", str(archive), "--out", str(out), *tables, "--since", "2026-11-22T11:00:00",
             cwd=tmp_path)
    pipeline("batch", "--archive", str(archive), "--out", str(whole), *tables, cwd=tmp_path)
    expected = {
        "a": ("sn-dev", "mqttsn"), "b": ("ws-dev", "ws"), "old/only": ("old-dev", None), "new/only": ("sn-dev", "mqttsn"),
    }
    # What the earlier table held is merged without a listener; the whole archive gives it again.
    merged = dict(expected, b=("ws-dev", None))
    for tables_dir, last_values in ((out, merged), (whole, expected)):
        last = by(table(tables_dir / "last_value"), "topic")
        assert {t: (r["last_client_id"], r["last_listener"]) for (t,), r in last.items()} == last_values, tables_dir
        assert {(r["topic"], r["hour"]): r["messages"] for r in table(tables_dir / "topic_hour")} == {
            ("a", 10): 1, ("old/only", 10): 1, ("b", 10): 1, ("a", 11): 1, ("new/only", 11): 1,
        }
        assert {(r["client_id"], r["hour"]): r["messages"] for r in table(tables_dir / "client_hour")} == {
            ("old-dev", 10): 2, ("ws-dev", 10): 1, ("sn-dev", 11): 2,
        }

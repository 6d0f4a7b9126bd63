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
from twisted.internet.task import Clock

from mqttgw import packets as P
from mqttgw.archive import Archive
from tests.conftest import require_program
from tests.gateway import REPO, Gateway, gateway_env
from tests.paho import PahoClient


@pytest.fixture(autouse=True)
def java():
    require_program("java")


def pipeline(*args, cwd, env=None):
    out = subprocess.run(
        [sys.executable, "-m", "mqttgw.pipeline", *args],
        capture_output=True, text=True, cwd=cwd, timeout=600, env=dict(gateway_env(), **(env or {})),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def table(path):
    if not path.exists():
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist()


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
    gw = Gateway(tmp_path, "--archive", str(archive), "--no-persistence")
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
    final = {}  # the last publish on each topic wins
    for client_id, topic, payload, qos, retain in MIX:
        final[topic] = (client_id, payload, qos, retain)
    assert {t: (r["last_client_id"], r["payload"], r["qos"], r["retain"]) for (t,), r in last.items()} == final

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


class ThreadClock(Clock):
    def callFromThread(self, f, *args, **kwargs):
        f(*args, **kwargs)


def write_segment(archive, start, topics, count, gateway_id="gw"):
    """One archive segment of ``count`` rows from ``start`` (ISO, UTC) on."""
    now = [datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp()]

    def clock():
        now[0] += 1.5
        return now[0]

    a = Archive(archive, ThreadClock(), gateway_id, clock=clock)
    a.start()
    for i in range(count):
        a.record("in", f"c{i % 3}", P.Publish(topics[i % len(topics)], b"x" * (i % 7), i % 3, False))
    a.stop()


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
    pipeline("batch", "--archive", str(archive), "--out", str(out), "--json-field", "celsius", cwd=tmp_path)
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
    batch = ["batch", "--archive", str(archive), "--out", str(out)]
    pipeline(*batch, "--json-field", "celsius", cwd=tmp_path)
    pipeline(*batch, "--json-field", "humidity", "--json-field", "$.sensors.t1", cwd=tmp_path)
    got = {r["field"]: (r["count"], r["min"], r["max"]) for r in table(out / "json_minute")}
    assert got == {"celsius": (4, 0, 3), "humidity": (4, 50, 53), "$.sensors.t1": (4, 0, 21)}


def snapshot(out):
    result = {}
    for name in ("topic_minute", "topic_hour", "client_hour", "last_value"):
        rows = table(out / name)
        result[name] = sorted(json.dumps(r, default=str, sort_keys=True) for r in rows)
    return result


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
    hours = {(r["topic"], r["hour"]): r["messages"] for r in table(out / "topic_hour")}
    assert sum(hours.values()) == 95
    # Re-running is idempotent.
    pipeline("batch", "--archive", str(archive), "--out", str(batch_out), cwd=tmp_path)
    assert snapshot(out) == snapshot(batch_out)


def test_rollups_are_published_back_as_retained_messages(tmp_path):
    import trustme

    from mqttgw.passwd import main as passwd
    from tests.test_transports import endpoint, free_port

    archive = tmp_path / "archive"
    write_segment(archive, "2026-11-22T10:00:00", ["plant/a", "plant/b"], 20)
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
            "--publish", f"localhost:{tls_port}", "--tls", "--ca", str(tmp_path / "ca.pem"),
            "--prefix", "$analytics", cwd=tmp_path, env={"MQTTGW_PASSWORD": "pipeline-pw"},
        )
        dashboard = PahoClient(gw.port, "dashboard", "MQTTv311")
        dashboard.client.username_pw_set("dashboard", "dash-pw")
        dashboard.connect()
        dashboard.subscribe("$analytics/#", 1)
        got = {m.topic: (json.loads(m.payload), m.retain) for m in dashboard.receive(4)}
        assert set(got) == {f"$analytics/plant/{x}/{w}" for x in "ab" for w in ("1m", "1h")}
        assert all(retain for _, retain in got.values())
        assert got["$analytics/plant/a/1h"][0]["messages"] == 10
        assert got["$analytics/plant/a/1h"][0]["window_start"] == "2026-11-22T10:00:00+00:00"
    finally:
        gw.stop()


def test_missing_archive_is_a_clear_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mqttgw.pipeline", "batch", "--archive", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, env=gateway_env(), timeout=60,
    )
    assert out.returncode == 2
    assert "is not a directory" in out.stderr


def test_the_same_module_runs_under_spark_submit(tmp_path):
    """As the README shows for a cluster; here with a local master."""
    import pyspark

    archive = tmp_path / "archive"
    write_segment(archive, "2026-11-22T10:00:00", ["x"], 12)
    package = tmp_path / "mqttgw.zip"
    subprocess.run([sys.executable, "-m", "zipfile", "-c", str(package), str(REPO / "mqttgw")], check=True, cwd=tmp_path)
    spark_home = Path(pyspark.__file__).parent
    env = dict(gateway_env(), SPARK_HOME=str(spark_home), PYSPARK_PYTHON=sys.executable)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    out = subprocess.run(
        [str(spark_home / "bin" / "spark-submit"), "--master", "local[1]", "--py-files", str(package),
         str(REPO / "mqttgw" / "pipeline" / "__main__.py"), "batch", "--archive", str(archive), "--out", str(tmp_path / "t")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert sum(r["messages"] for r in table(tmp_path / "t" / "topic_hour")) == 12

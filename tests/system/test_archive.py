"""
The archive writer: segments rolled by rows, by time and at hour
boundaries, closed on shutdown, binary payloads kept, a disk that fails
costing records, not routing, and each row naming the kind of listener
its client came through.
"""

import time
from datetime import datetime, timezone

import pyarrow.dataset as ds
from twisted.internet.task import Clock

from mqttgw.archive.segments import DIRECTIONS, SCHEMA, Archive
from mqttgw.broker.session import INTERNAL_PREFIX, Session
from mqttgw.wire import mqttsn as S
from mqttgw.wire import packets as P
from tests.gateway import Gateway
from tests.mosquitto_broker import free_port
from tests.mqttsn_raw import RawSn
from tests.paho import PahoClient


class ThreadClock(Clock):
    """A fake reactor that the writer thread may log through."""

    def callFromThread(self, f, *args, **kwargs):
        f(*args, **kwargs)


def at(text):
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def archive(directory, now=lambda: at("2026-11-22T10:15:00"), **kwargs):
    a = Archive(directory, ThreadClock(), "gw-test", clock=now, **kwargs)
    a.start()
    return a


def read(directory):
    return ds.dataset(directory, format="parquet", partitioning="hive", exclude_invalid_files=True).to_table()


def segments(directory):
    """Completed segments (those still in _tmp/ are not)."""
    found = (p.relative_to(directory).as_posix() for p in directory.rglob("*.parquet"))
    return sorted(f for f in found if not f.startswith("_tmp/"))


def record(a, n, topic="t", payload=b"p", direction="in"):
    for i in range(n):
        a.record(direction, "client", P.Publish(topic, payload + b"%d" % i, 1, False))


def test_rows_carry_every_column_and_binary_payloads_intact(tmp_path):
    a = archive(tmp_path)
    payloads = [bytes(range(256)), b"", b"\x00\xff" * 1000, "ü".encode()]
    for i, payload in enumerate(payloads):
        a.record("in", f"c{i}", P.Publish(f"t/{i}", payload, i % 3, i % 2 == 1), ("tcp", "tls", "wss", "")[i])
    a.stop()
    table = read(tmp_path).sort_by("sequence")
    assert table.schema.field("timestamp").type == SCHEMA.field("timestamp").type
    rows = table.to_pylist()
    assert [r["payload"] for r in rows] == payloads
    assert [r["payload_length"] for r in rows] == [len(p) for p in payloads]
    assert [r["topic"] for r in rows] == ["t/0", "t/1", "t/2", "t/3"]
    assert [r["listener"] for r in rows] == ["tcp", "tls", "wss", ""]
    assert table.schema.names[4:6] == ["client_id", "listener"]
    assert [r["qos"] for r in rows] == [0, 1, 2, 0]
    assert [r["retain"] for r in rows] == [False, True, False, True]
    assert [r["sequence"] for r in rows] == [1, 2, 3, 4]
    assert {r["gateway_id"] for r in rows} == {"gw-test"}
    assert {r["direction"] for r in rows} == {"in"}
    assert rows[0]["timestamp"] == datetime(2026, 11, 22, 10, 15, tzinfo=timezone.utc)
    assert segments(tmp_path)[0].startswith("date=2026-11-22/hour=10/")


def test_segments_roll_every_n_rows(tmp_path):
    a = archive(tmp_path, roll_rows=10)
    record(a, 25)
    a.stop()
    files = segments(tmp_path)
    assert len(files) == 3
    sizes = sorted(ds.dataset(tmp_path / f).count_rows() for f in files)
    assert sizes == [5, 10, 10]


def test_segments_roll_after_n_seconds_while_running(tmp_path):
    a = archive(tmp_path, roll_seconds=0.2)
    record(a, 3)
    a._hand_off()
    deadline = time.monotonic() + 10
    while not segments(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    # Complete before shutdown: renamed in from _tmp/.
    assert len(segments(tmp_path)) == 1
    assert not list((tmp_path / "_tmp").glob("*.parquet"))
    a.stop()


def test_an_hour_boundary_starts_a_new_segment_in_the_next_partition(tmp_path):
    times = iter([at("2026-11-22T23:59:59.5")] * 3 + [at("2026-11-23T00:00:00.5")] * 2)
    a = archive(tmp_path, now=lambda: next(times))
    record(a, 5)
    a.stop()
    files = segments(tmp_path)
    assert [f.split("/")[:2] for f in files] == [
        ["date=2026-11-22", "hour=23"],
        ["date=2026-11-23", "hour=00"],
    ]
    table = read(tmp_path)
    counts = {(r["date"], r["hour"]) for r in table.select(["date", "hour"]).to_pylist()}
    assert len(counts) == 2


def test_shutdown_closes_the_open_segment(tmp_path):
    a = archive(tmp_path, roll_seconds=3600)
    record(a, 7)
    a.stop()
    assert read(tmp_path).num_rows == 7
    assert not list((tmp_path / "_tmp").glob("*"))


def test_filters_and_directions_choose_what_is_recorded(tmp_path):
    a = archive(tmp_path, include=["sensors/#", "alerts"], exclude=["sensors/noisy/#"], directions=["in", "bridge_out"])
    a.record("in", "c", P.Publish("sensors/a", b"1"))
    a.record("in", "c", P.Publish("sensors/noisy/x", b"2"))
    a.record("in", "c", P.Publish("other", b"3"))
    a.record("out", "c", P.Publish("alerts", b"4"))
    a.record("bridge_out", "up", P.Publish("alerts", b"5"))
    a.stop()
    rows = read(tmp_path).sort_by("sequence").to_pylist()
    assert [(r["direction"], r["topic"], r["payload"]) for r in rows] == [
        ("in", "sensors/a", b"1"),
        ("bridge_out", "alerts", b"5"),
    ]


def test_new_filters_apply_to_topics_already_seen(tmp_path):
    a = archive(tmp_path, include=["a"])
    a.record("in", "c", P.Publish("a", b"1"))
    a.record("in", "c", P.Publish("b", b"2"))
    a.set_filters(["b"], [])
    a.record("in", "c", P.Publish("a", b"3"))
    a.record("in", "c", P.Publish("b", b"4"))
    a.stop()
    rows = read(tmp_path).sort_by("sequence").to_pylist()
    assert [(r["topic"], r["payload"]) for r in rows] == [("a", b"1"), ("b", b"4")]


def test_an_unwritable_directory_drops_and_counts_records_without_raising(tmp_path, logged):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    a = archive(blocked)
    record(a, 4)
    a._hand_off()
    record(a, 3)
    a.stop()
    assert a.dropped == 7
    assert a.written == 0
    assert any("cannot write" in m for m in logged())


class Carrier:
    """What a listener's connection shows a session: frames in, its kind."""

    def __init__(self, listener_kind):
        self.listener_kind = listener_kind

    def write(self, frame):
        pass


def test_the_router_hook_takes_each_row_s_listener_from_its_session(tmp_path):
    a = archive(tmp_path, directions=DIRECTIONS)
    clock = Clock()
    sn = Session("sn", 0, clock)
    sn.attach(Carrier("mqttsn"))
    # Gone, as before a will: the kind of its last connection stays.
    sn.detach()
    never_attached = Session("restored", 3600, clock)
    bridge = Session(INTERNAL_PREFIX + "up", 3600, clock)
    a.published(P.Publish("t", b"1"), sn, [(never_attached, 1), (bridge, 1)])
    a.published(P.Publish("t", b"2"), None, [(sn, 1)])
    a.published(P.Publish("t", b"3"), bridge, [])
    a.stop()
    rows = read(tmp_path).sort_by("sequence").to_pylist()
    assert [(r["direction"], r["client_id"], r["listener"], r["payload"]) for r in rows] == [
        ("in", "sn", "mqttsn", b"1"),
        ("out", "restored", "", b"1"),
        ("in", "", "", b"2"),
        ("out", "sn", "mqttsn", b"2"),
        ("bridge_in", "up", "bridge", b"3"),
    ]


def test_a_shared_subscriptions_out_row_names_its_group_and_routing_goes_on(tmp_path):
    from mqttgw.testing import FakeBroker, connected

    broker = FakeBroker()
    a = archive(tmp_path, directions=DIRECTIONS)
    broker.router.recorder = a
    member = connected(broker, "member")
    member.send(P.Subscribe(1, [("$share/g/t", 0)]))
    member.received()
    connected(broker, "pub").send(P.Publish("t", b"1"))
    assert [p.payload for p in member.received() if isinstance(p, P.Publish)] == [b"1"]
    a.stop()
    rows = read(tmp_path).sort_by("sequence").to_pylist()
    assert [(r["direction"], r["client_id"]) for r in rows] == [("in", "pub"), ("out", "$share/g")]
    assert rows[1]["listener"] == ""


def test_the_gateway_records_what_it_carries_and_keeps_routing_when_it_cannot(tmp_path):
    archive_dir = tmp_path / "archive"
    gw = Gateway(tmp_path, "--archive", str(archive_dir), "--archive-direction", "in",
                 "--archive-direction", "out", "--no-persistence")
    sub = PahoClient(gw.port, "sub", "MQTTv311")
    sub.connect()
    sub.subscribe("s/#", 1)
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    for i in range(5):
        pub.publish(f"s/{i}", b"\x00binary\xff%d" % i, 1)
    assert len(sub.receive(5)) == 5
    gw.stop()
    rows = read(archive_dir).to_pylist()
    assert sorted((r["direction"], r["client_id"], r["topic"]) for r in rows) == sorted(
        [("in", "pub", f"s/{i}") for i in range(5)] + [("out", "sub", f"s/{i}") for i in range(5)]
    )

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the archive should be")
    (tmp_path / "second").mkdir()
    gw = Gateway(tmp_path / "second", "--archive", str(blocked), "--no-persistence")
    try:
        sub = PahoClient(gw.port, "sub", "MQTTv311")
        sub.connect()
        sub.subscribe("s/#", 1)
        pub = PahoClient(gw.port, "pub", "MQTTv311")
        pub.connect()
        pub.publish("s/x", b"still routed", 1)
        assert sub.receive()[0].payload == b"still routed"
        gw.wait_for_log("cannot write")
    finally:
        gw.stop()


def test_rows_name_the_listener_kind_their_client_came_through(gateway_with, tmp_path):
    centre = gateway_with("--no-persistence")
    config = tmp_path / "site.toml"
    config.write_text(
        f'[[bridge]]\nname = "up"\naddresses = ["127.0.0.1:{centre.port}"]\n'
        'rules = ["up/# out 1", "down/# in 1"]\nreconnect_initial = 0.2\nreconnect_max = 1.0\n'
    )
    archive_dir = tmp_path / "archive"
    ws = free_port()
    every_direction = [a for d in ("in", "out", "bridge_in", "bridge_out") for a in ("--archive-direction", d)]
    site = gateway_with(
        "--config", str(config), "--archive", str(archive_dir), *every_direction,
        "--ws", f"tcp:{ws}:interface=127.0.0.1", "--mqttsn", "127.0.0.1:0",
    )
    site.wait_for_log("bridge up: upstream accepted CONNECT")
    # A persistent session away: what is routed to it is queued.
    away = PahoClient(site.port, "away", "MQTTv311", clean_session=False)
    away.connect()
    away.subscribe("s/#", 1)
    away.disconnect()
    sub = PahoClient(site.port, "sub", "MQTTv311")
    sub.connect()
    sub.subscribe("s/#", 1)
    sub.subscribe("down/#", 1)
    centre_sub = PahoClient(centre.port, "centre-sub", "MQTTv311")
    centre_sub.connect()
    centre_sub.subscribe("up/#", 1)

    pub = PahoClient(site.port, "pub", "MQTTv311")
    pub.connect()
    pub.publish("s/tcp", b"1", 1)
    pub_ws = PahoClient(ws, "pub-ws", "MQTTv311", transport="websockets")
    pub_ws.client.ws_set_options(path="/mqtt")
    pub_ws.connect()
    pub_ws.publish("s/ws", b"2", 1)
    sn = RawSn(site.mqttsn_port)
    assert sn.connect("pub-sn") == 0
    sn.send(S.Register(0, 1, "s/sn"))
    topic_id = sn.expect(S.Regack)[0].topic_id
    sn.send(S.Publish(topic_id, b"3", 1, message_id=2))
    assert sn.expect(S.Puback)[0].return_code == 0
    # A will goes after its connection: it keeps its client's listener kind.
    willer = PahoClient(site.port, "willer", "MQTTv311", will=("s/will", b"gone", 1))
    willer.connect()
    willer.drop()
    assert sorted(m.topic for m in sub.receive(4)) == ["s/sn", "s/tcp", "s/will", "s/ws"]
    pub.publish("up/x", b"4", 1)
    assert centre_sub.receive()[0].topic == "up/x"
    centre_pub = PahoClient(centre.port, "centre-pub", "MQTTv311")
    centre_pub.connect()
    centre_pub.publish("down/y", b"5", 1)
    assert sub.receive()[0].topic == "down/y"
    sn.close()
    site.stop()

    rows = {(r["direction"], r["client_id"], r["topic"], r["listener"]) for r in read(archive_dir).to_pylist()}
    published = {("s/tcp", "pub", "tcp"), ("s/ws", "pub-ws", "ws"), ("s/sn", "pub-sn", "mqttsn"), ("s/will", "willer", "tcp")}
    assert rows == (
        {("in", client, topic, kind) for topic, client, kind in published}
        | {("out", reader, topic, "tcp") for topic, _, _ in published for reader in ("sub", "away")}
        | {("in", "pub", "up/x", "tcp"), ("bridge_out", "up", "up/x", "bridge")}
        | {("bridge_in", "bridge/up", "down/y", "bridge"), ("out", "sub", "down/y", "tcp")}
        # The gateway's own messages: the bridge's state, from no client.
        | {("in", "", "mqttgw/bridge/up/state", "")}
    )

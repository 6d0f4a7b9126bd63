"""
The Sparkplug Aware MQTT Server (Sparkplug 3.0, chapter "Conformance"):
births kept on $sparkplug/certificates/..., retained and byte-identical,
readable as their source topics are, written only by the gateway; edge
state from births and deaths.  Tests named test_tck_* carry the
specification's requirement id; tests/CONFORMANCE_SPARKPLUG.md lists them.
"""

import pytest

from mqttgw.broker.sparkplug import Sparkplug
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import payload as S
from mqttgw.wire.sparkplug.payload import DataType as T

GROUP, NODE, DEVICE = "plant1", "edge1", "pump1"
NBIRTH = f"spBv1.0/{GROUP}/NBIRTH/{NODE}"
NDEATH = f"spBv1.0/{GROUP}/NDEATH/{NODE}"
NDATA = f"spBv1.0/{GROUP}/NDATA/{NODE}"
DBIRTH = f"spBv1.0/{GROUP}/DBIRTH/{NODE}/{DEVICE}"
DDATA = f"spBv1.0/{GROUP}/DDATA/{NODE}/{DEVICE}"
DDEATH = f"spBv1.0/{GROUP}/DDEATH/{NODE}/{DEVICE}"
CERT_N = f"$sparkplug/certificates/{NBIRTH}"
CERT_D = f"$sparkplug/certificates/{DBIRTH}"


def payload(seq=None, bd_seq=None, timestamp=1000, **metrics):
    p = S.Payload(timestamp=timestamp)
    if seq is not None:
        p.seq = seq
    if bd_seq is not None:
        p.metrics.add(name="bdSeq", datatype=T.UInt64, long_value=bd_seq)
    for name, value in metrics.items():
        p.metrics.add(name=name, datatype=T.Double, double_value=value)
    return S.encode(p)


def aware(aware_broker, **options):
    aware_broker.router.sparkplug = Sparkplug(aware_broker.router, aware_broker.clock, **options)
    return aware_broker.router.sparkplug


def connect(aware_broker, client_id, **fields):
    client = aware_broker.client(P.Connect(client_id=client_id, **fields))
    assert client.received()[0].return_code == 0
    return client


def subscribe(client, *filters, qos=1):
    client.send(P.Subscribe(1, [(f, qos) for f in filters]))
    return [p for p in client.received() if isinstance(p, P.Publish)]


def publishes(client):
    return [p for p in client.received() if isinstance(p, P.Publish)]


@pytest.fixture
def aware_broker():
    b = FakeBroker()
    aware(b)
    return b


def birth(aware_broker, client_id="edge", bd_seq=0):
    edge = connect(
        aware_broker, client_id, will_topic=NDEATH, will_message=payload(bd_seq=bd_seq), will_qos=1
    )
    nbirth = payload(seq=0, bd_seq=bd_seq, temperature=20.5)
    edge.send(P.Publish(NBIRTH, nbirth, 0, False))
    return edge, nbirth


def test_tck_conformance_mqtt_aware_store_and_nbirth_mqtt_topic_and_retain(aware_broker):
    """
    [tck-id-conformance-mqtt-aware-store], [...-nbirth-mqtt-topic],
    [...-nbirth-mqtt-retain]: the NBIRTH that passed is on
    $sparkplug/certificates/spBv1.0/GROUP/NBIRTH/NODE, retained, same bytes.
    """
    _, nbirth = birth(aware_broker)
    host = connect(aware_broker, "host")
    got = subscribe(host, "$sparkplug/certificates/#")
    assert [(p.topic, p.payload, p.retain) for p in got] == [(CERT_N, nbirth, True)]


def test_tck_conformance_mqtt_aware_dbirth_mqtt_topic_and_retain(aware_broker):
    """[...-dbirth-mqtt-topic], [...-dbirth-mqtt-retain]."""
    edge, _ = birth(aware_broker)
    dbirth = payload(seq=1, flow=3.0)
    edge.send(P.Publish(DBIRTH, dbirth, 0, False))
    host = connect(aware_broker, "host")
    got = subscribe(host, f"$sparkplug/certificates/spBv1.0/{GROUP}/DBIRTH/#")
    assert [(p.topic, p.payload, p.retain) for p in got] == [(CERT_D, dbirth, True)]


def test_a_live_subscriber_gets_the_certificate_as_the_birth_passes(aware_broker):
    host = connect(aware_broker, "host")
    subscribe(host, "$sparkplug/certificates/#", NBIRTH)
    _, nbirth = birth(aware_broker)
    got = {p.topic: p.payload for p in publishes(host)}
    assert got == {NBIRTH: nbirth, CERT_N: nbirth}


def test_a_rebirth_replaces_the_certificate(aware_broker):
    edge, _ = birth(aware_broker)
    again = payload(seq=0, bd_seq=0, temperature=21.0)
    edge.send(P.Publish(NBIRTH, again, 0, False))
    host = connect(aware_broker, "host")
    assert [p.payload for p in subscribe(host, CERT_N)] == [again]


def test_certificates_are_written_only_by_the_gateway(aware_broker):
    """$sparkplug/ is reserved as $SYS is: a client's PUBLISH there is refused."""
    spoofer = connect(aware_broker, "spoofer")
    spoofer.send(P.Publish(CERT_N, b"forged", 1, True, message_id=1))
    host = connect(aware_broker, "host")
    assert subscribe(host, "$sparkplug/#") == []
    assert aware_broker.router.stats.messages_denied == 1


def test_certificates_follow_the_acl_of_their_source_topics():
    aware_broker = FakeBroker(
        passwords={"edge": "e", "plant": "p", "other": "o"},
        acl=[
            "user edge",
            "topic write spBv1.0/#",
            "user plant",
            f"topic read spBv1.0/{GROUP}/#",
            "user other",
            "topic read spBv1.0/elsewhere/#",
        ],
    )
    aware(aware_broker)
    edge = connect(aware_broker, "edge", username="edge", password=b"e")
    nbirth = payload(seq=0, bd_seq=0)
    edge.send(P.Publish(NBIRTH, nbirth, 0, False))
    plant = connect(aware_broker, "plant", username="plant", password=b"p")
    other = connect(aware_broker, "other", username="other", password=b"o")
    assert [p.payload for p in subscribe(plant, "$sparkplug/certificates/#")] == [nbirth]
    assert subscribe(other, "$sparkplug/certificates/#") == []
    # A later birth reaches the one and not the other, live.
    again = payload(seq=0, bd_seq=1)
    edge.send(P.Publish(NBIRTH, again, 0, False))
    assert [p.payload for p in publishes(plant)] == [again]
    assert publishes(other) == []


def test_awareness_off_keeps_no_certificates():
    aware_broker = FakeBroker()
    birth(aware_broker)
    host = connect(aware_broker, "host")
    assert subscribe(host, "$sparkplug/#") == []


def test_certificates_survive_a_restart_with_the_store(tmp_path):
    aware_broker = FakeBroker(store_dir=tmp_path)
    aware(aware_broker)
    _, nbirth = birth(aware_broker)
    aware_broker.commit()
    again = aware_broker.restart()
    aware(again)
    host = connect(again, "host")
    assert [(p.topic, p.payload) for p in subscribe(host, "$sparkplug/certificates/#")] == [
        (CERT_N, nbirth)
    ]


def test_tck_conformance_mqtt_aware_ndeath_timestamp(aware_broker):
    """
    [tck-id-conformance-mqtt-aware-ndeath-timestamp]: replaced only when
    sparkplug.ndeath_timestamp is on, then with the time of delivery (UTC ms).
    """
    host = connect(aware_broker, "host")
    subscribe(host, NDEATH)
    edge, _ = birth(aware_broker, "edge")
    aware_broker.clock.advance(5)
    edge.lose_connection()  # the will: NDEATH
    (kept,) = publishes(host)
    assert S.decode(kept.payload).timestamp == 1000
    aware_broker.router.sparkplug.ndeath_timestamp = True
    edge, _ = birth(aware_broker, "edge2")
    aware_broker.clock.advance(7)
    edge.lose_connection()
    (replaced,) = publishes(host)
    assert S.decode(replaced.payload).timestamp == int(aware_broker.clock.seconds() * 1000)
    assert S.decode(replaced.payload).metrics[0].name == "bdSeq"


def test_edge_state_online_offline_from_births_deaths_and_wills(aware_broker):
    sp = aware_broker.router.sparkplug
    edge, _ = birth(aware_broker, bd_seq=3)
    edge.send(P.Publish(DBIRTH, payload(seq=1), 0, False))
    (node,) = sp.edge()
    assert node["online"] and node["bdSeq"] == 3
    assert node["devices"] == [{"device": DEVICE, "online": True}]
    assert (sp.stats.nodes_online, sp.stats.devices_online) == (1, 1)
    edge.send(P.Publish(DDEATH, payload(seq=2), 0, False))
    assert sp.stats.devices_online == 0
    edge.send(P.Publish(DBIRTH, payload(seq=3), 0, False))
    edge.lose_connection()  # its will, the NDEATH, takes node and devices offline
    (node,) = sp.edge()
    assert not node["online"] and node["devices"] == [{"device": DEVICE, "online": False}]
    assert (sp.stats.nodes_online, sp.stats.devices_online, sp.stats.deaths) == (0, 0, 1)


def test_an_ndeath_of_an_older_birth_is_ignored(aware_broker):
    """bdSeq: the will of a superseded connection does not kill the new birth."""
    sp = aware_broker.router.sparkplug
    birth(aware_broker, "edge", bd_seq=1)
    newer, _ = birth(aware_broker, "edge-b", bd_seq=2)
    stale = connect(aware_broker, "stale")
    stale.send(P.Publish(NDEATH, payload(bd_seq=1), 0, False))
    assert sp.edge()[0]["online"] and sp.stats.bdseq_mismatches == 1
    stale.send(P.Publish(NDEATH, payload(bd_seq=2), 0, False))
    assert not sp.edge()[0]["online"]


def test_seq_gaps_are_counted_with_the_wrap_at_255(aware_broker):
    sp = aware_broker.router.sparkplug
    edge, _ = birth(aware_broker)
    for seq in list(range(1, 256)) + [0, 1]:
        edge.send(P.Publish(NDATA, payload(seq=seq), 0, False))
    assert sp.stats.out_of_sequence == 0
    edge.send(P.Publish(DDATA, payload(seq=5), 0, False))  # 2 expected
    edge.send(P.Publish(NDATA, payload(seq=6), 0, False))
    assert sp.stats.out_of_sequence == 1


def test_malformed_payloads_are_counted_and_carried_as_bytes(aware_broker):
    host = connect(aware_broker, "host")
    subscribe(host, "spBv1.0/#", "$sparkplug/#")
    edge = connect(aware_broker, "edge")
    edge.send(P.Publish(NDATA, b"\xff\xff", 0, False))
    edge.send(P.Publish(NBIRTH, b"\x0f", 0, False))
    got = [(p.topic, p.payload) for p in publishes(host)]
    # Carried as it came; a birth, even unreadable, is kept as it passed.
    assert got == [(NDATA, b"\xff\xff"), (CERT_N, b"\x0f"), (NBIRTH, b"\x0f")]
    assert aware_broker.router.sparkplug.stats.malformed == 2


def test_the_node_table_is_bounded_and_forgets_offline_nodes_first(aware_broker):
    sp = aware(aware_broker, max_nodes=2)
    edge = connect(aware_broker, "edge")
    for n in range(3):
        edge.send(P.Publish(f"spBv1.0/g/NBIRTH/n{n}", payload(seq=0, bd_seq=0), 0, False))
    assert len(sp.nodes) == 2 and sp.stats.untracked == 1
    edge.send(P.Publish("spBv1.0/g/NDEATH/n0", payload(bd_seq=0), 0, False))
    edge.send(P.Publish("spBv1.0/g/NBIRTH/n2", payload(seq=0, bd_seq=0), 0, False))
    assert sorted(n["edge_node"] for n in sp.edge()) == ["n1", "n2"]


def test_other_topics_are_not_read(aware_broker, monkeypatch):
    sp = aware_broker.router.sparkplug
    monkeypatch.setattr(sp, "published", lambda message: pytest.fail("observed"))
    edge = connect(aware_broker, "edge")
    edge.send(P.Publish("spAv1.0/g/NDATA/n", b"\xff", 0, False))
    edge.send(P.Publish("plant/spBv1.0/NDATA", b"\xff", 0, False))


def test_edge_state_is_in_sys_metrics_and_the_admin_api(aware_broker):
    from mqttgw.service.gateway import Gateway
    from mqttgw.web.metrics import Metrics
    from mqttgw.web.systopics import SysTopics

    edge, _ = birth(aware_broker)
    edge.send(P.Publish(DBIRTH, payload(seq=1), 0, False))
    edge.send(P.Publish(DDATA, payload(seq=9), 0, False))
    values = SysTopics(aware_broker.router, aware_broker.clock, 10).values()
    assert values["$SYS/broker/sparkplug/nodes_online"] == 1
    assert values["$SYS/broker/sparkplug/devices_online"] == 1
    assert values["$SYS/broker/sparkplug/out_of_sequence"] == 1
    text = Metrics(aware_broker.router).text().decode()
    assert "mqttgw_sparkplug_nodes_online 1.0" in text
    assert "mqttgw_sparkplug_out_of_sequence_total 1.0" in text
    api = Gateway(aware_broker.router, aware_broker.clock).sparkplug()
    assert api["aware"] and api["stats"]["devices_online"] == 1
    (node,) = api["edge_nodes"]
    assert (node["group"], node["edge_node"], node["online"]) == (GROUP, NODE, True)

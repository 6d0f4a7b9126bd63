"""
What the dashboard's Sparkplug view stands on: the edge state GET
/api/sparkplug gives, listed as far as the reader may read, per node and
device.
"""

import pytest

from mqttgw.broker.sparkplug import Sparkplug
from mqttgw.security.portal import credentials_checker, make_portal
from mqttgw.testing import FakeBroker, ImmediateThreadPool
from mqttgw.web.admin import Roles
from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import payload as S
from mqttgw.wire.sparkplug.payload import DataType as T
from tests.test_admin_api import API, USERS, connected


def birth_payload(seq, bd_seq=None, metrics=()):
    """A payload of ``metrics``: (name or None, alias or None, datatype, value)."""
    p = S.Payload(timestamp=1_700_000_000_000, seq=seq)
    if bd_seq is not None:
        p.metrics.add(name="bdSeq", datatype=T.UInt64, long_value=bd_seq)
    for name, alias, datatype, value in metrics:
        m = p.metrics.add(datatype=datatype)
        if name is not None:
            m.name = name
        if alias is not None:
            m.alias = alias
        S.set_value(m, datatype, value)
    return S.encode(p)


def born(broker, group, node, devices=(), client_id=None, **login):
    """An edge node of ``group`` born, with ``devices``, publishing through the fake broker."""
    edge = connected(broker, client_id or f"{group}-{node}", **login)
    edge.send(P.Publish(f"spBv1.0/{group}/NBIRTH/{node}", birth_payload(0, 0), 0, False))
    for seq, device in enumerate(devices, 1):
        edge.send(P.Publish(f"spBv1.0/{group}/DBIRTH/{node}/{device}", birth_payload(seq), 0, False))
    return edge


# The API


@pytest.fixture
def edge_site():
    """Two groups and an ACL: viewer reads plantA, pumps reads plantB's pump devices only."""
    broker = FakeBroker(
        passwords={**USERS, "pumps": "pumpspw"},
        acl=[
            "user root", "topic readwrite #",
            "user viewer", "topic read spBv1.0/plantA/#",
            "user pumps", "topic read spBv1.0/plantB/+/+/pump1",
        ],
    )
    broker.router.sparkplug = Sparkplug(broker.router, broker.clock)
    login = {"username": "root", "password": b"rootpw"}
    born(broker, "plantA", "edge1", ["pump1"], **login)
    born(broker, "plantB", "edge2", ["pump1", "valve1"], **login)
    portal = make_portal(credentials_checker(broker.checker, None, broker.clock, ImmediateThreadPool()), False)
    roles = Roles(admin_users={"root"}, read_users={"viewer", "pumps"})
    return broker, API(broker, portal, roles)


def listed(api, user, password, path="/api/sparkplug"):
    status, body = api.json("GET", path, user=user, password=password)
    assert status == 200
    return {
        (n["group"], n["edge_node"]): [d["device"] for d in n["devices"]] for n in body["edge_nodes"]
    }


def test_the_sparkplug_edge_is_listed_as_far_as_the_reader_may_read_its_topics(edge_site):
    _, api = edge_site
    assert listed(api, "root", "rootpw") == {
        ("plantA", "edge1"): ["pump1"], ("plantB", "edge2"): ["pump1", "valve1"],
    }
    # A read-only user of the dashboard reads the edge as its ACL lets it.
    assert listed(api, "viewer", "viewpw") == {("plantA", "edge1"): ["pump1"]}
    # Only a device's topics readable: its node is listed for it, the other device not.
    assert listed(api, "pumps", "pumpspw") == {("plantB", "edge2"): ["pump1"]}
    # A user with no role is refused, as for the rest of the API.
    assert api.call("GET", "/api/sparkplug", "device", "devpw")[0] == 403


def test_the_sparkplug_edge_of_one_group(edge_site):
    _, api = edge_site
    assert listed(api, "root", "rootpw", "/api/sparkplug?group=plantB") == {("plantB", "edge2"): ["pump1", "valve1"]}
    assert listed(api, "viewer", "viewpw", "/api/sparkplug?group=plantB") == {}


def test_each_node_tells_its_bdseq_last_seq_and_gaps_in_its_seq(edge_site):
    broker, api = edge_site
    edge = broker.client(client_id="plantA-edge1", username="root", password=b"rootpw")
    edge.received()
    # seq 1 was the DBIRTH: 2 is next, then 5 skips two.
    for seq in (2, 5, 6):
        edge.send(P.Publish("spBv1.0/plantA/DDATA/edge1/pump1", birth_payload(seq), 0, False))
    _, body = api.json("GET", "/api/sparkplug", user="viewer", password="viewpw")
    (node,) = body["edge_nodes"]
    assert (node["online"], node["bdSeq"], node["seq"], node["out_of_sequence"]) == (True, 0, 6, 1)
    assert node["devices"] == [{"device": "pump1", "online": True}]
    assert body["stats"]["out_of_sequence"] == 1 and not body["truncated"]


def test_the_work_of_one_listing_is_bounded(edge_site, monkeypatch):
    from mqttgw.web import admin

    _, api = edge_site
    # plantA's node and device fit; plantB's node and its two devices do not.
    monkeypatch.setattr(admin, "MAX_LISTED", 4)
    _, body = api.json("GET", "/api/sparkplug", user="root", password="rootpw")
    assert [n["group"] for n in body["edge_nodes"]] == ["plantA"] and body["truncated"]


def test_on_loopback_the_edge_is_listed_as_an_anonymous_client_may_read_it():
    broker = FakeBroker(
        passwords=USERS, acl=["topic read spBv1.0/public/#", "user root", "topic readwrite #"], allow_anonymous=True
    )
    broker.router.sparkplug = Sparkplug(broker.router, broker.clock)
    born(broker, "public", "n1", username="root", password=b"rootpw")
    born(broker, "private", "n2", username="root", password=b"rootpw")
    open_ = API(broker, None, Roles(open=True))
    assert [n["group"] for n in open_.json("GET", "/api/sparkplug")[1]["edge_nodes"]] == ["public"]
    closed = API(broker, None, Roles(open=True), anonymous_reads=False)
    assert closed.call("GET", "/api/sparkplug")[0] == 401
    # The Unix socket: everything.
    assert len(API(broker, local=True).json("GET", "/api/sparkplug")[1]["edge_nodes"]) == 2


def test_with_awareness_off_the_api_says_so():
    api = API(FakeBroker(), local=True)
    assert api.json("GET", "/api/sparkplug") == (200, {"aware": False})

"""
The admin API in-process: the admin listener's resources over the fake
broker, called through treq's StubTreq.  tests/system/test_operations.py and
tests/system/test_dashboard_api.py call it over HTTP on a gateway under twistd.
"""

import base64
from urllib.parse import quote

import pytest
from twisted.trial.unittest import SynchronousTestCase

from mqttgw.broker.session import NEVER_EXPIRES
from mqttgw.security.passwords import PasswordChecker
from mqttgw.security.portal import credentials_checker, make_portal
from mqttgw.testing import V31, FakeBroker, ImmediateThreadPool, connected
from mqttgw.web.admin import Roles
from mqttgw.wire import packets as P
from tests.admin_api import API, URL, USERS

# successResultOf and failureResultOf, as SynchronousTestCase has them.
_sync = SynchronousTestCase()
successResultOf = _sync.successResultOf
failureResultOf = _sync.failureResultOf


@pytest.fixture
def api(broker):
    """The API on the local Unix socket: no credentials asked."""
    return API(broker, local=True)


# Clients


def test_clients_lists_those_connected_with_their_protocol_and_subscriptions(broker, api):
    device = connected(broker, "dev/1", clean_session=False)
    device.send(P.Subscribe(1, [("x/#", 1)]))
    device.received()
    connected(broker, "pub", V31, username="someone")
    away = connected(broker, "away", clean_session=False)
    away.lose_connection()
    # A bridge's own session is not a client.
    broker.router.connect("\x00bridge/up", clean_start=False, expiry_interval=NEVER_EXPIRES)
    status, clients = api.json("GET", "/api/clients")
    assert status == 200
    assert [
        (c["client_id"], c["protocol"], c["username"], c["clean_session"], c["subscriptions"])
        for c in clients
    ] == [
        ("dev/1", "3.1.1", None, False, 1),
        ("pub", "3.1", "someone", True, 0),
    ]
    assert clients[0]["address"].startswith("127.0.0.1:")


def test_kick_closes_the_clients_connection_and_keeps_its_session(broker, api, logged):
    device = connected(broker, "dev/1", clean_session=False)
    # Client ids are URL-encoded path segments.
    status, body = api.json("DELETE", "/api/clients/" + quote("dev/1", safe=""))
    assert (status, body) == (200, {"kicked": "dev/1"})
    assert device.closed
    device.finish_close()
    assert "admin API: client dev/1 disconnected" in logged()
    assert api.json("GET", "/api/clients") == (200, [])
    assert [s["client_id"] for s in api.json("GET", "/api/sessions")[1]] == ["dev/1"]


def test_kicking_a_client_not_connected_is_a_404_saying_so(broker, api):
    status, body = api.json("DELETE", "/api/clients/nobody")
    assert status == 404 and "not connected" in body["error"]
    assert api.json("DELETE", "/api/clients/")[0] == 404


# Sessions


def test_sessions_lists_persistent_sessions_connected_or_not(broker, api):
    device = connected(broker, "dev/1", clean_session=False)
    device.send(P.Subscribe(1, [("x/#", 1), ("y", 0)]))
    device.received()
    connected(broker, "clean")
    away = connected(broker, "away", clean_session=False)
    away.lose_connection()
    status, sessions = api.json("GET", "/api/sessions")
    assert status == 200
    assert [(s["client_id"], s["connected"], s["subscriptions"]) for s in sessions] == [
        ("away", False, []),
        ("dev/1", True, ["x/#", "y"]),
    ]


def test_a_session_out_of_use_is_deleted_and_one_in_use_is_not(broker, api, logged):
    device = connected(broker, "dev/1", clean_session=False)
    device.send(P.Subscribe(1, [("x/#", 1)]))
    device.received()
    status, body = api.json("DELETE", "/api/sessions/dev%2F1")
    assert status == 404 and "out of use" in body["error"]
    device.lose_connection()
    assert api.json("DELETE", "/api/sessions/dev%2F1") == (200, {"deleted": "dev/1"})
    assert "admin API: session of dev/1 deleted" in logged()
    assert api.json("GET", "/api/sessions") == (200, [])
    again = broker.client(client_id="dev/1", clean_session=False)
    assert again.received() == [P.Connack(0, session_present=False)]


# Retained messages


def test_retained_lists_by_filter_text_as_text_and_binary_as_base64(broker, api):
    publisher = connected(broker, "pub")
    publisher.send(
        P.Publish("r/1", b"retained one", 1, True, message_id=1),
        P.Publish("r/2", b"\xff\x00", 1, True, message_id=2),
        P.Publish("other", b"o", 0, True),
    )
    status, listed = api.json("GET", "/api/retained?filter=" + quote("r/#"))
    assert status == 200
    assert [(m["topic"], m["payload"], m["bytes"]) for m in listed] == [
        ("r/1", "retained one", 12),
        ("r/2", {"base64": "/wA="}, 2),
    ]
    assert len(api.json("GET", "/api/retained")[1]) == 3


def test_deleting_retained_messages_clears_them_for_late_subscribers(broker, api, logged):
    publisher = connected(broker, "pub")
    publisher.send(
        P.Publish("r/1", b"one", 1, True, message_id=1),
        P.Publish("r/2", b"two", 1, True, message_id=2),
    )
    status, body = api.json("DELETE", "/api/retained?filter=r/1")
    assert (status, body) == (200, {"deleted": ["r/1"]})
    assert "admin API: 1 retained message(s) matching r/1 deleted" in logged()
    late = connected(broker, "late")
    late.send(P.Subscribe(1, [("r/#", 1)]))
    assert [p.topic for p in late.received() if isinstance(p, P.Publish)] == ["r/2"]


def test_deleting_everything_retained_leaves_the_sys_topics(broker, api):
    broker.router.publish_sys(P.Publish("$SYS/broker/version", b"mqttgw", 0, True))
    connected(broker, "pub").send(P.Publish("r/1", b"one", 0, True))
    assert api.json("DELETE", "/api/retained?filter=%23") == (200, {"deleted": ["r/1"]})
    assert [m["topic"] for m in api.json("GET", "/api/retained?filter=%24SYS/%23")[1]] == [
        "$SYS/broker/version"
    ]


def test_a_filter_that_is_not_one_is_a_400(api):
    status, body = api.json("GET", "/api/retained?filter=" + quote("a/#/b"))
    assert status == 400 and body["error"]
    assert api.json("DELETE", "/api/retained?filter=" + quote("a/#/b"))[0] == 400


# Credentials


@pytest.fixture
def guarded():
    """
    The API on a listener beyond loopback: credentials of the password
    file, checked through a portal; root is an admin, viewer may read.
    """
    broker = FakeBroker(passwords=USERS)
    portal = make_portal(
        credentials_checker(broker.checker, None, broker.clock, ImmediateThreadPool()), False
    )
    return API(broker, portal, Roles(admin_users={"root"}, read_users={"viewer"}))


@pytest.mark.parametrize("path", ["/api/clients", "/api/sessions", "/api/overview", "/metrics"])
def test_without_credentials_the_answer_is_401_with_a_basic_challenge(guarded, path):
    status, headers, _ = guarded.call("GET", path)
    assert status == 401
    assert headers.getRawHeaders("www-authenticate") == ['Basic realm="mqttgw"']


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_a_wrong_password_or_an_unknown_user_is_a_401_after_the_throttles_delay(guarded, logged):
    clock = guarded.gateway.clock
    for user, password in (("root", "wrong"), ("nobody", "rootpw")):
        d = guarded.http.get(URL + "/api/clients", headers=basic(user, password))
        guarded.http.flush()
        # Held for the delay MQTT's throttle gives this address.
        _sync.assertNoResult(d)
        clock.advance(60)
        guarded.http.flush()
        assert successResultOf(d).code == 401
    refused = [m for m in logged() if "admin API: credentials refused from 127.0.0.1" in m]
    assert len(refused) == 2 and all("answered after" in m for m in refused)


def test_the_dashboards_own_calls_are_challenged_for_a_token_not_a_password(guarded):
    status, headers, _ = guarded.call("GET", "/api/clients", headers={"X-Requested-With": "mqttgw"})
    assert status == 401
    assert headers.getRawHeaders("www-authenticate") == ["Bearer"]


def test_admins_may_do_everything(guarded):
    assert guarded.json("GET", "/api/clients", user="root", password="rootpw") == (200, [])
    assert guarded.call("GET", "/metrics", "root", "rootpw")[0] == 200
    assert guarded.json("DELETE", "/api/retained?filter=%23", user="root", password="rootpw") == (
        200, {"deleted": []},
    )


def test_readers_may_read_the_overview_and_the_bridges_only(guarded, logged):
    assert guarded.call("GET", "/api/overview", "viewer", "viewpw")[0] == 200
    assert guarded.json("GET", "/api/bridges", user="viewer", password="viewpw") == (200, [])
    assert guarded.call("GET", "/api/clients", "viewer", "viewpw")[0] == 403
    assert guarded.call("DELETE", "/api/retained?filter=%23", "viewer", "viewpw")[0] == 403
    assert "admin API: user viewer may not DELETE /api/retained" in logged()


def test_users_with_no_role_are_refused(guarded):
    assert guarded.call("GET", "/api/overview", "device", "devpw")[0] == 403


def test_health_checks_need_no_credentials(guarded):
    assert guarded.json("GET", "/healthz") == (200, {"status": "alive"})
    assert guarded.json("GET", "/readyz") == (200, {"status": "ready"})


class HeldThreadPool:
    """A thread pool whose work waits until the test runs it."""

    def __init__(self):
        self.waiting = []

    def callInThreadWithCallback(self, on_result, f, *args, **kwargs):
        self.waiting.append((on_result, f, args, kwargs))

    def run(self):
        waiting, self.waiting = self.waiting, []
        for on_result, f, args, kwargs in waiting:
            ImmediateThreadPool().callInThreadWithCallback(on_result, f, *args, **kwargs)


def test_a_caller_gone_before_its_credentials_are_checked_is_not_answered(logged):
    broker = FakeBroker(passwords=USERS)
    pool = HeldThreadPool()
    checker = PasswordChecker(broker.checker.table, broker.clock, pool)
    portal = make_portal(credentials_checker(checker, None, broker.clock, pool), False)
    api = API(broker, portal, Roles(admin_users={"root"}))
    listed = []
    clients = api.gateway.clients
    api.gateway.clients = lambda: listed.append(True) or clients()
    basic = {"Authorization": "Basic " + base64.b64encode(b"root:rootpw").decode()}

    d = api.http.get(URL + "/api/clients", headers=basic)
    assert len(pool.waiting) == 1
    # The caller leaves while the password is hashed.
    d.cancel()
    api.http.flush()
    failureResultOf(d)
    pool.run()
    api.http.flush()
    assert listed == []
    assert not any(m.startswith("admin API: /api/clients") for m in logged())

    # One that waits is answered.
    d = api.http.get(URL + "/api/clients", headers=basic)
    pool.run()
    api.http.flush()
    assert successResultOf(d).code == 200
    assert listed == [True]


# Host names and origins (transports.httpguard)


def test_a_listener_answers_to_its_own_names_only():
    from mqttgw.transports.httpguard import HostNames, split_host

    assert split_host("[::1]:9883") == ("::1", 9883)
    assert split_host("Example.NET.:80") == ("example.net", 80)
    assert split_host("::1") == ("::1", None)
    hosts = HostNames(["gw.example.net"], machine="gw-7")
    # On loopback, the loopback names; anywhere, the address the
    # connection arrived on, the machine's name and the configured ones.
    for name in ("localhost", "127.0.0.1", "127.0.0.2", "::1", "gw-7", "GW.example.net"):
        assert hosts.allows(name, "127.0.0.1"), name
    assert hosts.allows("10.0.4.1", "10.0.4.1")
    assert not hosts.allows("localhost", "10.0.4.1")
    assert not hosts.allows("rebind.attacker.example", "127.0.0.1")
    assert not hosts.allows("10.0.4.2", "10.0.4.1")
    assert HostNames(["*"]).allows("anything.example", "10.0.4.1")


def test_an_origin_is_judged_by_the_listeners_names_never_by_the_host_header():
    from twisted.internet.address import IPv4Address

    from mqttgw.transports.httpguard import HostNames

    hosts = HostNames(machine="gw-7")
    local = IPv4Address("TCP", "127.0.0.1", 9883)
    allowed = lambda origin, host, secure=False, origins=frozenset(): hosts.origin_allowed(  # noqa: E731
        origin, host, local, secure, origins
    )
    assert allowed("http://localhost:9883", "localhost:9883")
    # The Host and the Origin agree, but the name is not one of ours.
    assert not allowed("http://rebind.attacker.example:9883", "rebind.attacker.example:9883")
    # Another site on this machine, another scheme.
    assert not allowed("http://localhost:3000", "localhost:9883")
    assert not allowed("https://localhost:9883", "localhost:9883")
    assert allowed("https://localhost:9883", "localhost:9883", secure=True)
    # A port mapped in front of the listener (a container's) is the Host's.
    assert allowed("http://127.0.0.1:18883", "127.0.0.1:18883")
    assert not allowed("null", "localhost:9883")
    assert allowed("https://dash.example.net", "localhost:9883", origins={"https://dash.example.net"})


def test_on_loopback_reads_are_open_but_changes_need_credentials(broker):
    portal = make_portal(
        credentials_checker(FakeBroker(passwords=USERS).checker, None, broker.clock, ImmediateThreadPool()),
        False,
    )
    api = API(broker, None, Roles(admin_users={"root"}, open=True), signin_portal=portal)
    connected(broker, "dev/1", clean_session=False)
    assert api.json("GET", "/api/clients")[0] == 200
    status, headers, _ = api.call("DELETE", "/api/clients/dev%2F1")
    assert status == 401 and headers.getRawHeaders("www-authenticate") == ['Basic realm="mqttgw"']
    # Signed in, only an admin user may change anything; others may read.
    assert api.call("DELETE", "/api/clients/dev%2F1", user="device", password="devpw")[0] == 403
    assert api.json("GET", "/api/clients", user="device", password="devpw")[0] == 200
    assert api.json("DELETE", "/api/clients/dev%2F1", user="root", password="rootpw") == (200, {"kicked": "dev/1"})
    # With no credentials to check, changes are for the Unix socket only.
    bare = API(broker, None, Roles(open=True))
    status, body = bare.json("DELETE", "/api/retained?filter=%23")
    assert status == 403 and "Unix socket" in body["error"]


def test_retained_payloads_are_listed_as_far_as_the_reader_may_read_them():
    broker = FakeBroker(
        passwords=USERS, acl=["topic read public/#", "user root", "topic readwrite #"], allow_anonymous=True
    )
    publisher = connected(broker, "pub", username="root", password="rootpw")
    publisher.send(P.Publish("public/a", b"open", 0, True), P.Publish("secret/b", b"hidden", 0, True))
    portal = make_portal(credentials_checker(broker.checker, None, broker.clock, ImmediateThreadPool()), False)
    open_ = API(broker, None, Roles(open=True), signin_portal=portal)
    assert [m["topic"] for m in open_.json("GET", "/api/retained")[1]] == ["public/a"]
    assert len(open_.json("GET", "/api/retained", user="root", password="rootpw")[1]) == 2
    assert open_.json("GET", "/api/retained", user="device", password="devpw")[1] == []
    # Anonymous clients refused: a read without credentials is asked for them.
    closed = API(broker, None, Roles(open=True), signin_portal=portal, anonymous_reads=False)
    assert closed.call("GET", "/api/retained")[0] == 401
    assert len(API(broker, local=True).json("GET", "/api/retained")[1]) == 2

"""
An identity owns its session, in process: a session records who made it
(kept in the store), another identity is refused its client id (or, with
auth.session_owner_mismatch = "new_session", gets a new session and the old
one is discarded), and what waited for a reader is checked against its
rights when it goes out.  tests/system/test_session_owner_gateway.py asks the same
of a running gateway.
"""

import sqlite3

import pytest

from mqttgw.broker.session import INTERNAL_PREFIX, NEVER_EXPIRES
from mqttgw.broker.store import Store
from mqttgw.security.acl import ACL
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R

USERS = {"alice": "a-pw", "bob": "b-pw"}
ACL_LINES = ["user alice", "topic readwrite private/alice/#", "user bob", "topic readwrite #"]
LEVELS = {
    "3.1": {"protocol_level": P.MQTT_31, "protocol_name": "MQIsdp"},
    "3.1.1": {"protocol_level": P.MQTT_311},
    "5.0": {"protocol_level": P.MQTT_5, "properties": {"session_expiry_interval": 3600}},
}
# What a refused CONNECT gets: 3.1 and 3.1.1 CONNACK 5, 5.0 0x87.
NOT_AUTHORIZED = {"3.1": 5, "3.1.1": 5, "5.0": R.NOT_AUTHORIZED}


def make_broker(tmp_path, acl=ACL_LINES, **kwargs):
    return FakeBroker(store_dir=tmp_path, passwords=USERS, acl=acl, **kwargs)


def restart(broker, **kwargs):
    """The same store under a new broker with the same users and ACL (a crash)."""
    broker.store._db.close()
    broker.store._lock.close()
    return make_broker(broker.store.path.parent, **kwargs)


def login(broker, client_id, user, level="3.1.1", clean=False, **fields):
    """A connection and its CONNACK, and what came with it."""
    fields = {**LEVELS[level], **fields}
    password = USERS[user].encode() if user is not None else None
    client = broker.client(
        client_id=client_id, clean_session=clean, username=user, password=password, **fields
    )
    packets = client.received()
    assert isinstance(packets[0], P.Connack), packets
    return client, packets[0], packets[1:]


def publishes(packets):
    return [(p.topic, p.payload) for p in packets if isinstance(p, P.Publish)]


def alice_away_with_queue(broker, level="3.1.1", n=3):
    """alice's persistent session on private/alice/#, n messages queued while she is away."""
    alice, connack, _ = login(broker, "device-1", "alice", level)
    assert connack.return_code == 0
    alice.send(P.Subscribe(1, [("private/alice/#", 1)], {} if level == "5.0" else None))
    assert isinstance(alice.received()[0], P.Suback)
    alice.lose_connection()
    bob, _, _ = login(broker, "bob-pub", "bob", clean=True)
    for i in range(n):
        bob.send(P.Publish("private/alice/x", b"secret-%d" % i, 1, message_id=i + 1))
    broker.commit()
    assert len([p for p in bob.received() if isinstance(p, P.Puback)]) == n
    bob.send(P.Disconnect())
    bob.finish_close()
    broker.commit()
    return n


@pytest.mark.parametrize("level", ["3.1", "3.1.1", "5.0"])
def test_another_user_is_refused_a_stored_session_and_reads_nothing_of_it(tmp_path, level, logged):
    broker = make_broker(tmp_path)
    n = alice_away_with_queue(broker, level)
    bob, connack, rest = login(broker, "device-1", "bob", level)
    assert connack.return_code == NOT_AUTHORIZED[level]
    assert not connack.session_present and not publishes(rest)
    assert bob.closed
    assert broker.router.stats.session_owner_refused == 1
    refusals = [m for m in logged() if "belongs to another identity" in m]
    assert len(refusals) == 1 and "'bob'" in refusals[0] and "b-pw" not in refusals[0]
    # A clean session does not take it either (nor end alice's).
    bob, connack, _ = login(broker, "device-1", "bob", level, clean=True)
    assert connack.return_code == NOT_AUTHORIZED[level]
    # alice still finds all of it.
    alice, connack, rest = login(broker, "device-1", "alice", level)
    # (3.1's CONNACK has no session present flag.)
    assert connack.return_code == 0 and connack.session_present == (level != "3.1")
    assert publishes(rest) == [("private/alice/x", b"secret-%d" % i) for i in range(n)]


def test_a_flood_of_refusals_is_counted_each_and_logged_at_a_bounded_rate(tmp_path, logged):
    broker = make_broker(tmp_path)
    alice_away_with_queue(broker)
    for _ in range(200):
        bob, connack, rest = login(broker, "device-1", "bob")
        assert connack.return_code == 5 and not rest
    assert broker.router.stats.session_owner_refused == 200
    lines = [m for m in logged() if "belongs to another identity" in m]
    # RateLimited's burst, the last saying that more are only counted.
    assert 1 <= len(lines) <= 10


@pytest.mark.parametrize("level", ["3.1.1", "5.0"])
def test_another_user_may_not_take_over_a_live_session(tmp_path, level):
    broker = make_broker(tmp_path)
    alice, connack, _ = login(broker, "device-1", "alice", level, clean=True)
    bob, connack, _ = login(broker, "device-1", "bob", level, clean=True)
    assert connack.return_code == NOT_AUTHORIZED[level]
    assert bob.closed and not alice.closed
    alice.send(P.Pingreq())
    assert isinstance(alice.received()[0], P.Pingresp)
    # Its owner still takes it over, as before.
    again, connack, _ = login(broker, "device-1", "alice", level, clean=True)
    assert connack.return_code == 0 and alice.closed


def test_the_new_session_setting_discards_the_old_session_and_never_resumes_it(tmp_path, logged):
    broker = make_broker(tmp_path)
    broker.router.session_owner_mismatch = "new_session"
    alice_away_with_queue(broker)
    bob, connack, rest = login(broker, "device-1", "bob")
    assert connack.return_code == 0 and not connack.session_present
    assert not publishes(rest)
    assert broker.router.stats.session_owner_replaced == 1
    assert any("discarding the session of client device-1" in m for m in logged())
    broker.commit()
    db = broker.store._db
    assert db.execute("SELECT client_id, owner FROM sessions").fetchall() == [("device-1", "bob")]
    assert db.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM subscriptions").fetchone() == (0,)
    # A live owner is never kicked, whatever the setting.
    alice, connack, _ = login(broker, "device-1", "alice")
    assert connack.return_code == 5 and not bob.closed


def test_the_owner_is_stored_and_holds_after_a_restart(tmp_path):
    broker = make_broker(tmp_path)
    n = alice_away_with_queue(broker)
    broker = restart(broker)
    bob, connack, rest = login(broker, "device-1", "bob")
    assert connack.return_code == 5 and not publishes(rest)
    alice, connack, rest = login(broker, "device-1", "alice")
    assert connack.session_present and len(publishes(rest)) == n


def test_anonymous_sessions_belong_to_anonymous(tmp_path):
    broker = make_broker(tmp_path, acl=None, allow_anonymous=True)
    anon, connack, _ = login(broker, "shared-id", None)
    assert connack.return_code == 0
    anon.send(P.Disconnect())
    anon.finish_close()
    bob, connack, _ = login(broker, "shared-id", "bob")
    assert connack.return_code == 5
    again, connack, _ = login(broker, "shared-id", None)
    assert connack.return_code == 0 and connack.session_present
    again.send(P.Disconnect())
    again.finish_close()
    # And the other way round.
    alice, connack, _ = login(broker, "alices-id", "alice")
    alice.send(P.Disconnect())
    alice.finish_close()
    anon, connack, _ = login(broker, "alices-id", None)
    assert connack.return_code == 5


def test_a_session_stored_without_an_owner_is_claimed_by_its_first_login(tmp_path, logged):
    broker = make_broker(tmp_path)
    n = alice_away_with_queue(broker)
    broker.store._db.execute("UPDATE sessions SET owner = NULL")
    broker = restart(broker)
    assert broker.router.sessions["device-1"].owner is None
    alice, connack, rest = login(broker, "device-1", "alice")
    assert connack.session_present and len(publishes(rest)) == n
    claims = [m for m in logged() if "stored without an owner" in m]
    assert len(claims) == 1 and "device-1" in claims[0] and "'alice'" in claims[0]
    broker.commit()
    assert broker.store._db.execute("SELECT owner FROM sessions").fetchall() == [("alice",)]
    alice.send(P.Disconnect())
    alice.finish_close()
    bob, connack, _ = login(broker, "device-1", "bob")
    assert connack.return_code == 5


def test_a_version_4_store_gains_the_owner_column_empty(tmp_path):
    db = sqlite3.connect(tmp_path / "mqttgw.db")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
        "INSERT INTO meta VALUES ('schema', 4);"
        "CREATE TABLE sessions (client_id TEXT PRIMARY KEY, last_seen REAL,"
        " expiry_interval INTEGER, sent_seq INTEGER);"
        "INSERT INTO sessions VALUES ('old', NULL, NULL, NULL);"
    )
    db.commit()
    db.close()
    store = Store(tmp_path, reactor=None)
    _, sessions = store.load()
    assert [(s.client_id, s.owner) for s in sessions] == [("old", None)]
    store.set_session_owner("old", "alice")
    store.run_pending()
    assert store.load()[1][0].owner == "alice"
    store.stop()


@pytest.fixture
def unreadable_log(monkeypatch):
    """The process's bounded log of unreadable drops, fresh for this test."""
    from mqttgw.broker import deliveries
    from mqttgw.broker.logsummary import RateLimited

    monkeypatch.setattr(deliveries, "_unreadable_log", RateLimited(deliveries.log))


def test_queued_messages_are_checked_against_the_readers_rights_when_they_go_out(
    tmp_path, logged, unreadable_log
):
    broker = make_broker(tmp_path)
    n = alice_away_with_queue(broker)
    # A reload takes alice's read right away.
    broker.router.access.replace(ACL.parse(["user alice", "topic write private/alice/#", "user bob", "topic #"]))
    alice, connack, rest = login(broker, "device-1", "alice")
    assert connack.session_present and not publishes(rest)
    assert broker.router.stats.messages_unreadable == n
    assert broker.router.stats.stored_messages == 0
    assert any("may no longer read that topic" in m for m in logged())
    broker.commit()
    assert broker.store._db.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)


def test_in_flight_messages_are_not_sent_again_once_the_reader_may_not_read_them(tmp_path):
    broker = make_broker(tmp_path)
    alice, connack, _ = login(broker, "device-1", "alice")
    alice.send(P.Subscribe(1, [("private/alice/#", 1)]))
    alice.received()
    bob, _, _ = login(broker, "bob-pub", "bob", clean=True)
    bob.send(P.Publish("private/alice/x", b"one", 1, message_id=1))
    broker.commit()
    # Sent, never acknowledged: in flight when she goes.
    assert publishes(alice.received()) == [("private/alice/x", b"one")]
    alice.lose_connection()
    broker.router.access.replace(ACL.parse(["user bob", "topic #"]))
    alice, connack, rest = login(broker, "device-1", "alice")
    assert connack.session_present and not publishes(rest)
    assert broker.router.stats.messages_unreadable == 1
    broker.commit()
    assert broker.store._db.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)


def test_the_gateways_own_sessions_have_no_owner_to_check(tmp_path):
    broker = make_broker(tmp_path)
    router = broker.router
    session, _ = router.connect(INTERNAL_PREFIX + "bridge", clean_start=False, expiry_interval=NEVER_EXPIRES)
    assert session.owner is None
    assert router.owner_refusal(INTERNAL_PREFIX + "bridge", "bob") is None
    session, present = router.connect(INTERNAL_PREFIX + "bridge", clean_start=False, expiry_interval=NEVER_EXPIRES)
    assert present


SECRET = b"s" * 40


def token_for(subject, now):
    import jwt

    return jwt.encode({"sub": subject, "exp": now + 3600}, SECRET, algorithm="HS256").encode()


def test_a_token_subject_owns_the_session_whatever_user_name_the_client_sends():
    from mqttgw.security.tokens import TokenKeys

    broker = FakeBroker(tokens=TokenKeys(SECRET, ("HS256",)))
    now = broker.clock.seconds()
    fields = dict(client_id="dash", clean_session=False)
    first = broker.client(username="whoever", password=token_for("alice", now), **fields)
    assert first.received()[0].return_code == 0
    assert broker.router.sessions["dash"].owner == "alice"
    first.lose_connection()
    # The user name sent beside a token is not who the client is.
    other = broker.client(username="alice", password=token_for("bob", now), **fields)
    assert other.received()[0].return_code == 5
    again = broker.client(username="x", password=token_for("alice", now), **fields)
    [connack] = again.received()
    assert connack.return_code == 0 and connack.session_present


class Certificate:
    def __init__(self, common_name):
        self.common_name = common_name

    def get_subject(self):
        return type("Subject", (), {"CN": self.common_name})()


def test_a_client_certificate_identity_owns_the_session():
    broker = FakeBroker()
    broker.factory.identity_as_username = True

    def connect(common_name):
        client = broker.client()
        client.transport.getPeerCertificate = lambda: Certificate(common_name)
        client.send(P.Connect("sensor-7", clean_session=False))
        [connack] = client.received()
        return client, connack

    first, connack = connect("sensor-7.example")
    assert connack.return_code == 0
    assert broker.router.sessions["sensor-7"].owner == "sensor-7.example"
    first.lose_connection()
    assert connect("intruder.example")[1].return_code == 5
    again, connack = connect("sensor-7.example")
    assert connack.return_code == 0 and connack.session_present

"""
Who may connect and what they may touch: password files in mosquitto's
format, the twisted.cred login in CONNECT, CONNACK 4 and 5, the ACL in
mosquitto's acl_file format (publish, subscribe, wildcard delivery,
retained messages, wills) and the reserved topics, in both protocol
versions.
"""

import subprocess

import pytest

from mqttgw.broker.topics import filters_intersect, matches
from mqttgw.security.acl import ACL
from mqttgw.security.files import AuthConfigError
from mqttgw.security.passwords import PasswordTable, hash_password
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from tests.conftest import require_program

V31, V311 = P.MQTT_31, P.MQTT_311
both_versions = pytest.mark.parametrize("version", [V31, V311], ids=["3.1", "3.1.1"])


def login(broker, client_id, version=V311, **fields):
    client = broker.client(
        client_id=client_id,
        protocol_level=version,
        protocol_name="MQTT" if version == V311 else "MQIsdp",
        **fields,
    )
    # Refusals wait for the throttle's delay.
    broker.clock.advance(60)
    return client


def connack(client):
    [packet] = client.received()
    return packet.return_code


def publishes(packets):
    return [(p.topic, p.payload) for p in packets if isinstance(p, P.Publish)]


# Password files.


def test_password_file_written_by_mosquitto_passwd_is_accepted_as_is(tmp_path):
    mosquitto_passwd = require_program("mosquitto_passwd")
    path = tmp_path / "passwd"
    subprocess.run([mosquitto_passwd, "-c", "-b", str(path), "alice", "s3cret"], check=True)
    subprocess.run([mosquitto_passwd, "-H", "sha512", "-b", str(path), "bob", "hunter2"], check=True)
    table = PasswordTable.from_file(path)
    assert table.entries["alice"][0] == "7" and table.entries["bob"][0] == "6"
    assert table.verify("alice", b"s3cret") and table.verify("bob", b"hunter2")
    assert not table.verify("alice", b"hunter2") and not table.verify("carol", b"s3cret")


def test_entries_this_project_writes_verify(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"# a comment\n\nalice:{hash_password('pw', iterations=10)}\n")
    table = PasswordTable.from_file(path)
    assert table.verify("alice", b"pw") and not table.verify("alice", b"pW")


@pytest.mark.parametrize("line", ["alice:plaintext", "alice", ":$7$1$AAAA$AAAA", "bob:$7$x$AAAA$AAAA"])
def test_bad_password_line_names_file_and_line_but_not_the_secret(tmp_path, line):
    path = tmp_path / "passwd"
    path.write_text(f"ok:{hash_password('pw', iterations=1)}\n{line}\n")
    with pytest.raises(AuthConfigError) as e:
        PasswordTable.from_file(path)
    assert f"{path}:2:" in str(e.value)
    assert "plaintext" not in str(e.value)


# Logging in.


@both_versions
def test_right_password_is_accepted(version):
    broker = FakeBroker(passwords={"alice": "s3cret"})
    client = login(broker, "c", version, username="alice", password=b"s3cret")
    assert connack(client) == 0


@both_versions
@pytest.mark.parametrize("username,password", [("alice", b"wrong"), ("mallory", b"s3cret"), ("alice", None)])
def test_wrong_credentials_get_connack_4(version, username, password):
    broker = FakeBroker(passwords={"alice": "s3cret"})
    client = login(broker, "c", version, username=username, password=password)
    assert connack(client) == P.CONNACK_BAD_CREDENTIALS
    assert client.closed
    assert broker.router.stats.logins_refused == 1


@both_versions
def test_no_credentials_where_anonymous_is_off_gets_connack_5(version):
    broker = FakeBroker(passwords={"alice": "s3cret"})
    client = login(broker, "c", version)
    assert connack(client) == P.CONNACK_NOT_AUTHORIZED


def test_anonymous_may_be_allowed_beside_a_password_file():
    broker = FakeBroker(passwords={"alice": "s3cret"}, allow_anonymous=True)
    assert connack(login(broker, "anon")) == 0
    assert connack(login(broker, "bad", username="alice", password=b"x")) == P.CONNACK_BAD_CREDENTIALS


def test_refusals_from_one_address_wait_longer_each_time():
    broker = FakeBroker(passwords={"alice": "s3cret"})
    delays = []
    for _ in range(4):
        client = broker.client(client_id="c", username="alice", password=b"guess")
        waited = 0.0
        while not client.received():
            assert waited < 60, "never answered"
            broker.clock.advance(0.05)
            waited += 0.05
        delays.append(waited)
    assert delays == sorted(delays) and delays[-1] > 4 * delays[0]


def test_packets_sent_with_connect_wait_for_the_login_in_order():
    broker = FakeBroker(passwords={"alice": "s3cret"})
    sub = login(broker, "sub", username="alice", password=b"s3cret")
    sub.received()
    sub.send(P.Subscribe(1, [("t", 0)]))
    sub.received()
    client = broker.client()
    client.send(
        P.Connect(client_id="c", username="alice", password=b"s3cret"),
        P.Publish("t", b"one"),
        P.Publish("t", b"two"),
        P.Pingreq(),
    )
    assert client.received() == [P.Connack(0), P.Pingresp()]
    assert publishes(sub.received()) == [("t", b"one"), ("t", b"two")]


def test_successful_logins_are_cached(monkeypatch):
    broker = FakeBroker(passwords={"alice": "s3cret"})
    calls = []
    original = PasswordTable.verify
    monkeypatch.setattr(PasswordTable, "verify", lambda self, u, p: calls.append(u) or original(self, u, p))
    for i in range(5):
        assert connack(login(broker, f"c{i}", username="alice", password=b"s3cret")) == 0
    assert connack(login(broker, "x", username="alice", password=b"other")) == 4
    assert calls == ["alice", "alice"]


# The ACL.

ACL_LINES = [
    "# anonymous clients",
    "topic read public/#",
    "topic write public/anon",
    "",
    "user alice",
    "topic readwrite alice/#",
    "topic read shared/#",
    "topic deny shared/secret",
    "topic read $SYS/#",
    "",
    "user bob",
    "topic shared/#",
    "",
    "pattern readwrite users/%u/#",
    "pattern write devices/%c/state",
]


def acl():
    return ACL.parse(ACL_LINES)


@pytest.mark.parametrize(
    "user,client_id,topic,read,write",
    [
        (None, "a", "public/x", True, False),
        (None, "a", "public/anon", True, True),
        (None, "a", "alice/x", False, False),
        ("alice", "a", "alice/x/y", True, True),
        ("alice", "a", "shared/x", True, False),
        ("alice", "a", "shared/secret", False, False),
        ("alice", "a", "public/x", False, False),
        ("alice", "a", "$SYS/broker/uptime", True, False),
        ("bob", "b", "shared/secret", True, True),
        ("bob", "b", "alice/x", False, False),
        ("alice", "a", "users/alice/inbox", True, True),
        ("alice", "a", "users/bob/inbox", False, False),
        (None, "a", "users/None/inbox", False, False),
        ("bob", "dev-9", "devices/dev-9/state", False, True),
        ("bob", "dev-9", "devices/dev-8/state", False, False),
    ],
)
def test_acl_matrix(user, client_id, topic, read, write):
    rules = acl()
    assert rules.allows(user, client_id, topic, 1) is read
    assert rules.allows(user, client_id, topic, 2) is write


@pytest.mark.parametrize(
    "user,topic_filter,allowed",
    [
        ("alice", "shared/#", True),
        ("alice", "+/+/x", True),
        ("alice", "#", True),
        ("alice", "other/#", False),
        ("alice", "$SYS/#", True),
        (None, "public/+", True),
        (None, "alice/#", False),
        ("bob", "users/bob/#", True),
        ("bob", "users/+/x", True),
        ("carol", "users/carol/x", True),
        ("carol", "shared/x", False),
    ],
)
def test_acl_subscribe_is_allowed_when_the_filter_can_match_a_readable_topic(user, topic_filter, allowed):
    assert acl().may_subscribe(user, "c", topic_filter) is allowed


@pytest.mark.parametrize(
    "a,b",
    [("a/+", "+/b"), ("a/#", "a"), ("#", "x/y"), ("a/+/c", "a/b/+"), ("$SYS/#", "$SYS/x"), ("+/+", "/x")],
)
def test_filters_that_share_a_topic_intersect(a, b):
    assert filters_intersect(a, b) and filters_intersect(b, a)


@pytest.mark.parametrize("a,b", [("a/+", "b/+"), ("a/b", "a/b/c"), ("+/x", "$SYS/x"), ("#", "$SYS/#"), ("a/+", "a")])
def test_filters_that_share_no_topic_do_not_intersect(a, b):
    assert not filters_intersect(a, b) and not filters_intersect(b, a)


def test_filters_intersect_agrees_with_matching_on_examples():
    filters = ["a/+", "+/b", "a/#", "#", "+/+", "a/b", "+", "a/+/c", "$x/#", "+/#"]
    topics = ["a", "a/b", "b/b", "a/x/c", "$x/y", "a/b/c", "x"]
    for f in filters:
        for g in filters:
            common = any(matches(f, t) and matches(g, t) for t in topics)
            if common:
                assert filters_intersect(f, g), (f, g)


@pytest.mark.parametrize("line", ["topic", "user", "bogus read a", "topic read a/#/b"])
def test_bad_acl_line_names_its_line(line):
    with pytest.raises(AuthConfigError, match="acl:2:"):
        ACL.parse(["topic read ok", line])


def acl_broker():
    return FakeBroker(passwords={"alice": "a", "bob": "b"}, acl=ACL_LINES, allow_anonymous=True)


@both_versions
def test_publish_without_write_access_is_acknowledged_but_not_routed(version):
    broker = acl_broker()
    bob = login(broker, "bob", version, username="bob", password=b"b")
    bob.received()
    bob.send(P.Subscribe(1, [("shared/#", 1)]))
    bob.received()
    alice = login(broker, "alice", version, username="alice", password=b"a")
    alice.received()
    alice.send(P.Publish("shared/x", b"no", 1, message_id=3), P.Publish("shared/x", b"no", 2, message_id=4))
    assert alice.received() == [P.Puback(3), P.Pubrec(4)]
    alice.send(P.Pubrel(4))
    assert alice.received() == [P.Pubcomp(4)]
    assert publishes(bob.received()) == []
    assert broker.router.stats.messages_denied == 2
    assert not alice.closed


def test_v311_subscribe_to_nothing_readable_gets_0x80():
    broker = acl_broker()
    alice = login(broker, "alice", username="alice", password=b"a")
    alice.received()
    alice.send(P.Subscribe(1, [("other/#", 0), ("shared/#", 0), ("+/+/x", 0)]))
    assert alice.received() == [P.Suback(1, [P.SUBACK_FAILURE, 0, 0])]


def test_v31_subscribe_to_nothing_readable_is_granted_but_delivers_nothing():
    broker = acl_broker()
    alice = login(broker, "alice", V31, username="alice", password=b"a")
    alice.received()
    alice.send(P.Subscribe(1, [("other/#", 0)]))
    assert alice.received() == [P.Suback(1, [0])]
    pub = login(broker, "anon")
    pub.send(P.Publish("other/x", b"secret"))
    assert publishes(alice.received()) == []


@both_versions
def test_wildcard_subscription_receives_only_readable_topics(version):
    broker = acl_broker()
    alice = login(broker, "alice", version, username="alice", password=b"a")
    alice.received()
    alice.send(P.Subscribe(1, [("#", 0)]))
    alice.received()
    bob = login(broker, "bob", version, username="bob", password=b"b")
    bob.received()
    for topic in ("shared/x", "shared/secret", "alice/y", "public/x", "users/alice/z"):
        bob.send(P.Publish(topic, topic.encode()))
    assert [t for t, _ in publishes(alice.received())] == ["shared/x"]


@both_versions
def test_retained_messages_obey_the_acl(version):
    broker = acl_broker()
    bob = login(broker, "bob", version, username="bob", password=b"b")
    bob.received()
    for topic in ("shared/x", "shared/secret"):
        bob.send(P.Publish(topic, b"r", retain=True))
    alice = login(broker, "alice", version, username="alice", password=b"a")
    alice.received()
    alice.send(P.Subscribe(1, [("shared/#", 0)]))
    assert [t for t, _ in publishes(alice.received())] == ["shared/x"]


@both_versions
def test_will_on_a_topic_the_client_may_not_write_is_refused_at_connect(version):
    broker = acl_broker()
    client = login(broker, "anon", version, will_topic="shared/x", will_message=b"gone")
    assert connack(client) == P.CONNACK_NOT_AUTHORIZED
    ok = login(broker, "anon2", version, will_topic="public/anon", will_message=b"gone")
    assert connack(ok) == 0


@both_versions
@pytest.mark.parametrize("topic", ["$SYS/broker/uptime", "$SYS", "mqttgw/bridge/central/state", "$analytics/a/1m"])
def test_clients_cannot_write_reserved_topics(version, topic):
    broker = FakeBroker()
    broker.router.access.reserved_topics.add("mqttgw/bridge/central/state")
    watcher = login(broker, "w", version)
    watcher.received()
    watcher.send(P.Subscribe(1, [(topic, 0)]))
    watcher.received()
    client = login(broker, "c", version)
    client.received()
    client.send(P.Publish(topic, b"forged", retain=True))
    assert publishes(watcher.received()) == []
    assert broker.router.retained.get(topic) is None


def test_analytics_writers_may_write_analytics():
    broker = FakeBroker()
    watcher = login(broker, "w")
    watcher.received()
    watcher.send(P.Subscribe(1, [("$analytics/#", 0)]))
    watcher.received()
    pipeline = login(broker, "p", username="mqttgw-pipeline")
    pipeline.received()
    pipeline.send(P.Publish("$analytics/a/1m", b"{}"))
    assert publishes(watcher.received()) == [("$analytics/a/1m", b"{}")]


def test_reloaded_acl_applies_from_the_next_message():
    broker = acl_broker()
    alice = login(broker, "alice", username="alice", password=b"a")
    alice.received()
    alice.send(P.Subscribe(1, [("shared/#", 0)]))
    alice.received()
    bob = login(broker, "bob", username="bob", password=b"b")
    bob.received()
    bob.send(P.Publish("shared/x", b"before"))
    assert publishes(alice.received()) == [("shared/x", b"before")]
    broker.router.access.replace(ACL.parse(["user bob", "topic shared/#"]))
    bob.send(P.Publish("shared/x", b"after"))
    assert publishes(alice.received()) == []
    assert not alice.closed


# python -m mqttgw.passwd


def passwd(*args):
    from mqttgw.passwd import main

    return main([str(a) for a in args])


def test_passwd_creates_updates_and_deletes_entries_mosquitto_can_read(tmp_path):
    path = tmp_path / "passwd"
    assert passwd("-c", "-b", path, "alice", "one") == 0
    assert passwd("-b", path, "bob", "two") == 0
    assert passwd("-b", path, "alice", "three") == 0
    table = PasswordTable.from_file(path)
    assert sorted(table.entries) == ["alice", "bob"]
    assert table.verify("alice", b"three") and table.verify("bob", b"two")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert passwd("-D", path, "bob") == 0
    assert sorted(PasswordTable.from_file(path).entries) == ["alice"]
    assert passwd("-D", path, "bob") == 1


def test_passwd_entries_are_accepted_by_mosquitto(tmp_path):
    from tests.mosquitto_broker import Mosquitto
    from tests.mosquitto_clients import pub

    path = tmp_path / "passwd"
    passwd("-c", "-b", path, "alice", "s3cret")
    broker = Mosquitto(tmp_path / "m", extra=[f"password_file {path}", "allow_anonymous false"]).start()
    try:
        pub(broker.port, "mqttv311", "t", "-m", "x", "-u", "alice", "-P", "s3cret")
        with pytest.raises(subprocess.CalledProcessError):
            pub(broker.port, "mqttv311", "t", "-m", "x", "-u", "alice", "-P", "wrong")
    finally:
        broker.stop()


def test_passwd_hashes_a_plain_text_file(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("# users\nalice:one\nbob:two\n")
    assert passwd("-U", path) == 0
    table = PasswordTable.from_file(path)
    assert table.verify("alice", b"one") and table.verify("bob", b"two")
    assert "one" not in path.read_text()
    assert passwd("-U", path) == 1


def test_a_user_name_is_one_user_in_the_tool_and_the_gateway(tmp_path, capsys):
    # Before: the tool took " alice" for a new user, the gateway read the
    # line as alice's, and the later line replaced her password silently.
    path = tmp_path / "passwd"
    assert passwd("-c", "-b", path, "alice", "one") == 0
    assert passwd("-b", path, " alice", "two") == 1
    assert "spaces at either end" in capsys.readouterr().err
    path.write_text(path.read_text() + " " + path.read_text())
    assert passwd("-D", path, "alice") == 0
    assert path.read_text() == ""
    path.write_text(f"alice:{hash_password('one')}\n bob:{hash_password('x')}\nalice:{hash_password('two')}\n")
    with pytest.raises(AuthConfigError, match=r"passwd:3: user 'alice' is given again \(first at line 1\)"):
        PasswordTable.from_file(path)


def test_passwd_errors_are_one_line(tmp_path, capsys):
    assert passwd("-b", tmp_path / "absent", "alice", "pw") == 1
    assert passwd("-c", "-b", tmp_path / "p", "a:b", "pw") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("mqttgw.passwd: ") for line in err)


# Signed tokens.

SECRET = b"s" * 40


def token(key=SECRET, algorithm="HS256", lifetime=3600, now=1_000_000.0, **claims):
    import jwt

    body = {"sub": "dashboard", "exp": now + lifetime, **claims}
    return jwt.encode(body, key, algorithm=algorithm).encode()


def token_broker(keys=None, **kwargs):
    from mqttgw.security.tokens import TokenKeys

    broker = FakeBroker(tokens=keys or TokenKeys(SECRET, ("HS256",)), **kwargs)
    broker.clock.advance(1_000_000)
    return broker


@both_versions
def test_token_as_password_logs_in_as_its_subject(version):
    broker = token_broker()
    client = login(broker, "c", version, username="ignored", password=token())
    assert connack(client) == 0
    assert client.protocol.username == "dashboard"


@pytest.mark.parametrize(
    "make",
    [
        lambda: token(key=b"x" * 40),
        lambda: token(lifetime=-10),
        lambda: token(algorithm="HS384", key=b"t" * 48),
        lambda: token()[:-4] + b"AAAA",
    ],
    ids=["wrong key", "expired", "wrong key and algorithm", "tampered"],
)
def test_bad_tokens_get_connack_4(make):
    broker = token_broker()
    assert connack(login(broker, "c", username="x", password=make())) == P.CONNACK_BAD_CREDENTIALS


def test_token_without_exp_is_refused():
    import jwt

    broker = token_broker()
    unexpiring = jwt.encode({"sub": "d"}, SECRET, algorithm="HS256").encode()
    assert connack(login(broker, "c", username="x", password=unexpiring)) == P.CONNACK_BAD_CREDENTIALS


def test_rs256_and_es256_tokens_are_checked_with_a_public_key(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    from mqttgw.security.tokens import TokenKeys

    for private, algorithm in (
        (rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"),
        (ec.generate_private_key(ec.SECP256R1()), "ES256"),
    ):
        pem = tmp_path / f"{algorithm}.pem"
        pem.write_bytes(
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        keys = TokenKeys.from_settings("", str(pem))
        assert keys.algorithms == (algorithm,)
        broker = token_broker(keys)
        good = token(key=private, algorithm=algorithm)
        assert connack(login(broker, "c", username="x", password=good)) == 0
        forged = token(key=SECRET, algorithm="HS256")
        assert connack(login(broker, "d", username="x", password=forged)) == P.CONNACK_BAD_CREDENTIALS


def test_token_keys_are_checked_at_start_up(tmp_path):
    from mqttgw.security.tokens import TokenKeys

    short = tmp_path / "short"
    short.write_bytes(b"too short")
    with pytest.raises(AuthConfigError, match="at least 32 bytes"):
        TokenKeys.from_settings(str(short), "")
    with pytest.raises(AuthConfigError, match="not a PEM public key"):
        TokenKeys.from_settings("", str(short))
    with pytest.raises(AuthConfigError, match="cannot read"):
        TokenKeys.from_settings(str(tmp_path / "absent"), "")


def test_read_only_token_receives_its_topics_and_nothing_else():
    broker = token_broker(allow_anonymous=True)
    page = login(broker, "page", username="x", password=token(mqtt_subscribe=["dashboard/#"], mqtt_publish=[]))
    assert connack(page) == 0
    page.send(P.Subscribe(1, [("dashboard/#", 0), ("private/#", 0), ("#", 0)]))
    assert page.received() == [P.Suback(1, [0, P.SUBACK_FAILURE, 0])]
    device = login(broker, "device")
    device.received()
    device.send(P.Publish("dashboard/temp", b"21"), P.Publish("private/x", b"no"))
    assert publishes(page.received()) == [("dashboard/temp", b"21")]
    page.send(P.Publish("dashboard/temp", b"forged", 1, message_id=2))
    assert page.received() == [P.Puback(2)]
    assert broker.router.stats.messages_denied == 1


def test_connection_is_closed_when_its_token_expires():
    broker = token_broker()
    client = login(broker, "c", username="x", password=token(lifetime=3600), keepalive=0)
    assert connack(client) == 0
    broker.clock.advance(3599 - 60)
    assert not client.closed
    broker.clock.advance(2)
    assert client.closed


def test_passwords_still_work_beside_tokens():
    broker = token_broker(passwords={"alice": "s3cret"})
    assert connack(login(broker, "a", username="alice", password=b"s3cret")) == 0
    assert connack(login(broker, "b", username="alice", password=b"nope")) == P.CONNACK_BAD_CREDENTIALS
    assert connack(login(broker, "t", username="x", password=token())) == 0


def test_acl_answer_cache_is_bounded_by_the_length_of_its_topics():
    from mqttgw.broker.access import READ, Access, CachedCheck

    access = Access(ACL.parse(["topic read #"]))
    check = access.checker(None, "c", READ)
    assert isinstance(check, CachedCheck)
    for i in range(5000):
        assert check(f"t/{i}/" + "x" * 100)
    assert 0 < check.cached <= CachedCheck.CACHE_CHARS
    for i in range(100):
        assert check(f"{i}/" + "y" * 60_000)
    assert all(len(t) < 60_000 for t in check.cache)


def test_without_an_acl_only_reserved_topics_are_checked_and_nothing_is_cached():
    from mqttgw.broker.access import READ, WRITE, Access

    access = Access()
    assert access.checker("u", "c", READ) is None
    write = access.checker("u", "c", WRITE)
    assert write("a/b") and not write("$SYS/x")
    assert not hasattr(write, "cache")


# The securing guide's examples (docs/guide/securing.rst).


def guide_block(after):
    """The literal block that follows ``after`` in the securing guide."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "securing.rst").read_text()
    rest = text[text.index(after) + len(after):]
    lines = []
    for line in rest.split("\n")[2:]:
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines).strip() + "\n"


def test_securing_guide_examples_parse(tmp_path):
    from mqttgw.service import config

    for marker in ("its own branch; ``/etc/mqttgw/mqttgw.toml``::", "dashboard's own origin::"):
        path = tmp_path / "example.toml"
        path.write_text(guide_block(marker))
        values = config.load_file(str(path))
        assert any(k.startswith("auth.") for k in values), marker
    rules = ACL.parse(guide_block("``/etc/mqttgw/acl``, in mosquitto's format::").splitlines())
    assert rules.allows("dev1", "sensor-7", "devices/sensor-7/temp", 2)
    assert not rules.allows("dev1", "sensor-7", "devices/sensor-8/temp", 2)
    assert rules.allows("operator", "op", "devices/sensor-7/temp", 1)
    assert not rules.allows("operator", "op", "devices/sensor-7/secrets/key", 1)

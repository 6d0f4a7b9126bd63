"""
An identity owns its session, against a running gateway: two users in a
password file made by ``python -m mqttgw.passwd`` and an ACL; alice keeps a
persistent session on topics only she may read, and messages are queued
for her while she is away.  bob, with her client id, is refused (MQTT
3.1.1 CONNACK 5, 5.0 0x87) and reads nothing, also after a SIGKILL and a
restart, and may not take over her live connection; with
auth.session_owner_mismatch = "new_session" he gets a new session and her
old one is gone.  An ACL reload that takes her read right away keeps what
was queued from her; a session from a store without owners is claimed by
its first login.  Nothing acknowledged is lost on the way.
"""

import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer
from tests.conftest import check_log_is_readable
from tests.gateway import Gateway
from tests.paho import TIMEOUT, PahoClient

PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-2"}
# alice alone reads private/alice/#; bob may write there, not read.
ACL = "user alice\ntopic readwrite private/alice/#\nuser bob\ntopic write private/alice/#\n"
DEVICE = "alice-device"
QUEUED = 5


@pytest.fixture
def auth_files(tmp_path):
    passwd = tmp_path / "passwd"
    for i, (user, password) in enumerate(PASSWORDS.items()):
        flags = ["-c", "-b"] if i == 0 else ["-b"]
        subprocess.run(
            [sys.executable, "-m", "mqttgw.passwd", *flags, str(passwd), user, password],
            check=True,
        )
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return passwd, acl


class Gateways:
    """Gateways on one store (and one port), one after another; logs checked at the end."""

    def __init__(self, tmp_path, auth_files):
        self.tmp_path = tmp_path
        passwd, self.acl = auth_files
        self.args = ["--password-file", str(passwd), "--acl-file", str(self.acl),
                     "--data-dir", str(tmp_path / "data")]
        self.all = []

    def start(self, *extra):
        workdir = self.tmp_path / f"gateway-{len(self.all)}"
        workdir.mkdir()
        args = list(self.args) + list(extra)
        if self.all:
            args += ["--tcp", f"tcp:{self.all[0].port}:interface=127.0.0.1"]
        gw = Gateway(workdir, *args)
        self.all.append(gw)
        return gw

    def check(self):
        for gw in self.all:
            gw.stop()
            log = gw.log()
            assert "Traceback" not in log, log
            check_log_is_readable(log)
            for password in PASSWORDS.values():
                assert password not in log


@pytest.fixture
def gateways(tmp_path, auth_files):
    g = Gateways(tmp_path, auth_files)
    yield g
    g.check()


def client(port, client_id, user, version="MQTTv311", persistent=True):
    c = PahoClient(port, client_id, version, clean_session=not persistent)
    c.client.username_pw_set(user, PASSWORDS[user])
    return c


def session_expiry(version):
    """5.0: a session kept an hour after its connection ends."""
    if version != "MQTTv5":
        return None
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return props


def alice_subscribes_and_leaves(port, version):
    alice = client(port, DEVICE, "alice", version)
    alice.connect(properties=session_expiry(version))
    assert alice.subscribe("private/alice/#", 1) == [1]
    alice.disconnect()


def bob_queues_for_alice(port, n=QUEUED, tag="m"):
    """bob publishes n QoS 1 messages for alice; each is acknowledged (so stored)."""
    bob = client(port, "bob-publisher", "bob", persistent=False)
    bob.connect()
    for i in range(n):
        bob.publish("private/alice/inbox", f"{tag}{i}".encode(), 1)
    bob.disconnect()
    return [f"{tag}{i}".encode() for i in range(n)]


def raw_connect(port, client_id, user, v5=False, clean=False):
    """
    CONNECT on a plain socket: the packets the gateway sends until it
    closes the connection or ``TIMEOUT`` passes, and whether it closed.
    """
    packet = P.Connect(
        client_id,
        P.MQTT_5 if v5 else P.MQTT_311,
        clean_session=clean,
        username=user,
        password=PASSWORDS[user].encode(),
        properties={"session_expiry_interval": 3600} if v5 else None,
    )
    data = b""
    closed = False
    deadline = time.monotonic() + TIMEOUT
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(packet.encode())
        while not closed and len(data) < 1 << 20:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            closed = not chunk
            data += chunk
    framer = Framer(P.MAX_REMAINING_LENGTH + 5)
    framer.from_client = False
    framer.v5 = v5
    return list(framer.feed(data)), closed


def assert_refused(port, user, v5=False, clean=False):
    """``user`` with alice's client id: CONNACK 5 (5.0: 0x87), and nothing else, ever."""
    packets, closed = raw_connect(port, DEVICE, user, v5, clean)
    assert [(type(p).__name__, getattr(p, "return_code", None)) for p in packets] == [
        ("Connack", 0x87 if v5 else 5)
    ], packets
    assert not packets[0].session_present and closed


def alice_resumes(port, version, expected):
    alice = client(port, DEVICE, "alice", version)
    flags = alice.connect(properties=session_expiry(version))
    got = [m.payload for m in alice.receive(len(expected))] if expected else []
    alice.nothing_more(0.5)
    alice.disconnect()
    return flags.session_present, got


@pytest.mark.parametrize("version", ["MQTTv311", "MQTTv5"])
def test_another_user_is_refused_alices_session_and_reads_none_of_it(gateways, version):
    gw = gateways.start()
    alice_subscribes_and_leaves(gw.port, version)
    queued = bob_queues_for_alice(gw.port)
    assert_refused(gw.port, "bob", v5=version == "MQTTv5")
    # A clean session neither gets it nor ends it.
    assert_refused(gw.port, "bob", v5=version == "MQTTv5", clean=True)
    gw.wait_for_log("its session belongs to another identity")
    assert alice_resumes(gw.port, version, queued) == (True, queued)


def test_the_refusal_holds_after_a_sigkill_and_a_restart(gateways):
    gw = gateways.start()
    alice_subscribes_and_leaves(gw.port, "MQTTv311")
    queued = bob_queues_for_alice(gw.port)
    gw.stop(signal.SIGKILL)
    gw = gateways.start()
    gw.wait_for_log("restored 1 persistent session")
    assert_refused(gw.port, "bob")
    assert_refused(gw.port, "bob", v5=True)
    assert alice_resumes(gw.port, "MQTTv311", queued) == (True, queued)


def test_another_user_may_not_take_over_alices_live_connection(gateways):
    gw = gateways.start()
    alice = client(gw.port, DEVICE, "alice")
    alice.connect()
    assert alice.subscribe("private/alice/#", 1) == [1]
    assert_refused(gw.port, "bob")
    assert_refused(gw.port, "bob", v5=True)
    # alice is still there and still served.
    alice.publish("private/alice/note", b"still here", 1)
    assert alice.receive(1)[0].payload == b"still here"
    assert not alice.disconnected.is_set()
    alice.disconnect()


def test_with_new_session_another_user_starts_afresh_and_alices_session_is_gone(gateways):
    gw = gateways.start("--session-owner-mismatch", "new_session")
    gw.wait_for_log("auth.session_owner_mismatch = new_session")
    alice_subscribes_and_leaves(gw.port, "MQTTv311")
    bob_queues_for_alice(gw.port)
    bob = client(gw.port, DEVICE, "bob")
    assert not bob.connect().session_present
    bob.nothing_more(1.0)
    bob.disconnect()
    gw.wait_for_log("discarding the session of client alice-device")
    # bob's own session ends with a clean one; alice finds nothing of hers.
    bob = client(gw.port, DEVICE, "bob", persistent=False)
    bob.connect()
    bob.disconnect()
    assert alice_resumes(gw.port, "MQTTv311", []) == (False, [])


def test_an_acl_reload_keeps_what_was_queued_from_a_reader_who_lost_the_right(gateways):
    gw = gateways.start()
    alice_subscribes_and_leaves(gw.port, "MQTTv311")
    bob_queues_for_alice(gw.port)
    gateways.acl.write_text("user alice\ntopic write private/alice/#\nuser bob\ntopic write private/alice/#\n")
    gw.process.send_signal(signal.SIGHUP)
    gw.wait_for_log("reloaded:")
    assert alice_resumes(gw.port, "MQTTv311", []) == (True, [])
    gw.wait_for_log("it may no longer read that topic")
    gw.stop()
    db = sqlite3.connect(gateways.tmp_path / "data" / "mqttgw.db")
    try:
        assert db.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)
    finally:
        db.close()


def test_a_session_from_a_store_without_owners_is_claimed_by_its_first_login(gateways):
    gw = gateways.start()
    alice_subscribes_and_leaves(gw.port, "MQTTv311")
    queued = bob_queues_for_alice(gw.port)
    gw.stop()
    # The store as the version before owners left it.
    db = sqlite3.connect(gateways.tmp_path / "data" / "mqttgw.db")
    db.executescript(
        "ALTER TABLE sessions DROP COLUMN owner; UPDATE meta SET value = 4 WHERE key = 'schema';"
    )
    db.close()
    gw = gateways.start()
    assert alice_resumes(gw.port, "MQTTv311", queued) == (True, queued)
    gw.wait_for_log("session of client alice-device was stored without an owner: now owned by 'alice'")
    assert gw.log().count("stored without an owner") == 1
    assert_refused(gw.port, "bob")
    more = bob_queues_for_alice(gw.port, tag="after")
    # And after a restart, still hers.
    gw.stop(signal.SIGKILL)
    gw = gateways.start()
    assert_refused(gw.port, "bob")
    assert alice_resumes(gw.port, "MQTTv311", more) == (True, more)
    assert "stored without an owner" not in gw.log()

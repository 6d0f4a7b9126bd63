"""
The login throttle's arithmetic and table, in-process; the stand-in hash
of unknown users; the log of refusals.  The same behaviour from outside,
against a running gateway, is in test_login_flood.py.
"""

import hashlib
import tracemalloc

from pytest import approx

from twisted.internet.task import Clock
from twisted.logger import Logger

from mqttgw.broker.logsummary import BySource
from mqttgw.security.passwords import PasswordTable, hash_password, parse_entry
from mqttgw.security.throttle import ConnectionRate, Throttle, address_key


class Now:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def fail(throttle, host, username=None):
    """One refused login from ``host``: the delay before its answer."""
    return throttle.answer(throttle.begin(host, username), False)


def test_a_hundred_thousand_failures_neither_overflow_nor_grow_the_count():
    # Before: first * 2**n raised OverflowError from the 1,025th failure.
    now = Now()
    throttle = Throttle(0.1, 10.0, seconds=now)
    for _ in range(10**5):
        delay = fail(throttle, "10.0.0.1")
        now.t += delay
    assert delay == 10.0
    assert throttle.most_failures == 8
    assert throttle._records["10.0.0.1"].failures == 8


def test_the_table_keeps_at_most_its_size_at_a_bounded_cost():
    now = Now()
    throttle = Throttle(size=1000, seconds=now)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5000):
            login = throttle.begin(f"10.0.{i >> 8}.{i & 255}", f"user-{i:06d}")
            throttle.answer(login, False)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(throttle) == 1000
    # Each remembered address or user name, its answer time included.
    assert used / len(throttle) < 600, used


def test_parallel_failures_are_answered_one_after_another():
    now = Now()
    throttle = Throttle(0.1, 10.0, max_waiting=16, seconds=now)
    logins = [throttle.begin(f"10.0.0.{i}", "alice") for i in range(10)]
    delays = [throttle.answer(login, False) for login in logins]
    # Each waits for the answers before it: 0.1, 0.1+0.2, 0.1+0.2+0.4, ...
    assert delays == sorted(delays) and len(set(delays)) == 10
    assert delays[:3] == approx([0.1, 0.1 + 0.2, 0.1 + 0.2 + 0.4])
    assert delays[-1] > 10.0


def test_a_right_guess_among_parallel_ones_waits_for_those_before_it():
    now = Now()
    throttle = Throttle(0.1, 10.0, seconds=now)
    wrong = [throttle.begin(f"10.0.0.{i}", "alice") for i in range(5)]
    right = throttle.begin("10.0.0.99", "alice")
    for login in wrong:
        throttle.answer(login, False)
    # The success of another user from an address that failed is not held.
    other = throttle.begin("10.0.0.1", "bob")
    assert throttle.answer(right, True) == approx(0.1 + 0.2 + 0.4 + 0.8 + 1.6)
    assert throttle.answer(other, True) == 0


def test_a_success_is_held_at_most_the_longest_delay():
    now = Now()
    throttle = Throttle(0.1, 10.0, max_waiting_per_user=100, seconds=now)
    for i in range(50):
        throttle.answer(throttle.begin(f"10.0.1.{i}", "alice"), False)
    assert throttle.answer(throttle.begin("10.0.0.1", "alice"), True) == approx(10.0)


def test_a_good_login_does_not_clear_the_failures_of_others():
    # Before: any success from the address forgot its failures.
    now = Now()
    throttle = Throttle(0.1, 10.0, seconds=now)
    for _ in range(5):
        now.t += throttle.answer(throttle.begin("10.0.0.1", "mallory"), False)
    now.t += 1
    assert throttle.answer(throttle.begin("10.0.0.1", "alice"), True) == 0
    assert fail(throttle, "10.0.0.1") == approx(3.2)
    now.t += 4
    assert fail(throttle, "10.0.0.1") == approx(6.4)


def test_failures_are_forgotten_in_time():
    now = Now()
    throttle = Throttle(0.1, 10.0, forget_after=600, seconds=now)
    for _ in range(5):
        now.t += fail(throttle, "10.0.0.1")
    now.t += 601
    assert fail(throttle, "10.0.0.1") == approx(0.1)


def test_logins_waiting_are_bounded_per_address_and_per_user():
    now = Now()
    throttle = Throttle(0.1, 10.0, max_waiting=4, max_waiting_per_user=4, seconds=now)
    held = [throttle.begin("10.0.0.1", f"u{i}") for i in range(4)]
    assert None not in held
    assert throttle.begin("10.0.0.1", "another") is None
    assert throttle.begin("10.0.0.1") is None
    # Per user name, across addresses.
    users = [throttle.begin(f"10.0.1.{i}", "alice") for i in range(4)]
    assert None not in users and throttle.begin("10.0.2.1", "alice") is None
    # A login gone before its check frees its place at once ...
    throttle.release(held[0])
    assert throttle.begin("10.0.0.1", "another") is not None
    # ... a refused one once its answer is due.
    delays = [throttle.answer(login, False) for login in held[1:]]
    assert throttle.begin("10.0.0.1", "x") is None
    now.t += delays[0]
    assert throttle.begin("10.0.0.1", "x") is not None


def test_no_answer_is_due_beyond_the_user_waiting_bound_times_the_longest_delay():
    now = Now()
    throttle = Throttle(0.1, 10.0, max_waiting=4, max_waiting_per_user=4, seconds=now)
    answered = 0
    for _ in range(1000):
        login = throttle.begin("10.0.0.1", "alice")
        if login is None:
            now.t += 0.5  # all its places taken: time passes
            continue
        assert throttle.answer(login, False) <= 40.0
        answered += 1
    assert answered > 20


def test_ipv6_addresses_count_by_their_64():
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::7") == "2001:db8:1:2::/64"
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert address_key("10.0.0.1") == "10.0.0.1"


def test_connection_rate_per_address_loopback_exempt_unless_asked():
    now = Now()
    rate = ConnectionRate(2.0, seconds=now)
    assert [rate.allows("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert rate.allows("10.0.0.2")
    assert all(rate.allows("127.0.0.1") for _ in range(100))
    now.t += 0.5
    assert rate.allows("10.0.0.1") and not rate.allows("10.0.0.1")
    strict = ConnectionRate(2.0, loopback=True, seconds=now)
    assert [strict.allows("127.0.0.1") for _ in range(3)] == [True, True, False]
    assert all(ConnectionRate(0.0).allows("10.0.0.1") for _ in range(100))


class Collected:
    def __init__(self):
        self.lines = []

    def __call__(self, event):
        from twisted.logger import formatEvent

        self.lines.append(formatEvent(event))


def test_refusals_are_logged_once_per_address_per_interval_with_a_count():
    clock = Clock()
    lines = Collected()
    log = BySource(Logger(observer=lines), clock, "{count} more from {source}: {reason}", 10.0, size=2)
    for i in range(1000):
        log.info("10.0.0.1", "refused {source}: {reason}", source="10.0.0.1", reason=f"r{i}")
    log.info("10.0.0.2", "refused {source}: {reason}", source="10.0.0.2", reason="x")
    # A third address is counted with the others beyond the table's bound.
    for _ in range(5):
        log.info("10.0.0.3", "refused {source}: {reason}", source="10.0.0.3", reason="y")
    assert lines.lines == ["refused 10.0.0.1: r0", "refused 10.0.0.2: x", "refused 10.0.0.3: y"]
    clock.advance(10)
    assert lines.lines[3:] == ["999 more from 10.0.0.1: r999", "4 more from other addresses: y"]
    # Still busy: counted in the next interval too, then forgotten.
    log.info("10.0.0.1", "refused {source}: {reason}", source="10.0.0.1", reason="z")
    clock.advance(10)
    assert lines.lines[5:] == ["1 more from 10.0.0.1: z"]
    clock.advance(10)
    assert len(lines.lines) == 6 and not clock.getDelayedCalls()


def test_an_unknown_user_costs_the_hash_of_the_password_files_entries(tmp_path, monkeypatch):
    # Before: the stand-in did 20,000 PBKDF2 iterations whatever the file's
    # entries did (mosquitto_passwd writes 101).
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('s3cret', iterations=101)}\nbob:{hash_password('x', iterations=101)}\n")
    table = PasswordTable.from_file(path)
    done = []
    real = hashlib.pbkdf2_hmac

    def counted(name, password, salt, iterations, *rest):
        done.append((name, len(salt), iterations))
        return real(name, password, salt, iterations, *rest)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    assert not table.verify("alice", b"wrong")
    assert not table.verify("nobody", b"wrong")
    assert done == [("sha512", 12, 101), ("sha512", 12, 101)]
    # Whatever the parameters, and again at reload.
    path.write_text(f"carol:{hash_password('s3cret', iterations=7, salt=b'0123456789abcdef')}\n")
    done.clear()
    reloaded = PasswordTable.from_file(path)
    assert not reloaded.verify("carol", b"wrong") and not reloaded.verify("nobody", b"wrong")
    assert done == [("sha512", 16, 7), ("sha512", 16, 7)]


def test_an_unknown_user_of_a_sha512_file_costs_a_sha512(tmp_path, monkeypatch):
    entry = "$6$" + "c2FsdHNhbHQ=" + "$" + "A" * 86 + "=="
    assert parse_entry(entry) is not None
    path = tmp_path / "passwd"
    path.write_text(f"old:{entry}\n")
    table = PasswordTable.from_file(path)
    assert table.stand_in[:2] == ("6", 0)
    pbkdf2 = []
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", lambda *a: pbkdf2.append(a))
    assert not table.verify("nobody", b"x")
    assert pbkdf2 == []


def test_a_login_past_the_waiting_bound_gets_server_busy_unchecked():
    from mqttgw.testing import FakeBroker
    from mqttgw.wire import packets as P
    from mqttgw.wire import reasons as R

    broker = FakeBroker(passwords={"alice": "right"})
    broker.factory.throttle = Throttle(0.1, 10.0, max_waiting=1, seconds=broker.clock.seconds)
    waiting = broker.client(client_id="a", username="alice", password=b"wrong")
    assert waiting.received() == []
    # Its answer is due in 0.1 s: meanwhile the address and user are full.
    busy = broker.client(client_id="b", username="alice", password=b"right")
    assert busy.received() == [P.Connack(3)] and busy.closed
    busy5 = broker.client(
        client_id="c", username="bob", password=b"x", protocol_level=P.MQTT_5
    )
    [connack] = busy5.received()
    assert connack.return_code == R.SERVER_BUSY and busy5.closed
    broker.clock.advance(0.1)
    assert waiting.received() == [P.Connack(4)]
    assert broker.client(client_id="d", username="alice", password=b"right").received() == [P.Connack(0)]


def test_idle_connections_past_their_connect_deadline_are_logged_once_per_address():
    from mqttgw.testing import FakeBroker

    broker = FakeBroker(connect_timeout=5)
    lines = Collected()
    broker.factory.refusals = BySource(
        Logger(observer=lines), broker.clock, "{count} more from {source}: {reason}", 10.0
    )
    idle = [broker.client() for _ in range(100)]
    broker.clock.advance(5)
    assert all(client.closed for client in idle)
    broker.clock.advance(10)
    assert len(lines.lines) == 2 and lines.lines[1] == "99 more from 127.0.0.1: no CONNECT in time", lines.lines


def test_a_site_behind_one_address_logs_in_at_once_up_to_the_address_bound():
    now = Now()
    throttle = Throttle(max_waiting=256, max_waiting_per_user=16, seconds=now)
    fleet = [throttle.begin("192.0.2.1", f"device-{i}") for i in range(256)]
    assert None not in fleet
    assert throttle.begin("192.0.2.1", "device-256") is None
    assert all(throttle.answer(login, True) == 0 for login in fleet)
    assert throttle.begin("192.0.2.1", "device-256") is not None

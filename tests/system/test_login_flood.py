"""
Logins under floods, from the outside: a running gateway, raw sockets from
chosen loopback addresses (127.0.0.2 floods, the neighbour is 127.0.0.1).
The throttle's arithmetic and table are tested in-process in
test_throttle.py; the same flood beside mosquitto is bench/flood.py.
"""

import os
import socket
import time

from bench.flood import Neighbour, flood, login
from mqttgw.security.passwords import hash_password
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer

PASSWORD = "right-password"
FLOODER = "127.0.0.2"
# Short delays keep the test short; the bounds are what is checked.
FAST_THROTTLE = ("--login-delay", "0.01", "--max-login-delay", "0.1", "--refusal-interval", "1")


def password_file(tmp_path, *users):
    path = tmp_path / "passwd"
    # mosquitto_passwd's 101 iterations: hashing is not what is measured.
    path.write_text("".join(f"{user}:{hash_password(PASSWORD, iterations=101)}\n" for user in users))
    return str(path)


def refusals_logged(gateway, address):
    return [line for line in gateway.log().splitlines() if address in line and "refus" in line]


def test_a_connect_flood_from_one_address_is_answered_logged_in_a_few_lines_and_a_good_login_follows(
    tmp_path, gateway_with
):
    # Before: from the 1,025th refusal on, OverflowError in the throttle:
    # a traceback per connection, and those CONNECTs never answered.
    gateway = gateway_with(
        "--password-file", password_file(tmp_path, "neighbour", "good"), *FAST_THROTTLE,
        "--max-waiting-logins", "16",
    )
    neighbour = Neighbour(gateway.port, "neighbour", PASSWORD, interval=0.05)
    try:
        before = gateway.log_path.stat().st_size
        mark = neighbour.mark()
        answers = flood(gateway.port, 2000, concurrency=50, patience=10, timeout=120)
        answers.pop("seconds")
        # Every CONNECT answered: refused (5: anonymous), or refused unchecked
        # past the waiting bound (3: server unavailable); none left hanging.
        assert set(answers) <= {"connack 5", "connack 3"}, answers
        assert sum(answers.values()) == 2000 and answers.get("connack 3", 0) > 0, answers
        # The neighbour was answered throughout, and still is.
        assert neighbour.since(mark) and neighbour.missed == 0
    finally:
        neighbour.stop()
    # A good login from the flooding address, once: CONNACK 0, not a hang.
    assert login(gateway.port, "good", PASSWORD, source=FLOODER, timeout=10) == 0
    # The refusals are summed up once per address per interval.
    gateway.wait_for_log(f"more from {FLOODER}", timeout=15)
    lines = refusals_logged(gateway, FLOODER)
    assert len(lines) <= 10, lines
    written = gateway.log_path.stat().st_size - before
    assert written / 2000 < 2, written
    assert "Traceback" not in gateway.log()


def test_parallel_guesses_for_one_user_are_throttled_across_addresses(tmp_path, gateway_with):
    # Before: 100 parallel guesses were all checked and answered at once,
    # the right one with CONNACK 0 among them.
    gateway = gateway_with(
        "--password-file", password_file(tmp_path, "alice"),
        "--max-waiting-logins-per-user", "8", "--login-delay", "0.01", "--max-login-delay", "0.2",
    )
    socks = []
    try:
        for i in range(100):
            sock = socket.socket()
            socks.append(sock)
            # Ten addresses, ten guesses each: the address bound alone would not hold them.
            sock.bind((f"127.0.0.{10 + i % 10}", 0))
            sock.settimeout(10)
            sock.connect(("127.0.0.1", gateway.port))
        for i, sock in enumerate(socks):
            guess = PASSWORD if i == 50 else f"guess-{i}"
            sock.sendall(P.Connect(client_id="", username="alice", password=guess.encode()).encode())
        codes = []
        deadline = time.monotonic() + 60
        for sock in socks:
            framer = Framer(1024)
            packets = []
            while not packets and time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    data = sock.recv(64)
                except OSError:
                    break
                if not data:
                    break
                packets = list(framer.feed(data))
            codes.append(packets[0].return_code if packets else None)
    finally:
        for sock in socks:
            sock.close()
    assert None not in codes, codes
    checked = [c for c in codes if c in (0, 4)]
    busy = codes.count(3)
    # At most the bound's worth checked at once (a few more as earlier
    # answers came due); the rest refused unchecked, telling nothing.
    assert len(checked) + busy == 100, codes
    assert len(checked) < 40 and busy > 60, codes


def test_max_connection_rate_closes_connections_past_it_before_a_packet(tmp_path, gateway_with):
    # Before: no such setting (the gateway refused the flag).
    gateway = gateway_with(
        "--max-connection-rate", "5", "--connection-rate-loopback", "--refusal-interval", "1"
    )
    answers = flood(gateway.port, 100, source="127.0.0.3", concurrency=10, patience=10, timeout=60)
    seconds = answers.pop("seconds")
    accepted = answers.get("connack 0", 0)
    # A burst of 5, then 5 a second; the rest closed without an answer.
    assert accepted <= 5 + 5 * seconds + 1, answers
    assert answers.get("closed", 0) == 100 - accepted and "unanswered" not in answers, answers
    # Another address has a rate of its own.
    assert flood(gateway.port, 3, source="127.0.0.4")["connack 0"] == 3
    gateway.wait_for_log("more from 127.0.0.3", timeout=15)
    lines = refusals_logged(gateway, "127.0.0.3")
    assert len(lines) <= 3 and "max_connection_rate" in lines[0], lines


def test_max_connection_rate_spares_loopback_unless_asked(tmp_path, gateway_with):
    gateway = gateway_with("--max-connection-rate", "5")
    answers = flood(gateway.port, 50, source="127.0.0.3", concurrency=10, patience=10, timeout=60)
    assert answers.get("connack 0") == 50, answers


def _cpu_seconds(pid):
    """The process's CPU time so far, every thread's (utime + stime)."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_unknown_user_costs_the_gateway_what_a_known_users_wrong_password_does(tmp_path, gateway_with):
    # Before: a known user's wrong password was checked against the file's
    # hash (here 100,000 iterations), an unknown user's against a fixed
    # 20,000: the difference in the answer's time told who exists.  What is
    # compared is the work the gateway does (its CPU time), not a latency.
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password(PASSWORD, iterations=100_000)}\n")
    gateway = gateway_with("--password-file", str(path), *FAST_THROTTLE)
    logins = 12

    def cpu_for(username):
        before = _cpu_seconds(gateway.process.pid)
        for n in range(logins):
            # One address per login: the answers wait for no earlier failure.
            source = f"127.0.{10 + (username == 'alice')}.{n + 1}"
            assert login(gateway.port, username, "wrong", source=source, timeout=30) == 4
        return _cpu_seconds(gateway.process.pid) - before

    known, unknown = cpu_for("alice"), cpu_for("nobody")
    # Each batch costs about twelve 100,000-iteration hashes (over a second
    # here); the old stand-in made the unknown batch a fifth of the known.
    assert 0.6 < unknown / known < 1.6, (known, unknown)

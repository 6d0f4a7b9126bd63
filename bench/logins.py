"""
The authentication scenarios: 200 clients logging in with passwords at
once (connects per second, and a probe's round trips meanwhile: hashing
must not stall the broker), and the fan-in rates with a 1,000-rule ACL
loaded.  mqttgw and mosquitto read the very same password file and ACL.
"""

import statistics
import threading
import time

from bench import hostile
from bench.percentile import nearest_rank
from mqttgw.security.passwords import hash_password
from mqttgw.wire import packets as P

USERS = 200
PASSWORD = "bench-password"
ACL_RULES = 1000


def write_files(directory):
    """A password file of USERS users (and the probe), and an ACL of ACL_RULES rules."""
    entry = hash_password(PASSWORD)
    # One hash for all: the broker still computes it once per login.
    lines = [f"u{i}:{entry}" for i in range(USERS)] + [f"probe:{entry}"]
    passwords = directory / "passwd"
    passwords.write_text("\n".join(lines) + "\n")
    acl = directory / "acl"
    rules = [f"topic readwrite other/{i}/#" for i in range(ACL_RULES - 2)]
    acl.write_text(
        "# anonymous clients (the load generator)\n"
        + "\n".join(rules)
        + "\ntopic readwrite bench/#\ntopic readwrite probe/#\n"
    )
    return {"password_file": str(passwords), "acl_file": str(acl)}


def _probe(port, stop, results):
    sock = hostile.connection(port)
    framer = hostile.Framer(P.MAX_REMAINING_LENGTH + 5)
    sock.sendall(P.Connect(client_id="probe", username="probe", password=PASSWORD.encode()).encode())
    hostile.recv_packets(sock, framer, 1)
    sock.sendall(P.Subscribe(1, [("probe/t", 0)]).encode())
    hostile.recv_packets(sock, framer, 1)
    results.append(None)  # ready
    while not stop.is_set():
        started = time.perf_counter()
        sock.sendall(P.Publish("probe/t", b"p").encode())
        if hostile.recv_packets(sock, framer, 1, timeout=10):
            results.append(time.perf_counter() - started)
        time.sleep(0.005)
    sock.close()


def login_burst(port, count, timeout=60):
    """``count`` clients logging in at once; (CONNACKs accepted, seconds)."""
    started = time.perf_counter()
    accepted = hostile.reconnect_storm(
        port,
        None,
        count,
        timeout,
        lambda i: P.Connect(client_id=f"c{i}", username=f"u{i}", password=PASSWORD.encode()),
    )
    return accepted, time.perf_counter() - started


def run(broker):
    stop = threading.Event()
    rtts = []
    probe = threading.Thread(target=_probe, args=(broker.port, stop, rtts), daemon=True)
    probe.start()
    deadline = time.monotonic() + 10
    while not rtts and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    before = len(rtts)
    accepted, elapsed = login_burst(broker.port, USERS)
    during = [r for r in rtts[before:] if r is not None]
    stop.set()
    probe.join(15)
    values = sorted(during)
    return {
        "logins": accepted,
        "seconds": round(elapsed, 3),
        "connects_per_second": accepted / elapsed if elapsed else 0.0,
        "probe_round_trips": len(values),
        "probe_p50_ms": statistics.median(values) * 1000 if values else None,
        "probe_p99_ms": nearest_rank(values, 0.99) * 1000 if values else None,
    }

"""
A gateway killed while its store could not be written starts again, from
outside (issue 54): its data directory on a small filesystem of its own
(a tmpfs, mounted by the test as root) that fills, or is mounted
read-only, around a SIGKILL.  It starts degraded within START_BOUND,
delivers what it held to its returning persistent client, refuses what
needs a write as a running gateway does, takes QoS 1 again within
RECOVERY_BOUND of the space coming back, and loses nothing acknowledged.
"""

import errno
import json
import os
import signal
import subprocess
import time

import pytest

from mqttgw.wire import packets as P
from tests.conftest import cannot_run, check_log_is_readable, require_program
from tests.gateway import Gateway
from tests.network import free_port, http, raw_connect, wait_until
from tests.paho import PahoClient

# Issue 54's bounds, in seconds: from the start to serving, degraded; from
# space freed to a QoS 1 publish acknowledged.
START_BOUND = 5.0
RECOVERY_BOUND = 2.0
QUEUED = 40
# Payload bytes: QUEUED of them in the -wal are more than the database
# file holds, so a checkpoint at start-up has to grow it on the full disk.
PAYLOAD = 4000


class SmallFilesystem:
    """A tmpfs of ``size`` at ``mount_point``; gateways run on a data directory in it."""

    def __init__(self, tmp_path, mount, umount, size="16m"):
        self.tmp_path = tmp_path
        self.mount_point = tmp_path / "fs"
        self.mount_point.mkdir()
        self.data = self.mount_point / "data"
        self._mount, self._umount = mount, umount
        done = subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(self.mount_point)],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            cannot_run(f"a tmpfs cannot be mounted here: {done.stderr.strip()}")
        self.http_port = free_port()
        self.gateways = []

    def start(self, timeout=30):
        workdir = self.tmp_path / f"gateway-{len(self.gateways)}"
        workdir.mkdir()
        gw = Gateway(workdir, "--data-dir", str(self.data), "--http", str(self.http_port), timeout=timeout)
        self.gateways.append(gw)
        return gw

    def fill(self):
        """Write a file until the filesystem takes no more (bounded: it is small)."""
        fd = os.open(self.mount_point / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 1 << 16, 4096, 512, 1):
                chunk = b"\0" * size
                for _ in range(1 << 10):
                    try:
                        os.write(fd, chunk)
                    except OSError as e:
                        assert e.errno == errno.ENOSPC, e
                        break
        finally:
            os.close(fd)
        assert os.statvfs(self.mount_point).f_bavail == 0

    def free(self):
        os.unlink(self.mount_point / "filler")

    def remount(self, options):
        subprocess.run([self._mount, "-o", f"remount,{options}", str(self.mount_point)], check=True)

    def close(self):
        for gw in self.gateways:
            gw.stop(signal.SIGKILL)
        done = subprocess.run([self._umount, str(self.mount_point)], capture_output=True)
        if done.returncode != 0:
            subprocess.run([self._umount, "-l", str(self.mount_point)], check=True)


@pytest.fixture
def small_filesystem(tmp_path):
    if os.geteuid() != 0:
        cannot_run("mounting a filesystem for the data directory needs root")
    fs = SmallFilesystem(tmp_path, require_program("mount"), require_program("umount"))
    try:
        yield fs
    finally:
        fs.close()


def publish(port, mid, payload, timeout=10.0):
    """
    One QoS 1 publish to keep/<mid> on a new connection: True once its
    PUBACK came, False if the connection closed (or ``timeout`` ran out)
    instead.
    """
    sock, code = raw_connect(port, "pub")
    assert code == 0
    try:
        sock.settimeout(max(timeout, 0.01))
        sock.sendall(P.Publish(f"keep/{mid}", payload, 1, message_id=mid).encode())
        got = b""
        while len(got) < 4:
            chunk = sock.recv(4 - len(got))
            if not chunk:
                return False
            got += chunk
        assert got == b"\x40\x02" + mid.to_bytes(2, "big"), got
        return True
    except (ConnectionResetError, TimeoutError):
        return False
    finally:
        sock.close()


def payload(mid):
    return b"%d:" % mid + b"." * PAYLOAD


def queue_for_keeper(gw, first, n):
    """``n`` acknowledged QoS 1 messages queued for the keeper, away: their payloads."""
    sent = set()
    for mid in range(first, first + n):
        assert publish(gw.port, mid, payload(mid))
        sent.add(payload(mid))
    return sent


def keeper(gw):
    """The persistent client, subscribed to keep/#, connected: (client, session present)."""
    client = PahoClient(gw.port, "keeper", "MQTTv311", clean_session=False)
    flags = client.connect()
    client.subscribe("keep/#", 1)
    return client, flags.session_present


def receive_all(client, expected, extra=0):
    """What ``client`` receives until it has every payload in ``expected`` (duplicates allowed)."""
    got = set()
    for _ in range(len(expected) + extra + 20):
        if expected <= got:
            break
        got.add(client.receive(1)[0].payload)
    assert expected <= got, sorted(expected - got)[:3]
    return got


def accepted_again(gw, mid, since):
    """Publishes until one is acknowledged, within RECOVERY_BOUND of ``since``: its payload."""
    deadline = since + RECOVERY_BOUND
    for _ in range(1000):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if publish(gw.port, mid, payload(mid), timeout=left):
            assert time.monotonic() - since <= RECOVERY_BOUND
            return payload(mid)
        time.sleep(0.02)
    raise AssertionError(f"no QoS 1 publish acknowledged within {RECOVERY_BOUND}s:\n{gw.log()}")


def started_degraded(fs, reason):
    """Start a gateway that must serve, degraded, within START_BOUND: it."""
    began = time.monotonic()
    gw = fs.start(timeout=START_BOUND)
    gw.wait_for_log("started degraded", timeout=max(began + START_BOUND - time.monotonic(), 0.05))
    [line] = [l for l in gw.log().splitlines() if "started degraded" in l]
    assert "[mqttgw.broker.store#critical]" in line and reason in line, line
    status, body = http(fs.http_port, "/readyz")
    assert status == 503 and "store cannot be written" in json.loads(body)["reasons"][0]
    return gw


def refuses_what_needs_a_write(gw):
    """As a running gateway whose store fails: no PUBACK, and no new persistent session."""
    assert not publish(gw.port, 999, b"needs the store")
    sock, code = raw_connect(gw.port, "newcomer", clean_session=False)
    sock.close()
    assert code == P.CONNACK_SERVER_UNAVAILABLE


def holds_everything(fs, owed):
    """
    A normal start after a SIGKILL: the keeper gets every payload it is
    ``owed`` (and again some it had: at least once); what it got.
    """
    gw = fs.start()
    client, present = keeper(gw)
    assert present
    got = receive_all(client, owed, extra=QUEUED)
    client.disconnect()
    assert "started degraded" not in gw.log()
    assert http(fs.http_port, "/readyz")[0] == 200
    gw.stop()
    assert "Traceback" not in gw.log(), gw.log()
    check_log_is_readable(gw.log())
    return got


def test_a_gateway_killed_on_a_full_disk_starts_degraded_serves_and_recovers(small_filesystem):
    fs = small_filesystem
    gw = fs.start()
    client, _ = keeper(gw)
    client.disconnect()
    acknowledged = queue_for_keeper(gw, 1, QUEUED)
    fs.fill()
    # The running gateway sees it (a probe cannot write), then is killed.
    wait_until(lambda: http(fs.http_port, "/readyz")[0] == 503, what="/readyz 503 on the full disk")
    gw.stop(signal.SIGKILL)
    fs.fill()

    again = started_degraded(fs, "database or disk is full")
    client, present = keeper(again)
    assert present
    received = receive_all(client, acknowledged)
    refuses_what_needs_a_write(again)

    fs.free()
    later = accepted_again(again, 500, time.monotonic())
    acknowledged.add(later)
    # The keeper, still connected, gets it; and what is acknowledged now
    # outlives a SIGKILL, as everything before.
    received |= receive_all(client, {later})
    again.wait_for_log("writable again")
    client.disconnect()
    owed = queue_for_keeper(again, 600, 5)
    acknowledged |= owed
    again.stop(signal.SIGKILL)
    assert "Traceback" not in again.log(), again.log()
    received |= holds_everything(fs, owed)
    assert acknowledged <= received


def test_a_gateway_killed_then_mounted_read_only_starts_degraded_serves_and_recovers(small_filesystem):
    fs = small_filesystem
    gw = fs.start()
    client, _ = keeper(gw)
    client.disconnect()
    acknowledged = queue_for_keeper(gw, 1, QUEUED)
    gw.stop(signal.SIGKILL)
    fs.remount("ro")

    again = started_degraded(fs, "readonly database")
    # The admin socket cannot be made in the data directory: the gateway
    # goes on without it (the admin listener answers, as above).
    again.wait_for_log("admin.sock: cannot listen: Read-only file system; going on without it")
    client, present = keeper(again)
    assert present
    received = receive_all(client, acknowledged)
    refuses_what_needs_a_write(again)

    fs.remount("rw")
    later = accepted_again(again, 500, time.monotonic())
    acknowledged.add(later)
    received |= receive_all(client, {later})
    client.disconnect()
    owed = queue_for_keeper(again, 600, 5)
    acknowledged |= owed
    again.stop()
    assert "Traceback" not in again.log(), again.log()
    received |= holds_everything(fs, owed)
    assert acknowledged <= received

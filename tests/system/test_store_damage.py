"""
A store damaged behind the gateway's back, from the outside: emptied, its
-wal lost after a SIGKILL, its files or directory removed while it runs.
Start-up refuses what lost acknowledged messages (one line naming the
file), ``--store-recover`` sets it aside, and a store removed while
running stops acknowledging until it is made again, losing nothing.
"""

import json
import re
import os
import signal
import sqlite3
import stat
import subprocess

from mqttgw.wire import packets as P
from tests.gateway import TWISTD, Gateway, gateway_env
from tests.network import free_port, http, raw_connect, wait_until
from tests.paho import PahoClient


def start(workdir, data, *args):
    workdir.mkdir(exist_ok=True)
    return Gateway(workdir, "--data-dir", str(data), *args)


def keeper(port, clean_session=False):
    """A persistent subscriber to keep/#: whatever is published there is stored for it."""
    client = PahoClient(port, "keeper", "MQTTv311", clean_session=clean_session)
    flags = client.connect()
    client.subscribe("keep/#", 1)
    return client, flags


def acknowledged(sock, payload, mid, retain=False):
    """Publish at QoS 1: True once its PUBACK came, False if the connection closed instead."""
    sock.sendall(P.Publish(f"keep/{mid}", payload, 1, retain=retain, message_id=mid).encode())
    sock.settimeout(10)
    got = b""
    while len(got) < 4:
        try:
            chunk = sock.recv(4 - len(got))
        except ConnectionResetError:
            return False
        if not chunk:
            return False
        got += chunk
    assert got == b"\x40\x02" + mid.to_bytes(2, "big"), got
    return True


def publisher(port, client_id="pub"):
    sock, code = raw_connect(port, client_id)
    assert code == 0
    return sock


def publish_acknowledged(port, first, n, retain_last=False):
    """``n`` QoS 1 publishes to keep/..., each acknowledged: their payloads."""
    sock = publisher(port)
    payloads = set()
    for mid in range(first, first + n):
        payload = f"m{mid}".encode()
        assert acknowledged(sock, payload, mid, retain=retain_last and mid == first + n - 1)
        payloads.add(payload)
    sock.close()
    return payloads


def received_all(port, expected):
    """The keeper's session after a restart holds every payload in ``expected``."""
    client, flags = keeper(port)
    assert flags.session_present
    got = set()
    for _ in range(len(expected) + 20):
        if expected <= got:
            break
        got.add(client.receive(1)[0].payload)
    client.disconnect()
    assert expected <= got, sorted(expected - got)


def refused(workdir, data, *args):
    """Start the gateway on ``data``: (exit code, stderr); None for either if it ran."""
    try:
        out = subprocess.run(
            [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--tcp", "tcp:0:interface=127.0.0.1",
             "--data-dir", str(data), *args],
            capture_output=True, text=True, cwd=workdir, timeout=30, env=gateway_env(),
        )
    except subprocess.TimeoutExpired:
        return None, None
    return out.returncode, out.stderr


def a_store_with_messages(tmp_path, data):
    """A gateway whose store holds a session with 30 queued messages and a retained one."""
    gw = start(tmp_path / "first", data)
    client, _ = keeper(gw.port)
    client.disconnect()
    publish_acknowledged(gw.port, 1, 30, retain_last=True)
    return gw


def set_aside(data):
    """Files renamed by --store-recover: {what follows the time stamp: size}."""
    found = {}
    for path in data.iterdir():
        match = ASIDE.match(path.name)
        if match:
            found[match.group(1)] = path.stat().st_size
    return found


ASIDE = re.compile(r"mqttgw\.db\.\d{8}T\d{6}Z(.*)$")


def test_an_emptied_store_is_refused_naming_it_and_recover_sets_it_aside(tmp_path):
    data = tmp_path / "data"
    gw = a_store_with_messages(tmp_path, data)
    gw.stop()
    (data / "mqttgw.db").write_bytes(b"")

    code, err = refused(tmp_path, data)
    assert code not in (0, None), "started on an emptied store"
    assert len(err.strip().splitlines()) == 1, err
    assert f"store {data / 'mqttgw.db'} is empty (0 bytes), and its record says it held" in err
    assert (data / "mqttgw.db").stat().st_size == 0

    again = start(tmp_path / "recovered", data, "--store-recover")
    try:
        again.wait_for_log("persistence.recover: set aside mqttgw.db, mqttgw.db.state as ")
        assert "is empty (0 bytes)" in again.log()
        aside = set_aside(data)
        assert aside == {"": 0, ".state": 128}, aside
        client, flags = keeper(again.port, clean_session=False)
        assert not flags.session_present
        client.disconnect()
        assert "restored 0 persistent session(s)" in again.log()
    finally:
        again.stop()
    assert "Traceback" not in again.log()


def test_a_store_whose_wal_was_lost_after_sigkill_is_refused_and_recover_logs_what_was_lost(tmp_path):
    data = tmp_path / "data"
    gw = a_store_with_messages(tmp_path, data)
    # The acknowledged messages are committed to the -wal, not yet to the
    # database file (checkpointed when the store was opened).
    wal = data / "mqttgw.db-wal"
    assert wal.stat().st_size > 30 * 100
    gw.stop(signal.SIGKILL)
    assert wal.stat().st_size > 30 * 100
    wal.unlink()
    (data / "mqttgw.db-shm").unlink(missing_ok=True)

    code, err = refused(tmp_path, data)
    assert code not in (0, None), "started on a store that lost its -wal"
    assert len(err.strip().splitlines()) == 1, err
    record = json.loads((data / "mqttgw.db.state").read_text())
    assert record["commits"] > 30
    assert f"store {data / 'mqttgw.db'} is older than its record {data / 'mqttgw.db.state'}" in err
    assert f"the record says {record['commits']}" in err

    again = start(tmp_path / "recovered", data, "--store-recover")
    try:
        again.wait_for_log("persistence.recover: set aside mqttgw.db, mqttgw.db.state as ")
        # What was lost: what the record said against what the database held.
        [line] = [l for l in again.log().splitlines() if "persistence.recover" in l]
        assert f"the record says {record['commits']}" in line
        assert "the database held 0 commit(s): 0 session(s), 0 queued message(s), 0 retained" in line
        assert "[mqttgw.broker.store#warn]" in line
        assert set(set_aside(data)) == {"", ".state"}
    finally:
        again.stop()
    assert "Traceback" not in again.log()


def test_a_missing_store_with_its_record_is_refused(tmp_path):
    data = tmp_path / "data"
    gw = a_store_with_messages(tmp_path, data)
    gw.stop()
    (data / "mqttgw.db").unlink()
    code, err = refused(tmp_path, data)
    assert code not in (0, None), "started without its store"
    assert f"store {data / 'mqttgw.db'} is missing, and its record says it held" in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_fresh_data_directory_starts_and_writes_the_record(tmp_path):
    data = tmp_path / "data"
    gw = start(tmp_path / "first", data)
    gw.stop()
    record = json.loads((data / "mqttgw.db.state").read_text())
    assert set(record) == {"id", "commits"}
    gw = start(tmp_path / "second", data)
    gw.stop()


def test_a_data_directory_removed_while_running_stops_acks_until_made_again(tmp_path):
    data = tmp_path / "data"
    http_port = free_port()
    gw = start(tmp_path / "first", data, "--http", str(http_port))
    try:
        client, _ = keeper(gw.port)
        client.disconnect()
        acked = publish_acknowledged(gw.port, 1, 20)
        subprocess.run(["rm", "-rf", str(data)], check=True)
        # A publish that must be stored is not acknowledged: its connection closes.
        sock = publisher(gw.port)
        assert not acknowledged(sock, b"after removal", 100)
        gw.wait_for_log("-wal was removed or replaced while open")
        critical = [l for l in gw.log().splitlines() if "#critical]" in l]
        assert len(critical) == 1 and "cannot write" in critical[0], critical
        status, body = http(http_port, "/readyz")
        assert status == 503, body
        # Still none while the directory is missing (probes come and go);
        # a 5.0 client is told why.
        sock = publisher(gw.port)
        assert not acknowledged(sock, b"still missing", 101)
        v5 = PahoClient(gw.port, "v5", "MQTTv5")
        v5.connect()
        info = v5.client.publish("keep/v5", b"5.0", 1)
        code, properties = v5.disconnect_reason.get(timeout=10)
        assert code.value == 0x80 and "store" in properties.ReasonString
        assert not info.is_published()
        v5.client.loop_stop()
        data.mkdir()
        gw.wait_for_log("made again at its path from the open database")
        wait_until(lambda: http(http_port, "/readyz")[0] == 200, what="/readyz 200 again")
        acked |= publish_acknowledged(gw.port, 200, 20)
        assert (data / "mqttgw.db").exists() and (data / "mqttgw.db.state").exists()
    finally:
        gw.stop(signal.SIGKILL)
    again = start(tmp_path / "again", data)
    try:
        received_all(again.port, acked)
    finally:
        again.stop()
    assert "Traceback" not in gw.log() + again.log()


def test_files_removed_while_running_stop_acks_and_nothing_acknowledged_is_lost(tmp_path):
    data = tmp_path / "data"
    gw = start(tmp_path / "first", data)
    try:
        client, _ = keeper(gw.port)
        client.disconnect()
        acked = publish_acknowledged(gw.port, 1, 20)
        for path in list(data.iterdir()):
            path.unlink()
        sock = publisher(gw.port)
        assert not acknowledged(sock, b"after rm", 100)
        gw.wait_for_log("-wal was removed or replaced while open")
        assert "[mqttgw.broker.store#critical]" in gw.log()
        # Made again at the next probe, from what the open database holds.
        gw.wait_for_log("writable again")
        acked |= publish_acknowledged(gw.port, 200, 20)
    finally:
        gw.stop(signal.SIGKILL)
    again = start(tmp_path / "again", data)
    try:
        received_all(again.port, acked)
    finally:
        again.stop()
    assert "Traceback" not in gw.log() + again.log()


def test_files_removed_then_a_normal_stop_loses_nothing_acknowledged(tmp_path):
    data = tmp_path / "data"
    gw = start(tmp_path / "first", data)
    client, _ = keeper(gw.port)
    client.disconnect()
    acked = publish_acknowledged(gw.port, 1, 20)
    for path in list(data.iterdir()):
        path.unlink()
    sock = publisher(gw.port)
    assert not acknowledged(sock, b"after rm", 100)
    # Stopped at once: the store is made again as it stops, if no probe did.
    gw.stop()
    assert "stopped before it could be made again" not in gw.log()
    again = start(tmp_path / "again", data)
    try:
        received_all(again.port, acked)
    finally:
        again.stop()
    assert "Traceback" not in gw.log() + again.log()


def test_a_store_whose_record_and_wal_were_lost_is_refused_naming_the_record(tmp_path):
    data = tmp_path / "data"
    gw = start(tmp_path / "first", data)
    client, _ = keeper(gw.port)
    client.disconnect()
    publish_acknowledged(gw.port, 1, 10)
    gw.stop(signal.SIGKILL)
    for name in ("mqttgw.db-wal", "mqttgw.db-shm", "mqttgw.db.state"):
        (data / name).unlink(missing_ok=True)

    code, err = refused(tmp_path, data)
    assert code not in (0, None), "started on a store whose record was lost"
    assert len(err.strip().splitlines()) == 1, err
    assert f"its record {data / 'mqttgw.db.state'} is missing" in err

    again = start(tmp_path / "recovered", data, "--store-recover")
    try:
        again.wait_for_log("persistence.recover: set aside mqttgw.db as ")
        [line] = [l for l in again.log().splitlines() if "persistence.recover" in l]
        assert "the database held " in line and "[mqttgw.broker.store#warn]" in line
        assert set(set_aside(data)) == {""}
    finally:
        again.stop()
    assert "Traceback" not in again.log()


def test_a_store_from_before_the_record_is_given_one_with_a_warning(tmp_path):
    data = tmp_path / "data"
    gw = start(tmp_path / "first", data)
    client, _ = keeper(gw.port)
    client.disconnect()
    acked = publish_acknowledged(gw.port, 1, 5)
    gw.stop()
    # As an older version left it: no id in the database, no record.
    db = sqlite3.connect(data / "mqttgw.db")
    db.execute("DELETE FROM meta WHERE key IN ('id', 'commits')")
    db.commit()
    db.close()
    (data / "mqttgw.db.state").unlink()
    again = start(tmp_path / "again", data)
    try:
        again.wait_for_log(f"its record {data / 'mqttgw.db.state'} is missing: made again from the database")
        received_all(again.port, acked)
    finally:
        again.stop()
    assert set(json.loads((data / "mqttgw.db.state").read_text())) == {"id", "commits"}


def modes(data):
    """{name: permission bits} of the data directory ("") and every file in it."""
    found = {"": stat.S_IMODE(data.stat().st_mode)}
    for path in data.iterdir():
        try:
            found[path.name] = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:  # the store's probe, come and gone
            pass
    return found


def test_the_data_directory_and_its_files_are_readable_by_the_gateway_user_only(tmp_path):
    data = tmp_path / "data"
    old = os.umask(0o022)
    try:
        gw = start(tmp_path / "first", data)
    finally:
        os.umask(old)
    try:
        client, _ = keeper(gw.port)
        client.disconnect()
        publish_acknowledged(gw.port, 1, 5)
        found = modes(data)
        assert {"mqttgw.db", "mqttgw.db-wal", "mqttgw.db-shm", "mqttgw.db.state"} <= set(found)
        wrong = {n: oct(m) for n, m in found.items() if m != (0o700 if n == "" else 0o600)}
        assert not wrong, wrong
    finally:
        gw.stop()
    assert "could be read by other users" not in gw.log()


def test_a_data_directory_readable_by_others_is_tightened_with_a_warning(tmp_path):
    data = tmp_path / "data"
    gw = start(tmp_path / "first", data)
    gw.stop()
    data.chmod(0o755)
    (data / "mqttgw.db").chmod(0o644)
    (data / "mqttgw.db.state").chmod(0o644)
    again = start(tmp_path / "again", data)
    try:
        again.wait_for_log("could be read by other users: now by its owner only")
        [line] = [l for l in again.log().splitlines() if "could be read by other users" in l]
        assert str(data / "mqttgw.db") in line and str(data / "mqttgw.db.state") in line
        found = modes(data)
        wrong = {n: oct(m) for n, m in found.items() if m != (0o700 if n == "" else 0o600)}
        assert not wrong, wrong
    finally:
        again.stop()

"""
The admin surface as an attacker's web page and a careless operator meet
it, from outside: real sockets against the gateway under twistd.  Host
names that are not its own (DNS rebinding), pages of other origins,
changes without credentials, guessed passwords, what error pages echo,
and idle connections that would take the store's descriptors.
"""

import base64
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import time

from mqttgw.passwd import main as passwd
from mqttgw.wire import packets as P
from tests.conftest import require_program
from tests.gateway import Gateway, gateway_env
from tests.mosquitto_broker import free_port

REBIND = "rebind.attacker.example"


def call(port, method, path, host=None, headers=None, body=None, timeout=10):
    """(status, headers, body) of one request naming ``host`` (default: 127.0.0.1:PORT)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        sent = {"Host": host or f"127.0.0.1:{port}", **(headers or {})}
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def upgrade(port, host, origin):
    """The status line of a WebSocket upgrade to /mqtt."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            (
                f"GET /mqtt HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: mqtt\r\nOrigin: {origin}\r\n\r\n"
            ).encode()
        )
        answer = b""
        deadline = time.monotonic() + 10
        while b"\r\n" not in answer and time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer.split(b"\r\n", 1)[0].decode()


def users(tmp_path):
    path = tmp_path / "passwd"
    passwd(["-c", "-b", str(path), "root", "rootpw"])
    passwd(["-b", str(path), "device", "devpw"])
    return path


def mqtt_connect(port, client_id, username=None, password=None):
    """A socket that sent CONNECT, and its CONNACK's return code (None: no CONNACK)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(P.Connect(client_id=client_id, username=username, password=password).encode())
    connack = _read(sock, 4)
    return sock, (connack[3] if len(connack) == 4 else None)


def _read(sock, n):
    data = b""
    try:
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


def test_a_rebound_host_name_is_refused_and_reads_see_only_what_the_acl_allows(gateway_with, tmp_path):
    acl = tmp_path / "acl"
    # Anonymous clients read public/# only.
    acl.write_text("topic read public/#\nuser root\ntopic readwrite #\n")
    port, ws_port = free_port(), free_port()
    gw = gateway_with(
        "--http", str(port), "--password-file", str(users(tmp_path)), "--acl-file", str(acl),
        "--allow-anonymous", "--ws", f"tcp:{ws_port}:interface=127.0.0.1",
    )
    gw.wait_for_log(f"starting on {port}")
    for topic, payload in (("public/a", b"open"), ("secret/b", b"hidden")):
        sock, rc = mqtt_connect(gw.port, f"pub-{topic}", "root", "rootpw")
        assert rc == 0
        sock.sendall(P.Publish(topic, payload, 1, True, message_id=1).encode())
        assert _read(sock, 4)[:1] == b"\x40"  # PUBACK
        sock.close()

    # A page whose name was re-pointed at 127.0.0.1 reads nothing, changes nothing.
    rebound = f"{REBIND}:{port}"
    status, _, body = call(port, "GET", "/api/retained?filter=%23", host=rebound)
    assert status == 421 and b"hidden" not in body and b"open" not in body
    table = json.dumps({"addresses": ["127.0.0.1:1"], "rules": ["# out 0"]}).encode()
    status, _, _ = call(port, "PUT", "/api/bridges/exfil", host=rebound, body=table,
                        headers={"Content-Type": "application/json", "Origin": f"http://{rebound}"})
    assert status == 421
    assert upgrade(port, rebound, f"http://{rebound}").split(" ")[1] in ("421", "403")
    # Its own name with a foreign page's Origin: no upgrade, no change.
    assert upgrade(port, f"127.0.0.1:{port}", "http://evil.example").split(" ")[1] == "403"
    assert upgrade(port, f"localhost:{port}", f"http://{REBIND}:{port}").split(" ")[1] == "403"
    assert call(port, "DELETE", "/api/retained?filter=%23", headers={"Origin": "http://evil.example"})[0] == 403
    # The page's own origin still upgrades.
    assert upgrade(port, f"localhost:{port}", f"http://localhost:{port}").split(" ")[1] == "101"
    # So on a WebSocket listener: a rebound page may not connect, its own may.
    assert upgrade(ws_port, f"{REBIND}:{ws_port}", f"http://{REBIND}:{ws_port}").split(" ")[1] == "403"
    assert upgrade(ws_port, f"127.0.0.1:{ws_port}", f"http://127.0.0.1:{ws_port}").split(" ")[1] == "101"
    # A token put in a URL is neither taken nor logged.
    assert call(ws_port, "GET", "/healthz?access_token=SECRET")[0] == 200
    assert call(port, "GET", "/api/overview?access_token=SECRET")[0] == 200

    status, _, body = call(port, "GET", "/api/bridges")
    assert status == 200 and json.loads(body) == []
    assert "admin API: bridge" not in gw.log()
    assert "refusing HTTP request from 127.0.0.1: host rebind.attacker.example" in gw.log()
    # A read without credentials lists what an anonymous client may read.
    status, headers, body = call(port, "GET", "/api/retained?filter=%23")
    assert status == 200 and headers["X-Content-Type-Options"] == "nosniff"
    assert [m["topic"] for m in json.loads(body)] == ["public/a"]
    status, _, body = call(port, "GET", "/api/retained?filter=%23", headers=basic("device", "devpw"))
    assert status == 200 and json.loads(body) == []
    status, _, body = call(port, "GET", "/api/retained?filter=%23", headers=basic("root", "rootpw"))
    assert sorted(m["topic"] for m in json.loads(body)) == ["public/a", "secret/b"]
    assert "SECRET" not in gw.log()


def ctl(*args):
    return subprocess.run(
        [sys.executable, "-m", "mqttgw.ctl", *args],
        capture_output=True, text=True, env=gateway_env(), timeout=30,
    )


def test_changes_need_credentials_on_loopback_and_ctl_uses_the_unix_socket(gateway_with, tmp_path):
    port = free_port()
    data = tmp_path / "data"
    gw = gateway_with(
        "--http", str(port), "--password-file", str(users(tmp_path)), "--admin-user", "root",
        "--data-dir", str(data),
    )
    gw.wait_for_log(f"starting on {port}")
    sock, rc = mqtt_connect(gw.port, "victim", "device", "devpw")
    assert rc == 0

    # Over TCP, even on loopback, no change without credentials.
    status, headers, _ = call(port, "DELETE", "/api/clients/victim")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    table = json.dumps({"addresses": ["127.0.0.1:1"], "rules": ["# out 0"]}).encode()
    assert call(port, "PUT", "/api/bridges/exfil", body=table)[0] == 401
    assert json.loads(call(port, "GET", "/api/bridges")[2]) == []
    assert call(port, "GET", "/api/clients")[0] == 200
    assert "client victim disconnected" not in gw.log()

    gw.wait_for_log("admin.sock'")
    socket_path = data / "admin.sock"
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
    listed = ctl("--socket", str(socket_path), "--json", "clients")
    assert listed.returncode == 0, listed.stderr
    assert [c["client_id"] for c in json.loads(listed.stdout)] == ["victim"]
    kicked = ctl("--socket", str(socket_path), "kick", "victim")
    assert kicked.returncode == 0 and "kicked victim" in kicked.stdout
    gw.wait_for_log("client victim disconnected by the admin API")
    sock.close()
    # --url keeps working, with credentials sent in the header.
    env_password = dict(os.environ, MQTTGW_PASSWORD="rootpw")
    over_tcp = subprocess.run(
        [sys.executable, "-m", "mqttgw.ctl", "--url", f"http://127.0.0.1:{port}", "--user", "root",
         "sessions", "delete", "nobody"],
        capture_output=True, text=True, env=dict(gateway_env(), **env_password), timeout=30,
    )
    assert over_tcp.returncode == 1 and "404" in over_tcp.stderr
    assert "rootpw" not in gw.log()


def test_wrong_passwords_over_http_are_answered_after_the_login_throttles_delay(gateway_with, tmp_path):
    port = free_port()
    gw = gateway_with(
        "--http", f"0.0.0.0:{port}", "--password-file", str(users(tmp_path)), "--admin-user", "root",
        "--log-level", "debug",
    )
    gw.wait_for_log(f"starting on {port}")
    started = time.monotonic()
    for n in range(6):
        # Tokens are taken from the Authorization header only, never the URL.
        status, _, _ = call(port, "GET", f"/api/clients?access_token=SECRET{n}", headers=basic("root", f"Wr0ng{n}"))
        assert status == 401
    elapsed = time.monotonic() - started
    refused = [line for line in gw.log().splitlines() if "admin API: credentials refused from 127.0.0.1" in line]
    assert len(refused) == 6, gw.log()
    delays = [float(line.rsplit("answered after ", 1)[1].rstrip("s")) for line in refused]
    assert all(d > 0 for d in delays) and delays == sorted(delays)
    # Each was held at least its delay (a lower bound only).
    assert elapsed >= sum(delays) * 0.9
    # The same throttle as MQTT's: this address waits there at least as long.
    started = time.monotonic()
    sock, rc = mqtt_connect(gw.port, "second-try", "root", "wrong")
    assert rc == 4 and time.monotonic() - started >= delays[-1] * 0.9
    sock.close()
    assert call(port, "GET", "/api/clients", headers=basic("root", "rootpw"))[0] == 200
    assert "SECRET" not in gw.log() and "Wr0ng" not in gw.log()


def test_json_is_nosniff_and_error_pages_escape_what_they_echo(gateway_with):
    port = free_port()
    gateway_with("--http", str(port)).wait_for_log(f"starting on {port}")
    status, headers, _ = call(port, "GET", "/api/overview")
    assert status == 200 and headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Type"] == "application/json"
    status, headers, body = call(port, "GET", "/api/overview", host="<script>alert(1)</script>")
    assert status == 421 and b"<script>" not in body and b"&lt;script&gt;alert(1)&lt;/script&gt;" in body
    # With its own phrase, not "Unknown Status".
    assert upgrade(port, "rebind.attacker.example", "http://rebind.attacker.example").startswith("HTTP/1.1 421 Misdirected Request")
    status, _, body = call(port, "GET", "/%3Cscript%3Ealert(1)%3C/script%3E.js")
    assert status == 404 and b"<script>" not in body and b"&lt;script&gt;" in body


def test_idle_http_connections_leave_descriptors_for_mqtt_and_the_store(tmp_path):
    prlimit = require_program("prlimit")
    port = free_port()
    gw = Gateway(tmp_path, "--http", str(port), prefix=(prlimit, "--nofile=256:256"))
    idle = []
    try:
        gw.wait_for_log(f"starting on {port}")
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        clients = []
        for n in range(20):
            sock, rc = mqtt_connect(gw.port, f"device-{n}")
            assert rc == 0, gw.log()
            clients.append(sock)
        # A retained QoS 1 message is acknowledged once the store committed it.
        clients[0].sendall(P.Publish("site/state", b"on", 1, True, message_id=7).encode())
        assert _read(clients[0], 4) == P.Puback(7).encode(), gw.log()
        for sock in clients:
            sock.close()
        # Past its bound the listener closed new connections as it accepted them;
        # its socket, bounded apart, still serves python -m mqttgw.ctl.
        gw.wait_for_log("to the admin listener: 19 connections is the limit")
        listed = ctl("--socket", str(tmp_path / "mqttgw-data" / "admin.sock"), "--json", "sessions")
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    finally:
        for sock in idle:
            sock.close()
        gw.stop()
    log = gw.log()
    assert "Errno 24" not in log and "Too many open files" not in log and "EMFILE" not in log, log
    assert "max_connections 118: the open-file limit 256 less 100" in log
    assert "Traceback" not in log


def test_idle_http_connections_are_closed(gateway_with):
    port = free_port()
    gateway_with("--http", str(port), "--http-idle-timeout", "0.5").wait_for_log(f"starting on {port}")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # Closed by the gateway, with nothing sent.
        assert _read(sock, 1) == b""


BRIDGE = json.dumps({"addresses": ["127.0.0.1:1"], "rules": ["secret/# out 0"]}).encode()


def test_on_loopback_only_admin_users_change_anything(gateway_with, tmp_path):
    port = free_port()
    data = tmp_path / "data"
    gw = gateway_with(
        "--http", str(port), "--password-file", str(users(tmp_path)), "--admin-user", "root",
        "--data-dir", str(data),
    )
    gw.wait_for_log(f"starting on {port}")
    # An MQTT user who signs in may read, not change.
    status, _, _ = call(port, "PUT", "/api/bridges/evil", "localhost", basic("device", "devpw"), BRIDGE)
    assert status == 403
    assert call(port, "DELETE", "/api/retained?filter=%23", "localhost", basic("device", "devpw"))[0] == 403
    assert call(port, "GET", "/api/bridges", "localhost", basic("device", "devpw"))[0] == 200
    assert json.loads(call(port, "GET", "/api/bridges")[2]) == []
    assert not os.path.exists(data / "bridges.json") or "evil" not in (data / "bridges.json").read_text()
    assert "user device may not PUT /api/bridges/evil" in gw.log()
    # The admin user may.
    status, _, _ = call(port, "PUT", "/api/bridges/mine", "localhost", basic("root", "rootpw"), BRIDGE)
    assert status == 200
    assert [b["name"] for b in json.loads(call(port, "GET", "/api/bridges")[2])] == ["mine"]


def test_without_admin_users_no_change_over_http(gateway_with, tmp_path):
    port = free_port()
    gw = gateway_with("--http", str(port), "--password-file", str(users(tmp_path)))
    gw.wait_for_log(f"starting on {port}")
    status, _, _ = call(port, "PUT", "/api/bridges/evil", "localhost", basic("root", "rootpw"), BRIDGE)
    assert status == 403
    assert "changes only over the admin socket" in gw.log()
    assert json.loads(call(port, "GET", "/api/bridges")[2]) == []


def _guess_and_leave(port, password):
    """One Basic guess for root, the connection closed before any answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        auth = basic("root", password)["Authorization"]
        sock.sendall(
            f"GET /api/clients HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {auth}\r\n\r\n".encode()
        )


def test_http_basic_is_throttled_as_mqtt_logins_are(gateway_with, tmp_path):
    port = free_port()
    gw = gateway_with(
        "--http", str(port), "--password-file", str(users(tmp_path)), "--admin-user", "root",
        "--login-delay", "0.5", "--max-login-delay", "2", "--max-waiting-logins-per-user", "4",
    )
    gw.wait_for_log(f"starting on {port}")
    started = time.monotonic()
    # Guesses whose callers leave at once still count, and delay the right one.
    for n in range(3):
        _guess_and_leave(port, f"Wr0ng{n}")
    deadline = time.monotonic() + 30
    refused = []
    while len(refused) < 3 and time.monotonic() < deadline:
        refused = [line for line in gw.log().splitlines() if "admin API: credentials refused from" in line]
        time.sleep(0.05)
    assert len(refused) == 3, gw.log()
    due = max(float(line.rsplit("answered after ", 1)[1].rstrip("s")) for line in refused)
    assert due > 1
    assert call(port, "GET", "/api/clients", headers=basic("root", "rootpw"))[0] == 200
    # Answered no earlier than the refusals due before it, or the longest
    # delay (--max-login-delay): a lower bound only.
    assert time.monotonic() - started >= min(due, 2.0)

    # A flood of parallel guesses for one user: past the bound, 429 unchecked.
    from concurrent.futures import ThreadPoolExecutor

    passwords = [f"Wr0ng{n}" for n in range(11)] + ["rootpw"]
    with ThreadPoolExecutor(len(passwords)) as pool:
        statuses = list(pool.map(
            lambda p: call(port, "GET", "/api/clients", headers=basic("root", p), timeout=60)[0], passwords
        ))
    assert set(statuses) <= {200, 401, 429}
    assert statuses.count(429) >= len(passwords) - 4, statuses
    assert "too many logins waiting from 127.0.0.1" in gw.log()
    assert "Wr0ng" not in gw.log() and "rootpw" not in gw.log()

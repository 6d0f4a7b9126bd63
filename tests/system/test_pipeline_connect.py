"""
Spark kept warm for hourly runs (docs/guide/pipeline.rst): a Spark
Connect server started with ``mqttgw-pipeline connect-server`` as the
guide and deploy/mqttgw-spark-connect.service start it, and ``batch
--remote`` through it.  Every port the server opens is on loopback, a
client without its token is refused in one line, and the tables written
through it equal a local run's, run after run.
"""

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_program
from tests.gateway import REPO, gateway_env
from tests.network import free_port
from tests.pipeline_runs import pipeline, snapshot, table, write_segment

TOKEN = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


@pytest.fixture(autouse=True)
def java():
    require_program("java")


def poll(what, check, timeout=180):
    """``check()``'s first true value, polling until ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


class ConnectServer:
    """``python -m mqttgw.pipeline connect-server ARGS`` in its own process group, its output in ``log``."""

    def __init__(self, workdir, args, env):
        self.log = workdir / "connect-server.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mqttgw.pipeline", "connect-server", *args],
                cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def started(self):
        text = self.log.read_text(errors="replace")
        assert self.process.poll() is None, text[-3000:]
        return "Spark Connect server started" in text

    def stop(self):
        """SIGTERM to the group (the JVM and its Python workers), SIGKILL after 15 s."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def listening(pid):
    """The (address, port) of every TCP socket process ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for name, size in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
            found.append((ipaddress.ip_address(raw), int(port, 16)))
    return found


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("archive") / "archive"
    payload = lambda i: json.dumps({"celsius": i % 40} if i % 11 else {"celsius": "n/a"}).encode()  # noqa: E731
    write_segment(path, "2026-11-22T10:00:00", ["plant/a", "plant/b", "/plant/c"], 1500, payload=payload)
    write_segment(path, "2026-11-22T11:10:00", ["plant/a", "plant/d"], 900, gateway_id="gw2", payload=payload)
    return path


def tables(out):
    """Every table of a run, json_minute included, its rows as sorted JSON."""
    result = snapshot(out)
    result["json_minute"] = sorted(json.dumps(r, default=str, sort_keys=True) for r in table(out / "json_minute"))
    assert all(result.values()), {name: len(rows) for name, rows in result.items()}
    return result


def test_a_resident_connect_server_on_loopback_computes_what_a_local_run_does(archive, tmp_path):
    batch = ["batch", "--archive", str(archive), "--json-field", "celsius"]
    pipeline(*batch, "--out", str(tmp_path / "local"), "--master", "local[2]", cwd=tmp_path)
    port = free_port()
    env = dict(gateway_env(), **{TOKEN: "hourly-runs-only"})
    env.pop("SPARK_LOCAL_IP", None)
    env.pop("SPARK_REMOTE", None)
    # As the guide and the unit start it: no --host, so loopback.
    server = ConnectServer(
        tmp_path, ["--port", str(port), "--", "--driver-memory", "1g", "--conf", f"spark.ui.port={free_port()}"], env,
    )
    try:
        poll("the Connect server", server.started)
        ports = listening(server.process.pid)
        assert (ipaddress.ip_address("127.0.0.1"), port) in ports or (
            ipaddress.ip_address("::ffff:127.0.0.1"), port) in ports, ports
        # The gRPC port, Spark's UI, the driver's and the block manager's: none on another address.
        assert len(ports) >= 3 and all(address.is_loopback or getattr(address, "ipv4_mapped", None)
                                       and address.ipv4_mapped.is_loopback for address, _ in ports), ports
        remote = ["--remote", f"sc://localhost:{port}"]
        # Twice: the second run finds Spark warm, and replaces the first's tables.
        for _ in range(2):
            pipeline(*batch, *remote, "--out", str(tmp_path / "warm"), cwd=tmp_path, env={TOKEN: env[TOKEN]})
            assert tables(tmp_path / "warm") == tables(tmp_path / "local")
        [run, again] = [
            json.loads(line) for f in sorted((tmp_path / "warm" / "_runs").glob("part-*"))
            for line in f.read_text().splitlines()
        ]
        assert run["status"] == again["status"] == "ok" and run["remote"] == f"sc://localhost:{port}"
        assert run["application"] == again["application"], "each run started a Spark of its own"
        refused = subprocess.run(
            [sys.executable, "-m", "mqttgw.pipeline", *batch, *remote, "--out", str(tmp_path / "refused")],
            capture_output=True, text=True, cwd=tmp_path, timeout=300,
            env={k: v for k, v in gateway_env().items() if k != TOKEN},
        )
        assert refused.returncode == 2, refused.stderr[-3000:]
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith(f"pipeline: Spark Connect sc://localhost:{port} refused this client"), line
        assert not (tmp_path / "refused").exists()
    finally:
        server.stop()

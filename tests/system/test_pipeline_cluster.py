"""
The pipeline guide's cluster commands (docs/guide/pipeline.rst), run literally from an installed package
against a Spark standalone master and worker on this machine (started as
``spark-class`` starts them): through spark-submit, and through a Spark
Connect server.  The master's own record (its JSON status page) and the
Connect server's (its REST API) show the jobs ran there, and the tables
equal a ``local[*]`` run's.  Everything listens on 127.0.0.1 only.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import require_program
from tests.gateway import REPO
from tests.network import free_port
from tests.pipeline_runs import said, snapshot, write_segment

LOCAL = "127.0.0.1"
# Small: the machine is shared.  The worker's 1g is what spark-submit's
# default executor (1g) needs.
WORKER = ("--cores", "1", "--memory", "1g")


def spark_home():
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "SPARK_REMOTE")}
    return dict(env, SPARK_LOCAL_IP=LOCAL, **extra)


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def poll(what, check, timeout=120):
    """``check()``'s first true value, polling until ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


class Daemon:
    """A JVM in its own process group, its output in ``log``; stopped whole."""

    def __init__(self, name, args, workdir, env):
        self.log = workdir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                args, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check_running(self):
        assert self.process.poll() is None, self.log.read_text()[-3000:]

    def stop(self):
        """SIGTERM to the group (the JVM and what it started), SIGKILL after 15 s."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # Executors the worker started are in its group: none may outlive it.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and one worker, for every test of the module."""
    require_program("java")
    bin_ = spark_home() / "bin"
    workdir = tmp_path_factory.mktemp("cluster")
    port, web = free_port(), free_port()
    daemons = []
    try:
        daemons.append(Daemon("master", [
            str(bin_ / "spark-class"), "org.apache.spark.deploy.master.Master",
            "--host", LOCAL, "--port", str(port), "--webui-port", str(web),
        ], workdir, spark_env()))
        url = f"spark://{LOCAL}:{port}"
        status = f"http://{LOCAL}:{web}/json/"
        poll("the master", lambda: daemons[0].check_running() or get_json(status))
        (workdir / "work").mkdir()
        daemons.append(Daemon("worker", [
            str(bin_ / "spark-class"), "org.apache.spark.deploy.worker.Worker", *WORKER,
            "--host", LOCAL, "--webui-port", str(free_port()), "--work-dir", str(workdir / "work"), url,
        ], workdir, spark_env()))
        poll("the worker", lambda: daemons[1].check_running() or get_json(status)["aliveworkers"] == 1)
        yield {"url": url, "status": status, "workdir": workdir}
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """This checkout installed as a user installs it (without its dependencies, which are here)."""
    target = tmp_path_factory.mktemp("installed")
    source = tmp_path_factory.mktemp("source")
    for name in ("setup.cfg", "pyproject.toml", "README.rst"):
        shutil.copy(REPO / name, source)
    ignore = shutil.ignore_patterns("__pycache__", "build")
    shutil.copytree(REPO / "mqttgw", source / "mqttgw", ignore=ignore)
    shutil.copytree(REPO / "twisted", source / "twisted", ignore=ignore)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "bin" / "mqttgw-pipeline").exists()
    return target


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("archive") / "archive"
    payload = lambda i: json.dumps({"celsius": i % 40}).encode()  # noqa: E731
    write_segment(path, "2026-11-22T10:00:00", ["plant/a", "plant/b", "/plant/c"], 1500, payload=payload)
    write_segment(path, "2026-11-22T11:10:00", ["plant/a", "plant/d"], 900, gateway_id="gw2", payload=payload)
    return path


def run_installed(installed, command, cwd, timeout=600, **env):
    """A command line as a user types it, where the package is installed and no checkout is."""
    args = shlex.split(command)
    args[0] = str(installed / "bin" / args[0])
    out = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=spark_env(PYTHONPATH=str(installed), **env),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def local_tables(installed, archive, tmp_path_factory):
    """The reference: the same tables on local[*]."""
    cwd = tmp_path_factory.mktemp("local")
    out = cwd / "tables"
    run_installed(installed, f"mqttgw-pipeline batch --master local[*] --archive {archive} --out {out}", cwd)
    return snapshot(out)


def guide_command(start):
    """The pipeline guide's command beginning with ``start``, its continuation lines joined."""
    lines = (REPO / "docs" / "guide" / "pipeline.rst").read_text().splitlines()
    [first] = [i for i, line in enumerate(lines) if line.strip().startswith(start)]
    command = []
    for line in lines[first:]:
        command.append(line.strip().rstrip("\\").strip())
        if not line.endswith("\\"):
            return " ".join(command)


def literally(command, archive, out, **hosts):
    """The guide's placeholders replaced by this machine's: nothing else changes."""
    for placeholder, value in hosts.items():
        assert placeholder in command
        command = command.replace(placeholder, value)
    assert "hdfs:///mqtt/archive" in command and "hdfs:///mqtt/tables" in command
    return command.replace("hdfs:///mqtt/archive", f"file://{archive}").replace("hdfs:///mqtt/tables", f"file://{out}")


def runs(out):
    return [json.loads(line) for f in sorted((out / "_runs").glob("part-*")) for line in f.read_text().splitlines()]


def test_spark_submit_from_an_installed_package_runs_on_the_cluster(cluster, installed, archive, local_tables, tmp_path):
    out = tmp_path / "tables"
    command = literally(
        guide_command("mqttgw-pipeline submit --master spark://"), archive, out,
        **{"spark://spark-master:7077": cluster["url"]},
    )
    # Where there is no mqttgw/ folder to zip or submit.
    assert not (tmp_path / "mqttgw").exists()
    result = run_installed(installed, command, tmp_path)
    [run] = runs(out)
    assert run["status"] == "ok" and run["master"] == cluster["url"]
    # spark-submit passes the driver's stderr on to its stdout.
    assert said(result.stdout)[0] == f"Spark master {cluster['url']}, application {run['application']}"
    # The master's own record: it ran the application, to the end.
    status = get_json(cluster["status"])
    [app] = [a for a in status["activeapps"] + status["completedapps"] if a["id"] == run["application"]]
    assert app["name"] == "mqttgw-pipeline"
    poll("the application to finish", lambda: any(
        a["id"] == run["application"] and a["state"] == "FINISHED" for a in get_json(cluster["status"])["completedapps"]
    ), timeout=60)
    assert snapshot(out) == local_tables
    for name in local_tables:
        assert (out / name / "_SUCCESS").is_file(), name
    # The zip came from the installed files: the line says so.
    line = run_installed(installed, "mqttgw-pipeline submit --dry-run --master spark://h:7077 -- batch --out x", tmp_path)
    args = shlex.split(line.stdout)
    assert args[args.index("--py-files") + 1] == str(tmp_path / "mqttgw-pipeline.zip")
    assert args[args.index("--py-files") + 2] == str(installed / "mqttgw" / "pipeline" / "__main__.py")
    import zipfile

    names = zipfile.ZipFile(tmp_path / "mqttgw-pipeline.zip").namelist()
    assert "mqttgw/pipeline/cli.py" in names and "mqttgw/wire/packets.py" in names
    assert not [n for n in names if n.split("/")[1] not in ("__init__.py", "wire", "pipeline")]


def test_spark_connect_runs_on_the_server(cluster, installed, archive, local_tables, tmp_path):
    port, ui = free_port(), free_port()
    server = Daemon("connect", [
        str(spark_home() / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name", "Spark Connect server", "--master", cluster["url"], "--driver-memory", "1g",
        "--conf", f"spark.connect.grpc.binding.address={LOCAL}", "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", f"spark.ui.port={ui}", "--conf", f"spark.driver.host={LOCAL}", "--conf", f"spark.driver.bindAddress={LOCAL}",
    ], tmp_path, spark_env())
    try:
        poll("the Connect server", lambda: server.check_running() or "Spark Connect server started" in server.log.read_text())
        [app] = get_json(f"http://{LOCAL}:{ui}/api/v1/applications")
        jobs = f"http://{LOCAL}:{ui}/api/v1/applications/{app['id']}/jobs"
        before = len(get_json(jobs))
        out = tmp_path / "tables"
        command = literally(
            guide_command("mqttgw-pipeline batch --remote sc://"), archive, out,
            **{"sc://spark-connect:15002": f"sc://{LOCAL}:{port}"},
        )
        result = run_installed(installed, command, tmp_path)
        [run] = runs(out)
        assert run["status"] == "ok" and run["remote"] == f"sc://{LOCAL}:{port}"
        assert (run["application"], run["master"]) == (app["id"], cluster["url"])
        assert said(result.stderr)[0] == f"Spark Connect sc://{LOCAL}:{port}: master {cluster['url']}, application {app['id']}"
        # The server's own record: the jobs ran there, and it is the
        # master's application.
        assert len([j for j in get_json(jobs) if j["status"] == "SUCCEEDED"]) > before
        assert app["id"] in [a["id"] for a in get_json(cluster["status"])["activeapps"]]
        assert snapshot(out) == local_tables
        for name in local_tables:
            assert (out / name / "_SUCCESS").is_file(), name
        # The same through $SPARK_REMOTE, and stream said to be not for Connect.
        refused = subprocess.run(
            [str(installed / "bin" / "mqttgw-pipeline"), "stream", "--archive", str(archive), "--out", str(tmp_path / "s"),
             "--checkpoint", str(tmp_path / "c")],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
            env=spark_env(PYTHONPATH=str(installed), SPARK_REMOTE=f"sc://{LOCAL}:{port}"),
        )
        assert refused.returncode == 2 and re.search(r"stream needs a Spark driver here", refused.stderr), refused.stderr
        assert said(refused.stderr)[0].startswith(f"Spark Connect sc://{LOCAL}:{port}: ")
    finally:
        server.stop()

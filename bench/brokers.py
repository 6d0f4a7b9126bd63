"""
The brokers under test, each started on a free loopback port with the same
limits: mqttgw (this repository), mosquitto (Debian package) and amqtt
(PyPI, in a virtual environment of its own, as its dependencies are pinned
differently from ours).
"""

import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
AMQTT_VENV = BENCH / ".amqtt-venv"

# The same in-flight window and queue bounds for every broker.
MAX_INFLIGHT = 20
MAX_QUEUED = 10_000


def free_port():
    # Free on every address: mosquitto binds its WebSocket listener to all
    # of them, and a port the kernel hands out for 127.0.0.1 alone may be
    # held on another (127.0.0.2, a connection in TIME_WAIT).
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 65536:
        # Beyond the hard limit where the process may (root).
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (65536, 65536))
            return
        except (ValueError, OSError):
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def ensure_mosquitto():
    path = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None
    )
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing mosquitto with apt-get ...", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "mosquitto"], check=True, env=env
        )
        return ensure_mosquitto()
    raise SystemExit("bench: mosquitto is not installed (apt-get install mosquitto)")


def ensure_amqtt():
    amqtt = AMQTT_VENV / "bin" / "amqtt"
    if not amqtt.exists():
        print(f"installing amqtt into {AMQTT_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(AMQTT_VENV)], check=True)
        subprocess.run(
            [str(AMQTT_VENV / "bin" / "pip"), "install", "-q", "amqtt"], check=True
        )
    return amqtt


class Broker:
    name = None
    # MQTT 3.1 clients are not accepted by every broker; 3.1.1 is.
    def __init__(self, workdir, cpu=None, options=(), auth=None, max_queued=MAX_QUEUED, kinds=("tcp", "ws"), pki=None):
        # A directory of its own per start: no state carries over.
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=workdir))
        self.options = list(options)
        # {"password_file": path, "acl_file": path}, either optional.
        self.auth = auth or {}
        self.max_queued = max_queued
        self.port = free_port()
        self.ws_port = free_port()
        # The listeners it has: "tcp", "ws", "tls", "wss"; the TLS ones
        # with ``pki`` {"cert": path, "key": path}.
        self.kinds = kinds
        self.pki = pki
        self.tls_port = free_port() if "tls" in kinds else None
        self.wss_port = free_port() if "wss" in kinds else None
        self.cpu = cpu
        self.process = None

    # Environment variables of the broker's own.
    env = {}

    def command(self):
        raise NotImplementedError

    def ports(self):
        ports = {"tcp": self.port, "ws": self.ws_port, "tls": self.tls_port, "wss": self.wss_port}
        return [ports[kind] for kind in self.kinds]

    def launch(self):
        """The broker's process started, not waited for."""
        log = open(self.workdir / "broker.log", "wb")
        cpu = self.cpu

        def setup():
            _raise_fd_limit()
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})

        env = {**os.environ, "PYTHONPATH": str(REPO), **self.env}
        # As installed: its modules' bytecode cached, not compiled anew at
        # every start (a test or CI environment may turn the cache off).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=setup,
            env=env,
        )
        return self

    def start(self):
        self.launch()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited: {(self.workdir / 'broker.log').read_text()}"
                )
            try:
                for port in self.ports():
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start listening")

    def rss_kib(self):
        """Resident memory of the broker process, in KiB."""
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def cpu_seconds(self):
        """User and system CPU time the broker has used so far."""
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Mqttgw(Broker):
    name = "mqttgw"
    # A file to write its long reactor turns to (bench/turns.py), or None,
    # and how long a turn must take to be written.
    turns_log = None
    turns_long_ms = 2.0

    def command(self):
        twistd = [str(Path(sys.executable).parent / "twistd")]
        if self.turns_log is not None:
            twistd = [
                sys.executable, "-m", "bench.turns",
                "--log", str(self.turns_log), "--long-ms", str(self.turns_long_ms), "--",
            ]
        return twistd + [
            "-n", "--pidfile=", "--logfile=broker-twistd.log", "mqttgw",
        ] + self.listener_options() + [
            "--max-inflight-messages", str(MAX_INFLIGHT),
            "--max-queued-messages", str(self.max_queued),
            "--max-connections", "50000",
            # As mosquitto's log_type below: errors and warnings only.
            "--log-level", "warn", "--no-connection-messages",
        ] + self.auth_options() + self.options

    def listener_options(self):
        options = []
        for kind, port in zip(self.kinds, self.ports()):
            options += [f"--{kind}", f"tcp:{port}:interface=127.0.0.1"]
        if self.tls_port or self.wss_port:
            options += ["--cert", self.pki["cert"], "--key", self.pki["key"]]
        return options

    def auth_options(self):
        options = []
        if "password_file" in self.auth:
            # The load generator stays anonymous; the probe logs in.
            options += ["--password-file", self.auth["password_file"], "--allow-anonymous"]
        if "acl_file" in self.auth:
            options += ["--acl-file", self.auth["acl_file"]]
        return options


class MqttgwMemory(Mqttgw):
    """mqttgw without its store, to show what persistence costs."""

    name = "mqttgw-memory"

    def command(self):
        return super().command() + ["--no-persistence"]


class MqttgwBaseline(Mqttgw):
    """
    mqttgw from another checkout, for runs of old against new in turns:
    ``MQTTGW_BASELINE`` names its directory (e.g. a ``git worktree`` of
    an earlier commit), whose modules and twistd plugin come first.
    """

    name = "mqttgw-baseline"

    @property
    def env(self):
        path = os.environ.get("MQTTGW_BASELINE")
        if not path or not (Path(path) / "mqttgw" / "__init__.py").exists():
            raise SystemExit(f"bench: {self.name} needs MQTTGW_BASELINE, the directory of a checkout of mqttgw")
        return {"PYTHONPATH": str(Path(path).resolve())}


class Mosquitto(Broker):
    name = "mosquitto"

    def command(self):
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "set_tcp_nodelay true\n"
            f"max_inflight_messages {MAX_INFLIGHT}\n"
            f"max_queued_messages {self.max_queued}\n"
            "persistence false\n"
            "max_connections -1\n"
            "log_dest stdout\n"
            "log_type error\n"
            "log_type warning\n"
            + self.listener_lines()
            + "".join(f"{key} {path}\n" for key, path in self.auth.items())
            # Extra configuration lines (a bridge's).
            + "".join(f"{line}\n" for line in self.options)
            # As root it would drop to its own user, who cannot read the
            # files in the run's private directory.
            + ("user root\n" if (self.auth or self.pki) and os.geteuid() == 0 else "")
        )
        return [ensure_mosquitto(), "-c", str(conf)]

    def listener_lines(self):
        """The listeners besides the first TCP one."""
        tls = f"certfile {self.pki['cert']}\nkeyfile {self.pki['key']}\n" if self.pki else ""
        lines = ""
        if "tls" in self.kinds:
            lines += f"listener {self.tls_port} 127.0.0.1\n" + tls
        # mosquitto 2.0 cannot bind a WebSocket listener to one address.
        if "ws" in self.kinds:
            lines += f"listener {self.ws_port}\nprotocol websockets\n"
        if "wss" in self.kinds:
            lines += f"listener {self.wss_port}\nprotocol websockets\n" + tls
        return lines


class Amqtt(Broker):
    name = "amqtt"

    def command(self):
        conf = self.workdir / "amqtt.yaml"
        conf.write_text(
            "listeners:\n"
            "  default:\n"
            "    type: tcp\n"
            f"    bind: 127.0.0.1:{self.port}\n"
            "    max_connections: 50000\n"
            "  ws:\n"
            "    type: ws\n"
            f"    bind: 127.0.0.1:{self.ws_port}\n"
            "plugins:\n"
            "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
            "    allow_anonymous: true\n"
        )
        return [str(ensure_amqtt()), "-c", str(conf)]


class PythonFloor(Broker):
    """
    Not a broker: a minimal epoll server in plain Python (bench/floor.py),
    for the storm scenario only, to show how much of a connect's cost is
    Python's and the kernel's before any MQTT.
    """

    name = "python-floor"

    def command(self):
        return [sys.executable, "-m", "bench.floor"] + [str(p) for p in self.ports()]


BROKERS = {b.name: b for b in (Mqttgw, MqttgwMemory, MqttgwBaseline, Mosquitto, Amqtt, PythonFloor)}
# What a run takes unless told: all but the baseline, which needs a
# checkout, and the floor, which is asked for by name.
DEFAULT_BROKERS = [name for name in BROKERS if name not in (MqttgwBaseline.name, PythonFloor.name)]

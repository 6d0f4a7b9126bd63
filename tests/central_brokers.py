"""
The central brokers fleets bridge into, started by the tests on this
machine from Debian's packages: a RabbitMQ cluster (``rabbitmq-server``,
its MQTT plugin on each node, joined with ``rabbitmqctl join_cluster``) and
ejabberd with ``mod_mqtt`` (mosquitto is tests/mosquitto_broker.py).  Each
runs on free loopback ports in a directory of its own, with its own Erlang
cookie and epmd, and is killed with all it started whatever the test does.
"""

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_program
from tests.mosquitto_broker import free_port

RABBITMQ_BIN = "/usr/lib/rabbitmq/bin"
BOOT_TIMEOUT = 90
# A node restarted while its only peer's MQTT client-id tracker (a Raft
# cluster of the two) has no leader waits for that peer up to 100 s
# (rabbitmq_mqtt 3.10, mqtt_node:start) before its MQTT listener opens.
REJOIN_TIMEOUT = 200


def wait_until(condition, timeout, what, interval=0.1):
    """Poll ``condition`` until it is true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s")
        time.sleep(interval)


def accepts(port):
    """Whether something accepts a TCP connection on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# Processes: each broker in a session of its own, so that a signal meant
# for the test run (timeout's, ^C) does not reach it half-way, and a reaper
# that kills those sessions when the test process ends however it ends.

_REAPER = """
import os, signal, sys
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    verb, group = line.split()
    (groups.add if verb == "watch" else groups.discard)(int(group))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class Reaper:
    """
    A child of its own whose input closes when this process ends, however
    it ends; it then kills the process groups it was told to watch.
    """

    _process = None

    @classmethod
    def _tell(cls, verb, group):
        if cls._process is None or cls._process.poll() is not None:
            cls._process = subprocess.Popen(
                [sys.executable, "-c", _REAPER], stdin=subprocess.PIPE, start_new_session=True
            )
        cls._process.stdin.write(f"{verb} {group}\n".encode())
        cls._process.stdin.flush()

    @classmethod
    def watch(cls, group):
        cls._tell("watch", group)

    @classmethod
    def forget(cls, group):
        cls._tell("forget", group)


def _parent(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...", where comm may hold spaces and brackets.
    return int(stat.rpartition(")")[2].split()[1])


def descendants(pid):
    """Every process below ``pid``, children first."""
    parents = {int(p): _parent(p) for p in os.listdir("/proc") if p.isdigit()}
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def command_name(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def peer_ports(pid):
    """The remote ports of the established TCP connections process ``pid`` holds."""
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            sockets.add(link[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and inode in sockets:  # ESTABLISHED
                ports.add(int(remote.rpartition(":")[2], 16))
    return ports


class Process:
    """A broker's process, in a session (and process group) of its own."""

    def __init__(self, argv, env, log_path, cwd):
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        Reaper.watch(self.popen.pid)

    @property
    def running(self):
        return self.popen.poll() is None

    def kill(self):
        """SIGKILL the group, and what left it (Erlang's port helpers make sessions of their own)."""
        strays = descendants(self.popen.pid)
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait(15)
        Reaper.forget(self.popen.pid)
        self._log.close()


class Epmd:
    """The Erlang port mapper the nodes of one broker register with, loopback only."""

    def __init__(self, workdir, port):
        self.port = port
        self.process = Process(
            [require_program("epmd"), "-port", str(self.port), "-address", "127.0.0.1"],
            dict(os.environ), Path(workdir) / "epmd.log", workdir,
        )
        # Up before any node, which would otherwise start a daemon of its own.
        wait_until(lambda: accepts(self.port) or not self.process.running, 10, "epmd listening")
        if not self.process.running:
            raise RuntimeError(f"epmd did not start: {(Path(workdir) / 'epmd.log').read_text()}")

    def stop(self):
        self.process.kill()


# RabbitMQ


class RabbitNode:
    """One node of a RabbitMQ cluster: its own ports, directories and configuration."""

    def __init__(self, cluster, index):
        self.cluster = cluster
        self.name = f"{cluster.prefix}-{index}@localhost"
        self.dir = cluster.workdir / f"node-{index}"
        self.dir.mkdir(parents=True)
        self.mqtt_port, self.amqp_port, self.dist_port = free_port(), free_port(), free_port()
        (self.dir / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        (self.dir / "conf.d").mkdir()
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}\n"
            "log.file.level = info\n"
            "log.console = false\n"
        )
        self.env = dict(
            cluster.env,
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
            # Not /etc/rabbitmq/conf.d's files.
            RABBITMQ_CONFIG_FILES=str(self.dir / "conf.d"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),
            RABBITMQ_PID_FILE=str(self.dir / "rabbitmq.pid"),
        )
        self.process = None
        self.starts = 0

    def __repr__(self):
        return f"<RabbitMQ node {self.name} MQTT {self.mqtt_port}>"

    @property
    def address(self):
        """As a bridge's address list names it."""
        return f"127.0.0.1:{self.mqtt_port}"

    @property
    def running(self):
        return self.process is not None and self.process.running

    def start(self):
        self.starts += 1
        self.process = Process(
            [f"{RABBITMQ_BIN}/rabbitmq-server"], self.env, self.dir / f"server-{self.starts}.log", self.dir
        )

    def wait_for_mqtt(self, timeout=BOOT_TIMEOUT):
        wait_until(lambda: accepts(self.mqtt_port) or not self.running, timeout, f"{self.name} MQTT listener")
        if not self.running:
            raise RuntimeError(f"{self.name} exited while starting:\n{self.log()[-3000:]}")

    def beam(self):
        """The Erlang VM's pid (rabbitmq-server's script is its parent)."""
        found = [p for p in descendants(self.process.popen.pid) if command_name(p) == "beam.smp"]
        assert len(found) == 1, found
        return found[0]

    def kill(self):
        """A crash: SIGKILL the VM, then whatever it leaves behind."""
        os.kill(self.beam(), signal.SIGKILL)
        self.process.popen.wait(15)
        self.process.kill()

    def stop(self):
        if self.process is not None:
            self.process.kill()

    def ctl(self, *args, timeout=120):
        """``rabbitmqctl -n NODE ARGS``: its output; a failure raises with it."""
        result = subprocess.run(
            [f"{RABBITMQ_BIN}/rabbitmqctl", "-n", self.name, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.name}: {result.stdout}{result.stderr}")
        return result.stdout

    def log(self):
        """The node's log file(s), every start's."""
        files = sorted((self.dir / "log").glob("*.log")) + sorted(self.dir.glob("server-*.log"))
        return "".join(f.read_text(errors="replace") for f in files)


class RabbitCluster:
    """
    Nodes of Debian's ``rabbitmq-server`` with the MQTT plugin, clustered
    on this machine under node names of their own (``PREFIX-N@localhost``)
    with their own cookie (HOME) and epmd port, so a system RabbitMQ is
    neither used nor touched.
    """

    def __init__(self, workdir, size=2):
        require_program("rabbitmq-server", path=RABBITMQ_BIN)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prefix = f"mqttgw-{secrets.token_hex(3)}"
        home = self.workdir / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        self.epmd = None
        self.env = {
            **os.environ,
            "HOME": str(home),
            "ERL_EPMD_PORT": str(free_port()),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            # Not /etc/rabbitmq's.
            "RABBITMQ_CONF_ENV_FILE": str(self.workdir / "rabbitmq-env.conf"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            # rabbitmqctl's own distribution port: any free one, on loopback.
            "RABBITMQ_CTL_DIST_PORT_MIN": "0",
            "RABBITMQ_CTL_DIST_PORT_MAX": "0",
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        (self.workdir / "rabbitmq-env.conf").write_text("")
        self.nodes = [RabbitNode(self, i) for i in range(size)]

    def start(self):
        """Boot every node at once, then join the others to the first."""
        try:
            self.epmd = Epmd(self.workdir, int(self.env["ERL_EPMD_PORT"]))
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                node.wait_for_mqtt()
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.name)
                node.ctl("start_app")
            self.wait_for_cluster()
        except BaseException:
            self.stop()
            raise
        return self

    def running_nodes(self, via):
        """The running nodes ``via`` sees in the cluster (none while it cannot be asked)."""
        try:
            status = json.loads(via.ctl("cluster_status", "--formatter", "json"))
        except RuntimeError:
            return set()
        return set(status["running_nodes"])

    def wait_for_cluster(self, timeout=BOOT_TIMEOUT):
        """Every node running, seen so by the others, its MQTT listener open."""
        names = {n.name for n in self.nodes}
        for node in self.nodes:
            wait_until(lambda: self.running_nodes(node) == names, timeout, f"{node.name} seeing {sorted(names)}", 1.0)
        for node in self.nodes:
            node.wait_for_mqtt(timeout)

    def restart(self, node):
        """Start a killed node again: done once it is back in the cluster and takes MQTT clients."""
        node.start()
        self.wait_for_cluster(REJOIN_TIMEOUT)

    def heal(self):
        """Every node running again, whatever a test did to them."""
        down = [n for n in self.nodes if not n.running]
        for node in down:
            node.stop()
            node.start()
        if down:
            self.wait_for_cluster(REJOIN_TIMEOUT)

    def mqtt_follower(self):
        """
        A node that does not lead the MQTT plugin's client-id tracker (a Raft
        cluster of the nodes).  Killed, it is back within seconds; the leader,
        killed, comes back only after the REJOIN_TIMEOUT wait, as its peer
        has no leader to answer it meanwhile.
        """
        for via in self.nodes:
            answer = via.ctl("eval", "ra:members({mqtt_node, node()}).")
            leader = re.search(r"\{mqtt_node,'([^']+)'\}\}\s*$", answer.strip())
            if leader:
                return next(n for n in self.nodes if n.name != leader.group(1))
        raise AssertionError(f"no MQTT client-id tracker leader in the cluster: {answer}")

    def node_at(self, port):
        (node,) = [n for n in self.nodes if n.mqtt_port == port]
        return node

    def nodes_serving(self, pid):
        """The nodes whose MQTT listener process ``pid`` (a gateway) holds a connection to."""
        ports = peer_ports(pid)
        return [n for n in self.nodes if n.mqtt_port in ports]

    def node_of(self, client_id):
        """
        The node an MQTT client is connected to, as the MQTT plugin lists its
        connections (by the listener's port); None if it lists it nowhere.
        The plugin lists the clients its client-id tracker registered: one
        that connected while a node was down, the tracker without quorum,
        is missing (nodes_serving sees it).
        """
        for via in self.nodes:
            if not via.running:
                continue
            rows = json.loads(via.ctl("list_mqtt_connections", "client_id", "port", "--formatter", "json"))
            for row in rows:
                if row["client_id"] == client_id:
                    return self.node_at(row["port"])
        return None

    def stop(self):
        for node in self.nodes:
            node.stop()
        if self.epmd is not None:
            self.epmd.stop()

    def logs(self):
        return "\n".join(f"--- {n.name}\n{n.log()[-4000:]}" for n in self.nodes)


@pytest.fixture(scope="module")
def rabbitmq_cluster(tmp_path_factory):
    """A 2-node RabbitMQ cluster shared by a module's tests; each test gets it with every node up."""
    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbitmq")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rabbitmq(rabbitmq_cluster):
    rabbitmq_cluster.heal()
    return rabbitmq_cluster


# ejabberd

EJABBERD_CONFIG = """\
hosts:
  - localhost
loglevel: info
log_rotate_count: 0
# Any user name with any password is a user of its own: a bridge gives
# one, as mod_mqtt refuses a CONNECT without a password (unless over TLS
# with a client certificate).
auth_method: [anonymous]
anonymous_protocol: login_anon
listen:
  -
    port: {port}
    ip: "127.0.0.1"
    module: mod_mqtt
modules:
  mod_mqtt: {{}}
"""


def _ejabberd_libs():
    """Where Debian's ejabberdctl has the VM look for ejabberd's applications."""
    script = Path(require_program("ejabberdctl", path="/usr/sbin")).read_text()
    match = re.search(r"^ERL_LIBS='([^']+)'", script, re.M)
    if match is None:
        raise RuntimeError("ejabberdctl does not say where ejabberd's libraries are (ERL_LIBS)")
    return match.group(1)


class Ejabberd:
    """
    Debian's ejabberd with mod_mqtt (MQTT 3.1.1 and 5.0) on a free port,
    its configuration, spool and logs in ``workdir``.  The VM runs
    undistributed (no node name, no epmd, no cookie), as the current user.
    """

    def __init__(self, workdir):
        libs = _ejabberd_libs()
        erl = require_program("erl")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = self.workdir / "ejabberd.yml"
        config.write_text(EJABBERD_CONFIG.format(port=self.port))
        (self.workdir / "home").mkdir(exist_ok=True)
        self.log_path = self.workdir / "ejabberd.log"
        env = {
            **os.environ,
            "HOME": str(self.workdir / "home"),
            "ERL_LIBS": libs,
            "EJABBERD_CONFIG_PATH": str(config),
            "EJABBERD_LOG_PATH": str(self.log_path),
            "EJABBERD_PID_PATH": str(self.workdir / "ejabberd.pid"),
            "CONTRIB_MODULES_PATH": str(self.workdir / "contrib"),
            "CONTRIB_MODULES_CONF_DIR": str(self.workdir / "contrib"),
            "ERL_CRASH_DUMP_BYTES": "0",
        }
        spool = self.workdir / "spool"
        self.process = Process(
            [erl, "-noinput", "-mnesia", "dir", f'"{spool}"', "-s", "ejabberd"],
            env, self.workdir / "vm.log", self.workdir,
        )
        try:
            wait_until(lambda: accepts(self.port) or not self.process.running, BOOT_TIMEOUT, "ejabberd's MQTT listener")
            if not self.process.running:
                raise RuntimeError(f"ejabberd exited while starting:\n{self.log()[-3000:]}")
        except BaseException:
            self.stop()
            raise

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def log(self):
        return "".join(
            p.read_text(errors="replace") for p in (self.log_path, self.workdir / "vm.log") if p.exists()
        )

    def stop(self):
        self.process.kill()


@pytest.fixture
def ejabberd(tmp_path):
    broker = Ejabberd(tmp_path / "ejabberd")
    try:
        yield broker
    finally:
        broker.stop()

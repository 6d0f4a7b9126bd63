"""
Run the gateway the way a user does, ``twistd -n mqttgw ...``, in a child
process listening on a free loopback port.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TWISTD = Path(sys.executable).parent / "twistd"

def gateway_env():
    """The environment that runs this checkout's mqttgw, installed or not."""
    return dict(os.environ, PYTHONPATH=str(REPO))


# The gateways the running test started, for its failure report (conftest).
STARTED = []

# MQTT-SN's UDP ports (its listener's, its discovery's) are told apart.
_LISTENING = re.compile(r"(?<!MQTT-SN listener)(?<!MQTT-SN discovery) starting on (\d+)")
_MQTTSN_LISTENING = re.compile(r"MQTT-SN listener starting on (\d+)")
LISTENER_FLAGS = ("--tcp", "--tls", "--ws", "--wss")


class Gateway:
    """``prefix``: what runs twistd (``ip netns exec NAME`` for a field site)."""

    def __init__(self, workdir, *args, timeout=30, prefix=()):
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "gateway.log"
        env = gateway_env()
        self._log = open(self.log_path, "wb")
        command = list(prefix) + [str(TWISTD), "-n", "--pidfile=", "--logfile=-", "mqttgw"]
        if "--tcp" not in args:
            command += ["--tcp", "tcp:0:interface=127.0.0.1"]
        command += list(args)
        # Wait until every listener is up; the first TCP one gives .port.
        self._listeners = sum(a in LISTENER_FLAGS for a in command)
        self._mqttsn_listeners = sum(a == "--mqttsn" for a in command)
        # The MQTT-SN listeners' UDP ports, in the order they started.
        self.mqttsn_ports = []
        STARTED.append(self)
        self.process = subprocess.Popen(
            command,
            cwd=self.workdir,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.port = self._wait_for_port(timeout)

    def _wait_for_port(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            found = _LISTENING.findall(text)
            mqttsn = _MQTTSN_LISTENING.findall(text)
            if len(found) >= self._listeners and len(mqttsn) >= self._mqttsn_listeners:
                self.mqttsn_ports = [int(port) for port in mqttsn]
                return int(found[0])
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"gateway did not start listening:\n{self.log()}")

    @property
    def mqttsn_port(self):
        """The first MQTT-SN listener's UDP port."""
        return self.mqttsn_ports[0]

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not logged within {timeout}s:\n{self.log()}")

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

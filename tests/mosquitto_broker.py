"""A real mosquitto broker, started by a test on a free port, as an upstream."""

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.conftest import require_program
from tests.network import free_port


class Mosquitto:
    """
    A mosquitto of its own on free ports. Stop it whatever the test does:
    with the ``start_mosquitto`` fixture (tests/conftest.py), ``with
    Mosquitto(...).start() as broker:``, or try/finally.
    """

    def __init__(self, workdir, tls=None, extra=()):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        os.environ["PATH"] = os.environ["PATH"] + ":/usr/sbin"
        self.binary = require_program("mosquitto")
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "max_queued_messages 100000",
            f"log_dest file {self.workdir}/mosquitto.log",
            "log_type all",
        ]
        if os.geteuid() == 0:
            # Otherwise it drops to its own user, who cannot reach the
            # tests' private temporary directories.
            lines.append("user root")
        if tls:
            lines += [
                f"listener {self.tls_port} 127.0.0.1",
                f"certfile {tls['cert']}",
                f"keyfile {tls['key']}",
            ]
        lines += list(extra)
        self.conf = self.workdir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.process = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(self.workdir / f"mosquitto-{self.starts}.log", "wb")
        self.process = subprocess.Popen(
            [self.binary, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        # Not left running for want of a listener.
        self.stop()
        raise RuntimeError(f"mosquitto did not start: {self.log()}")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def log(self):
        path = self.workdir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)

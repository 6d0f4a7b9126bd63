"""
A real Prometheus (Debian's ``prometheus``), started by a test on a free
loopback port with its storage in the test's directory, and its HTTP API.
"""

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.conftest import require_program
from tests.mosquitto_broker import free_port


class Prometheus:
    """Stop it whatever the test does: ``with Prometheus(...) as prometheus:``."""

    def __init__(self, workdir, config):
        self.workdir = Path(workdir)
        self.config = Path(config)
        self.binary = require_program("prometheus")
        self.port = free_port()
        self.process = None

    def __enter__(self):
        self.log_path = self.workdir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_until_ready(30)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def _wait_until_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("/-/ready"), timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready within {timeout}s:\n{self.log()}")

    def url(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        return f"http://127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    def api(self, path, **params):
        """The ``data`` of a successful answer of the HTTP API (``/api/v1/...``)."""
        try:
            with urllib.request.urlopen(self.url(path, **params), timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{path} {params}: {e.code} {e.read().decode(errors='replace')}") from e
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        """The instant vector (or scalar) ``expr`` evaluates to now, through /api/v1/query."""
        return self.api("/api/v1/query", query=expr)

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

"""mosquitto_sub and mosquitto_pub driven from tests."""

import queue
import signal
import subprocess
import threading
import time

from tests.conftest import require_program

TIMEOUT = 10


class Sub:
    """mosquitto_sub in the background, its output lines read as they come."""

    def __init__(self, port, version, *args):
        # Line-buffered, so each message is seen as it arrives.
        command = [
            "stdbuf", "-oL",
            require_program("mosquitto_sub"),
            "-h", "127.0.0.1",
            "-p", str(port),
            "-V", version,
            "-d", "-v",
            *args,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.debug = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for_debug("received SUBACK")

    def _read(self):
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if line.startswith(("Client ", "Subscribed (mid")):
                self.debug.append(line)
            else:
                self.lines.put(line)

    def wait_for_debug(self, text, count=1):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if sum(text in d for d in self.debug) >= count:
                return
            if self.process.poll() is not None and not self.debug:
                break
            time.sleep(0.02)
        raise AssertionError(f"mosquitto_sub never said {text!r}: {self.debug}")

    def messages(self, n):
        return [self.lines.get(timeout=TIMEOUT) for _ in range(n)]

    def finish(self):
        """Wait for mosquitto_sub to exit by itself; the lines not yet taken."""
        self.process.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        lines = []
        while not self.lines.empty():
            lines.append(self.lines.get_nowait())
        return lines

    def stop(self, sig=signal.SIGTERM):
        self.process.send_signal(sig)
        try:
            self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            # A mosquitto_sub between reconnects on a loaded machine can
            # miss its TERM's turn; what the test checks came before this.
            self.process.kill()
            self.process.wait(TIMEOUT)


def pub(port, version, topic, *args, input=None):
    subprocess.run(
        [
            require_program("mosquitto_pub"),
            "-h", "127.0.0.1",
            "-p", str(port),
            "-V", version,
            "-t", topic,
            *args,
        ],
        check=True,
        timeout=TIMEOUT,
        input=input,
        text=True,
    )

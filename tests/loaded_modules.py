"""
What a gateway has loaded once it answers CONNECT, started as twistd
starts it in a fresh interpreter with the options a test gives.
"""

import json
import subprocess
import sys

from tests.gateway import gateway_env
from tests.network import free_port

# Started by twistd's own entry point; a thread waits for the reactor's
# first CONNACK and then writes what is loaded.
DRIVER = r"""
import json, socket, sys, threading, time

path, port = sys.argv[1], int(sys.argv[2])
CONNECT = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01f"

def report():
    connack = b""
    deadline = time.monotonic() + 60
    while not connack and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(CONNECT)
                connack = s.recv(4)
        except OSError:
            time.sleep(0.05)
    with open(path, "w") as f:
        json.dump({"connack": connack.hex(), "modules": sorted(sys.modules)}, f)
    reactor = sys.modules["twisted.internet.reactor"]
    reactor.callFromThread(reactor.stop)

threading.Thread(target=report, daemon=True).start()
from twisted.scripts.twistd import run
sys.argv = ["twistd", "-n", "--pidfile=", "--logfile=-", "mqttgw"] + sys.argv[3:]
run()
"""


def loaded(tmp_path, *args):
    """The modules loaded once a gateway started with ``args`` answered CONNECT."""
    port = free_port()
    out = tmp_path / "loaded.json"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), str(port),
         "--tcp", f"tcp:{port}:interface=127.0.0.1", "--no-persistence", *args],
        cwd=tmp_path, env=gateway_env(), capture_output=True, timeout=120,
    )
    assert out.exists(), done.stdout.decode(errors="replace")[-3000:]
    report = json.loads(out.read_text())
    assert report["connack"] == "20020000", done.stdout.decode(errors="replace")[-3000:]
    return set(report["modules"])

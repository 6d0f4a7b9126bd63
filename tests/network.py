"""
Loopback networking for the tests: free ports, listener endpoint strings,
a raw MQTT CONNECT, whether the gateway closed a socket, a plain HTTP
request to the admin listener, and polling until a condition holds.
"""

import socket
import time
import urllib.error
import urllib.request

from mqttgw.wire import packets as P

LOCAL = "127.0.0.1"


def free_port():
    # Free on every address: some listeners bind 0.0.0.0, and a port the
    # kernel hands out for 127.0.0.1 alone may be held on another address
    # (127.0.0.2, a connection in TIME_WAIT).
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def endpoint(port):
    """A Twisted endpoint string for a listener on ``port`` of 127.0.0.1."""
    return f"tcp:{port}:interface={LOCAL}"


def http(port, path, method="GET"):
    """(status, body) of a request to the admin listener."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(condition, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout}s")


def raw_connect(port, client_id, clean_session=True):
    """A socket that sent CONNECT; returns it with the CONNACK's return code."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(P.Connect(client_id=client_id, clean_session=clean_session).encode())
    connack = sock.recv(4)
    return sock, connack[3]


def closed_by_peer(sock, timeout=10.0):
    """Whether the gateway closed ``sock`` (reading what it still sends)."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False

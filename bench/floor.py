"""
A floor under a connection storm in Python: a minimal epoll server that
does what a broker does per connect (accept the socket, watch it with
epoll, read the CONNECT, write a CONNACK, keep the socket) and nothing of
MQTT beyond those four bytes: no parsing, no session, no timer, no log.
What it costs a connect here is about what Python and the kernel cost any
broker in Python built this way; the storm scenario runs it beside the
brokers as ``python-floor``.

    python -m bench.floor TCP_PORT [OTHER_PORT ...]

Every port listens on 127.0.0.1; the others (the bench's WebSocket port)
only accept, as the broker class checks each port is open.
"""

import select
import socket
import sys

CONNACK = b"\x20\x02\x00\x00"
# Sockets taken per wake-up of the listening socket.
ACCEPTS = 256


def _listen(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit it: no call per connect.
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind(("127.0.0.1", port))
    s.listen(4096)
    s.setblocking(False)
    return s


def serve(ports):
    poller = select.epoll()
    listening = {}
    for port in ports:
        s = _listen(port)
        listening[s.fileno()] = s
        poller.register(s.fileno(), select.EPOLLIN)
    held = {}
    while True:
        for fd, _events in poller.poll():
            s = listening.get(fd)
            if s is not None:
                for _ in range(ACCEPTS):
                    try:
                        conn, _address = s.accept()
                    except OSError:
                        # None waiting (EAGAIN), or one the kernel gave up on.
                        break
                    conn.setblocking(False)
                    held[conn.fileno()] = conn
                    poller.register(conn.fileno(), select.EPOLLIN)
                continue
            conn = held[fd]
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                try:
                    conn.send(CONNACK)
                    continue
                except OSError:
                    # Reset or broken: closed, as one that ended.
                    pass
            poller.unregister(fd)
            del held[fd]
            conn.close()


if __name__ == "__main__":
    serve([int(p) for p in sys.argv[1:]])

"""
A TCP proxy that makes a link bad, placed in a field site's uplink by the
network-fault tests and benchmarks (these kernels have tc's tbf for a rate
cap, but no netem): every chunk is held for a delay with jitter (order
kept in each direction), the link stalls now and then (nothing crosses,
nothing is lost), connections are reset, and on a signal every connection
goes half-open (both sockets stay open, nothing crosses again, nobody is
told), as a dead NAT leaves them.

    python -m bench.faultproxy --listen 127.0.0.1:11883 --target 10.77.1.1:1883 \\
        --delay 0.08 --jitter 0.02 --stall-every 30 --stall-for 3 --reset-every 60

SIGUSR1: every connection now goes half-open.  SIGUSR2: reset every
connection now.  Each fault is logged on stdout, one line each.  What a
connection holds is bounded: past ``--buffer`` bytes waiting, the side
sending is paused.
"""

import argparse
import random
import signal
import socket
import sys
import time
from collections import deque

from twisted.internet import protocol
from twisted.internet.endpoints import TCP4ClientEndpoint

LIMIT = 4 * 1024 * 1024


def say(text):
    print(f"{time.strftime('%H:%M:%S')} faultproxy: {text}", flush=True)


class Faults:
    """The link's faults, shared by every connection through it."""

    def __init__(self, reactor, delay, jitter, stall_every, stall_for, reset_every, seed, buffer):
        self.reactor = reactor
        self.delay = delay
        self.jitter = jitter
        self.stall_every = stall_every
        self.stall_for = stall_for
        self.reset_every = reset_every
        self.random = random.Random(seed)
        self.buffer = buffer
        self.stalled_until = 0.0
        self.links = set()
        if stall_every:
            reactor.callLater(stall_every, self.stall)
        if reset_every:
            reactor.callLater(reset_every, self.reset_one)

    def hold(self):
        """Seconds a chunk waits: the delay give or take the jitter."""
        if not self.delay and not self.jitter:
            return 0.0
        return max(0.0, self.delay + self.random.uniform(-self.jitter, self.jitter))

    def stall(self):
        self.stalled_until = self.reactor.seconds() + self.stall_for
        say(f"stall for {self.stall_for} s")
        self.reactor.callLater(self.stall_for, self._unstall)
        self.reactor.callLater(self.stall_every, self.stall)

    def _unstall(self):
        for link in list(self.links):
            link.flush()

    def reset_one(self):
        if self.links:
            link = self.random.choice(sorted(self.links, key=id))
            say("reset one connection")
            link.reset()
        self.reactor.callLater(self.reset_every, self.reset_one)

    def reset_all(self):
        say(f"reset {len(self.links)} connection(s)")
        for link in list(self.links):
            link.reset()

    def half_open_all(self):
        say(f"{len(self.links)} connection(s) half-open")
        for link in list(self.links):
            link.half_open = True


class _Side(protocol.Protocol):
    """One socket of a link: what it reads goes to the other side."""

    def __init__(self, link, name):
        self.link = link
        self.name = name

    def dataReceived(self, data):
        self.link.carry(self, data)

    def connectionLost(self, reason):
        self.link.lost(self)


class Link:
    """A client's connection and the proxy's to the target."""

    def __init__(self, faults):
        self.faults = faults
        self.client = None
        self.server = None
        self.half_open = False
        self.closed = False
        # The side that closed cleanly while what it sent was still held:
        # the other side is closed once that is delivered.
        self.closing = None
        # Per direction: (due, data) in order, and the bytes held.
        self.queues = {}
        self.held = {}

    def carry(self, source, data):
        if self.half_open or self.closed:
            return
        faults = self.faults
        now = faults.reactor.seconds()
        queue = self.queues.setdefault(source, deque())
        due = max(now + faults.hold(), queue[-1][0] if queue else 0.0)
        queue.append((due, data))
        self.held[source] = self.held.get(source, 0) + len(data)
        if self.held[source] > faults.buffer:
            source.transport.pauseProducing()
        faults.reactor.callLater(max(0.0, due - now), self.flush)

    def flush(self):
        if self.half_open or self.closed:
            return
        faults = self.faults
        now = faults.reactor.seconds()
        if now < faults.stalled_until:
            return
        for source, queue in self.queues.items():
            sink = self.server if source is self.client else self.client
            if sink is None or sink.transport is None:
                continue
            out = []
            while queue and queue[0][0] <= now + 1e-6:
                out.append(queue.popleft()[1])
            if out:
                data = b"".join(out)
                sink.transport.write(data)
                before = self.held[source]
                self.held[source] = before - len(data)
                if before > faults.buffer >= self.held[source]:
                    source.transport.resumeProducing()
            if source is self.closing and not queue:
                self.closed = True
                faults.links.discard(self)
                sink.transport.loseConnection()
                return

    def reset(self):
        """Both sockets closed with an RST, as a router that lost state sends."""
        self.closed = True
        for side in (self.client, self.server):
            if side is not None and side.transport is not None:
                sock = side.transport.getHandle()
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
                side.transport.abortConnection()

    def lost(self, side):
        if self.half_open:
            return
        if not self.closed and self.queues.get(side):
            # A clean close comes after the data before it (a CONNACK
            # refusal, say), delay and all; a stall's end flushes it too.
            self.closing = side
            return
        self.faults.links.discard(self)
        self.closed = True
        other = self.server if side is self.client else self.client
        if other is not None and other.transport is not None:
            other.transport.loseConnection()


class _ClientSide(_Side):
    def connectionMade(self):
        link = self.link
        self.transport.pauseProducing()
        faults = link.faults
        host, port = faults.target
        endpoint = TCP4ClientEndpoint(faults.reactor, host, port, timeout=10)

        def connected(server):
            link.server = server
            self.transport.resumeProducing()
            link.flush()

        def failed(reason):
            say(f"target unreachable: {reason.getErrorMessage()}")
            self.transport.loseConnection()

        factory = protocol.Factory.forProtocol(lambda: _Side(link, "server"))
        endpoint.connect(factory).addCallbacks(connected, failed)


class ProxyFactory(protocol.Factory):
    noisy = False

    def __init__(self, faults):
        self.faults = faults

    def buildProtocol(self, addr):
        link = Link(self.faults)
        link.client = _ClientSide(link, "client")
        self.faults.links.add(link)
        return link.client


def _address(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.faultproxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--target", required=True, help="HOST:PORT to connect to")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each chunk is held")
    parser.add_argument("--jitter", type=float, default=0.0, help="give or take this many seconds")
    parser.add_argument("--stall-every", type=float, default=0.0, help="a stall every this many seconds (0: none)")
    parser.add_argument("--stall-for", type=float, default=3.0, help="seconds a stall lasts")
    parser.add_argument("--reset-every", type=float, default=0.0, help="reset a connection every this many seconds (0: never)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--buffer", type=int, default=LIMIT, help="bytes a direction holds before its sender is paused")
    args = parser.parse_args(argv)
    from twisted.internet import reactor

    faults = Faults(
        reactor, args.delay, args.jitter, args.stall_every, args.stall_for, args.reset_every,
        args.seed, args.buffer,
    )
    faults.target = _address(args.target)
    host, port = _address(args.listen)
    reactor.listenTCP(port, ProxyFactory(faults), interface=host)
    signal.signal(signal.SIGUSR1, lambda *_: reactor.callFromThread(faults.half_open_all))
    signal.signal(signal.SIGUSR2, lambda *_: reactor.callFromThread(faults.reset_all))
    say(f"listening on {args.listen}, to {args.target}")
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

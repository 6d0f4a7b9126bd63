"""
The listeners' reactor dispatches each event without a logging context,
and does what Twisted's does with what a handler returns or raises (see
mqttgw.transports.leanreactor).
"""

import select
import socket

import pytest
from twisted.internet import epollreactor
from twisted.internet.abstract import FileDescriptor
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock
from twisted.python import log

from mqttgw.transports import leanreactor


class Reader(FileDescriptor):
    """One end of a socket pair; ``action`` decides what doRead does."""

    def __init__(self, sock, reactor, action):
        super().__init__(reactor)
        self.socket = sock
        self.action = action
        self.read = []
        self.lost = []

    def fileno(self):
        return self.socket.fileno()

    def logPrefix(self):
        return "Reader,7"

    def doRead(self):
        data = self.socket.recv(100)
        if not data:
            return ConnectionDone()
        self.read.append(data)
        return self.action()

    def connectionLost(self, reason):
        self.lost.append(reason)
        super().connectionLost(reason)


def close(reactor):
    """A reactor made here and never run: its descriptors closed."""
    reactor.removeAll()
    reactor.waker.connectionLost(None)
    reactor._poller.close()


@pytest.fixture
def lean():
    reactor = leanreactor.poll_lean(epollreactor.EPollReactor())
    yield reactor
    close(reactor)


@pytest.fixture
def pair(lean):
    ours, theirs = socket.socketpair()
    yield ours, theirs
    lean.removeAll()
    ours.close()
    theirs.close()


def poll_until(reactor, predicate, turns=50):
    for _ in range(turns):
        if predicate():
            return
        reactor.doIteration(0.1)
    raise AssertionError("not within 50 turns")


def test_only_twisteds_epoll_reactor_changes_class():
    memory = MemoryReactorClock()
    assert leanreactor.poll_lean(memory) is memory
    assert type(memory) is MemoryReactorClock
    reactor = epollreactor.EPollReactor()
    try:
        assert type(leanreactor.poll_lean(reactor)) is leanreactor.EPollReactor
        # Twice is once.
        assert type(leanreactor.poll_lean(reactor)) is leanreactor.EPollReactor
    finally:
        close(reactor)


def test_a_readable_descriptor_is_read(lean, pair):
    ours, theirs = pair
    reader = Reader(ours, lean, lambda: None)
    lean.addReader(reader)
    theirs.send(b"hello")
    poll_until(lean, lambda: reader.read)
    assert reader.read == [b"hello"]
    assert reader.lost == []


def test_a_reason_returned_disconnects(lean, pair):
    ours, theirs = pair
    reader = Reader(ours, lean, lambda: None)
    lean.addReader(reader)
    theirs.close()
    poll_until(lean, lambda: reader.lost)
    assert reader.lost[0].check(ConnectionDone)
    assert reader not in lean.getReaders()


def test_a_handler_that_raises_is_logged_with_its_name_and_disconnected(lean, pair):
    ours, theirs = pair

    def fail():
        raise ValueError("no good")

    reader = Reader(ours, lean, fail)
    lean.addReader(reader)
    events = []
    log.addObserver(events.append)
    try:
        theirs.send(b"x")
        poll_until(lean, lambda: reader.lost)
    finally:
        log.removeObserver(events.append)
    assert reader.lost[0].check(ValueError)
    errors = [e for e in events if e.get("isError")]
    assert len(errors) == 1
    assert errors[0]["system"] == "Reader,7"
    assert errors[0]["failure"].check(ValueError)
    assert reader not in lean.getReaders()


def tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as server:
        theirs = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    return ours, theirs


def test_peers_closes_wait_behind_reads_and_are_taken_a_few_a_poll(lean):
    lean.CLOSES_PER_POLL = lean.CLOSES_ALONE = 2
    order = []
    pairs = [tcp_pair() for _ in range(6)]
    try:
        readers = []
        for i, (ours, _) in enumerate(pairs):
            reader = Reader(ours, lean, lambda i=i: order.append(("read", i)))
            reader.connectionLost = lambda reason, i=i: order.append(("closed", i))
            readers.append(reader)
        # Five peers close; the last one sends, after them.
        for _, theirs in pairs[:5]:
            theirs.close()
        pairs[5][1].send(b"x")
        for reader in readers:
            lean.addReader(reader)
        poll_until(lean, lambda: order)
        assert order[0] == ("read", 5)
        assert [what for what, _ in order[1:]] == ["closed"] * 2
        closed = 2
        for _ in range(2):
            lean.doPoll(0.1)
            now = len(order) - 1
            assert now - closed <= 2
            closed = now
        assert sorted(i for what, i in order if what == "closed") == [0, 1, 2, 3, 4]
    finally:
        lean.removeAll()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


def test_the_peers_close_is_watched_while_reading_only():
    reactor = leanreactor.poll_lean(epollreactor.EPollReactor())
    ours, theirs = tcp_pair()
    try:
        reader = Reader(ours, reactor, lambda: None)
        reactor.addReader(reader)
        reactor.addWriter(reader)
        reactor.removeReader(reader)
        # Writing only: a close is an error or a hang-up to the writer.
        theirs.close()
        events = dict(reactor._poller.poll(0.1))
        assert not events.get(ours.fileno(), 0) & select.EPOLLRDHUP
        reactor.addReader(reader)
        events = dict(reactor._poller.poll(0.1))
        assert events[ours.fileno()] & select.EPOLLRDHUP
    finally:
        reactor.removeAll()
        close(reactor)
        ours.close()


def test_peers_closes_with_nothing_else_ready_are_taken_more_a_poll(lean):
    lean.CLOSES_PER_POLL = 1
    lean.CLOSES_ALONE = 4
    closed = []
    pairs = [tcp_pair() for _ in range(6)]
    try:
        for i, (ours, _) in enumerate(pairs):
            reader = Reader(ours, lean, lambda: None)
            reader.connectionLost = lambda reason, i=i: closed.append(i)
            lean.addReader(reader)
        for _, theirs in pairs:
            theirs.close()
        poll_until(lean, lambda: closed)
        assert len(closed) == 4
        poll_until(lean, lambda: len(closed) == 6)
        assert sorted(closed) == list(range(6))
    finally:
        lean.removeAll()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()

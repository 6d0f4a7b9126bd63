"""
The reactor's poll loop, without a logging context per event, and with
peers' closes put after open connections' reads.

Twisted's epoll reactor runs every read and write event inside
``log.callWithLogger``: it asks the selectable for its log prefix and
copies a context dictionary so that a legacy log line written meanwhile
names the connection.  That costs a sizeable share of what routing a
PUBLISH costs, and nothing here writes legacy log lines on the
way.  :class:`EPollReactor` calls the handlers directly and names the
connection only when a handler raises, where Twisted's line needs it.

Closing a connection costs far more than a read (its socket, the
reactor's sets, its session).  When hundreds of clients close at once (a reconnect storm), one
poll would close them all before reading the connections that stay open.
Descriptors are watched for the peer's close too (``EPOLLRDHUP``): a poll
handles the other events first, then at most ``CLOSES_PER_POLL`` closes
(``CLOSES_ALONE`` when nothing else was ready); the others are still
ready, and the next polls take them.

The gateway's own transports (:class:`~mqttgw.transports.tcpserver.Server`)
are kept in a list by descriptor number, what they wait for read from their
own flags: Twisted's dictionary of selectables and its sets of readers and
writers cost an idle connection some 130 bytes (their entries, and the
number of its descriptor), a list's slot 8.
"""

import sys
from select import EPOLLIN, EPOLLOUT, EPOLLRDHUP

from twisted.internet import epollreactor
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.posixbase import _NO_FILEDESC
from twisted.python import failure, log

from mqttgw.transports.tcpserver import READING, WRITING, Server


class EPollReactor(epollreactor.EPollReactor):
    """Twisted's epoll reactor with a leaner dispatch of each event, and
    a bound on the peers' closes handled a poll."""

    CLOSES_PER_POLL = 16
    # ... and when no other event is ready (some 8 ms of closing).
    CLOSES_ALONE = 256

    def __init__(self):
        self._own = []
        super().__init__()

    def doPoll(self, timeout):
        try:
            events = self._poller.poll(-1 if timeout is None else timeout, len(self._selectables))
        except InterruptedError:
            return
        selectables = self._selectables
        own = self._own
        dispatch = self._doReadOrWrite
        closed = []
        # With nothing else ready, more closes are handled: when
        # thousands close at once, every poll reports them all again, and
        # a poll that went over all of them for 16 made their cost grow
        # with their square.
        closes = self.CLOSES_ALONE
        others = False
        for fd, event in events:
            if event & EPOLLRDHUP:
                if closes:
                    closed.append((fd, event))
                    closes -= 1
                continue
            others = True
            selectable = own[fd] if fd < len(own) else None
            if selectable is None:
                selectable = selectables.get(fd)
            if selectable is not None:
                dispatch(selectable, fd, event)
        if closed:
            for fd, event in closed[: self.CLOSES_PER_POLL] if others else closed:
                selectable = own[fd] if fd < len(own) else None
                if selectable is None:
                    selectable = selectables.get(fd)
                if selectable is not None:
                    dispatch(selectable, fd, event)

    doIteration = doPoll

    # Reading is watched for the peer's close as well (see doPoll).

    def _add(self, xer, primary, other, selectables, event, antievent):
        super()._add(xer, primary, other, selectables, _closes(event), _closes(antievent))

    def _remove(self, xer, primary, other, selectables, event, antievent):
        super()._remove(xer, primary, other, selectables, _closes(event), _closes(antievent))

    # The gateway's own transports, by descriptor.

    def addReader(self, reader):
        if isinstance(reader, Server):
            reader._flags |= READING
            self._watch(reader)
        else:
            super().addReader(reader)

    def addWriter(self, writer):
        if isinstance(writer, Server):
            writer._flags |= WRITING
            self._watch(writer)
        else:
            super().addWriter(writer)

    def removeReader(self, reader):
        if isinstance(reader, Server):
            reader._flags &= ~READING
            self._watch(reader)
        else:
            super().removeReader(reader)

    def removeWriter(self, writer):
        if isinstance(writer, Server):
            writer._flags &= ~WRITING
            self._watch(writer)
        else:
            super().removeWriter(writer)

    def _watch(self, transport):
        """Tell epoll what ``transport`` waits for now (its flags say)."""
        own = self._own
        fd = transport.fileno()
        if fd < 0:
            # Its socket is gone: found by a walk, as Twisted's _remove does.
            fd = next((n for n, t in enumerate(own) if t is transport), -1)
            if fd < 0:
                return
        flags = transport._flags
        mask = (EPOLLIN | EPOLLRDHUP if flags & READING else 0) | (EPOLLOUT if flags & WRITING else 0)
        if fd < len(own) and own[fd] is transport:
            if mask:
                self._poller.modify(fd, mask)
            else:
                own[fd] = None
                try:
                    self._poller.unregister(fd)
                except OSError:
                    # Closed already, which took it out of epoll.
                    pass
        elif mask:
            if fd >= len(own):
                own.extend([None] * max(fd + 1 - len(own), len(own)))
            self._poller.register(fd, mask)
            own[fd] = transport

    def getReaders(self):
        return super().getReaders() + [t for t in self._own if t is not None and t._flags & READING]

    def getWriters(self):
        return super().getWriters() + [t for t in self._own if t is not None and t._flags & WRITING]

    def removeAll(self):
        own = [t for t in self._own if t is not None]
        for transport in own:
            transport._flags &= ~(READING | WRITING)
            self._watch(transport)
        return super().removeAll() + own

    def _doReadOrWrite(self, selectable, fd, event):
        # As posixbase._PollLikeMixin's, with the connection named on the
        # error's log line rather than in a context made for every event.
        why = None
        inRead = False
        if event & self._POLL_DISCONNECTED and not (event & self._POLL_IN):
            # A clean shutdown once all input is read; else an error.
            if fd in self._reads or (isinstance(selectable, Server) and selectable._flags & READING):
                inRead = True
                why = CONNECTION_DONE
            else:
                why = CONNECTION_LOST
        else:
            try:
                if selectable.fileno() == -1:
                    why = _NO_FILEDESC
                else:
                    if event & self._POLL_IN:
                        why = selectable.doRead()
                        inRead = True
                    if not why and event & self._POLL_OUT:
                        why = selectable.doWrite()
                        inRead = False
            except BaseException:
                why = sys.exc_info()[1]
                log.err(failure.Failure(), system=_prefix(selectable))
        if why:
            self._disconnectSelectable(selectable, why, inRead)


def _closes(flags):
    return flags | EPOLLRDHUP if flags & EPOLLIN else flags


def _prefix(selectable):
    try:
        return selectable.logPrefix()
    except BaseException:
        return "(buggy logPrefix method)"


def poll_lean(reactor):
    """Make ``reactor`` an :class:`EPollReactor` if it is Twisted's own
    epoll reactor; any other reactor is left as it is."""
    if type(reactor) is epollreactor.EPollReactor:
        reactor.__class__ = EPollReactor
        reactor._own = []
    return reactor

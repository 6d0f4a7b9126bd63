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
"""

import sys
from select import EPOLLIN, EPOLLRDHUP

from twisted.internet import epollreactor
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.posixbase import _NO_FILEDESC
from twisted.python import failure, log


class EPollReactor(epollreactor.EPollReactor):
    """Twisted's epoll reactor with a leaner dispatch of each event, and
    a bound on the peers' closes handled a poll."""

    CLOSES_PER_POLL = 16
    # ... and when no other event is ready (some 8 ms of closing).
    CLOSES_ALONE = 256

    def doPoll(self, timeout):
        try:
            events = self._poller.poll(-1 if timeout is None else timeout, len(self._selectables))
        except InterruptedError:
            return
        selectables = self._selectables
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
            selectable = selectables.get(fd)
            if selectable is not None:
                dispatch(selectable, fd, event)
        if closed:
            for fd, event in closed[: self.CLOSES_PER_POLL] if others else closed:
                selectable = selectables.get(fd)
                if selectable is not None:
                    dispatch(selectable, fd, event)

    doIteration = doPoll

    # Reading is watched for the peer's close as well (see doPoll).

    def _add(self, xer, primary, other, selectables, event, antievent):
        super()._add(xer, primary, other, selectables, _closes(event), _closes(antievent))

    def _remove(self, xer, primary, other, selectables, event, antievent):
        super()._remove(xer, primary, other, selectables, _closes(event), _closes(antievent))

    def _doReadOrWrite(self, selectable, fd, event):
        # As posixbase._PollLikeMixin's, with the connection named on the
        # error's log line rather than in a context made for every event.
        why = None
        inRead = False
        if event & self._POLL_DISCONNECTED and not (event & self._POLL_IN):
            # A clean shutdown once all input is read; else an error.
            if fd in self._reads:
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
    return reactor

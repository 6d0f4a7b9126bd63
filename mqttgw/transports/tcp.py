"""
The listeners' TCP ports and connections: Twisted's, leaner and quicker.

CPython 3.11 keeps an instance's attributes in a small array laid out by
keys its class shares; a name the shared keys do not hold yet gives that
instance a dictionary of its own.  The room for new names
shrinks by one with every instance made, so a burst of connections at
start-up leaves no room for the names Twisted sets only on the first write
(``dataBuffer``, ``offset``), and every later connection pays for a
dictionary.  :func:`share` sets every name a live connection uses on one
throwaway instance, before the first connection, which puts them all in
the shared keys.

:class:`Server` keeps no log prefix, representation string or bound
``fileno`` method per connection: it makes them when they are asked
for; nor a list for bytes waiting to be written while none wait; nor a
second reference to the peer's host.  Peers at one address (behind a NAT
or a load balancer, or many clients on one host) share one string for
it, not one each.  It sends what it is given at once when nothing waits
before it, as mosquitto does, rather than on the reactor's next turn.
:class:`Port` accepts connections in bounded batches.
"""

import errno
import socket
import sys
from collections import deque

from twisted.internet import tcp

# What tcp.Server and its bases set on a connection that is open: its
# constructor, registerProducer, write and doWrite, pauseProducing.
LIVE_ATTRIBUTES = (
    "reactor", "_tempDataBuffer", "_tempDataLen", "socket", "fileno", "protocol",
    "server", "client", "sessionno", "hostname", "logstr", "repstr", "connected",
    "producer", "streamingProducer", "dataBuffer", "offset", "producerPaused",
)


def _discard(*_):
    pass


def _closed():
    # As abstract.FileDescriptor.fileno: no socket any more.
    return -1


class _SocketFileno:
    """``fileno``, looked up on the socket when asked for; tcp.Connection
    sets it and deletes it, both of which change nothing."""

    def __get__(self, transport, cls=None):
        if transport is None:
            return self
        try:
            return transport.socket.fileno
        except AttributeError:
            return _closed

    __set__ = __delete__ = _discard


class _NothingWaits(list):
    """
    An empty write buffer shared by every connection with nothing waiting,
    in place of the empty list Twisted gives each; a connection gets a
    list of its own when bytes must wait.  It refuses to hold any.
    """

    def _refuse(self, *_):
        raise TypeError("the shared empty write buffer holds nothing")

    append = extend = insert = __setitem__ = __iadd__ = _refuse


_NOTHING_WAITS = _NothingWaits()


class Server(tcp.Server):
    """A server-side TCP transport that writes eagerly and makes its strings
    for logs and its write buffer on demand."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tempDataBuffer = _NOTHING_WAITS

    def _idle(self):
        """Whether bytes written now may go straight to the socket."""
        return (
            not self.TLS
            and not self._tempDataLen
            and self.offset == len(self.dataBuffer)
            and self.connected
            and not self.disconnecting
            and not self._writeDisconnected
        )

    def write(self, data):
        # With nothing buffered, waiting for the socket to be writable
        # costs two epoll_ctl calls and a doWrite for bytes it takes now.
        if data and self._idle():
            try:
                sent = self.socket.send(data)
            except OSError:
                # Full (EAGAIN), or broken: doWrite meets the error and
                # reports the connection lost, as it would have.
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        if self._tempDataBuffer is _NOTHING_WAITS:
            self._tempDataBuffer = []
        super().write(data)

    def writeSequence(self, iovec):
        # A WebSocket frame's header and payload: joined only to go now.
        if self._idle():
            self.write(b"".join(iovec))
        else:
            if self._tempDataBuffer is _NOTHING_WAITS:
                self._tempDataBuffer = []
            super().writeSequence(iovec)

    def doWrite(self):
        # Twisted leaves a fresh empty list after moving what waited.
        result = super().doWrite()
        if not self._tempDataBuffer:
            self._tempDataBuffer = _NOTHING_WAITS
        return result

    def logPrefix(self):
        # Asked for when a line is logged about the connection.
        return f"{self._protocol_name()},{self.sessionno},{self.hostname}"

    def __repr__(self):
        port = self.server._realPortNumber if self.server is not None else self.client[1]
        return f"<{self._protocol_name()} #{self.sessionno} on {port}>"

    def _protocol_name(self):
        # tcp.Connection forgets its protocol once the connection is lost.
        protocol = getattr(self, "protocol", None)
        return "Closed" if protocol is None else self._getLogPrefix(protocol)

    # tcp.Server's constructor sets them; nothing is kept.
    logstr = property(logPrefix, _discard)
    repstr = property(__repr__, _discard)
    fileno = _SocketFileno()
    hostname = property(lambda self: self.client[0], _discard)


class Port(tcp.Port):
    """
    A listening TCP port that makes :class:`Server` s, and accepts at most
    ``ACCEPTS_PER_READ`` connections each time the reactor finds it
    readable: tcp.Port grows its batch by 20 with every full one, so a
    storm of connects would hold the reactor for one ever longer turn.

    With an ``admission`` (a listener's :class:`~.schedulers.Flusher`) it
    makes no more connections than there is room for.  Sockets beyond
    that are taken out of the kernel's queue and held (``held``), as many
    as ``vacancies()`` allows, when it is given: the kernel's queue is
    capped at net.core.somaxconn (4096 on most systems), and every SYN
    that arrives while it is full costs its client a second's retry, so a
    storm of 10,000 clients connecting at once would wait on the kernel
    rather than on the gateway.  Taking a socket in costs an accept();
    its connection is made once there is room.  Without ``vacancies`` the
    rest wait in the kernel's queue, the port not read until there is
    room; with none left (``max_connections`` reached) they are refused.
    """

    transport = Server
    ACCEPTS_PER_READ = 32
    # Sockets taken in per read: a few milliseconds of accept().
    TAKE_IN_PER_READ = 512
    admission = None
    vacancies = None
    held = ()

    def doRead(self):
        if self.numberAccepts > self.ACCEPTS_PER_READ:
            self.numberAccepts = self.ACCEPTS_PER_READ
        admission = self.admission
        if admission is None:
            return super().doRead()
        if self.vacancies is None:
            room = admission.room()
            if room <= 0:
                # Read again once there is room (Flusher.wait_for_room).
                self.stopReading()
                admission.wait_for_room(self)
                return None
            if self.numberAccepts > room:
                self.numberAccepts = room
            return super().doRead()
        if not self.held and self.vacancies() <= 0:
            # Full: connects are refused as they come (accepted, refused
            # by the factory, which logs and counts them, and closed), as
            # tcp.Port does; left in the kernel's queue, they would keep
            # the port readable and the reactor spinning.
            return super().doRead()
        self._take_in()
        held = self.held
        if held:
            room = admission.room()
            if room > 0:
                self._make(min(room, self.ACCEPTS_PER_READ))
            if held:
                if len(held) >= self.vacancies():
                    # No more can be taken in: the rest wait in the kernel.
                    self.stopReading()
                admission.wait_for_room(self)
        return None

    def _take_in(self):
        """Sockets from the kernel's queue into ``held``, as many as there are vacancies for."""
        held = self.held
        if not held:
            held = self.held = deque()
        room = min(self.TAKE_IN_PER_READ, self.vacancies() - len(held))
        accept = self.socket.accept
        while room > 0:
            room -= 1
            try:
                skt, addr = accept()
            except OSError as e:
                if e.errno == errno.ECONNABORTED:
                    # Gone before it was taken in.
                    continue
                # Nothing more waits (EAGAIN), or no descriptor or memory
                # for it: what waits stays in the kernel's queue.
                return
            if len(addr) == 4:
                # IPv6: the scope id kept, as tcp.Port does.
                host = socket.getnameinfo(addr, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
                addr = (sys.intern(host[0]),) + tuple(addr[1:])
            else:
                addr = (sys.intern(addr[0]), addr[1])
            held.append((skt, addr))

    def _make(self, count):
        """
        Connections made of ``count`` held sockets, oldest first; those the
        factory refuses (over a limit) are closed and take no room.
        """
        held = self.held
        factory = self.factory
        while held and count > 0:
            skt, addr = held.popleft()
            protocol = factory.buildProtocol(self._buildAddr(addr))
            if protocol is None:
                skt.close()
                continue
            count -= 1
            s = self.sessionno
            self.sessionno = s + 1
            protocol.makeConnection(self.transport(skt, protocol, addr, self, s, self.reactor))

    def startReading(self):
        # Room again (Flusher): held sockets go before the kernel's queue.
        super().startReading()
        if self.held:
            self.doRead()

    def connectionLost(self, reason):
        for skt, _ in self.held:
            skt.close()
        self.held = ()
        return super().connectionLost(reason)

    def listening(self):
        """Whether the port still listens (it may be told to read again after it stopped)."""
        return self.connected and not self.disconnecting


def serve_lean(port, admission=None, vacancies=None):
    """Make ``port`` a :class:`Port` if it is a plain tcp.Port (TCP, TLS
    and WebSocket listeners; not a UNIX socket's), accepting as
    ``admission`` has room if given, holding sockets for which
    ``vacancies()`` has room meanwhile."""
    if type(port) is tcp.Port:
        port.__class__ = Port
        port.admission = admission
        port.vacancies = vacancies
    return port


def share(cls=Server, names=LIVE_ATTRIBUTES):
    """Put ``names`` in the shared keys of ``cls``'s instances."""
    template = cls.__new__(cls)
    for name in names:
        setattr(template, name, None)

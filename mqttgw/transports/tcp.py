"""
The listeners' TCP ports: Twisted's, accepting in bounded batches, making
the gateway's own transport (:class:`~mqttgw.transports.tcpserver.Server`)
of each socket with no Python socket object around it.
"""

import errno
import socket
import sys
from array import array
from collections import deque

from _socket import socket as raw_socket
from twisted.internet import tcp
from twisted.python import log

from mqttgw.transports.tcpserver import Server

# accept() errors for want of a descriptor or memory.
_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class PeerPorts(array):
    """The ports of a listener's IPv4 peers, by the descriptor of their connection."""

    def __new__(cls):
        return super().__new__(cls, "H")

    def keep(self, fd, port):
        if fd >= len(self):
            # Grown by half again at least: amortized, as a list.
            self.frombytes(bytes(2 * max(fd + 1 - len(self), len(self) // 2)))
        self[fd] = port


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
    # Whether accepted sockets have TCP_NODELAY set: the listening
    # socket's, which Linux passes on to the sockets it accepts (its
    # transports then need no system call to set it).  Known once the
    # kernel's queue was found empty after it was set: what waited there
    # before was made without it.
    no_delay = False
    _no_delay_coming = False
    # See tcpserver.Server (a PeerPorts once serve_lean made the port lean).
    peer_ports = None

    def doRead(self):
        try:
            self._read()
        except BaseException:
            # As tcp.Port's: a protocol that cannot be made is logged; the
            # port goes on listening.
            log.deferr()

    def _read(self):
        admission = self.admission
        if admission is None:
            return self._accept_now(self.ACCEPTS_PER_READ)
        if self.vacancies is None:
            room = admission.room()
            if room <= 0:
                # Read again once there is room (Flusher.wait_for_room).
                self.stopReading()
                admission.wait_for_room(self)
                return None
            return self._accept_now(min(room, self.ACCEPTS_PER_READ))
        if not self.held and self.vacancies() <= 0:
            # Full: connects are refused as they come (accepted, refused
            # by the factory, which logs and counts them, and closed), as
            # tcp.Port does; left in the kernel's queue, they would keep
            # the port readable and the reactor spinning.
            return self._accept_now(self.ACCEPTS_PER_READ)
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

    def _accepted(self):
        """A socket from the kernel's queue and its peer's address; OSError when none can be had."""
        fd, addr = self.socket._accept()
        skt = raw_socket(self.addressFamily, self.socketType, 0, fd)
        if len(addr) == 4:
            # IPv6: the scope id kept, as tcp.Port does.
            host = socket.getnameinfo(addr, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
            addr = (sys.intern(host[0]),) + tuple(addr[1:])
        else:
            addr = (sys.intern(addr[0]), addr[1])
        return skt, addr

    def _accept_now(self, count):
        """At most ``count`` connections made as they are accepted."""
        while count > 0:
            count -= 1
            try:
                skt, addr = self._accepted()
            except OSError as e:
                if e.errno == errno.ECONNABORTED:
                    continue
                if e.errno == errno.EAGAIN:
                    self._queue_empty()
                elif e.errno in _RESOURCES:
                    # tcp.Port's answer: a line, and a descriptor kept in
                    # reserve to refuse the connection with.
                    self.numberAccepts = 1
                    super().doRead()
                return None
            self._connect(skt, addr)
        return None

    def _take_in(self):
        """Sockets from the kernel's queue into ``held``, as many as there are vacancies for."""
        held = self.held
        if not held:
            held = self.held = deque()
        room = min(self.TAKE_IN_PER_READ, self.vacancies() - len(held))
        while room > 0:
            room -= 1
            try:
                held.append(self._accepted())
            except OSError as e:
                if e.errno == errno.ECONNABORTED:
                    # Gone before it was taken in.
                    continue
                if e.errno == errno.EAGAIN:
                    self._queue_empty()
                # Nothing more waits (EAGAIN), or no descriptor or memory
                # for it: what waits stays in the kernel's queue.
                return

    def _make(self, count):
        """
        Connections made of ``count`` held sockets, oldest first; those the
        factory refuses (over a limit) are closed and take no room.
        """
        held = self.held
        while held and count > 0:
            if self._connect(*held.popleft()):
                count -= 1

    def _connect(self, skt, addr):
        """A connection of ``skt``, unless the factory refuses it (then closed): whether it was made."""
        protocol = self.factory.buildProtocol(self._buildAddr(addr))
        if protocol is None:
            skt.close()
            return False
        self.sessionno += 1
        protocol.makeConnection(self.transport(skt, protocol, addr, self))
        return True

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

    def pass_no_delay(self):
        """Set TCP_NODELAY on the listening socket, for its connections to have it from the start."""
        if self.addressFamily not in (socket.AF_INET, socket.AF_INET6) or not sys.platform.startswith("linux"):
            return
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            return
        self._no_delay_coming = True

    def _queue_empty(self):
        if self._no_delay_coming:
            self._no_delay_coming = False
            self.no_delay = True

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
        port.peer_ports = PeerPorts()
        port.pass_no_delay()
    return port

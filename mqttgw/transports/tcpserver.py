"""
The transport of a connection a TCP listener accepted: what Twisted's
``tcp.Server`` gives the protocol, TLS and WebSocket layers above it
(``ITCPTransport``, its buffering, the producer's pause and resume,
half-close), in one slotted object.

An idle client holds what its connection needs and no more: the socket
(``_socket.socket``, not the Python class around it), its protocol, its
port, the peer's address and a few flags in one small integer; no log
prefix, session number, write buffer or producer flags of its own.
Bytes written with nothing waiting before them go to the socket at once,
as mosquitto sends, rather than on the reactor's next turn; what the
socket does not take waits in one ``bytearray`` until it is writable.
"""

import errno
import socket
import struct

from twisted.internet import address, error, main
from twisted.internet.interfaces import (
    IConsumer,
    IHalfCloseableDescriptor,
    IHalfCloseableProtocol,
    ILoggingContext,
    IPushProducer,
    IReadWriteDescriptor,
    ISystemHandle,
    ITCPTransport,
)
from twisted.python import failure, log
from zope.interface import implementer

# The flags of ``Server._flags``.  An idle connection's (connected,
# reading, a streaming producer, no delay) add up to less than 257, an
# integer CPython keeps one of: a connection costs none of its own.
CONNECTED = 1
READING = 2
WRITING = 4
STREAMING = 8
PRODUCER_PAUSED = 16
# TCP_NODELAY known to be set (the listening socket's, which Linux passes on).
NO_DELAY = 32
DISCONNECTING = 64
WRITE_DISCONNECTING = 128
WRITE_DISCONNECTED = 256
ABORTING = 512
LOST = 1024

# Nothing may be sent at once, but for nothing waiting.
_NOT_AT_ONCE = DISCONNECTING | WRITE_DISCONNECTED | ABORTING | LOST

_LINGER_NONE = struct.pack("ii", 1, 0)


def _local_address(skt):
    """The socket's own address as tcp.Server's getHost gives it (IPv6
    with its scope).  Not imported from twisted.internet.tcp: importing
    that before the reactor would load pyOpenSSL (see service.footprint)."""
    addr = skt.getsockname()
    if len(addr) == 4:
        host = socket.getnameinfo(addr, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)[0]
        return (host, *addr[1:])
    return addr[:2]


@implementer(
    ITCPTransport, ISystemHandle, IPushProducer, IConsumer, IReadWriteDescriptor, IHalfCloseableDescriptor,
    ILoggingContext,
)
class Server:
    """
    A server-side TCP connection: ``skt`` (a connected socket), the
    ``protocol`` it feeds, the peer's address (``client``: host and port,
    and for IPv6 flow info and scope id) and the listening ``server`` port
    it came from.  It starts reading at once, as ``tcp.Server`` does.
    """

    # The peer's host (a string its port shares with every peer at that
    # address) and, apart, its port (IPv6: port, flow info and scope id),
    # rather than a tuple of them: 48 bytes less a connection.  An IPv4
    # peer's port is kept by the listening port, in its ``peer_ports`` by
    # descriptor (two bytes, where an integer object costs 32), until the
    # socket closes; ``_peer`` is None meanwhile.
    __slots__ = ("socket", "protocol", "server", "hostname", "_peer", "_flags", "_pending", "producer")

    # Bytes read at once; and bytes waiting past which a streaming
    # producer is paused (as abstract.FileDescriptor's).
    bufferSize = 2**16

    def __init__(self, skt, protocol, client, server, sessionno=None, reactor=None):
        skt.setblocking(False)
        self.socket = skt
        self.protocol = protocol
        self.server = server
        self.hostname = client[0]
        ports = getattr(server, "peer_ports", None)
        if len(client) == 2 and ports is not None:
            ports.keep(skt.fileno(), client[1])
            self._peer = None
        else:
            self._peer = client[1] if len(client) == 2 else client[1:]
        self.producer = None
        self._pending = None
        self._flags = CONNECTED | (NO_DELAY if getattr(server, "no_delay", False) else 0)
        self.startReading()

    # What Twisted's transports are read for.

    reactor = property(lambda self: self.server.reactor, doc="The reactor (the port's).")
    connected = property(lambda self: int(bool(self._flags & CONNECTED)))
    disconnecting = property(lambda self: int(bool(self._flags & DISCONNECTING)))
    disconnected = property(lambda self: int(bool(self._flags & LOST)))
    streamingProducer = property(lambda self: bool(self._flags & STREAMING))
    producerPaused = property(lambda self: bool(self._flags & PRODUCER_PAUSED))

    @property
    def client(self):
        """The peer's address as the socket gave it (tcp.Server's ``client``)."""
        peer = self._peer_port()
        return (self.hostname, peer) if type(peer) is int else (self.hostname, *peer)

    def _peer_port(self):
        peer = self._peer
        return self.server.peer_ports[self.socket.fileno()] if peer is None else peer

    def fileno(self):
        skt = self.socket
        return -1 if skt is None else skt.fileno()

    def getHandle(self):
        return self.socket

    def getPeer(self):
        peer = self._peer_port()
        if type(peer) is int:
            return address.IPv4Address("TCP", self.hostname, peer)
        return address.IPv6Address("TCP", self.hostname, *peer)

    def getHost(self):
        return self.server._addressType("TCP", *_local_address(self.socket))

    def logPrefix(self):
        protocol = self.protocol
        if protocol is None:
            name = "Closed"
        elif ILoggingContext.providedBy(protocol):
            name = protocol.logPrefix()
        else:
            name = type(protocol).__name__
        return f"{name},{self.fileno()},{self.hostname}"

    def __repr__(self):
        return f"<{self.logPrefix().split(',', 1)[0]} #{self.fileno()} on {self.server._realPortNumber}>"

    # The reactor's side.

    def startReading(self):
        if not self._flags & READING:
            self._flags |= READING
            self.server.reactor.addReader(self)

    def stopReading(self):
        if self._flags & READING:
            self._flags &= ~READING
            self.server.reactor.removeReader(self)

    def startWriting(self):
        if not self._flags & WRITING:
            self._flags |= WRITING
            self.server.reactor.addWriter(self)

    def stopWriting(self):
        if self._flags & WRITING:
            self._flags &= ~WRITING
            self.server.reactor.removeWriter(self)

    def doRead(self):
        if self._flags & ABORTING:
            return None
        try:
            data = self.socket.recv(self.bufferSize)
        except BlockingIOError:
            return None
        except OSError:
            return main.CONNECTION_LOST
        if not data:
            return main.CONNECTION_DONE
        self.protocol.dataReceived(data)
        return None

    def doWrite(self):
        flags = self._flags
        if flags & ABORTING:
            return None
        pending = self._pending
        if pending is not None:
            try:
                sent = self.socket.send(pending)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.ENOBUFS):
                    return main.CONNECTION_LOST
                sent = 0
            del pending[:sent]
            if pending:
                return None
            self._pending = None
        # Everything written: as abstract.FileDescriptor.doWrite.
        self.stopWriting()
        producer = self.producer
        if producer is not None and (not flags & STREAMING or flags & PRODUCER_PAUSED):
            self._flags &= ~PRODUCER_PAUSED
            producer.resumeProducing()
        elif flags & DISCONNECTING:
            return main.CONNECTION_DONE
        elif flags & WRITE_DISCONNECTING:
            self._flags |= WRITE_DISCONNECTED
            return self._closeWriteConnection()
        return None

    # Writing (ITransport, IConsumer).

    def write(self, data):
        flags = self._flags
        if not flags & CONNECTED or flags & (WRITE_DISCONNECTED | ABORTING) or not data:
            if isinstance(data, str):
                raise TypeError("Data must be bytes")
            return
        if self._pending is None and not flags & _NOT_AT_ONCE:
            # Waiting for the socket to be writable would cost two
            # epoll_ctl calls and a doWrite for bytes it takes now.
            try:
                sent = self.socket.send(data)
            except OSError:
                # Full (EAGAIN), or broken: doWrite meets the error and
                # reports the connection lost.
                sent = 0
            if sent == len(data):
                return
            self._pending = bytearray(memoryview(data)[sent:])
        elif self._pending is None:
            self._pending = bytearray(data)
        else:
            self._pending += data
        self.startWriting()
        producer = self.producer
        if (
            producer is not None
            and self._flags & (STREAMING | PRODUCER_PAUSED) == STREAMING
            and len(self._pending) > self.bufferSize
        ):
            self._flags |= PRODUCER_PAUSED
            producer.pauseProducing()

    def writeSequence(self, iovec):
        # A WebSocket frame's header and payload, say: joined, to go as one.
        data = b"".join(iovec)
        if data:
            self.write(data)

    def registerProducer(self, producer, streaming):
        if self.producer is not None:
            raise RuntimeError(
                f"Cannot register producer {producer}, because producer {self.producer} was never unregistered."
            )
        if self._flags & LOST:
            producer.stopProducing()
            return
        self.producer = producer
        if streaming:
            self._flags |= STREAMING
        else:
            self._flags &= ~STREAMING
            producer.resumeProducing()

    def unregisterProducer(self):
        self.producer = None
        self._flags &= ~(STREAMING | PRODUCER_PAUSED)
        if self._flags & (CONNECTED | DISCONNECTING) == CONNECTED | DISCONNECTING:
            self.startWriting()

    def stopConsuming(self):
        # As abstract.FileDescriptor's (a ProtocolWrapper passes it on).
        self.unregisterProducer()
        self.loseConnection()

    # Being a producer of what is read (IPushProducer).

    def pauseProducing(self):
        self.stopReading()

    def resumeProducing(self):
        if self._flags & (CONNECTED | DISCONNECTING) == CONNECTED:
            self.startReading()

    def stopProducing(self):
        self.loseConnection()

    # The end.

    def loseConnection(self, _reason=None):
        flags = self._flags
        if not flags & CONNECTED or flags & DISCONNECTING:
            return
        if flags & WRITE_DISCONNECTED:
            self.stopReading()
            self.stopWriting()
            self.connectionLost(failure.Failure(main.CONNECTION_DONE))
        else:
            self.stopReading()
            self.startWriting()
            self._flags |= DISCONNECTING

    def loseWriteConnection(self):
        self._flags |= WRITE_DISCONNECTING
        self.startWriting()

    def abortConnection(self):
        if self._flags & (LOST | ABORTING):
            return
        self._flags |= ABORTING
        self.stopReading()
        self.stopWriting()
        self.server.reactor.callLater(0, self.connectionLost, failure.Failure(error.ConnectionAborted()))

    def _closeWriteConnection(self):
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        half = IHalfCloseableProtocol(self.protocol, None)
        if half is not None:
            try:
                half.writeConnectionLost()
            except BaseException:
                reason = failure.Failure()
                log.err()
                self.connectionLost(reason)
        return None

    def readConnectionLost(self, reason):
        half = IHalfCloseableProtocol(self.protocol, None)
        if half is None:
            self.connectionLost(reason)
            return
        try:
            half.readConnectionLost()
        except BaseException:
            log.err()
            self.connectionLost(failure.Failure())

    def writeConnectionLost(self, reason):
        self.connectionLost(reason)

    def connectionLost(self, reason):
        # Once, whoever calls it first (an abort, then an error, say).
        if self._flags & LOST:
            return
        self._flags = (self._flags & (READING | WRITING)) | LOST
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.stopProducing()
        self.stopReading()
        self.stopWriting()
        self._pending = None
        self._close(orderly=reason.check(error.ConnectionAborted) is None)
        protocol, self.protocol = self.protocol, None
        protocol.connectionLost(reason)

    def _close(self, orderly):
        # The peer's port outlives the socket (for log lines about it).
        self._peer = self._peer_port()
        skt, self.socket = self.socket, None
        try:
            if orderly:
                skt.shutdown(socket.SHUT_RDWR)
            else:
                # An abort resets the connection, as tcp.Connection's.
                skt.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
        except OSError:
            pass
        try:
            skt.close()
        except OSError:
            pass

    # TCP options (ITCPTransport).

    def getTcpNoDelay(self):
        return bool(self.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    def setTcpNoDelay(self, enabled):
        enabled = bool(enabled)
        if enabled and self._flags & NO_DELAY:
            # Already set: given by the listening socket.
            return
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, enabled)
        except OSError as e:
            log.err(e, "got error when setting TCP_NODELAY on TCP socket")
            return
        if enabled:
            self._flags |= NO_DELAY
        else:
            self._flags &= ~NO_DELAY

    def getTcpKeepAlive(self):
        return bool(self.socket.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))

    def setTcpKeepAlive(self, enabled):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, enabled)

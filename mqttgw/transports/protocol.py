"""
The server side of MQTT: the protocol of one client connection, and the
factory every listener shares.  The connection holds its parts, each in a
module of its own and joined to it by the interfaces of
:mod:`~mqttgw.transports.interfaces`: what it reads, and when
(:mod:`~mqttgw.transports.reading`), CONNECT and the login
(:mod:`~mqttgw.transports.login`), 5.0 enhanced authentication
(:mod:`~mqttgw.transports.handshake`), PUBLISH and acks
(:mod:`~mqttgw.transports.publishing`), SUBSCRIBE
(:mod:`~mqttgw.transports.subscribing`); what differs by version is the
dialect's (:mod:`~mqttgw.transports.dialects`).  Its output leaves once a
reactor turn.  Bad input closes this connection with a log line and
nothing else.
"""

import sys
from types import MappingProxyType

import attr
from twisted.internet.interfaces import ILoggingContext, IProtocol, IPushProducer, ISSLTransport, ITCPTransport
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.interfaces import IClientConnection
from mqttgw.broker.logsummary import BySource
from mqttgw.schema import default
from mqttgw.security.identity import Identity
from mqttgw.security.throttle import ConnectionRate, Throttle
from mqttgw.transports.dialects import UNKNOWN
from mqttgw.transports.handshake import (
    AWAITING_CONNECT,
    BEFORE_CONNACK,
    CHALLENGED,
    CLOSED,
    CONNECTED,
    TRANSITIONS,
    Handshake,
    cancel,
    connack_refusal,
    disconnect_refusal,
)
from mqttgw.transports.interfaces import IConnecting, IReadingConnection, IScheduledConnection
from mqttgw.transports.login import Login
from mqttgw.transports.publishing import Publishing
from mqttgw.transports.reading import CONNECTION, HANDSHAKE, PUBLISHING, READING, Reading, receiver
from mqttgw.transports.schedulers import Flusher
from mqttgw.transports.subscribing import Subscribing
from mqttgw.transports.tcpserver import Server
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation

# Where they were first defined (tests and tools import them from here).
__all__ = ["ConnectionLimits", "MQTTServerFactory", "MQTTServerProtocol", "connack_refusal",
           "disconnect_refusal", "refusal_log"]

log = Logger()
# The lines about a connection's bytes keep the namespace they were first
# written in (log filters and JSON readers key on it).
bytes_log = Logger(namespace="mqttgw.transports.connection")

# Output of one reactor turn is written at once past this many bytes, so
# that a full socket pauses delivery (and reading) before more piles up.
OUTPUT_HIGH_WATER = 64 * 1024

_NOBODY = Identity(None)


@attr.s(frozen=True, slots=True)
class ConnectionLimits:
    """
    Per-connection bounds; see ``[limits]`` in the configuration.  The
    defaults are the configuration's (mqttgw.schema), but for
    max_connections, whose 0 the service resolves from the open-file limit.
    """

    max_packet_size = attr.ib(default=default("limits.max_packet_size"))
    # A CONNECT is small; until one arrives little is buffered.
    max_connect_size = attr.ib(default=default("limits.max_connect_size"))
    connect_timeout = attr.ib(default=default("limits.connect_timeout"))
    max_connections = attr.ib(default=100_000)
    # MQTT 3.1.1 strings with control characters or non-characters close
    # the connection (the spec's MAY); off for fleets that send them.
    reject_control_characters = attr.ib(default=default("mqtt.reject_control_characters"))
    # MQTT 3.1 client ids over the spec's 23 characters (many libraries
    # generate longer ones).
    allow_long_client_ids = attr.ib(default=default("mqtt.allow_long_client_ids"))
    # Log each client's connect and disconnect (mosquitto's
    # connection_messages).
    connection_messages = attr.ib(default=default("log.connection_messages"))
    # What the server tells a 5.0 client in CONNACK (see [mqtt]).
    max_topic_alias = attr.ib(default=default("mqtt.max_topic_alias"))
    max_keepalive = attr.ib(default=default("mqtt.max_keepalive"))
    retain_available = attr.ib(default=default("mqtt.retain_available"))
    wildcard_subscription_available = attr.ib(default=default("mqtt.wildcard_subscription_available"))
    subscription_identifier_available = attr.ib(default=default("mqtt.subscription_identifier_available"))
    shared_subscription_available = attr.ib(default=default("mqtt.shared_subscription_available"))
    response_information = attr.ib(default=default("mqtt.response_information"))


def _tls_failed(reason):
    """
    Whether ``reason`` is a failed TLS handshake.  pyOpenSSL is loaded only
    where TLS is configured; where it is not, no handshake could fail.
    """
    SSL = sys.modules.get("OpenSSL.SSL")
    return SSL is not None and reason.check(SSL.Error) is not None


def _tls_reason(error):
    """OpenSSL's error list as one short line."""
    try:
        return "; ".join(str(e[2]) for e in error.args[0]) or str(error)
    except (IndexError, TypeError):
        return str(error)


_NO_METHODS = MappingProxyType({})


def _peer_host(transport):
    """The peer's host: a listener's own TCP transport knows it without
    making an address object; any other (TLS, a PROXY protocol header's)
    is asked for its peer."""
    if type(transport) is Server:
        return transport.hostname
    return getattr(transport.getPeer(), "host", None)

# ``MQTTServerProtocol._out`` when the connection has no output this turn
# and is not in the flusher's list; a list (empty, too) once it is.
_UNMARKED = ()



@implementer(
    IProtocol, ILoggingContext, IClientConnection, IPushProducer, IConnecting, IReadingConnection,
    IScheduledConnection,
)
class MQTTServerProtocol:
    """
    One client's connection: its parts, the facts its handshake
    established (see :class:`IConnection`), its output and its end.
    """

    # One per connection: slots, and IProtocol provided rather than
    # Protocol inherited (its instances carry a dictionary).
    __slots__ = (
        "transport", "state",
        "host", "opening", "_out", "_out_size", "_close_grace",
        # The listener's MQTTServerFactory (its router, clock, portal,
        # throttle and 5.0 authentication methods) and kind (tcp, tls, ws
        # or wss).
        "factory", "listener_kind",
        # Messages a second it is sent at most (0: no bound): a dashboard page.
        "max_delivery_rate",
        # What its handshake established.
        "client_id", "log_id", "username", "identity", "dialect", "session", "keepalive",
        # Its parts: a login from CONNECT until it holds nothing more, a
        # handshake where CONNECT named an authentication method,
        # publishing from the first PUBLISH or acknowledgement, subscribing
        # from the first SUBSCRIBE (an idle client costs fewer parts).
        "reading", "login", "handshake", "publishing", "subscribing",
        # The login's cached ACL check of publishing, until publishing takes it.
        "_may_write",
    )
    # Seconds a peer has to close its side after we closed ours.
    CLOSE_GRACE = 2.0

    def __init__(self, factory):
        self.transport = None
        self.factory = factory
        self.state = AWAITING_CONNECT
        self.host = None
        # Admitted and not yet read from (see Flusher.admit).
        self.opening = False
        # Bytes written this reactor turn: a list once there are some.
        self._out = _UNMARKED
        self._out_size = 0
        self._close_grace = None
        self.listener_kind = factory.kind
        self.max_delivery_rate = 0
        self.client_id = self.log_id = self.username = None
        self.identity = _NOBODY
        self.dialect = UNKNOWN
        self.session = None
        self.keepalive = 0
        self.login = self.handshake = self.publishing = self.subscribing = None
        self._may_write = None
        self.reading = Reading(self, factory.limits, BEFORE_CONNECT)

    # The listener's (a slot each would cost every connection).
    router = property(lambda self: self.factory.router, doc="The router (the factory's).")
    clock = property(lambda self: self.factory.clock, doc="The clock (the factory's).")
    limits = property(lambda self: self.factory.limits, doc="The ConnectionLimits (the factory's).")
    stats = property(lambda self: self.factory.router.stats, doc="The router's counters.")
    # As Twisted's Protocol: 1 once made (and after), a slot's worth less.
    connected = property(lambda self: int(self.transport is not None), doc="Whether it was connected.")

    # Connection life

    def makeConnection(self, transport):
        self.transport = transport
        self.connectionMade()

    def logPrefix(self):
        return "MQTTServerProtocol"

    def connectionMade(self):
        transport = self.transport
        # Writes are already batched per reactor turn; Nagle would only delay.
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)
        self.host = _peer_host(transport)
        factory = self.factory
        stats = factory.router.stats
        stats.connections += 1
        stats.connections_accepted += 1
        if stats.connections > stats.clients_maximum:
            stats.clients_maximum = stats.connections
        # We are the producer of the bytes the transport sends: it tells us
        # when its buffer is full so a slow reader can't grow it without end.
        transport.registerProducer(self, True)
        flusher = factory.flusher
        if not flusher.admit(self):
            # Many new connections not yet read from: this one waits its turn.
            self.reading.wait_for_admission()
        flusher.connects.add(self, factory.limits.connect_timeout)

    @property
    def peer(self):
        """The peer's address for log lines (made when needed: idle
        connections are many, log lines about them few)."""
        transport = self.transport
        if transport is None:
            return "?"
        peer = transport.getPeer()
        host = getattr(peer, "host", None)
        return f"{host}:{peer.port}" if host else str(peer)

    def dataReceived(self, data):
        if self.opening:
            self.factory.flusher.opened(self)
        # Closing: whatever the peer still sends is ignored.
        if self.state is not CLOSED:
            self.reading.received(data)

    def connectionLost(self, reason):
        flusher = self.factory.flusher
        if self.opening:
            flusher.opened(self)
        self.factory.router.stats.connections -= 1
        if self.state is not CLOSED:
            self._lost(reason)
            self._closed(publish_will=True)
        self._close_grace = cancel(self._close_grace)

    def _lost(self, reason):
        """The peer went away before we closed."""
        if self.state in BEFORE_CONNACK and _tls_failed(reason):
            self.router.limited("tls handshakes", log).warn(
                "TLS handshake with {peer} failed: {reason}",
                peer=self.peer,
                reason=_tls_reason(reason.value),
            )
        if self.session is not None and self.limits.connection_messages:
            self.factory.flusher.connection_messages.lost(self.log_id, reason.getErrorMessage())

    def _closed(self, publish_will):
        """What closing leaves behind, once, whichever side closed first."""
        self.state = CLOSED
        self.reading.handlers = None
        self.factory.flusher.connects.closed()
        if self.keepalive:
            self.factory.flusher.keepalives.closed()
        if self.handshake is not None:
            self.handshake.ended()
        if self.login is not None:
            self.login.ended()
        if self.session is not None:
            self._count_version(-1)
            session, self.session = self.session, None
            self.router.disconnect(session, publish_will)

    # What the schedulers every connection shares ask (see IScheduledConnection)

    @property
    def unread(self):
        """Whether nothing has been read from this connection yet."""
        return self.reading.unread

    @property
    def reading_paused(self):
        """Whether the transport is not read from (the WebSocket layer asks)."""
        return self.reading.paused

    def admitted(self):
        """Our turn has come to be read from (see :meth:`Flusher.admit`)."""
        self.reading.admitted()

    def connect_due(self):
        self.reading.connect_due()

    def keepalive_due(self, now, stalls):
        return self.reading.keepalive_due(now, stalls)

    # Output

    def write(self, data):
        """
        Queue bytes for this connection.  Everything written in one reactor
        turn goes out in a single transport write.
        """
        out = self._out
        if out is not _UNMARKED:
            out.append(data)
        else:
            self.factory.flusher.mark(self)
            self._out = [data]
        self._out_size += len(data)
        if self._out_size > OUTPUT_HIGH_WATER:
            self.flush()

    def flush(self):
        out = self._out
        self._out = _UNMARKED
        if out:
            # Counted per flush, not per packet: one write is one packet.
            stats = self.factory.router.stats
            stats.packets_sent += len(out)
            stats.bytes_sent += self._out_size
            self._out_size = 0
            try:
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            except Exception:
                self.flush_failed()

    def flush_alone(self):
        """
        Where this connection alone has output this turn, it is written now
        (see Reading.FLUSH_EVERY); it stays in the flusher's list for what
        comes next.
        """
        if self._out and self.factory.flusher.alone(self):
            self.flush()
            if self.state is not CLOSED:
                self._out = []

    def flush_failed(self):
        """Writing to the transport raised: this connection cannot go on."""
        self._out = _UNMARKED
        self._out_size = 0
        if self.state is CLOSED:
            return
        bytes_log.failure(
            "cannot write to client {client_id} at {peer}: closing",
            client_id=self.log_id,
            peer=self.peer,
        )
        self.close(publish_will=True)

    def pauseProducing(self):
        # The peer is not reading what we send: its deliveries wait in the
        # session's bounded queue, and its requests, whose answers would
        # pile up here, are not read.
        reading = self.reading
        reading.output_full = True
        if self.session is not None:
            self.session.pause()
        reading.pause()

    def resumeProducing(self):
        self.reading.output_full = False
        if self.state is CLOSED:
            return
        self.reading.resume()
        if self.session is not None:
            self.session.resume()

    def stopProducing(self):
        pass

    # The end (see IConnection)

    def protocol_error(self, reason, reason_code=None):
        self.disconnect_first(R.PROTOCOL_ERROR if reason_code is None else reason_code, reason)
        self.reading.count_protocol_error(reason)
        self.close(publish_will=True, graceful=True)

    def disconnect_first(self, reason_code, reason=None):
        """
        The client, connected, is sent the DISCONNECT its dialect has for
        ``reason_code`` (5.0's) before the server closes ([MQTT-3.14.0-1]:
        not before CONNACK).  True when it was.
        """
        if self.state is not CONNECTED:
            return False
        frame = self.dialect.disconnect(reason_code, reason)
        if frame is None:
            return False
        self.write(frame)
        return True

    def close(self, publish_will, graceful=False):
        if self.state is CLOSED:
            return
        self._closed(publish_will)
        if graceful:
            self._close_gracefully()
        else:
            self._out = _UNMARKED
            self._out_size = 0
            self.transport.abortConnection()

    def _close_gracefully(self):
        """
        What is queued (a CONNACK with a refusal, say) goes out, then our
        side closes, so the peer reads an orderly end of stream rather than
        a reset.  What it still sends is read and ignored until it closes
        too; a peer that does not within ``CLOSE_GRACE`` is cut off.
        """
        self.flush()
        transport = self.transport
        self.reading.closing()
        if ITCPTransport.providedBy(transport) and not ISSLTransport.providedBy(transport):
            transport.loseWriteConnection()
        else:
            transport.loseConnection()
        self._close_grace = self.clock.callLater(self.CLOSE_GRACE, transport.abortConnection)

    # What the broker and the admin API ask

    def kick(self):
        """The admin API disconnects the client (its will is published)."""
        log.info("client {client_id} disconnected by the admin API", client_id=self.log_id)
        self.disconnect_first(R.ADMINISTRATIVE_ACTION)
        self.close(publish_will=True, graceful=True)

    def taken_over(self, publish_will=True):
        """Another connection claims our client id: make way for it now."""
        # A 5.0 client reads why before the connection ends.
        self.close(publish_will, graceful=self.disconnect_first(R.SESSION_TAKEN_OVER))

    def shutting_down(self):
        """The gateway stops: a 5.0 client is told so ([MQTT-4.13.2-1])."""
        self.disconnect_first(R.SERVER_SHUTTING_DOWN)
        self.close(publish_will=True, graceful=True)

    # The handshake (see IConnecting)

    def enter(self, event):
        state = self.state = TRANSITIONS[self.state][event]
        self.reading.handlers = handlers_in(state, self.dialect, self.publishing is not None)

    def speak(self, dialect):
        self.dialect = dialect
        dialect.configure(self.reading.framer)

    def authenticating(self, handshake):
        self.handshake = handshake

    def accepted(self, session, may_write):
        self.session = session
        self._may_write = may_write
        self.enter("accept")
        self._count_version(1)

    def publishing_begins(self, packet):
        """The first PUBLISH or ack: the publishing part is made, for it and what follows."""
        router = self.router
        self.publishing = Publishing(self, router, self.session, self.dialect, self.limits, self._may_write,
                                     router.access.reserved_topics)
        self._may_write = None
        handlers = self.reading.handlers = handlers_in(self.state, self.dialect)
        which, handler = handlers[packet.packet_type]
        return handler(receiver(self, which), packet)

    def logged_in(self):
        self.login = None

    def keep_alive(self, seconds):
        self.keepalive = seconds
        if seconds:
            # Heard from now (its CONNECT); Reading keeps the time from here on.
            now = self.reading.last_received = self.clock.seconds()
            self.factory.flusher.keepalives.add(self, now + seconds * 1.5)

    def resume(self):
        self.reading.resume_put_off()

    def in_steps(self, work):
        return self.reading.in_steps(work)

    def _count_version(self, change):
        name = self.dialect.counter
        setattr(self.stats, name, getattr(self.stats, name) + change)

    # Packets the connection handles itself

    def handle_CONNECT(self, packet):
        # Behind a PROXY protocol listener (haproxy:tcp:PORT) the client's
        # address is known only once the header before this packet was
        # read: the throttles count that address, not the load balancer's.
        self.host = _peer_host(self.transport)
        f = self.factory
        login = self.login = Login(self, f.router, f.clock, f.limits, f.flusher.connection_messages)
        return login.handle_CONNECT(packet)

    def handle_AUTH(self, packet):
        if self.handshake is None:
            # CONNECT named no method (it was refused with 0x8C if it named
            # one not offered).
            return self.protocol_error("AUTH without an authentication method", R.PROTOCOL_ERROR)
        return self.handshake.handle_AUTH(packet)

    def handle_SUBSCRIBE(self, packet):
        return self._subscribing().handle_SUBSCRIBE(packet)

    def handle_UNSUBSCRIBE(self, packet):
        return self._subscribing().handle_UNSUBSCRIBE(packet)

    def _subscribing(self):
        if self.subscribing is None:
            self.subscribing = Subscribing(self, self.router, self.session, self.dialect, self.limits)
        return self.subscribing

    def handle_PINGREQ(self, packet):
        self.write(P.PINGRESP_WIRE)

    def handle_DISCONNECT(self, packet):
        try:
            publish_will = self.dialect.disconnecting(packet, self.router, self.session)
        except ProtocolViolation as e:
            return self.protocol_error(str(e), e.reason_code)
        if self.limits.connection_messages:
            self.factory.flusher.connection_messages.disconnected(self.log_id, packet.reason_code)
        # A clean DISCONNECT discards the will; anything after it is ignored.
        self.close(publish_will=publish_will, graceful=True)


# Until CONNECT, every other packet is a protocol violation.
BEFORE_CONNECT = {t: (READING, Reading.not_connected) for t in P.PACKET_NAMES}
BEFORE_CONNECT[P.CONNECT] = (CONNECTION, MQTTServerProtocol.handle_CONNECT)

# After a CONNECT that began an enhanced authentication, only AUTH and
# DISCONNECT may come before CONNACK ([MQTT-3.1.2-30]).
CHALLENGED_HANDLERS = {t: (HANDSHAKE, Handshake.challenge_broken) for t in P.PACKET_NAMES}
CHALLENGED_HANDLERS[P.AUTH] = (HANDSHAKE, Handshake.challenge_answered)
CHALLENGED_HANDLERS[P.DISCONNECT] = (HANDSHAKE, Handshake.challenge_dropped)

# A connected client's packets: who handles each, and its method's name
# (a dialect may name another of the same receiver's, see V5.HANDLERS).
_CONNECTED = {
    P.CONNECT: (READING, "second_connect"),
    P.CONNACK: (READING, "unexpected"),
    P.PUBLISH: (PUBLISHING, "handle_PUBLISH"),
    P.PUBACK: (PUBLISHING, "handle_PUBACK"),
    P.PUBREC: (PUBLISHING, "handle_PUBREC"),
    P.PUBREL: (PUBLISHING, "handle_PUBREL"),
    P.PUBCOMP: (PUBLISHING, "handle_PUBCOMP"),
    P.SUBSCRIBE: (CONNECTION, "handle_SUBSCRIBE"),
    P.SUBACK: (READING, "unexpected"),
    P.UNSUBSCRIBE: (CONNECTION, "handle_UNSUBSCRIBE"),
    P.UNSUBACK: (READING, "unexpected"),
    P.PINGREQ: (CONNECTION, "handle_PINGREQ"),
    P.PINGRESP: (READING, "unexpected"),
    P.DISCONNECT: (CONNECTION, "handle_DISCONNECT"),
    P.AUTH: (CONNECTION, "handle_AUTH"),
}
_RECEIVER_CLASSES = (MQTTServerProtocol, Reading, Handshake, Publishing)
# The tables of connected clients, by dialect class and by whether the
# connection has its publishing part yet (until then, what publishing
# handles makes it first).
_CONNECTED_TABLES = {}
_PUBLISHING_BEGINS = (CONNECTION, MQTTServerProtocol.publishing_begins)


def handlers_in(state, dialect, publishing=True):
    """
    The handlers of ``state`` (None where nothing is read), a connected
    client's by ``dialect`` and whether its connection has its
    ``publishing`` part.
    """
    if state is CONNECTED:
        key = (type(dialect), publishing)
        table = _CONNECTED_TABLES.get(key)
        if table is None:
            table = _CONNECTED_TABLES[key] = {
                t: (which, getattr(_RECEIVER_CLASSES[which], dialect.HANDLERS.get(t, name)))
                if publishing or which != PUBLISHING else _PUBLISHING_BEGINS
                for t, (which, name) in _CONNECTED.items()
            }
        return table
    if state is AWAITING_CONNECT:
        return BEFORE_CONNECT
    if state is CHALLENGED:
        return CHALLENGED_HANDLERS
    return None


class MQTTServerFactory(Factory):
    """One factory, shared by every listener, feeding the one router."""

    # No "Starting factory <... object at 0x...>" lines.
    noisy = False

    def __init__(
        self,
        router,
        limits=ConnectionLimits(),
        clock=None,
        flusher=None,
        identity_as_username=False,
        portal=None,
        throttle=None,
        connection_rate=None,
        refusals=None,
    ):
        if clock is None:
            from twisted.internet import reactor as clock
        self.router = router
        self.limits = limits
        self.clock = clock
        self.flusher = flusher if flusher is not None else Flusher(clock)
        # Take the user name from the client certificate (TLS listeners).
        self.identity_as_username = identity_as_username
        # The twisted.cred portal logins go through, or None: no checks.
        self.portal = portal
        # Shared by every listener's factory (see service.tap): failures
        # count per address and user name whichever listener they came to.
        self.throttle = throttle if throttle is not None else Throttle(seconds=clock.seconds)
        self.connection_rate = connection_rate if connection_rate is not None else ConnectionRate()
        # Refused CONNECTs, logged once per address per interval with a count.
        self.refusals = refusals if refusals is not None else refusal_log(clock)
        # Set by whoever builds the listener: tcp, tls, ws or wss.
        self.kind = None
        # 5.0 enhanced authentication methods offered, by name (see
        # mqttgw.security.enhanced).
        self.auth_methods = _NO_METHODS
        if router.store is not None:
            # A disk behind the traffic holds the clients back (one flusher
            # serves every listener: told once).
            listeners = router.store.congestion_listeners
            if self.flusher.hold_reading not in listeners:
                listeners.append(self.flusher.hold_reading)

    def buildProtocol(self, addr):
        return self.admit(addr) if self.accepts(addr) else None

    def accepts(self, addr):
        """
        The one admission gate of every listener: whether a connection
        from ``addr`` fits under ``max_connections`` (counting WebSocket
        handshakes under way); refusals are counted, and logged at a
        bounded rate.
        """
        stats = self.router.stats
        host = getattr(addr, "host", None)
        if not self.connection_rate.allows(host):
            # Refused before a byte is read.
            self.refusals.info(
                host,
                "refusing connection from {peer}: {reason}",
                peer=host,
                reason="over limits.max_connection_rate",
            )
            stats.connections_refused += 1
            return False
        if stats.connections + stats.handshakes < self.limits.max_connections:
            return True
        self.router.limited("connection limit", log).warn(
            "refusing connection from {addr}: {n} connections is the limit",
            addr=f"{getattr(addr, 'host', addr)}:{getattr(addr, 'port', '')}",
            n=self.limits.max_connections,
        )
        stats.connections_refused += 1
        return False

    def vacancies(self):
        """Connections that may still be made under ``max_connections``."""
        stats = self.router.stats
        return self.limits.max_connections - stats.connections - stats.handshakes

    def admit(self, addr):
        """A protocol for a connection already counted (a WebSocket)."""
        return MQTTServerProtocol(self)



def refusal_log(clock, interval=10.0):
    """The log of refused connections and CONNECTs, one line per address per interval."""
    return BySource(
        log,
        clock,
        "refused {count} more from {source} in the last {interval:.0f}s; the last: {reason}",
        interval,
    )

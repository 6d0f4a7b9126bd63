"""
The server side of MQTT: the protocol of one connection, its packets
dispatched to ``handle_<TYPE>`` by state and version, and the factory every
listener shares.  Its jobs are in modules of their own: the handshake
(:mod:`~mqttgw.transports.handshake`), CONNECT and the login
(:mod:`~mqttgw.transports.login`), PUBLISH and acks
(:mod:`~mqttgw.transports.publishing`), SUBSCRIBE
(:mod:`~mqttgw.transports.subscribing`); what differs by version is the
dialect's (:mod:`~mqttgw.transports.dialects`), the bytes the
connection's (:mod:`~mqttgw.transports.connection`).  Bad input closes
this connection with a log line and nothing else.
"""

import sys
from types import MappingProxyType

import attr
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqttgw.broker.ratelimited import BySource
from mqttgw.schema import default
from mqttgw.security.identity import Identity
from mqttgw.security.throttle import ConnectionRate, Throttle
from mqttgw.transports.connection import MQTTConnection
from mqttgw.transports.connlog import DISCONNECTED, LOST
from mqttgw.transports.dialects import UNKNOWN
from mqttgw.transports.handshake import (
    BEFORE_CONNACK,
    CONNECTED,
    Handshake,
    challenged_handlers,
    connack_refusal,
    disconnect_refusal,
)
from mqttgw.transports.login import Login
from mqttgw.transports.publishing import Publishing
from mqttgw.transports.schedulers import Flusher
from mqttgw.transports.subscribing import Subscribing
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import STRICT, STRICT_TEXT, Framer, ProtocolViolation

# Where they were first defined (tests and tools import them from here).
__all__ = ["ConnectionLimits", "MQTTServerFactory", "MQTTServerProtocol", "connack_refusal",
           "disconnect_refusal", "refusal_log"]

log = Logger()


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


class MQTTServerProtocol(Login, Handshake, Publishing, Subscribing, MQTTConnection):
    """The MQTT packets of one connection, dispatched to ``handle_<TYPE>``."""

    __slots__ = (
        "session", "client_id", "keepalive", "username",
        "identity", "_denied_topics", "_may_write", "_reserved",
        # Acks waiting, in order, behind a store commit (OrderedAcks), once
        # some have.
        "ordered_acks",
        # What the client's protocol version says and does (see dialects),
        # chosen at CONNECT.
        "dialect",
        # The listener's MQTTServerFactory (its portal, throttle and 5.0
        # authentication methods) and kind (tcp, tls, ws or wss).
        "factory", "listener_kind",
        # 5.0 enhanced authentication: the method CONNECT authenticated
        # with, and the exchange under way (handshake.Exchange), if any.
        "auth_method", "_auth",
        # Messages a second it is sent at most (0: no bound): a dashboard page.
        "max_delivery_rate",
        # The login under way in the throttle (a Login), or None.
        "_login",
        # One timer per purpose: a login's answer (welcome or refusal)
        # the throttle delays; the deadline of an enhanced authentication;
        # the expiry of the client's token.
        "_answer", "_auth_deadline", "_expiry",
    )

    def __init__(self, router, limits, clock, flusher):
        super().__init__(
            router,
            limits,
            clock,
            flusher,
            Framer(
                limits.max_packet_size,
                first_packet=P.CONNECT,
                first_packet_size=min(limits.max_connect_size, limits.max_packet_size),
                strict_for_311=STRICT_TEXT if limits.reject_control_characters else STRICT,
            ),
        )
        self.session = None
        self.client_id = None
        self.dialect = UNKNOWN
        self.keepalive = 0
        self.username = None
        self.identity = _NOBODY
        self.factory = None
        self.listener_kind = None
        self.auth_method = None
        self._auth = None
        self.max_delivery_rate = 0
        self._login = None
        self.ordered_acks = None
        self._denied_topics = None
        # A cached ACL check of what the client may publish, or None: then
        # only the reserved topics are checked (see _write_allowed).
        self._may_write = None
        self._reserved = frozenset()
        self._answer = self._auth_deadline = self._expiry = None

    # Connection life

    def connectionMade(self):
        super().connectionMade()
        self._flusher.connects.add(self, self.limits.connect_timeout)

    def _lost(self, reason):
        if self.state in BEFORE_CONNACK and _tls_failed(reason):
            self.router.limited("tls handshakes", log).warn(
                "TLS handshake with {peer} failed: {reason}",
                peer=self.peer,
                reason=_tls_reason(reason.value),
            )
        if self.session is not None and self.limits.connection_messages:
            self._flusher.connection_messages.info(
                LOST,
                "client {client_id} connection lost: {reason}",
                client_id=self.log_id,
                reason=reason.getErrorMessage(),
            )

    def _ended(self, publish_will):
        self._flusher.connects.closed()
        if self.keepalive:
            self._flusher.keepalives.closed()
        self._cancel_answers()
        if self._login is not None:
            # Gone while its credentials were checked.
            self.factory.throttle.release(self._login)
            self._login = None
        if self.session is not None:
            self._count_version(-1)
            session, self.session = self.session, None
            self.router.disconnect(session, publish_will)

    def _output_paused(self):
        # Its deliveries wait in the session's bounded queue.
        if self.session is not None:
            self.session.pause()

    def _output_resumed(self):
        if self.session is not None:
            self.session.resume()

    def kick(self):
        """The admin API disconnects the client (its will is published)."""
        log.info("client {client_id} disconnected by the admin API", client_id=self.log_id)
        self.disconnect_first(R.ADMINISTRATIVE_ACTION)
        self._close(publish_will=True, graceful=True)

    def taken_over(self, publish_will=True):
        """Another connection claims our client id: make way for it now."""
        # A 5.0 client reads why before the connection ends.
        self._close(publish_will, graceful=self.disconnect_first(R.SESSION_TAKEN_OVER))

    def shutting_down(self):
        """The gateway stops: a 5.0 client is told so ([MQTT-4.13.2-1])."""
        self.disconnect_first(R.SERVER_SHUTTING_DOWN)
        self._close(publish_will=True, graceful=True)

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

    def protocol_error(self, reason, reason_code=None):
        self.disconnect_first(R.PROTOCOL_ERROR if reason_code is None else reason_code, reason)
        super().protocol_error(reason, reason_code)

    # Timers

    def connect_due(self):
        """The CONNECT deadline came (see :class:`ConnectDeadlines`)."""
        if self.state in BEFORE_CONNACK:
            # Idle connections by the thousand: one line per address.
            self.factory.refusals.info(
                self._host,
                "no CONNECT from {peer} in time: closing",
                peer=self.peer,
                reason="no CONNECT in time",
            )
            self._close(publish_will=False, graceful=True)

    def keepalive_due(self, now, stalls):
        """
        The keepalive's deadline came (see :class:`KeepaliveTimers`): None
        when the client is gone or expired, else its next deadline.
        Rather than re-arming a timer per packet, check now how long it has
        really been since the client was last heard from, less the time
        the gateway could not read it (``stalls``, a :class:`Stalls`).
        """
        if self.state is not CONNECTED:
            return None
        limit = self.keepalive * 1.5
        if self._awaiting_admission:
            # Not read from because of us (see Flusher): its silence is ours.
            return now + limit
        last = self._last_received
        idle = now - last
        if idle >= limit:
            stalled = stalls.since(last)
            if idle - stalled < limit:
                return last + stalled + limit
            log.info(
                "client {client_id} keepalive expired ({idle:.1f}s silent)",
                client_id=self.log_id,
                idle=idle - stalled,
            )
            self._close(publish_will=True, graceful=self.disconnect_first(R.KEEP_ALIVE_TIMEOUT))
            return None
        return last + limit

    # Packet handlers (the others are the mixins')

    def handle_PINGREQ(self, packet):
        self.write(P.PINGRESP_WIRE)

    def handle_DISCONNECT(self, packet):
        try:
            publish_will = self.dialect.disconnecting(self, packet)
        except ProtocolViolation as e:
            return self.protocol_error(str(e), e.reason_code)
        if self.limits.connection_messages:
            if packet.reason_code:
                self._flusher.connection_messages.info(
                    DISCONNECTED,
                    "client {client_id} disconnected: {reason}",
                    client_id=self.log_id,
                    reason=R.name(packet.reason_code),
                )
            else:
                self._flusher.connection_messages.info(
                    DISCONNECTED, "client {client_id} disconnected", client_id=self.log_id
                )
        # A clean DISCONNECT discards the will; anything after it is ignored.
        self._close(publish_will=publish_will, graceful=True)

    def _second_connect(self, packet):
        self.protocol_error("second CONNECT")

    def _not_connected(self, packet):
        self.protocol_error(f"{P.PACKET_NAMES[packet.packet_type]} before CONNECT")

    def _unexpected(self, packet):
        self.protocol_error(
            f"unexpected {P.PACKET_NAMES[packet.packet_type]} from a client"
        )

    handle_CONNACK = handle_SUBACK = handle_UNSUBACK = handle_PINGRESP = _unexpected

    # The handlers of a connected client, by class and dialect class.
    _TABLES = {}

    @classmethod
    def _handlers_for(cls, dialect):
        """The handlers of a connected client of ``dialect``: its own where it has some."""
        table = cls._TABLES.get((cls, type(dialect)))
        if table is None:
            table = {t: getattr(cls, "handle_" + name) for t, name in P.PACKET_NAMES.items()}
            table[P.CONNECT] = cls._second_connect
            for packet_type, name in dialect.HANDLERS.items():
                table[packet_type] = getattr(cls, name)
            cls._TABLES[cls, type(dialect)] = table
        return table




# Until CONNECT, every other packet is a protocol violation; after a
# CONNECT that began an enhanced authentication, only AUTH and DISCONNECT
# may come before CONNACK ([MQTT-3.1.2-30]).
MQTTServerProtocol._before_connect = {
    t: MQTTServerProtocol.handle_CONNECT if t == P.CONNECT else MQTTServerProtocol._not_connected
    for t in P.PACKET_NAMES
}
MQTTServerProtocol._challenged = challenged_handlers()


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
        protocol = MQTTServerProtocol(self.router, self.limits, self.clock, self.flusher)
        protocol.factory = self
        protocol.listener_kind = self.kind
        return protocol



def refusal_log(clock, interval=10.0):
    """The log of refused connections and CONNECTs, one line per address per interval."""
    return BySource(
        log,
        clock,
        "refused {count} more from {source} in the last {interval:.0f}s; the last: {reason}",
        interval,
    )

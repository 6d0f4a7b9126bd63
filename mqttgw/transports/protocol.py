"""
The server side of one MQTT connection: CONNECT first, then packets
dispatched to ``handle_<TYPE>`` and on to the router.  Bad input closes this
connection with a log line and nothing else.
"""

import heapq
import uuid
from collections import deque

import attr
from OpenSSL import SSL
from twisted.cred.credentials import Anonymous, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.internet.interfaces import IPushProducer, ISSLTransport, ITCPTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.access import BRIDGE_STATE_PREFIX, READ, WRITE
from mqttgw.broker.store import OrderedAcks
from mqttgw.broker.topics import (
    InvalidTopic,
    filter_size,
    validate_topic_filter,
    validate_topic_name,
)
from mqttgw.security.identity import Identity, IIdentity
from mqttgw.security.passwords import Busy
from mqttgw.security.throttle import Throttle
from mqttgw.transports.tls import peer_identity
from mqttgw.wire import packets as P
from mqttgw.wire.framing import LAX, STRICT, STRICT_TEXT, Framer, ProtocolViolation
from mqttgw.wire.printable import printable

log = Logger()

AWAITING_CONNECT = "AWAITING_CONNECT"
CONNECTED = "CONNECTED"
CLOSED = "CLOSED"

_NOBODY = Identity(None)


@attr.s(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection bounds; see ``[limits]`` in the configuration."""

    max_packet_size = attr.ib(default=1024 * 1024)
    # A CONNECT is small; until one arrives little is buffered.
    max_connect_size = attr.ib(default=16 * 1024)
    connect_timeout = attr.ib(default=10.0)
    max_connections = attr.ib(default=100_000)
    # MQTT 3.1.1 strings with control characters or non-characters close
    # the connection (the spec's MAY); off for fleets that send them.
    reject_control_characters = attr.ib(default=True)
    # MQTT 3.1 client ids over the spec's 23 characters (many libraries
    # generate longer ones).
    allow_long_client_ids = attr.ib(default=False)
    # Log each client's connect and disconnect (mosquitto's
    # connection_messages).
    connection_messages = attr.ib(default=True)


def _tls_reason(error):
    """OpenSSL's error list as one short line."""
    try:
        return "; ".join(str(e[2]) for e in error.args[0]) or str(error)
    except (IndexError, TypeError):
        return str(error)


# What every topic only the gateway writes starts with (those outside it
# are in Access.reserved_topics).
_RESERVED_STARTS = ("$", BRIDGE_STATE_PREFIX)
_PUBACK = P.Puback
_PUBREC = P.Pubrec
_PUBCOMP = P.Pubcomp

# Output of one reactor turn is written at once past this many bytes, so
# that a full socket pauses delivery (and reading) before more piles up.
OUTPUT_HIGH_WATER = 64 * 1024


@implementer(IPushProducer)
class MQTTServerProtocol(Protocol):
    # One per connection, so its attributes are slots: an idle client costs
    # no instance dictionary (see the connections benchmark).
    __slots__ = (
        "transport", "connected", "router", "limits", "clock", "_flusher",
        "framer", "stats", "log_id", "state", "session", "client_id",
        "protocol_level", "keepalive", "username", "identity", "_host",
        "_connect_seen", "_last_received", "_timer", "_expiry",
        # From the listener.
        "identity_as_username", "listener_kind", "portal", "factory_throttle",
        # Messages a second it is sent at most (0: no bound): a dashboard page.
        "max_delivery_rate",
        "_acks", "_backlog", "_work", "_held", "_authenticating",
        "_denied_topics", "_may_write", "_reserved", "_reading_paused",
        "_output_full", "_awaiting_admission", "_out", "_out_size",
    )
    # Packets handled per reactor turn before the rest wait for the next.
    PACKETS_PER_TURN = 256
    # Seconds a peer has to close its side after we closed ours.
    CLOSE_GRACE = 2.0
    # Topic filters of one SUBSCRIBE or UNSUBSCRIBE handled per turn.
    FILTERS_PER_STEP = 1000

    def __init__(self, router, limits, clock, flusher):
        self.transport = None
        self.connected = 0
        self.router = router
        self.limits = limits
        self.clock = clock
        self._flusher = flusher
        self.framer = Framer(
            limits.max_packet_size,
            first_packet=P.CONNECT,
            first_packet_size=min(limits.max_connect_size, limits.max_packet_size),
            strict_for_311=STRICT_TEXT if limits.reject_control_characters else STRICT,
        )
        self.stats = router.stats
        self.log_id = None
        self.state = AWAITING_CONNECT
        self.session = None
        self.client_id = None
        self.protocol_level = None
        self.keepalive = 0
        self.username = None
        self.identity = _NOBODY
        self._host = None
        self._connect_seen = False
        self._last_received = 0.0
        self._timer = None
        self._expiry = None
        self.identity_as_username = False
        # The kind of listener it came in on (tcp, tls, ws, wss).
        self.listener_kind = None
        self.portal = None
        self.factory_throttle = None
        self.max_delivery_rate = 0
        self._acks = None
        self._backlog = None
        self._work = None
        # Data read while reading was paused (a list, once there is some).
        self._held = ()
        self._authenticating = False
        self._denied_topics = None
        # A cached ACL check of what the client may publish, or None: then
        # only the reserved topics are checked (see _write_allowed).
        self._may_write = None
        self._reserved = frozenset()
        self._reading_paused = False
        self._output_full = False
        self._awaiting_admission = False
        # Bytes written this reactor turn: a list once there are some.
        self._out = ()
        self._out_size = 0

    # Connection life

    def connectionMade(self):
        # Writes are already batched per reactor turn; Nagle would only delay.
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        self._host = getattr(self.transport.getPeer(), "host", None)
        stats = self.stats
        stats.connections += 1
        stats.connections_accepted += 1
        if stats.connections > stats.clients_maximum:
            stats.clients_maximum = stats.connections
        # We are the producer of the bytes the transport sends: it tells us
        # when its buffer is full so a slow reader can't grow it without end.
        self.transport.registerProducer(self, True)
        self._flusher.connects.add(self, self.limits.connect_timeout)
        if not self._flusher.admit(self):
            # Too many connections arrived this turn: read this one later.
            self._awaiting_admission = True
            self._pause_reading()

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

    def admitted(self):
        """Our turn has come to be read from (see :meth:`Flusher.admit`)."""
        self._awaiting_admission = False
        self._resume_reading()

    def connectionLost(self, reason):
        self.router.stats.connections -= 1
        if self.state is not CLOSED:
            self._flusher.connects.closed()
            if self.keepalive:
                self._flusher.keepalives.closed()
        self._cancel_timer()
        self._cancel_expiry()
        if self.state is AWAITING_CONNECT and reason.check(SSL.Error):
            self.router.limited("tls handshakes", log).warn(
                "TLS handshake with {peer} failed: {reason}",
                peer=self.peer,
                reason=_tls_reason(reason.value),
            )
        if self.session is not None:
            if self.limits.connection_messages:
                log.info(
                    "client {client_id} connection lost: {reason}",
                    client_id=self.log_id,
                    reason=reason.getErrorMessage(),
                )
            self._end_session(publish_will=True)
        self.state = CLOSED

    def dataReceived(self, data):
        if self.state is CLOSED:
            # Closing: whatever the peer still sends is ignored.
            return
        self.stats.bytes_received += len(data)
        if self._backlog is not None:
            # Reading is paused; what was already on its way waits here.
            if self._held:
                self._held.append(data)
            else:
                self._held = [data]
            return
        self._consume(self.framer.feed(data))

    def _consume(self, packets):
        """
        Handle ``packets`` (the framer's iterator), at most
        ``PACKETS_PER_TURN`` of them: the rest wait for the next reactor
        turn with reading paused, so a peer that sends a great many packets
        at once takes no more than its share of a turn.
        """
        budget = self.PACKETS_PER_TURN
        packet = None
        try:
            for packet in packets:
                state = self.state
                # A handler returns True when what follows must wait (a
                # login, or a packet handled over several turns).
                if state is CONNECTED:
                    wait = self._handlers[packet.packet_type](self, packet)
                elif state is AWAITING_CONNECT:
                    wait = self._before_connect[packet.packet_type](self, packet)
                else:
                    break
                budget -= 1
                if (wait or budget <= 0) and self.state is not CLOSED:
                    self._backlog = packets
                    self._pause_reading()
                    # After a login, its answer carries on.
                    if not self._authenticating:
                        self.clock.callLater(0, self._next_turn)
                    break
            # Keepalive counts whole packets only: a peer dripping the bytes
            # of a packet it never finishes is not alive for MQTT.
            if packet is not None:
                self._last_received = self.clock.seconds()
                self.stats.packets_received += self.PACKETS_PER_TURN - budget
        except ProtocolViolation as e:
            self.protocol_error(str(e))
        except Exception:
            log.failure(
                "internal error handling data from {client_id} at {peer}",
                client_id=self.log_id,
                peer=self.peer,
            )
            self._close(publish_will=True)

    def _next_turn(self):
        if self.state is CLOSED:
            self._backlog = self._work = None
            return
        if self._work is not None:
            try:
                more = next(self._work, True) is not True
            except Exception:
                self._work = None
                log.failure("internal error handling a packet from {client_id}", client_id=self.log_id)
                self._close(publish_will=True)
                return
            if more:
                self.clock.callLater(0, self._next_turn)
                return
            self._work = None
        packets, self._backlog = self._backlog, None
        if packets is not None:
            self._consume(packets)
        if self._backlog is None and self._held:
            held, self._held = self._held, ()
            self._consume(self.framer.feed(b"".join(held)))
        if self._backlog is None:
            self._resume_reading()

    # Reading stops while the peer's output is full or its input is
    # waiting for a later turn, and goes on when neither holds.

    def _pause_reading(self):
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pauseProducing()

    def _resume_reading(self):
        if (
            self._reading_paused
            and not self._output_full
            and self._backlog is None
            and not self._awaiting_admission
        ):
            self._reading_paused = False
            if self.state is not CLOSED:
                self.transport.resumeProducing()

    def write(self, data):
        """
        Queue bytes for this connection.  Everything written in one reactor
        turn goes out in a single transport write.
        """
        out = self._out
        if out:
            out.append(data)
        else:
            self._flusher.mark(self)
            self._out = [data]
        self._out_size += len(data)
        if self._out_size > OUTPUT_HIGH_WATER:
            self.flush()

    def flush(self):
        out = self._out
        if out:
            # Counted per flush, not per packet: one write is one packet.
            stats = self.stats
            stats.packets_sent += len(out)
            stats.bytes_sent += self._out_size
            self._out = ()
            self._out_size = 0
            try:
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            except Exception:
                self.flush_failed()

    def flush_failed(self):
        """Writing to the transport raised: this connection cannot go on."""
        self._out = ()
        self._out_size = 0
        if self.state is CLOSED:
            return
        log.failure(
            "cannot write to client {client_id} at {peer}: closing",
            client_id=self.log_id,
            peer=self.peer,
        )
        self._close(publish_will=True)

    def protocol_error(self, reason):
        """Log, count and close: the peer broke the protocol."""
        # Under a flood of broken clients: some lines, then a count.
        self.router.limited("protocol errors", log).warn(
            "closing connection of client {client_id} from {peer}: {reason}",
            client_id=self.log_id,
            peer=self.peer,
            reason=reason,
        )
        self.router.stats.protocol_errors += 1
        self._close(publish_will=True, graceful=True)

    def kick(self):
        """The admin API disconnects the client (its will is published)."""
        log.info("client {client_id} disconnected by the admin API", client_id=self.log_id)
        self._close(publish_will=True, graceful=True)

    def taken_over(self, publish_will=True):
        """Another connection claims our client id: make way for it now."""
        self._close(publish_will)

    def _close(self, publish_will, graceful=False):
        if self.state is CLOSED:
            return
        self.state = CLOSED
        self._flusher.connects.closed()
        if self.keepalive:
            self._flusher.keepalives.closed()
        self._cancel_timer()
        self._cancel_expiry()
        if self.session is not None:
            self._end_session(publish_will)
        if graceful:
            self._close_gracefully()
        else:
            self._out = ()
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
        if ITCPTransport.providedBy(transport) and not ISSLTransport.providedBy(transport):
            transport.loseWriteConnection()
        else:
            transport.loseConnection()
        if self._reading_paused:
            self._reading_paused = False
            transport.resumeProducing()
        self._timer = self.clock.callLater(self.CLOSE_GRACE, transport.abortConnection)

    def _end_session(self, publish_will):
        session, self.session = self.session, None
        self.router.disconnect(session, publish_will)

    def _refuse(self, return_code, reason):
        log.info(
            "refusing CONNECT from {peer} (client {client_id}): {reason}",
            peer=self.peer,
            client_id=self.log_id,
            reason=reason,
        )
        self.router.stats.connections_refused += 1
        self.write(P.Connack(return_code).encode())
        self._close(publish_will=False, graceful=True)

    # Timers

    def _cancel_expiry(self):
        if self._expiry is not None:
            if self._expiry.active():
                self._expiry.cancel()
            self._expiry = None

    def _cancel_timer(self):
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def connect_due(self):
        """The CONNECT deadline came (see :class:`ConnectDeadlines`)."""
        if self.state is AWAITING_CONNECT and not self._connect_seen:
            log.info("no CONNECT from {peer} in time: closing", peer=self.peer)
            self._close(publish_will=False, graceful=True)

    def keepalive_due(self, now):
        """
        The keepalive's deadline came (see :class:`KeepaliveTimers`): None
        when the client is gone or expired, else its next deadline.
        Rather than re-arming a timer per packet, check now how long it has
        really been since the client was last heard from.
        """
        if self.state is not CONNECTED:
            return None
        limit = self.keepalive * 1.5
        idle = now - self._last_received
        if idle >= limit:
            log.info(
                "client {client_id} keepalive expired ({idle:.1f}s silent)",
                client_id=self.log_id,
                idle=idle,
            )
            self._close(publish_will=True)
            return None
        return self._last_received + limit

    # Flow control from the transport (IPushProducer)

    def pauseProducing(self):
        # The peer is not reading what we send: hold its deliveries in the
        # session's bounded queue, and stop reading its requests, whose
        # answers would pile up here.
        self._output_full = True
        if self.session is not None:
            self.session.pause()
        self._pause_reading()

    def resumeProducing(self):
        self._output_full = False
        if self.state is CLOSED:
            return
        self._resume_reading()
        if self.session is not None:
            self.session.resume()

    def stopProducing(self):
        pass

    # Packet handlers

    def handle_CONNECT(self, packet):
        self._connect_seen = True
        level = packet.protocol_level
        if (packet.protocol_name, level) not in (
            ("MQIsdp", P.MQTT_31),
            ("MQTT", P.MQTT_311),
        ):
            return self._refuse(
                P.CONNACK_UNACCEPTABLE_PROTOCOL,
                f"unsupported protocol {packet.protocol_name!r} level {level}",
            )
        self.protocol_level = level
        self.framer.strict = self.framer.strict_for_311 if level == P.MQTT_311 else LAX
        client_id = self.client_id = packet.client_id
        self.log_id = printable(client_id)
        if "\x00" in client_id:
            # The router keeps such ids for bridges.
            return self._refuse(P.CONNACK_IDENTIFIER_REJECTED, "client id contains U+0000")
        if level == P.MQTT_31:
            if not client_id or (len(client_id) > 23 and not self.limits.allow_long_client_ids):
                return self._refuse(
                    P.CONNACK_IDENTIFIER_REJECTED,
                    "MQTT 3.1 client id must be 1 to 23 characters",
                )
        elif not client_id:
            if not packet.clean_session:
                return self._refuse(
                    P.CONNACK_IDENTIFIER_REJECTED,
                    "empty client id needs clean session",
                )
            client_id = self.client_id = self.log_id = f"mqttgw-{uuid.uuid4().hex}"
        self.username = packet.username
        will = None
        if packet.will_topic is not None:
            try:
                validate_topic_name(packet.will_topic)
            except InvalidTopic as e:
                return self.protocol_error(f"invalid will topic: {e}")
            will = P.Publish(
                packet.will_topic,
                packet.will_message,
                packet.will_qos,
                packet.will_retain,
            )
        if self.identity_as_username:
            identity = peer_identity(self.transport)
            if identity is None:
                return self._refuse(
                    P.CONNACK_NOT_AUTHORIZED, "no client certificate identity"
                )
            # The certificate, checked by TLS, is the credential.
            self.username = identity
            self.identity = Identity(identity)
            return self._logged_in(packet, will)
        portal = self.portal
        if portal is None:
            return self._logged_in(packet, will)
        if packet.username is not None:
            creds = UsernamePassword(packet.username.encode(), packet.password or b"")
        else:
            creds = Anonymous()
        # Packets that arrive meanwhile wait, in order, with reading paused.
        self._authenticating = True
        d = portal.login(creds, None, IIdentity)
        d.addCallbacks(self._login_succeeded, self._login_failed, (packet, will), None, (packet,))
        # True while the login is under way: the packets after it wait.
        return self._authenticating

    def _login_succeeded(self, result, packet, will):
        self._authenticating = False
        if self.state is CLOSED:
            return
        _, identity, _ = result
        self.username = identity.username
        self.identity = identity
        self.factory_throttle.succeeded(self._host)
        self._logged_in(packet, will)
        if self._backlog is not None:
            # What arrived during the login is handled next.
            self.clock.callLater(0, self._next_turn)

    def _login_failed(self, reason, packet):
        self._authenticating = False
        if self.state is CLOSED:
            return
        if reason.check(Busy):
            code, why = P.CONNACK_SERVER_UNAVAILABLE, "too many logins waiting"
        elif packet.username is None:
            code, why = P.CONNACK_NOT_AUTHORIZED, "anonymous clients are not allowed"
        elif reason.check(UnauthorizedLogin, UnhandledCredentials):
            code, why = P.CONNACK_BAD_CREDENTIALS, f"bad user name or password for {printable(packet.username)!r}"
        else:
            log.failure("login of {client_id} failed", reason, client_id=self.log_id)
            code, why = P.CONNACK_SERVER_UNAVAILABLE, "authentication failed"
        self.router.stats.logins_refused += 1
        delay = self.factory_throttle.failed(self._host)
        # The answer waits, longer for each failure from the same address.
        self._timer = self.clock.callLater(delay, self._refuse, code, why)

    def _logged_in(self, packet, will):
        client_id = self.client_id
        level = self.protocol_level
        access = self.router.access
        identity = self.identity
        if access.acl is not None or identity.publish is not None:
            self._may_write = access.checker(self.username, client_id, WRITE, identity.publish)
        self._reserved = access.reserved_topics
        if will is not None and not self._write_allowed(will.topic):
            return self._refuse(
                P.CONNACK_NOT_AUTHORIZED, f"may not publish its will on {printable(will.topic)!r}"
            )
        router = self.router
        if not packet.clean_session:
            if router.store is not None and router.store.failed is not None:
                return self._refuse(
                    P.CONNACK_SERVER_UNAVAILABLE, "the store cannot be written: no persistent sessions"
                )
            if not router.may_start_session(client_id, False):
                return self._refuse(
                    P.CONNACK_SERVER_UNAVAILABLE,
                    f"max_persistent_sessions ({router.max_persistent_sessions}) reached",
                )
        session, present = router.connect(client_id, packet.clean_session, will)
        self.session = session
        session.may_read = access.checker(self.username, client_id, READ, identity.subscribe)
        if self.max_delivery_rate:
            session.may_read = DeliveryBudget(
                session.may_read, self.max_delivery_rate, router, session, self.clock
            )
        self.state = CONNECTED
        self.write(
            P.Connack(
                P.CONNACK_ACCEPTED, present and level == P.MQTT_311
            ).encode()
        )
        if self.limits.connection_messages:
            self._log_connected(packet)
        session.attach(self)
        self.keepalive = packet.keepalive
        if self.keepalive:
            self._flusher.keepalives.add(self, self.clock.seconds() + self.keepalive * 1.5)
        if identity.expires is not None:
            self._expiry = self.clock.callLater(
                max(0.0, identity.expires - self.clock.seconds()), self._token_expired
            )

    def _log_connected(self, packet):
        level = self.protocol_level
        log.info(
            "client {client_id} connected from {peer} (MQTT {version},"
            " clean session {clean}, keepalive {keepalive}s, user {username})",
            client_id=self.log_id,
            peer=self.peer,
            username=printable(self.username),
            version="3.1.1" if level == P.MQTT_311 else "3.1",
            clean=packet.clean_session,
            keepalive=packet.keepalive,
        )

    def _token_expired(self):
        self._expiry = None
        log.info("client {client_id}: its token expired: closing", client_id=self.log_id)
        self._close(publish_will=True, graceful=True)

    def handle_PUBLISH(self, packet):
        topic = packet.topic
        if not topic or "+" in topic or "#" in topic or "\x00" in topic:
            return self.protocol_error(f"invalid topic name {topic!r} in PUBLISH")
        qos = packet.qos
        router = self.router
        stats = self.stats
        stats.messages_received += 1
        stats.publish_bytes_received += len(packet.payload)
        session = self.session
        may_write = self._may_write
        if may_write is not None:
            if not may_write(topic):
                return self._denied(packet)
        elif topic.startswith(_RESERVED_STARTS) or topic in self._reserved:
            # Reserved topics start with "$" or are bridge state topics.
            if not self._write_allowed(topic):
                return self._denied(packet)
        if qos == 0:
            router.publish(packet, session)
            return
        # The acknowledgement goes out before the routed copies (the
        # publisher may be a subscriber too), unless it must wait for the
        # store to commit the message.
        if qos == 1:
            ack = _PUBACK(packet.message_id).encode()
            if router.may_be_durable(packet):
                if router.store.failed is not None:
                    return self._store_failed(packet)
                self._acknowledge(ack, router.publish(packet, session))
            else:
                self._acknowledge(ack, False)
                router.publish(packet, session)
            return
        mid = packet.message_id
        ack = _PUBREC(mid).encode()
        # Exactly once: a re-sent PUBLISH before PUBREL is not routed again.
        if not session.qos2_received(mid):
            self._acknowledge(ack, False)
        elif session.store is None and not router.may_be_durable(packet):
            self._acknowledge(ack, False)
            router.publish(packet, session)
        elif router.store.failed is not None:
            session.qos2_released(mid)
            return self._store_failed(packet)
        else:
            self._acknowledge(ack, router.publish(packet, session) or session.store is not None)

    def _store_failed(self, reason=None):
        """
        A QoS 1/2 publish needs the store and the store cannot commit:
        rather than leave the client waiting for an ack that cannot come,
        the connection is closed; the client sends the message again when
        it reconnects (and CONNACK tells it when the gateway cannot hold
        persistent sessions).
        """
        self.stats.store_refused += 1
        self.router.limited("store refusals", log).warn(
            "closing connection of client {client_id}: its QoS 1/2 publish needs"
            " the store, which cannot be written",
            client_id=self.log_id,
        )
        self._close(publish_will=True, graceful=True)

    def _write_allowed(self, topic):
        may_write = self._may_write
        if may_write is not None:
            return may_write(topic)
        return self.router.access.may_publish(self.username, self.client_id, topic)

    def _denied(self, packet):
        """
        A PUBLISH the client may not make: not routed, but acknowledged as
        the protocol requires, so the client does not send it again.
        """
        self.router.stats.messages_denied += 1
        denied = self._denied_topics
        if denied is None:
            denied = self._denied_topics = set()
        if packet.topic not in denied and len(denied) < 100:
            # Once per topic and connection, not once per message.
            denied.add(packet.topic)
            log.warn(
                "client {client_id} (user {username}) may not publish on {topic}",
                client_id=self.log_id,
                username=printable(self.username),
                topic=printable(packet.topic),
            )
        if packet.qos == 1:
            self._acknowledge(_PUBACK(packet.message_id).encode(), False)
        elif packet.qos == 2:
            self.session.qos2_received(packet.message_id)
            self._acknowledge(_PUBREC(packet.message_id).encode(), False)

    def _acknowledge(self, ack, durable):
        if self._acks is None:
            self._acks = OrderedAcks(self.router.store, self._write_if_connected)
            self._acks.on_failure = self._store_failed
        self._acks.send(ack, durable)

    def _write_if_connected(self, data):
        if self.state is CONNECTED:
            self.write(data)

    def handle_PUBACK(self, packet):
        self.session.puback(packet.message_id)

    def handle_PUBREC(self, packet):
        self.session.pubrec(packet.message_id)

    def handle_PUBREL(self, packet):
        mid = packet.message_id
        self._acknowledge(_PUBCOMP(mid).encode(), self.session.qos2_released(mid))

    def handle_PUBCOMP(self, packet):
        self.session.pubcomp(packet.message_id)

    def handle_SUBSCRIBE(self, packet):
        return self._in_steps(self._subscribe(packet))

    def handle_UNSUBSCRIBE(self, packet):
        return self._in_steps(self._unsubscribe(packet))

    def _in_steps(self, work):
        """
        Run ``work``, a generator that yields between steps of bounded
        size; what is left of it runs over the next reactor turns, before
        any further packet of this connection.  True when some is left.
        """
        if next(work, True) is not True:
            self._work = work
            return True
        return False

    def _subscribe(self, packet):
        access = self.router.access
        session = self.session
        limits = session.limits
        suback = []
        accepted = []
        refused = 0
        first_reason = None
        topics = packet.topics
        for start in range(0, len(topics), self.FILTERS_PER_STEP):
            if start:
                yield
            chunk = []
            codes = []
            # What this step adds to the session's filters, for its bounds.
            adding = set()
            adding_bytes = 0
            for topic_filter, qos in topics[start : start + self.FILTERS_PER_STEP]:
                try:
                    validate_topic_filter(topic_filter)
                except InvalidTopic as e:
                    if self.protocol_level == P.MQTT_31:
                        self.protocol_error(f"SUBSCRIBE: {e}")
                        return
                    refused += 1
                    if first_reason is None:
                        first_reason = str(e)
                    codes.append(False)
                    continue
                # 3.1 has no failure code: a filter that can match nothing
                # readable is granted, and nothing is delivered on it.
                if self.protocol_level == P.MQTT_311 and not access.may_subscribe(
                    self.username, self.client_id, topic_filter, self.identity.subscribe
                ):
                    refused += 1
                    if first_reason is None:
                        first_reason = f"not authorized for {topic_filter!r}"
                    codes.append(False)
                    continue
                if topic_filter not in session.subscriptions and topic_filter not in adding:
                    size = filter_size(topic_filter)
                    over = None
                    if len(session.subscriptions) + len(adding) >= limits.max_subscriptions:
                        over = f"max_subscriptions ({limits.max_subscriptions}) reached"
                    elif session.filter_bytes + adding_bytes + size > limits.max_subscription_bytes:
                        over = f"max_subscription_bytes ({limits.max_subscription_bytes}) reached"
                    if over is not None:
                        if self.protocol_level == P.MQTT_31:
                            # No failure code to refuse one filter with.
                            self.router.stats.subscriptions_refused += 1
                            self.protocol_error(f"SUBSCRIBE: {over}")
                            return
                        self.router.stats.subscriptions_refused += 1
                        refused += 1
                        if first_reason is None:
                            first_reason = over
                        codes.append(False)
                        continue
                    adding.add(topic_filter)
                    adding_bytes += size
                chunk.append((topic_filter, qos))
                codes.append(True)
            granted = iter(self.router.subscribe(session, chunk))
            suback.extend(next(granted) if ok else P.SUBACK_FAILURE for ok in codes)
            accepted.extend(f for f, _ in chunk)
        if refused:
            # One line per packet, however many filters it refuses.
            log.info(
                "client {client_id} SUBSCRIBE refused {refused} of {n} filters: {reason}",
                client_id=self.log_id,
                refused=refused,
                n=len(topics),
                reason=printable(first_reason),
            )
        self.write(P.Suback(packet.message_id, suback).encode())
        self.router.send_retained(session, accepted)

    def _unsubscribe(self, packet):
        topics = packet.topics
        for start in range(0, len(topics), self.FILTERS_PER_STEP):
            if start:
                yield
            self.router.unsubscribe(self.session, topics[start : start + self.FILTERS_PER_STEP])
        self.write(P.Unsuback(packet.message_id).encode())

    def handle_PINGREQ(self, packet):
        self.write(P.PINGRESP_WIRE)

    def handle_DISCONNECT(self, packet):
        if self.limits.connection_messages:
            log.info("client {client_id} disconnected", client_id=self.log_id)
        # A clean DISCONNECT discards the will; anything after it is ignored.
        self._close(publish_will=False, graceful=True)

    def _second_connect(self, packet):
        self.protocol_error("second CONNECT")

    def _not_connected(self, packet):
        self.protocol_error(f"{P.PACKET_NAMES[packet.packet_type]} before CONNECT")

    def _unexpected(self, packet):
        self.protocol_error(
            f"unexpected {P.PACKET_NAMES[packet.packet_type]} from a client"
        )

    handle_CONNACK = handle_SUBACK = handle_UNSUBACK = handle_PINGRESP = _unexpected


MQTTServerProtocol._handlers = {
    t: getattr(MQTTServerProtocol, "handle_" + name)
    for t, name in P.PACKET_NAMES.items()
}
MQTTServerProtocol._handlers[P.CONNECT] = MQTTServerProtocol._second_connect
# Until CONNECT, every other packet is a protocol violation.
MQTTServerProtocol._before_connect = {
    t: MQTTServerProtocol.handle_CONNECT if t == P.CONNECT else MQTTServerProtocol._not_connected
    for t in P.PACKET_NAMES
}


class KeepaliveTimers:
    """
    Every connection's keepalive deadline in one heap under one timer, set
    for the earliest: a DelayedCall per connection cost an idle client
    some 450 bytes, a heap entry a fifth of that.  Entries of connections
    that closed are dropped when they come due.
    """

    def __init__(self, clock):
        self.clock = clock
        self._heap = []
        self._call = None
        self._order = 0
        self._closed = 0

    def closed(self):
        """
        A connection with a deadline here closed.  Once they are most of
        the heap (a reconnect storm), it is rebuilt without them rather
        than holding them until they come due.
        """
        self._closed += 1
        if self._closed > 64 and self._closed * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[2].state is not CLOSED]
            heapq.heapify(self._heap)
            self._closed = 0

    def add(self, connection, due):
        self._order += 1
        heapq.heappush(self._heap, (due, self._order, connection))
        if self._call is None or due < self._call.getTime():
            if self._call is not None:
                self._call.cancel()
            self._call = self.clock.callLater(max(0.0, due - self.clock.seconds()), self._fire)

    def _fire(self):
        self._call = None
        heap = self._heap
        now = self.clock.seconds()
        while heap and heap[0][0] <= now:
            _, _, connection = heapq.heappop(heap)
            try:
                due = connection.keepalive_due(now)
            except Exception:
                log.failure("keepalive check of {client_id} failed", client_id=connection.log_id)
                continue
            if due is not None:
                self._order += 1
                heapq.heappush(heap, (due, self._order, connection))
        if heap:
            self._call = self.clock.callLater(max(0.0, heap[0][0] - now), self._fire)


class ConnectDeadlines:
    """
    The CONNECT deadlines of new connections under one timer.  They come in
    the order they are due (one timeout for all), so they are kept in
    buckets of those due within ``GRAIN`` seconds of each other: a
    connection costs a slot in a list, where a timer made and cancelled for
    each was some 450 bytes and a tenth of a connect's time.  A bucket
    fires at its last member's deadline: no connection is closed early, and
    none more than ``GRAIN`` late.  (A timeout shortened by a reload waits
    for the buckets before it.)
    """

    GRAIN = 0.1

    def __init__(self, clock):
        self.clock = clock
        # [due, first member's due, connections]
        self._buckets = deque()
        self._call = None
        self._held = 0
        self._closed = 0

    def add(self, connection, timeout):
        due = self.clock.seconds() + timeout
        buckets = self._buckets
        if buckets and 0 <= due - buckets[-1][1] < self.GRAIN:
            bucket = buckets[-1]
            bucket[2].append(connection)
            if due > bucket[0]:
                bucket[0] = due
        else:
            buckets.append([due, due, [connection]])
        self._held += 1
        if self._call is None:
            self._call = self.clock.callLater(max(0.0, buckets[0][0] - self.clock.seconds()), self._fire)

    def closed(self):
        """
        A connection closed.  Once closed ones are most of those held (a
        reconnect storm), the buckets are rebuilt with only the connections
        still waiting for CONNECT, rather than holding the others until
        their deadline.
        """
        self._closed += 1
        if self._closed > 64 and self._closed * 2 > self._held:
            for bucket in self._buckets:
                bucket[2] = [c for c in bucket[2] if c.state is AWAITING_CONNECT]
            self._held = sum(len(bucket[2]) for bucket in self._buckets)
            self._closed = 0

    def _fire(self):
        self._call = None
        buckets = self._buckets
        now = self.clock.seconds()
        while buckets and buckets[0][0] <= now:
            _, _, connections = buckets.popleft()
            self._held -= len(connections)
            for connection in connections:
                if connection.state is AWAITING_CONNECT:
                    try:
                        connection.connect_due()
                    except Exception:
                        log.failure("CONNECT deadline of {peer} failed", peer=connection.peer)
        if buckets:
            self._call = self.clock.callLater(max(0.0, buckets[0][0] - now), self._fire)


class Flusher:
    """
    Work shared out per reactor turn, one for every listener.  Connections
    with output waiting are flushed on the next turn: all the reads of one
    turn cost each subscriber a single transport write, rather than one per
    message.  New connections are read from at most ``ADMISSIONS_PER_TURN``
    a turn, so a storm of reconnecting clients is taken in over several
    turns instead of holding up everyone else for one long one.
    """

    ADMISSIONS_PER_TURN = 64

    def __init__(self, clock):
        self.clock = clock
        self.keepalives = KeepaliveTimers(clock)
        self.connects = ConnectDeadlines(clock)
        self.pending = []
        self._call = None
        self._admissions = 0
        self._waiting = deque()
        self._admit_call = None

    def admit(self, connection):
        """Whether ``connection`` may be read from now; if not, it is told later."""
        if self._admissions < self.ADMISSIONS_PER_TURN and not self._waiting:
            self._admissions += 1
            if self._admit_call is None:
                self._admit_call = self.clock.callLater(0, self._admit_turn)
            return True
        self._waiting.append(connection)
        return False

    def _admit_turn(self):
        self._admit_call = None
        self._admissions = 0
        waiting = self._waiting
        while waiting and self._admissions < self.ADMISSIONS_PER_TURN:
            connection = waiting.popleft()
            if connection.state is not CLOSED:
                self._admissions += 1
                connection.admitted()
        if self._admissions:
            self._admit_call = self.clock.callLater(0, self._admit_turn)

    def mark(self, connection):
        self.pending.append(connection)
        if self._call is None:
            self._call = self.clock.callLater(0, self._run)

    def _run(self):
        self._call = None
        self.flush()

    def flush(self):
        while self.pending:
            pending, self.pending = self.pending, []
            for connection in pending:
                try:
                    connection.flush()
                except Exception:
                    # One connection's failure must not keep the others'
                    # output from leaving.
                    connection.flush_failed()


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
        self.throttle = Throttle()
        # Set by whoever builds the listener: tcp, tls, ws or wss.
        self.kind = None

    def buildProtocol(self, addr):
        stats = self.router.stats
        if stats.connections + stats.handshakes >= self.limits.max_connections:
            self.router.limited("connection limit", log).warn(
                "refusing connection from {addr}: {n} connections is the limit",
                addr=f"{getattr(addr, 'host', addr)}:{getattr(addr, 'port', '')}",
                n=self.limits.max_connections,
            )
            stats.connections_refused += 1
            return None
        return self.admit(addr)

    def admit(self, addr):
        """A protocol for a connection already counted (a WebSocket)."""
        protocol = MQTTServerProtocol(self.router, self.limits, self.clock, self.flusher)
        protocol.identity_as_username = self.identity_as_username
        protocol.listener_kind = self.kind
        protocol.portal = self.portal
        protocol.factory_throttle = self.throttle
        return protocol


class DeliveryBudget:
    """
    What a dashboard page may read: ``may_read`` (the ACL), and at most
    ``rate`` messages a second.  The page shows each topic's latest value,
    and an open page would otherwise cost the gateway a second delivery of
    every message.  Once a second's budget is spent the page's filters
    leave the subscription trie until the second ends, so what it misses
    costs the router nothing.  Retained messages are read through
    ``__wrapped__``: never held back.
    """

    def __init__(self, may_read, rate, router, session, clock):
        self.__wrapped__ = may_read
        self.rate = rate
        self.router = router
        self.session = session
        self.clock = clock
        self.left = rate
        self.window_end = clock.seconds() + 1.0
        self._resume = None

    def __call__(self, topic):
        may_read = self.__wrapped__
        if may_read is not None and not may_read(topic):
            return False
        self.left -= 1
        if self.left > 0:
            return True
        now = self.clock.seconds()
        if now >= self.window_end:
            self.window_end = now + 1.0
            self.left = self.rate
            return True
        if self.left == 0:
            self._pause()
            return True
        return False

    def _pause(self):
        trie = self.router.subscriptions
        for topic_filter in self.session.subscriptions:
            trie.remove(topic_filter, self.session)
        if self._resume is None:
            self._resume = self.clock.callLater(
                max(0.0, self.window_end - self.clock.seconds()), self._resumed
            )

    def _resumed(self):
        self._resume = None
        session = self.session
        self.left = self.rate
        self.window_end = self.clock.seconds() + 1.0
        # Back in the trie while the session lives, connected or not (a
        # persistent one queues while away).
        if self.router.sessions.get(session.client_id) is not session:
            return
        trie = self.router.subscriptions
        for topic_filter, qos in session.subscriptions.items():
            trie.add(topic_filter, session, qos)

"""
The server side of MQTT: CONNECT first (the login through the portal),
then each packet dispatched to ``handle_<TYPE>`` and on to the router; the
factory every listener shares.  The bytes are the connection's
(:mod:`mqttgw.transports.connection`).  Bad input closes this connection
with a log line and nothing else.
"""

import uuid

import attr
from OpenSSL import SSL
from twisted.cred.credentials import Anonymous, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqttgw.broker.access import BRIDGE_STATE_PREFIX, READ, WRITE
from mqttgw.broker.delivery_budget import DeliveryBudget
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
from mqttgw.transports.connection import (
    AUTHENTICATING,
    AWAITING_CONNECT,
    CONNECTED,
    MQTTConnection,
)
from mqttgw.transports.schedulers import Flusher
from mqttgw.transports.tls import peer_identity
from mqttgw.wire import packets as P
from mqttgw.wire.framing import LAX, STRICT, STRICT_TEXT, Framer
from mqttgw.wire.printable import printable

log = Logger()


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



class MQTTServerProtocol(MQTTConnection):
    """The MQTT packets of one connection, dispatched to ``handle_<TYPE>``."""

    __slots__ = (
        "session", "client_id", "protocol_level", "keepalive", "username",
        "identity", "_expiry", "_acks", "_denied_topics", "_may_write", "_reserved",
        # From the listener.
        "identity_as_username", "listener_kind", "portal", "factory_throttle",
        # Messages a second it is sent at most (0: no bound): a dashboard page.
        "max_delivery_rate",
    )
    # Topic filters of one SUBSCRIBE or UNSUBSCRIBE handled per turn.
    FILTERS_PER_STEP = 1000

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
        self.protocol_level = None
        self.keepalive = 0
        self.username = None
        self.identity = _NOBODY
        self._expiry = None
        self.identity_as_username = False
        # The kind of listener it came in on (tcp, tls, ws, wss).
        self.listener_kind = None
        self.portal = None
        self.factory_throttle = None
        self.max_delivery_rate = 0
        self._acks = None
        self._denied_topics = None
        # A cached ACL check of what the client may publish, or None: then
        # only the reserved topics are checked (see _write_allowed).
        self._may_write = None
        self._reserved = frozenset()

    # Connection life

    def connectionMade(self):
        super().connectionMade()
        self._flusher.connects.add(self, self.limits.connect_timeout)

    def _lost(self, reason):
        if self.state is AWAITING_CONNECT and reason.check(SSL.Error):
            self.router.limited("tls handshakes", log).warn(
                "TLS handshake with {peer} failed: {reason}",
                peer=self.peer,
                reason=_tls_reason(reason.value),
            )
        if self.session is not None and self.limits.connection_messages:
            log.info(
                "client {client_id} connection lost: {reason}",
                client_id=self.log_id,
                reason=reason.getErrorMessage(),
            )

    def _ended(self, publish_will):
        self._flusher.connects.closed()
        if self.keepalive:
            self._flusher.keepalives.closed()
        self._cancel_expiry()
        if self.session is not None:
            self._end_session(publish_will)

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
        self._close(publish_will=True, graceful=True)

    def taken_over(self, publish_will=True):
        """Another connection claims our client id: make way for it now."""
        self._close(publish_will)

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

    def connect_due(self):
        """The CONNECT deadline came (see :class:`ConnectDeadlines`)."""
        if self.state is AWAITING_CONNECT:
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

    # Packet handlers

    def handle_CONNECT(self, packet):
        self.state = AUTHENTICATING
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
        d = portal.login(creds, None, IIdentity)
        d.addCallbacks(self._login_succeeded, self._login_failed, (packet, will), None, (packet,))
        # True while the login is under way: the packets after it wait.
        return self.state is AUTHENTICATING

    def _login_succeeded(self, result, packet, will):
        if self.state is not AUTHENTICATING:
            # Closed meanwhile.
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
        if self.state is not AUTHENTICATING:
            # Closed meanwhile.
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
        return self.admit(addr) if self.accepts(addr) else None

    def accepts(self, addr):
        """
        The one admission gate of every listener: whether a connection
        from ``addr`` fits under ``max_connections`` (counting WebSocket
        handshakes under way); refusals are counted, and logged at a
        bounded rate.
        """
        stats = self.router.stats
        if stats.connections + stats.handshakes < self.limits.max_connections:
            return True
        self.router.limited("connection limit", log).warn(
            "refusing connection from {addr}: {n} connections is the limit",
            addr=f"{getattr(addr, 'host', addr)}:{getattr(addr, 'port', '')}",
            n=self.limits.max_connections,
        )
        stats.connections_refused += 1
        return False

    def admit(self, addr):
        """A protocol for a connection already counted (a WebSocket)."""
        protocol = MQTTServerProtocol(self.router, self.limits, self.clock, self.flusher)
        protocol.identity_as_username = self.identity_as_username
        protocol.listener_kind = self.kind
        protocol.portal = self.portal
        protocol.factory_throttle = self.throttle
        return protocol


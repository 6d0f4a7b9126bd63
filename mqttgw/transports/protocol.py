"""
The server side of MQTT: CONNECT first (the login through the portal),
then each packet dispatched to ``handle_<TYPE>`` and on to the router; the
factory every listener shares.  The bytes are the connection's
(:mod:`mqttgw.transports.connection`).  Bad input closes this connection
with a log line and nothing else.
"""

import uuid
from types import MappingProxyType

import attr
from OpenSSL import SSL
from twisted.cred.credentials import Anonymous, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.internet.defer import maybeDeferred
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqttgw.broker.access import BRIDGE_STATE_PREFIX, READ, WRITE
from mqttgw.broker.delivery_budget import DeliveryBudget
from mqttgw.broker.ratelimited import BySource
from mqttgw.broker.router import owner_name
from mqttgw.broker.store import OrderedAcks
from mqttgw.broker.subscriptions import (
    SEND_RETAINED_IF_NEW,
    SubscriptionOptions,
    is_shared,
    shared_filter,
)
from mqttgw.broker.topics import (
    InvalidTopic,
    filter_size,
    is_wildcard,
    validate_topic_filter,
    validate_topic_name,
)
from mqttgw.security.enhanced import Authenticated, Continue, Refused
from mqttgw.security.identity import Identity, IIdentity
from mqttgw.security.passwords import Busy
from mqttgw.security.throttle import ConnectionRate, Throttle, address_key
from mqttgw.transports.connection import (
    AUTHENTICATING,
    AWAITING_CONNECT,
    CLOSED,
    CONNECTED,
    MQTTConnection,
)
from mqttgw.transports.mqtt5 import Connection5, check_response_topic
from mqttgw.transports.schedulers import Flusher
from mqttgw.transports.tls import peer_identity
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import (
    LAX,
    STRICT,
    STRICT_TEXT,
    FiltersToDecode,
    Framer,
    ProtocolViolation,
)
from mqttgw.wire.printable import printable
from mqttgw.wire.properties import message_properties

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
    # What the server tells a 5.0 client in CONNACK (see [mqtt]).
    max_topic_alias = attr.ib(default=10)
    max_keepalive = attr.ib(default=65535)
    retain_available = attr.ib(default=True)
    wildcard_subscription_available = attr.ib(default=True)
    subscription_identifier_available = attr.ib(default=True)
    shared_subscription_available = attr.ib(default=True)
    response_information = attr.ib(default="")


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
_puback_bytes = P.puback_bytes
_pubrec_bytes = P.pubrec_bytes
_pubcomp_bytes = P.pubcomp_bytes



_NO_METHODS = MappingProxyType({})

def connack_refusal(code):
    """``code`` if a CONNACK may refuse with it, else Not authorized."""
    return code if code in R.CONNACK_CODES and code >= 0x80 else R.NOT_AUTHORIZED


def disconnect_refusal(code):
    """``code`` if a DISCONNECT may give it, else Not authorized."""
    return code if code in R.DISCONNECT_CODES and code >= 0x80 else R.NOT_AUTHORIZED


class _Exchange:
    """An enhanced authentication under way (see mqttgw.security.enhanced)."""

    __slots__ = ("method", "steps", "connect", "will", "reauthenticating", "pending", "first_data")

    def __init__(self, method, steps, connect=None, will=None):
        self.method = method
        self.steps = steps
        # A step's answer is awaited.
        self.pending = False
        # CONNECT's authentication data.
        self.first_data = None
        # The CONNECT it answers and its will; None when re-authenticating.
        self.connect = connect
        self.will = will
        self.reauthenticating = connect is None


def _take_step(topics, start, count):
    """
    ``count`` filters of a SUBSCRIBE or UNSUBSCRIBE from ``start``, dropped
    from a list as they are taken: a hundred thousand freed all at once,
    when the packet goes, would hold the reactor for milliseconds.
    """
    step = topics[start : start + count]
    topics[start : start + count] = [None] * len(step)
    return step


class MQTTServerProtocol(MQTTConnection):
    """The MQTT packets of one connection, dispatched to ``handle_<TYPE>``."""

    __slots__ = (
        "session", "client_id", "protocol_level", "keepalive", "username",
        "identity", "_expiry", "_acks", "_denied_topics", "_may_write", "_reserved",
        # A 5.0 connection's own state (Connection5), or None; and its
        # session expiry interval.
        "v5", "session_expiry",
        # The listener's MQTTServerFactory (its portal, throttle and 5.0
        # authentication methods) and kind (tcp, tls, ws or wss).
        "factory", "listener_kind",
        # 5.0 enhanced authentication: the method CONNECT authenticated
        # with, and the exchange under way (_Exchange), if any.
        "auth_method", "_auth",
        # Messages a second it is sent at most (0: no bound): a dashboard page.
        "max_delivery_rate",
        # The login under way in the throttle (a Login), or None.
        "_login",
    )
    # Topic filters of one SUBSCRIBE or UNSUBSCRIBE handled per turn.
    FILTERS_PER_STEP = 64

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
        self.factory = None
        self.listener_kind = None
        self.auth_method = None
        self._auth = None
        self.max_delivery_rate = 0
        self._login = None
        self._acks = None
        self._denied_topics = None
        # A cached ACL check of what the client may publish, or None: then
        # only the reserved topics are checked (see _write_allowed).
        self._may_write = None
        self._reserved = frozenset()
        self.v5 = None
        self.session_expiry = 0

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
        if self._login is not None:
            # Gone while its credentials were checked.
            self.factory.throttle.release(self._login)
            self._login = None
        if self.session is not None:
            self._count_version(-1)
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
        self.disconnect5(R.ADMINISTRATIVE_ACTION)
        self._close(publish_will=True, graceful=True)

    def taken_over(self, publish_will=True):
        """Another connection claims our client id: make way for it now."""
        # A 5.0 client reads why before the connection ends.
        self._close(publish_will, graceful=self.disconnect5(R.SESSION_TAKEN_OVER))

    def shutting_down(self):
        """The gateway stops: a 5.0 client is told so ([MQTT-4.13.2-1])."""
        self.disconnect5(R.SERVER_SHUTTING_DOWN)
        self._close(publish_will=True, graceful=True)

    def disconnect5(self, reason_code, reason=None):
        """
        A 5.0 client, connected, is sent DISCONNECT with ``reason_code``
        before the server closes ([MQTT-3.14.0-1]: not before CONNACK).
        True when it was.
        """
        if self.v5 is None or self.state is not CONNECTED:
            return False
        props = {"reason_string": reason[:200]} if reason else None
        self.write(self.v5.fit(P.Disconnect, reason_code, properties=props, exempt=True))
        return True

    def protocol_error(self, reason, reason_code=None):
        self.disconnect5(R.PROTOCOL_ERROR if reason_code is None else reason_code, reason)
        super().protocol_error(reason, reason_code)

    def _end_session(self, publish_will):
        session, self.session = self.session, None
        self.router.disconnect(session, publish_will)

    def _refuse(self, reason_code, reason):
        """CONNACK with a refusal: ``reason_code`` in 5.0's terms."""
        # A flood from one address is one line an interval, not one each.
        self.factory.refusals.info(
            self._host,
            "refusing CONNECT from {peer} (client {client_id}): {reason}",
            peer=self.peer,
            client_id=self.log_id,
            reason=reason,
        )
        self.router.stats.connections_refused += 1
        if self.protocol_level == P.MQTT_5:
            props = {"reason_string": reason[:200]}
            if self.v5 is not None:
                props = self.v5.fit_connack(reason_code, props)
            if props is not None:
                self.write(P.Connack(reason_code, False, props).encode())
        else:
            self.write(P.Connack(R.CONNACK_V3.get(reason_code, P.CONNACK_NOT_AUTHORIZED)).encode())
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
            self._close(publish_will=True, graceful=self.disconnect5(R.KEEP_ALIVE_TIMEOUT))
            return None
        return last + limit

    # Packet handlers

    def handle_CONNECT(self, packet):
        if self._auth is not None:
            self._auth = None
            return self._refuse(R.PROTOCOL_ERROR, "second CONNECT during enhanced authentication")
        self.state = AUTHENTICATING
        level = packet.protocol_level
        if (packet.protocol_name, level) not in (
            ("MQIsdp", P.MQTT_31),
            ("MQTT", P.MQTT_311),
            ("MQTT", P.MQTT_5),
        ):
            return self._refuse(
                R.UNSUPPORTED_PROTOCOL_VERSION,
                f"unsupported protocol {packet.protocol_name!r} level {level}",
            )
        self.protocol_level = level
        self.framer.strict = self.framer.strict_for_311 if level != P.MQTT_31 else LAX
        limits = self.limits
        props = packet.properties
        if level == P.MQTT_5:
            self.framer.v5 = True
            self.v5 = Connection5(
                self.clock,
                props,
                limits.max_topic_alias,
                self.router.limits.max_inflight_messages or 65535,
            )
            self.session_expiry = props.get("session_expiry_interval", 0)
        client_id = self.client_id = packet.client_id
        self.log_id = printable(client_id)
        if "\x00" in client_id:
            # The router keeps such ids for bridges.
            return self._refuse(R.CLIENT_IDENTIFIER_NOT_VALID, "client id contains U+0000")
        if level == P.MQTT_31:
            if not client_id or (len(client_id) > 23 and not limits.allow_long_client_ids):
                return self._refuse(
                    R.CLIENT_IDENTIFIER_NOT_VALID,
                    "MQTT 3.1 client id must be 1 to 23 characters",
                )
        elif not client_id:
            # 5.0 assigns one whatever Clean Start says ([MQTT-3.1.3-6]).
            if not packet.clean_session and level == P.MQTT_311:
                return self._refuse(
                    R.CLIENT_IDENTIFIER_NOT_VALID,
                    "empty client id needs clean session",
                )
            client_id = self.client_id = self.log_id = f"mqttgw-{uuid.uuid4().hex}"
        self.username = packet.username
        method = props.get("authentication_method") if props else None
        # Where the client certificate is the credential, no method is.
        if method is not None and (method not in self.factory.auth_methods or self.factory.identity_as_username):
            # The client is told at once rather than left waiting for an AUTH.
            return self._refuse(
                R.BAD_AUTHENTICATION_METHOD,
                f"authentication method {printable(method)!r} is not offered",
            )
        will = None
        if packet.will_topic is not None:
            try:
                validate_topic_name(packet.will_topic)
            except InvalidTopic as e:
                if self.v5 is not None:
                    return self._refuse(R.TOPIC_NAME_INVALID, f"invalid will topic: {e}")
                return self.protocol_error(f"invalid will topic: {e}")
            if self.v5 is not None:
                if packet.will_qos > self.router.max_qos:
                    return self._refuse(
                        R.QOS_NOT_SUPPORTED, f"will QoS {packet.will_qos} exceeds max_qos"
                    )
                if packet.will_retain and not limits.retain_available:
                    return self._refuse(R.RETAIN_NOT_SUPPORTED, "retained will: retain_available is off")
            will_props = packet.will_properties
            if will_props and "response_topic" in will_props:
                try:
                    check_response_topic(will_props)
                except ProtocolViolation as e:
                    return self._refuse(R.PROTOCOL_ERROR, f"will: {e}")
            will = P.Publish(
                packet.will_topic,
                packet.will_message,
                packet.will_qos,
                packet.will_retain,
                properties=message_properties(will_props),
            )
        if method is not None:
            try:
                steps = self.factory.auth_methods[method].exchange(client_id, packet.username)
            except Exception:
                log.failure("authentication method {method} failed", method=printable(method))
                return self._refuse(R.UNSPECIFIED_ERROR, "authentication failed")
            exchange = _Exchange(method, steps, packet, will)
            exchange.first_data = props.get("authentication_data")
            self._auth_begin(exchange)
            # While a step is under way, the packets after it wait.
            return self.state is AUTHENTICATING
        if self.factory.identity_as_username:
            identity = peer_identity(self.transport)
            if identity is None:
                return self._refuse(R.NOT_AUTHORIZED, "no client certificate identity")
            # The certificate, checked by TLS, is the credential.
            self.username = identity
            self.identity = Identity(identity)
            return self._logged_in(packet, will)
        portal = self.factory.portal
        if portal is None:
            return self._logged_in(packet, will)
        login = self.factory.throttle.begin(self._host, packet.username)
        if login is None:
            # Refused before any hashing: it tells nothing of the password.
            return self._refuse(R.SERVER_BUSY, "too many logins waiting from this address or for this user")
        self._login = login
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
        # After the answers already due for this user name (parallel
        # guesses are answered in turn).
        delay = self.factory.throttle.answer(self._login, True)
        self._login = None
        if delay > 0:
            self._timer = self.clock.callLater(delay, self._welcome, packet, will)
        else:
            self._welcome(packet, will)

    def _welcome(self, packet, will):
        self._timer = None
        self._logged_in(packet, will)
        if self._backlog is not None:
            # What arrived during the login is handled next.
            self.clock.callLater(0, self._next_turn)

    def _login_failed(self, reason, packet):
        if self.state is not AUTHENTICATING:
            # Closed meanwhile.
            return
        throttle, login, self._login = self.factory.throttle, self._login, None
        if reason.check(Busy):
            # No password was checked: answered at once, no failure counted.
            throttle.release(login)
            return self._refuse(R.SERVER_BUSY, "too many logins waiting")
        if packet.username is None:
            code, why = R.NOT_AUTHORIZED, "anonymous clients are not allowed"
        elif reason.check(UnauthorizedLogin, UnhandledCredentials):
            code, why = R.BAD_USER_NAME_OR_PASSWORD, f"bad user name or password for {printable(packet.username)!r}"
        else:
            log.failure("login of {client_id} failed", reason, client_id=self.log_id)
            code, why = R.SERVER_UNAVAILABLE, "authentication failed"
        self.router.stats.logins_refused += 1
        # The answer waits, longer for each failure from the same address
        # or for the same user name, after those already due.
        delay = throttle.answer(login, False)
        self._timer = self.clock.callLater(delay, self._refuse, code, why)

    def _logged_in(self, packet, will, auth_properties=None):
        client_id = self.client_id
        level = self.protocol_level
        access = self.router.access
        identity = self.identity
        if access.acl is not None or identity.publish is not None:
            self._may_write = access.checker(self.username, client_id, WRITE, identity.publish)
        self._reserved = access.reserved_topics
        if will is not None and not self._write_allowed(will.topic):
            return self._refuse(
                R.NOT_AUTHORIZED, f"may not publish its will on {printable(will.topic)!r}"
            )
        router = self.router
        owner = identity.owner
        refusal = router.owner_refusal(client_id, owner)
        if refusal is not None:
            return self._refuse(
                R.NOT_AUTHORIZED,
                f"user {owner_name(owner)}: {refusal}",
            )
        v5 = self.v5
        persistent = self.session_expiry != 0 if v5 is not None else not packet.clean_session
        if persistent:
            if router.store is not None and router.store.failed is not None:
                return self._refuse(
                    R.SERVER_UNAVAILABLE, "the store cannot be written: no persistent sessions"
                )
            if not router.may_start_session(client_id, False):
                return self._refuse(
                    R.QUOTA_EXCEEDED if v5 is not None else R.SERVER_UNAVAILABLE,
                    f"max_persistent_sessions ({router.max_persistent_sessions}) reached",
                )
        if v5 is None:
            session, present = router.connect(client_id, packet.clean_session, will, owner=owner)
        else:
            connack, keepalive = self._connack_properties(packet)
            if auth_properties:
                connack.update(auth_properties)
            connack = v5.fit_connack(R.SUCCESS, connack)
            if connack is None:
                # Before the session is claimed: nothing changes for it.
                return self._too_large_for_connack()
            will_props = packet.will_properties or {}
            session, present = router.connect(
                client_id,
                packet.clean_session,
                will,
                self.session_expiry,
                will_props.get("will_delay_interval", 0),
                owner,
            )
        self.session = session
        session.may_read = access.checker(self.username, client_id, READ, identity.subscribe)
        session.budget = DeliveryBudget(self.max_delivery_rate, router, session, self.clock) if self.max_delivery_rate else None
        self.state = CONNECTED
        if v5 is None:
            keepalive = packet.keepalive
            self.write(P.Connack(P.CONNACK_ACCEPTED, present and level == P.MQTT_311).encode())
        else:
            self.write(P.Connack(R.SUCCESS, present, connack).encode())
            if session.store is not None:
                # Frames behind a store commit: aliases only on QoS 0 ones.
                v5.assign_aliases_at = 1
        if self.limits.connection_messages:
            self._log_connected(packet)
        self._count_version(1)
        if v5 is None:
            session.attach(self)
        else:
            session.attach(self, v5, (packet.properties or {}).get("receive_maximum"))
        self.keepalive = keepalive
        if self.keepalive:
            self._flusher.keepalives.add(self, self.clock.seconds() + self.keepalive * 1.5)
        if identity.expires is not None:
            self._expiry = self.clock.callLater(
                max(0.0, identity.expires - self.clock.seconds()), self._token_expired
            )

    def _too_large_for_connack(self):
        """
        Not even the smallest CONNACK fits the client's Maximum Packet
        Size: the connection closes without one ([MQTT-3.1.2-24]).
        """
        self.router.stats.connections_refused += 1
        self.router.limited("CONNACK too large", log).info(
            "closing connection of client {client_id} from {peer}: its maximum packet"
            " size {size} is below the smallest CONNACK",
            client_id=self.log_id,
            peer=self.peer,
            size=self.v5.max_packet_size,
        )
        self._close(publish_will=False, graceful=True)

    def _connack_properties(self, packet):
        """A 5.0 CONNACK's properties, and the keep alive the server takes."""
        limits = self.limits
        router = self.router
        props = {}
        if self.session_expiry and packet.properties.get("session_expiry_interval") is None:
            props["session_expiry_interval"] = self.session_expiry
        if not packet.client_id:
            props["assigned_client_identifier"] = self.client_id
        receive_maximum = self.v5.receive_maximum
        if receive_maximum < 65535:
            props["receive_maximum"] = receive_maximum
        if router.max_qos < 2:
            props["maximum_qos"] = router.max_qos
        if not limits.retain_available:
            props["retain_available"] = 0
        props["maximum_packet_size"] = limits.max_packet_size
        if limits.max_topic_alias:
            props["topic_alias_maximum"] = limits.max_topic_alias
        if not limits.wildcard_subscription_available:
            props["wildcard_subscription_available"] = 0
        if not limits.subscription_identifier_available:
            props["subscription_identifier_available"] = 0
        if not limits.shared_subscription_available:
            props["shared_subscription_available"] = 0
        keepalive = packet.keepalive
        if limits.max_keepalive < 65535 and (keepalive == 0 or keepalive > limits.max_keepalive):
            # [MQTT-3.2.2-21]: the client uses the server's value.
            keepalive = props["server_keep_alive"] = limits.max_keepalive
        if packet.properties.get("request_response_information") and limits.response_information:
            props["response_information"] = limits.response_information.replace(
                "%c", self.client_id
            )
        return props, keepalive

    _VERSION_COUNTERS = {P.MQTT_31: "clients_v31", P.MQTT_311: "clients_v311", P.MQTT_5: "clients_v5"}

    def _count_version(self, change):
        name = self._VERSION_COUNTERS[self.protocol_level]
        setattr(self.stats, name, getattr(self.stats, name) + change)

    def _log_connected(self, packet):
        level = self.protocol_level
        if self.v5 is None:
            session = f"clean session {packet.clean_session}"
        else:
            # 5.0: Clean Start says whether a session resumes, the expiry
            # how long it outlives the connection.
            session = f"clean start {packet.clean_session}, session expiry {self.session_expiry}s"
        log.info(
            "client {client_id} connected from {peer} (MQTT {version},"
            " {session}, keepalive {keepalive}s, user {username})",
            client_id=self.log_id,
            peer=self.peer,
            username=printable(self.username),
            version=P.VERSION_NAMES[level],
            session=session,
            keepalive=packet.keepalive,
        )

    def _token_expired(self):
        self._expiry = None
        log.info("client {client_id}: its token expired: closing", client_id=self.log_id)
        self.disconnect5(R.NOT_AUTHORIZED, "token expired")
        self._close(publish_will=True, graceful=True)

    def handle_PUBLISH(self, packet):
        if self.v5 is not None:
            self._publish5(packet)
        topic = packet.topic
        if not topic or "+" in topic or "#" in topic or "\x00" in topic:
            return self.protocol_error(
                f"invalid topic name {topic!r} in PUBLISH", R.TOPIC_NAME_INVALID
            )
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
            ack = _puback_bytes(packet.message_id)
            if router.may_be_durable(packet):
                if router.store.failed is not None:
                    return self._store_failed(packet)
                held = router.publish_held(packet, session)
                self._acknowledge(ack, held is not None, held)
            else:
                self._acknowledge(ack, False)
                router.publish(packet, session)
            return
        mid = packet.message_id
        ack = _pubrec_bytes(mid)
        # Exactly once: a re-sent PUBLISH before PUBREL is not routed again.
        if not session.qos2_received(mid):
            self._acknowledge(ack, False)
        elif session.store is None and not router.may_be_durable(packet):
            self._acknowledge(ack, False)
            router.publish(packet, session)
        elif router.store.failed is not None:
            session.qos2_released(mid)
            return self._store_failed(packet)
        elif session.store is not None:
            # Its id is recorded as received: the ack waits for that commit.
            router.publish(packet, session)
            self._acknowledge(ack, True)
        else:
            held = router.publish_held(packet, session)
            self._acknowledge(ack, held is not None, held)

    def _publish5(self, packet):
        """
        What a 5.0 PUBLISH must pass first: its topic alias, the server's
        maximum QoS, retain available and receive maximum.  Raises
        ProtocolViolation with the reason code the DISCONNECT gives.
        """
        v5 = self.v5
        v5.inbound_topic(packet)
        qos = packet.qos
        if qos > self.router.max_qos:
            raise ProtocolViolation(f"PUBLISH at QoS {qos} exceeds max_qos", R.QOS_NOT_SUPPORTED)
        if packet.retain and not self.limits.retain_available:
            raise ProtocolViolation(
                "retained PUBLISH: retain_available is off", R.RETAIN_NOT_SUPPORTED
            )
        if qos:
            session = self.session
            waiting = len(session.awaiting_pubrel) + (self._acks.waiting if self._acks else 0)
            if waiting >= v5.receive_maximum and packet.message_id not in session.awaiting_pubrel:
                # [MQTT-3.3.4-9]
                raise ProtocolViolation(
                    f"more than {v5.receive_maximum} QoS 1/2 publishes unacknowledged",
                    R.RECEIVE_MAXIMUM_EXCEEDED,
                )

    def _ack5(self, packet_class, mid, reason_code, reason=None):
        """A 5.0 acknowledgement with a reason code (and why, if asked)."""
        props = {"reason_string": reason} if reason else None
        return self.v5.fit(packet_class, mid, reason_code, properties=props)

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
        self.disconnect5(R.UNSPECIFIED_ERROR, "the store cannot be written")
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
        if self.v5 is not None:
            # 5.0 says why; a refused QoS 2 flow ends at its PUBREC.
            if packet.qos:
                cls = _PUBACK if packet.qos == 1 else _PUBREC
                self._acknowledge(
                    self._ack5(cls, packet.message_id, R.NOT_AUTHORIZED, "not authorized"), False
                )
        elif packet.qos == 1:
            self._acknowledge(_puback_bytes(packet.message_id), False)
        elif packet.qos == 2:
            self.session.qos2_received(packet.message_id)
            self._acknowledge(_pubrec_bytes(packet.message_id), False)

    def _acknowledge(self, ack, durable, held=None):
        acks = self._acks
        if not durable and (acks is None or not acks.queue):
            # Nothing to wait for, and nothing waiting before it: written
            # now, without the queue's calls (most acks, on the hot path).
            if self.state is CONNECTED:
                self.write(ack)
            return
        if acks is None:
            acks = self._acks = OrderedAcks(self.router.store, self._write_if_connected)
            acks.on_failure = self._store_failed
        acks.send(ack, durable, held)

    def _write_if_connected(self, data):
        if self.state is CONNECTED:
            self.write(data)

    def handle_PUBACK(self, packet):
        self.session.puback(packet.message_id)

    def handle_PUBREC(self, packet):
        self.session.pubrec(packet.message_id, packet.reason_code >= 0x80)

    def handle_PUBREL(self, packet):
        mid = packet.message_id
        if self.v5 is not None and mid not in self.session.awaiting_pubrel:
            self._acknowledge(
                self._ack5(_PUBCOMP, mid, R.PACKET_IDENTIFIER_NOT_FOUND), False
            )
            return
        self._acknowledge(_pubcomp_bytes(mid), self.session.qos2_released(mid))

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

    def _decoded(self, packet):
        """
        Decode a large packet's filters a step at a time (yielding between
        steps); every one is decoded, and so checked, before any is used.
        """
        topics = packet.topics
        if type(topics) is FiltersToDecode:
            while not topics.step(self.FILTERS_PER_STEP):
                yield
            packet.topics = topics.decoded

    def _subscribe(self, packet):
        yield from self._decoded(packet)
        access = self.router.access
        session = self.session
        limits = session.limits
        v5 = self.v5
        level = self.protocol_level
        identifier = None
        if v5 is not None:
            identifier = packet.properties.get("subscription_identifier")
            if identifier is not None and not self.limits.subscription_identifier_available:
                self.protocol_error(
                    "SUBSCRIBE with a subscription identifier: not available",
                    R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                )
                return
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
            new_groups = set()
            for topic_filter, requested in _take_step(topics, start, self.FILTERS_PER_STEP):
                failure, why = self._check_filter(topic_filter, requested, access)
                if failure is None and (
                    topic_filter not in session.subscriptions and topic_filter not in adding
                ):
                    size = filter_size(topic_filter)
                    if len(session.subscriptions) + len(adding) >= limits.max_subscriptions:
                        why = f"max_subscriptions ({limits.max_subscriptions}) reached"
                    elif session.filter_bytes + adding_bytes + size > limits.max_subscription_bytes:
                        why = f"max_subscription_bytes ({limits.max_subscription_bytes}) reached"
                    elif is_shared(topic_filter):
                        key = shared_filter(topic_filter)
                        if key not in new_groups:
                            why = self.router.shared_refusal(topic_filter, len(new_groups))
                            if why is None and key not in self.router.shared:
                                new_groups.add(key)
                    if why is not None:
                        failure = R.QUOTA_EXCEEDED
                        self.router.stats.subscriptions_refused += 1
                    else:
                        adding.add(topic_filter)
                        adding_bytes += size
                if failure is not None:
                    if failure < 0:
                        # Closed: a protocol error.
                        return
                    if level == P.MQTT_31:
                        # No failure code to refuse one filter with.
                        self.protocol_error(f"SUBSCRIBE: {why}")
                        return
                    refused += 1
                    if first_reason is None:
                        first_reason = why
                    codes.append(failure if v5 is not None else P.SUBACK_FAILURE)
                    continue
                if v5 is None:
                    chunk.append((topic_filter, requested))
                    accepted.append(topic_filter)
                else:
                    handling = (requested >> 4) & 3
                    shared = is_shared(topic_filter)
                    if not shared and (
                        handling == 0
                        or handling == SEND_RETAINED_IF_NEW
                        and topic_filter not in session.subscriptions
                    ):
                        accepted.append(topic_filter)
                    options = SubscriptionOptions(
                        shared_filter(topic_filter)[1] if shared else topic_filter,
                        bool(requested & 4),
                        bool(requested & 8),
                        handling,
                        identifier,
                    )
                    chunk.append((topic_filter, requested & 3, options))
                codes.append(True)
            granted = iter(self.router.subscribe(session, chunk))
            suback.extend(next(granted) if ok is True else ok for ok in codes)
        if refused:
            # One line per packet, however many filters it refuses.
            log.info(
                "client {client_id} SUBSCRIBE refused {refused} of {n} filters: {reason}",
                client_id=self.log_id,
                refused=refused,
                n=len(topics),
                reason=printable(first_reason),
            )
        if v5 is None:
            self.write(P.Suback(packet.message_id, suback).encode())
        else:
            props = {"reason_string": first_reason[:200]} if refused else None
            self.write(v5.fit(P.Suback, packet.message_id, suback, properties=props))
        self.router.send_retained(session, accepted)

    def _check_filter(self, topic_filter, requested, access):
        """
        ``(None, None)`` for a filter the client may subscribe to, else
        ``(reason code, why)``; a reason code of -1 when the connection
        was closed for it.
        """
        v5 = self.v5
        try:
            if is_shared(topic_filter):
                inner = shared_filter(topic_filter)[1]
                if v5 is not None:
                    if requested & 4:
                        self.protocol_error("SUBSCRIBE: no local on a shared subscription")
                        return -1, None
                    if not self.limits.shared_subscription_available:
                        return R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, "shared subscriptions are off"
            else:
                validate_topic_filter(topic_filter)
                inner = topic_filter
        except InvalidTopic as e:
            return R.TOPIC_FILTER_INVALID, str(e)
        if v5 is not None and not self.limits.wildcard_subscription_available and is_wildcard(inner):
            return R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, "wildcard subscriptions are off"
        # 3.1 has no failure code: a filter that can match nothing
        # readable is granted, and nothing is delivered on it.
        if self.protocol_level != P.MQTT_31 and not access.may_subscribe(
            self.username, self.client_id, inner, self.identity.subscribe
        ):
            return R.NOT_AUTHORIZED, f"not authorized for {topic_filter!r}"
        return None, None

    def _unsubscribe(self, packet):
        yield from self._decoded(packet)
        topics = packet.topics
        v5 = self.v5
        codes = []
        for start in range(0, len(topics), self.FILTERS_PER_STEP):
            if start:
                yield
            step = _take_step(topics, start, self.FILTERS_PER_STEP)
            if v5 is not None:
                # As a sequence of single UNSUBSCRIBEs ([MQTT-3.10.4-6]).
                held = self.session.subscriptions
                gone = set()
                for f in step:
                    codes.append(R.SUCCESS if f in held and f not in gone else R.NO_SUBSCRIPTION_EXISTED)
                    gone.add(f)
            self.router.unsubscribe(self.session, step)
        if v5 is None:
            self.write(P.Unsuback(packet.message_id).encode())
        else:
            self.write(v5.fit(P.Unsuback, packet.message_id, codes))

    def handle_PINGREQ(self, packet):
        self.write(P.PINGRESP_WIRE)

    def handle_DISCONNECT(self, packet):
        publish_will = False
        if self.v5 is not None:
            expiry = (packet.properties or {}).get("session_expiry_interval")
            if expiry is not None and expiry != self.session_expiry:
                if self.session_expiry == 0:
                    # 3.14.2.2.2: a Protocol Error; the session ends as CONNECT said.
                    return self.protocol_error(
                        "DISCONNECT sets a session expiry where CONNECT set none"
                    )
                self.session_expiry = expiry
                self.router.set_session_expiry(self.session, expiry)
            # 0x04: the client asks for its will all the same.
            publish_will = packet.reason_code == R.DISCONNECT_WITH_WILL_MESSAGE
        if self.limits.connection_messages:
            if packet.reason_code:
                log.info(
                    "client {client_id} disconnected: {reason}",
                    client_id=self.log_id,
                    reason=R.name(packet.reason_code),
                )
            else:
                log.info("client {client_id} disconnected", client_id=self.log_id)
        # A clean DISCONNECT discards the will; anything after it is ignored.
        self._close(publish_will=publish_will, graceful=True)

    # Enhanced authentication (section 4.12)

    def _auth_begin(self, exchange):
        """CONNECT named a method offered: its exchange starts."""
        self._auth = exchange
        # The CONNECT deadline bounds the whole exchange, however its steps
        # are answered.
        self._cancel_timer()
        self._timer = self.clock.callLater(self.limits.connect_timeout, self._auth_too_long, exchange)
        self._auth_step(exchange.first_data)

    def _auth_too_long(self, exchange):
        self._timer = None
        if self._auth is exchange and self.state is not CLOSED:
            self._auth = None
            log.info(
                "enhanced authentication of {client_id} from {peer} not finished in time: closing",
                client_id=self.log_id,
                peer=self.peer,
            )
            self._close(publish_will=False, graceful=True)

    def _auth_step(self, data):
        exchange = self._auth
        exchange.pending = True
        d = maybeDeferred(exchange.steps.step, data)
        d.addCallback(self._auth_answered, exchange)
        d.addErrback(self._auth_failed, exchange)

    def _auth_failed(self, reason, exchange):
        """A step refused, or failed, or its answer could not be acted on."""
        if self.state is CLOSED:
            return
        if self._auth is exchange:
            return self._auth_refused(reason, exchange)
        # Its answer was being acted on when this came up.
        log.failure("enhanced authentication of {client_id} failed", reason, client_id=self.log_id)
        self._close(publish_will=False)

    def _auth_answered(self, answer, exchange):
        if self._auth is not exchange or self.state is CLOSED:
            return
        exchange.pending = False
        if not isinstance(answer, (Continue, Authenticated)):
            raise TypeError(f"{answer!r} is not Continue or Authenticated")
        props = {"authentication_method": exchange.method}
        if answer.data is not None:
            props["authentication_data"] = bytes(answer.data)
        if isinstance(answer, Continue):
            self.write(self.v5.fit(P.Auth, R.CONTINUE_AUTHENTICATION, properties=props, exempt=True))
            if not exchange.reauthenticating:
                # The client's AUTH is read next (and nothing else may come
                # before CONNACK, [MQTT-3.1.2-30]).
                self.state = AWAITING_CONNECT
                self._resume_backlog()
            return
        if exchange.reauthenticating:
            if answer.username != self.username:
                raise Refused(f"re-authenticated as another user, {printable(answer.username)!r}")
            self._auth = None
            self.write(self.v5.fit(P.Auth, R.SUCCESS, properties=props, exempt=True))
            return
        self._auth = None
        self._cancel_timer()
        self.state = AUTHENTICATING
        self.username = answer.username
        self.identity = Identity(answer.username)
        self.auth_method = exchange.method
        # CONNACK carries the method, and the last data if any ([MQTT-4.12.0-5]).
        self._logged_in(exchange.connect, exchange.will, props)
        self._resume_backlog()

    def _auth_refused(self, reason, exchange):
        self._auth = None
        if reason.check(Refused):
            code, why = reason.value.reason_code, str(reason.value)
        else:
            log.failure("enhanced authentication of {client_id} failed", reason, client_id=self.log_id)
            code, why = R.UNSPECIFIED_ERROR, "authentication failed"
        if exchange.reauthenticating:
            # [MQTT-4.12.1-2], with a reason DISCONNECT may give.
            log.info("client {client_id} failed to re-authenticate: {why}", client_id=self.log_id, why=why)
            self._close(publish_will=True, graceful=self.disconnect5(disconnect_refusal(code), why))
            return
        self._cancel_timer()
        self.router.stats.logins_refused += 1
        self.state = AUTHENTICATING
        delay = self.factory.throttle.failed(address_key(self._host))
        self._timer = self.clock.callLater(delay, self._refuse, connack_refusal(code), why)

    def _resume_backlog(self):
        if self._backlog is not None:
            self.clock.callLater(0, self._next_turn)

    def _auth_before_connack(self, packet):
        """A packet while CONNECT's authentication goes on."""
        exchange = self._auth
        if exchange is None:
            return self._not_connected(packet)
        kind = packet.packet_type
        if kind == P.AUTH:
            method = (packet.properties or {}).get("authentication_method")
            if packet.reason_code != R.CONTINUE_AUTHENTICATION or method != exchange.method:
                self._auth = None
                # Before CONNACK, a refusing CONNACK says why ([MQTT-4.13.1-1]).
                return self._refuse(
                    R.PROTOCOL_ERROR, "AUTH must continue the authentication CONNECT began"
                )
            self.state = AUTHENTICATING
            self._auth_step(packet.properties.get("authentication_data"))
            return self.state is AUTHENTICATING
        if kind == P.DISCONNECT:
            self._auth = None
            return self._close(publish_will=False, graceful=True)
        self._auth = None
        self._refuse(R.PROTOCOL_ERROR, f"{P.PACKET_NAMES[kind]} during enhanced authentication")

    def handle_AUTH(self, packet):
        props = packet.properties or {}
        method = props.get("authentication_method")
        connect_method = self.auth_method
        if self.v5 is None or connect_method is None:
            # CONNECT named no method (it was refused with 0x8C if it named
            # one not offered).
            return self.protocol_error("AUTH without an authentication method", R.PROTOCOL_ERROR)
        if method != connect_method:
            # [MQTT-4.12.1-1]
            return self.protocol_error(
                "AUTH with another authentication method than CONNECT's", R.PROTOCOL_ERROR
            )
        exchange = self._auth
        if exchange is not None and exchange.pending:
            # The client answers only what the server has asked.
            return self.protocol_error("AUTH before the last one was answered", R.PROTOCOL_ERROR)
        if packet.reason_code == R.RE_AUTHENTICATE and exchange is None:
            try:
                steps = self.factory.auth_methods[method].exchange(self.client_id, self.username)
            except Exception:
                log.failure("authentication method {method} failed", method=printable(method))
                return self.protocol_error("re-authentication failed", R.UNSPECIFIED_ERROR)
            self._auth = _Exchange(method, steps)
        elif packet.reason_code != R.CONTINUE_AUTHENTICATION or exchange is None:
            return self.protocol_error(
                f"AUTH {R.name(packet.reason_code)} out of turn", R.PROTOCOL_ERROR
            )
        self._auth_step(props.get("authentication_data"))

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
# Until CONNECT, every other packet is a protocol violation; after a
# CONNECT that began an enhanced authentication, only AUTH and DISCONNECT
# may come before CONNACK ([MQTT-3.1.2-30]).
MQTTServerProtocol._before_connect = {
    t: MQTTServerProtocol.handle_CONNECT if t == P.CONNECT else MQTTServerProtocol._auth_before_connack
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

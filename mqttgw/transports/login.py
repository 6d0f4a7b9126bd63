"""
CONNECT to CONNACK: the checks a CONNECT passes (protocol, client
identifier, will, authentication method), the login through the portal
and its throttle, the session claimed from the router and the CONNACK, or
a refusal; then the expiry of the client's token.  What differs by version
is the dialect's (:mod:`mqttgw.transports.dialects`); the states are the
handshake's.  A part of :class:`~mqttgw.transports.protocol.MQTTServerProtocol`.
"""

import uuid

from twisted.cred.credentials import Anonymous, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.access import READ, WRITE
from mqttgw.broker.delivery_budget import DeliveryBudget
from mqttgw.broker.sessions import owner_name
from mqttgw.broker.topics import InvalidTopic, validate_topic_name
from mqttgw.security.identity import Identity, IIdentity
from mqttgw.security.passwords import Busy
from mqttgw.transports.connlog import CONNECTED
from mqttgw.transports.dialects import dialect_for, unsupported
from mqttgw.transports.handshake import ANSWERING, LOGGING_IN, REFUSING, Exchange, Handshake, cancel
from mqttgw.transports.interfaces import ILogin
from mqttgw.transports.mqtt5 import check_response_topic
from mqttgw.transports.publishing import write_allowed
from mqttgw.transports.tlsprofile import peer_identity
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.printable import printable
from mqttgw.wire.properties import message_properties

log = Logger()


@implementer(ILogin)
class Login:
    """
    The login of one connection's client, from its CONNECT: what the
    connection (an :class:`~mqttgw.transports.interfaces.IConnecting`) is
    told and answers, the throttle's place it holds while its credentials
    are checked, and one timer per purpose: the answer the throttle
    delays, the expiry of the client's token.
    """

    __slots__ = ("connection", "router", "clock", "limits", "messages", "_ticket", "_answer", "_expiry")

    def __init__(self, connection, router, clock, limits, messages):
        self.connection = connection
        self.router = router
        self.clock = clock
        self.limits = limits
        # Every listener's connects and disconnects, summed up in a burst.
        self.messages = messages
        # The login under way in the throttle, or None.
        self._ticket = None
        self._answer = self._expiry = None

    def handle_CONNECT(self, packet):
        connection = self.connection
        connection.enter("CONNECT")
        dialect = dialect_for(packet, self.clock, self.limits, self.router.limits.max_inflight_messages or 65535)
        if dialect is None:
            return self.refuse(R.UNSUPPORTED_PROTOCOL_VERSION, unsupported(packet))
        connection.speak(dialect)
        client_id = connection.client_id = packet.client_id
        connection.log_id = printable(client_id)
        if "\x00" in client_id:
            # The router keeps such ids for bridges.
            return self.refuse(R.CLIENT_IDENTIFIER_NOT_VALID, "client id contains U+0000")
        why = dialect.client_id_refusal(client_id, packet.clean_session, self.limits)
        if why is not None:
            return self.refuse(R.CLIENT_IDENTIFIER_NOT_VALID, why)
        if not client_id:
            connection.client_id = connection.log_id = f"mqttgw-{uuid.uuid4().hex}"
        connection.username = packet.username
        props = packet.properties
        method = props.get("authentication_method") if props else None
        factory = connection.factory
        # Where the client certificate is the credential, no method is.
        if method is not None and (method not in factory.auth_methods or factory.identity_as_username):
            # The client is told at once rather than left waiting for an AUTH.
            return self.refuse(
                R.BAD_AUTHENTICATION_METHOD,
                f"authentication method {printable(method)!r} is not offered",
            )
        will = None
        if packet.will_topic is not None:
            will = self._will(packet)
            if will is None:
                return None
        if method is not None:
            return self._begin_exchange(packet, will, method)
        return self._log_in(packet, will)

    def _will(self, packet):
        """CONNECT's will as a PUBLISH; None when refused (the connection is closing)."""
        dialect = self.connection.dialect
        try:
            validate_topic_name(packet.will_topic)
        except InvalidTopic as e:
            return dialect.bad_will(self, f"invalid will topic: {e}")
        refusal = dialect.will_refusal(packet, self.router.max_qos, self.limits)
        if refusal is not None:
            return self.refuse(*refusal)
        will_props = packet.will_properties
        if will_props and "response_topic" in will_props:
            try:
                check_response_topic(will_props)
            except ProtocolViolation as e:
                return self.refuse(R.PROTOCOL_ERROR, f"will: {e}")
        return P.Publish(
            packet.will_topic,
            packet.will_message,
            packet.will_qos,
            packet.will_retain,
            properties=message_properties(will_props),
        )

    def _begin_exchange(self, packet, will, method):
        """CONNECT named an enhanced authentication method: its exchange starts."""
        connection = self.connection
        methods = connection.factory.auth_methods
        try:
            steps = methods[method].exchange(connection.client_id, packet.username)
        except Exception:
            log.failure("authentication method {method} failed", method=printable(method))
            return self.refuse(R.UNSPECIFIED_ERROR, "authentication failed")
        # Counted and bounded as a password login is, per address and user.
        ticket = connection.factory.throttle.begin(connection.host, packet.username)
        if ticket is None:
            return self.refuse(R.SERVER_BUSY, "too many logins waiting from this address or for this user")
        self._ticket = ticket
        handshake = Handshake(connection, self, self.clock, self.limits.connect_timeout, methods)
        connection.authenticating(handshake)
        exchange = Exchange(method, steps, packet, will)
        exchange.first_data = packet.properties.get("authentication_data")
        handshake.begin(exchange)
        # While a step is under way, the packets after it wait.
        return connection.state in ANSWERING

    def _log_in(self, packet, will):
        connection = self.connection
        factory = connection.factory
        if factory.identity_as_username:
            identity = peer_identity(connection.transport)
            if identity is None:
                return self.refuse(R.NOT_AUTHORIZED, "no client certificate identity")
            # The certificate, checked by TLS, is the credential.
            connection.username = identity
            connection.identity = Identity(identity)
            return self._logged_in(packet, will)
        portal = factory.portal
        if portal is None:
            return self._logged_in(packet, will)
        ticket = factory.throttle.begin(connection.host, packet.username)
        if ticket is None:
            # Refused before any hashing: it tells nothing of the password.
            return self.refuse(R.SERVER_BUSY, "too many logins waiting from this address or for this user")
        self._ticket = ticket
        if packet.username is not None:
            creds = UsernamePassword(packet.username.encode(), packet.password or b"")
        else:
            creds = Anonymous()
        # Packets that arrive meanwhile wait, in order, with reading paused.
        d = portal.login(creds, None, IIdentity)
        d.addCallbacks(self._login_succeeded, self._login_failed, (packet, will), None, (packet,))
        # True while the login is under way: the packets after it wait.
        return connection.state in ANSWERING

    def _login_succeeded(self, result, packet, will):
        connection = self.connection
        if connection.state is not LOGGING_IN:
            # Closed meanwhile.
            return
        _, identity, _ = result
        connection.username = identity.username
        connection.identity = identity
        # After the answers already due for this user name (parallel
        # guesses are answered in turn).
        self.welcome_after(self.answered(True), packet, will)

    def _login_failed(self, reason, packet):
        if self.connection.state is not LOGGING_IN:
            # Closed meanwhile.
            return
        if reason.check(Busy):
            # No password was checked: answered at once, no failure counted.
            ticket, self._ticket = self._ticket, None
            self.connection.factory.throttle.release(ticket)
            return self.refuse(R.SERVER_BUSY, "too many logins waiting")
        if packet.username is None:
            code, why = R.NOT_AUTHORIZED, "anonymous clients are not allowed"
        elif reason.check(UnauthorizedLogin, UnhandledCredentials):
            code, why = R.BAD_USER_NAME_OR_PASSWORD, f"bad user name or password for {printable(packet.username)!r}"
        else:
            log.failure("login of {client_id} failed", reason, client_id=self.connection.log_id)
            code, why = R.SERVER_UNAVAILABLE, "authentication failed"
        self.refused(code, why)

    # The answer (the handshake's too)

    def answered(self, ok):
        """The throttle's delay before this login's answer (0 if none was begun)."""
        ticket, self._ticket = self._ticket, None
        return self.connection.factory.throttle.answer(ticket, ok) if ticket is not None else 0.0

    def welcome_after(self, delay, packet, will, auth_properties=None):
        """The credentials were accepted: the client is welcomed ``delay`` seconds from now."""
        if delay > 0:
            self._answer = self.clock.callLater(delay, self._welcome, packet, will, auth_properties)
        else:
            self._welcome(packet, will, auth_properties)

    def _welcome(self, packet, will, auth_properties):
        self._answer = None
        self._logged_in(packet, will, auth_properties)
        # What arrived during the login is handled next.
        self.connection.resume()

    def refused(self, reason_code, reason):
        """
        The credentials were refused: counted, and answered after the
        throttle's delay, longer for each failure from the same address or
        for the same user name, after those already due.
        """
        self.router.stats.logins_refused += 1
        self.refuse_after(self.answered(False), reason_code, reason)

    def refuse_after(self, delay, reason_code, reason):
        """The refusal is answered ``delay`` seconds from now."""
        self.connection.enter("refuse")
        self._answer = self.clock.callLater(delay, self.refuse, reason_code, reason)

    def refuse(self, reason_code, reason):
        """CONNACK with a refusal: ``reason_code`` in 5.0's terms."""
        self._answer = None
        connection = self.connection
        if connection.state is not REFUSING:
            connection.enter("refuse")
        # A flood from one address is one line an interval, not one each.
        connection.factory.refusals.info(
            connection.host,
            "refusing CONNECT from {peer} (client {client_id}): {reason}",
            peer=connection.peer,
            client_id=connection.log_id,
            reason=reason,
        )
        self.router.stats.connections_refused += 1
        connack = connection.dialect.refusal(reason_code, reason)
        if connack is not None:
            connection.write(connack)
        connection.close(publish_will=False, graceful=True)

    # Accepted

    def _session_refusal(self, packet, will, may_write):
        """(reason code, why) when this login may not have the session it asks for, else None."""
        connection = self.connection
        router = self.router
        if will is not None and not write_allowed(
            may_write, router.access, connection.username, connection.client_id, will.topic
        ):
            return R.NOT_AUTHORIZED, f"may not publish its will on {printable(will.topic)!r}"
        refusal = router.owner_refusal(connection.client_id, connection.identity.owner)
        if refusal is not None:
            return R.NOT_AUTHORIZED, f"user {owner_name(connection.identity.owner)}: {refusal}"
        if connection.dialect.persistent(packet):
            if (
                router.store is not None
                and router.store.failed is not None
                and not router.resumes_session(connection.client_id, packet.clean_session, connection.identity.owner)
            ):
                return R.SERVER_UNAVAILABLE, "the store cannot be written: no new persistent sessions"
            if not router.may_start_session(connection.client_id, False):
                return (
                    connection.dialect.QUOTA_REFUSAL,
                    f"max_persistent_sessions ({router.max_persistent_sessions}) reached",
                )
        return None

    def _logged_in(self, packet, will, auth_properties=None):
        """The client is who it says: its session, and CONNACK, unless refused."""
        connection = self.connection
        router = self.router
        access = router.access
        identity = connection.identity
        client_id = connection.client_id
        # A cached ACL check of what the client may publish, or None: then
        # only the reserved topics are checked (see publishing.write_allowed).
        may_write = None
        if access.acl is not None or identity.publish is not None:
            may_write = access.checker(connection.username, client_id, WRITE, identity.publish)
        refusal = self._session_refusal(packet, will, may_write)
        if refusal is not None:
            return self.refuse(*refusal)
        dialect = connection.dialect
        accepted = dialect.accept(packet, client_id, self.limits, router.max_qos, auth_properties)
        if accepted is None:
            # Before the session is claimed: nothing changes for it.
            return self._too_large_for_connack()
        connack, keepalive = accepted
        session, present = dialect.connect(router, client_id, packet, will, identity.owner)
        session.may_read = access.checker(connection.username, client_id, READ, identity.subscribe)
        rate = connection.max_delivery_rate
        session.budget = DeliveryBudget(rate, router, session, self.clock) if rate else None
        connection.accepted(session, may_write)
        connection.write(dialect.connack(present, connack))
        if self.limits.connection_messages:
            self._log_connected(packet)
        dialect.attach(session, connection, packet)
        connection.keep_alive(keepalive)
        if identity.expires is not None:
            self._expiry = self.clock.callLater(
                max(0.0, identity.expires - self.clock.seconds()), self._token_expired
            )
        else:
            connection.logged_in()

    def _too_large_for_connack(self):
        """
        Not even the smallest CONNACK fits the client's Maximum Packet
        Size: the connection closes without one ([MQTT-3.1.2-24]).
        """
        connection = self.connection
        self.router.stats.connections_refused += 1
        self.router.limited("CONNACK too large", log).info(
            "closing connection of client {client_id} from {peer}: its maximum packet"
            " size {size} is below the smallest CONNACK",
            client_id=connection.log_id,
            peer=connection.peer,
            size=connection.dialect.max_packet_size,
        )
        connection.close(publish_will=False, graceful=True)

    def _log_connected(self, packet):
        connection = self.connection
        self.messages.info(
            CONNECTED,
            "client {client_id} connected from {peer} (MQTT {version},"
            " {session}, keepalive {keepalive}s, user {username})",
            client_id=connection.log_id,
            peer=connection.peer,
            username=printable(connection.username),
            version=P.VERSION_NAMES[connection.dialect.level],
            session=connection.dialect.session_line(packet),
            keepalive=packet.keepalive,
        )

    def _token_expired(self):
        self._expiry = None
        connection = self.connection
        log.info("client {client_id}: its token expired: closing", client_id=connection.log_id)
        connection.disconnect_first(R.NOT_AUTHORIZED, "token expired")
        connection.close(publish_will=True, graceful=True)

    def ended(self):
        self._answer = cancel(self._answer)
        self._expiry = cancel(self._expiry)
        if self._ticket is not None:
            # Gone while its credentials were checked.
            ticket, self._ticket = self._ticket, None
            self.connection.factory.throttle.release(ticket)

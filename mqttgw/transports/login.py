"""
CONNECT to CONNACK: the checks a CONNECT passes (protocol, client
identifier, will, authentication method), the login through the portal
and its throttle, the session claimed from the router and the CONNACK, or
a refusal.  What differs by version is the dialect's
(:mod:`mqttgw.transports.dialects`); the states are the handshake's.
"""

import uuid

from twisted.cred.credentials import Anonymous, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.logger import Logger

from mqttgw.broker.access import READ, WRITE
from mqttgw.broker.delivery_budget import DeliveryBudget
from mqttgw.broker.sessions import owner_name
from mqttgw.broker.topics import InvalidTopic, validate_topic_name
from mqttgw.security.identity import Identity, IIdentity
from mqttgw.security.passwords import Busy
from mqttgw.transports.connlog import CONNECTED
from mqttgw.transports.dialects import dialect_for, unsupported
from mqttgw.transports.handshake import ANSWERING, LOGGING_IN, REFUSING, Exchange, cancel
from mqttgw.transports.mqtt5 import check_response_topic
from mqttgw.transports.tlsprofile import peer_identity
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.printable import printable
from mqttgw.wire.properties import message_properties

log = Logger()


class Login:
    """CONNECT, the login and CONNACK; a mixin of MQTTServerProtocol."""

    __slots__ = ()

    def handle_CONNECT(self, packet):
        self._enter("CONNECT")
        # Behind a PROXY protocol listener (haproxy:tcp:PORT) the client's
        # address is known only once the header before this packet was
        # read: the throttles count that address, not the load balancer's.
        self._host = getattr(self.transport.getPeer(), "host", None)
        dialect = dialect_for(packet, self.clock, self.limits, self.router.limits.max_inflight_messages or 65535)
        if dialect is None:
            return self._refuse(R.UNSUPPORTED_PROTOCOL_VERSION, unsupported(packet))
        self.dialect = dialect
        self._handlers = self._handlers_for(dialect)
        dialect.configure(self.framer)
        client_id = self.client_id = packet.client_id
        self.log_id = printable(client_id)
        if "\x00" in client_id:
            # The router keeps such ids for bridges.
            return self._refuse(R.CLIENT_IDENTIFIER_NOT_VALID, "client id contains U+0000")
        why = dialect.client_id_refusal(client_id, packet.clean_session, self.limits)
        if why is not None:
            return self._refuse(R.CLIENT_IDENTIFIER_NOT_VALID, why)
        if not client_id:
            client_id = self.client_id = self.log_id = f"mqttgw-{uuid.uuid4().hex}"
        self.username = packet.username
        props = packet.properties
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
            will = self._will(packet)
            if will is None:
                return None
        if method is not None:
            return self._begin_exchange(packet, will, method)
        return self._log_in(packet, will)

    def _will(self, packet):
        """CONNECT's will as a PUBLISH; None when refused (the connection is closing)."""
        try:
            validate_topic_name(packet.will_topic)
        except InvalidTopic as e:
            return self.dialect.bad_will(self, f"invalid will topic: {e}")
        refusal = self.dialect.will_refusal(packet, self.router.max_qos, self.limits)
        if refusal is not None:
            return self._refuse(*refusal)
        will_props = packet.will_properties
        if will_props and "response_topic" in will_props:
            try:
                check_response_topic(will_props)
            except ProtocolViolation as e:
                return self._refuse(R.PROTOCOL_ERROR, f"will: {e}")
        return P.Publish(
            packet.will_topic,
            packet.will_message,
            packet.will_qos,
            packet.will_retain,
            properties=message_properties(will_props),
        )

    def _begin_exchange(self, packet, will, method):
        """CONNECT named an enhanced authentication method: its exchange starts."""
        try:
            steps = self.factory.auth_methods[method].exchange(self.client_id, packet.username)
        except Exception:
            log.failure("authentication method {method} failed", method=printable(method))
            return self._refuse(R.UNSPECIFIED_ERROR, "authentication failed")
        # Counted and bounded as a password login is, per address and user.
        login = self.factory.throttle.begin(self._host, packet.username)
        if login is None:
            return self._refuse(R.SERVER_BUSY, "too many logins waiting from this address or for this user")
        self._login = login
        exchange = Exchange(method, steps, packet, will)
        exchange.first_data = packet.properties.get("authentication_data")
        self._auth_begin(exchange)
        # While a step is under way, the packets after it wait.
        return self.state in ANSWERING

    def _log_in(self, packet, will):
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
        return self.state in ANSWERING

    def _login_succeeded(self, result, packet, will):
        if self.state is not LOGGING_IN:
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
            self._answer = self.clock.callLater(delay, self._welcome, packet, will)
        else:
            self._welcome(packet, will)

    def _welcome(self, packet, will):
        self._answer = None
        self._logged_in(packet, will)
        if self._packets_put_off is not None:
            # What arrived during the login is handled next.
            self.clock.callLater(0, self._next_turn)

    def _login_failed(self, reason, packet):
        if self.state is not LOGGING_IN:
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
        self._refuse_after(throttle.answer(login, False), code, why)

    def _refuse_after(self, delay, reason_code, reason):
        """The refusal is answered ``delay`` seconds from now."""
        self._enter("refuse")
        self._answer = self.clock.callLater(delay, self._refuse, reason_code, reason)

    def _refuse(self, reason_code, reason):
        """CONNACK with a refusal: ``reason_code`` in 5.0's terms."""
        self._answer = None
        if self.state is not REFUSING:
            self._enter("refuse")
        # A flood from one address is one line an interval, not one each.
        self.factory.refusals.info(
            self._host,
            "refusing CONNECT from {peer} (client {client_id}): {reason}",
            peer=self.peer,
            client_id=self.log_id,
            reason=reason,
        )
        self.router.stats.connections_refused += 1
        connack = self.dialect.refusal(reason_code, reason)
        if connack is not None:
            self.write(connack)
        self._close(publish_will=False, graceful=True)

    def _session_refusal(self, packet, will):
        """(reason code, why) when this login may not have the session it asks for, else None."""
        access = self.router.access
        identity = self.identity
        if access.acl is not None or identity.publish is not None:
            self._may_write = access.checker(self.username, self.client_id, WRITE, identity.publish)
        self._reserved = access.reserved_topics
        if will is not None and not self._write_allowed(will.topic):
            return R.NOT_AUTHORIZED, f"may not publish its will on {printable(will.topic)!r}"
        router = self.router
        refusal = router.owner_refusal(self.client_id, identity.owner)
        if refusal is not None:
            return R.NOT_AUTHORIZED, f"user {owner_name(identity.owner)}: {refusal}"
        if self.dialect.persistent(packet):
            if (
                router.store is not None
                and router.store.failed is not None
                and not router.resumes_session(self.client_id, packet.clean_session, identity.owner)
            ):
                return R.SERVER_UNAVAILABLE, "the store cannot be written: no new persistent sessions"
            if not router.may_start_session(self.client_id, False):
                return (
                    self.dialect.QUOTA_REFUSAL,
                    f"max_persistent_sessions ({router.max_persistent_sessions}) reached",
                )
        return None

    def _logged_in(self, packet, will, auth_properties=None):
        refusal = self._session_refusal(packet, will)
        if refusal is not None:
            return self._refuse(*refusal)
        router = self.router
        dialect = self.dialect
        accepted = dialect.accept(self, packet, auth_properties)
        if accepted is None:
            # Before the session is claimed: nothing changes for it.
            return self._too_large_for_connack()
        connack, keepalive = accepted
        identity = self.identity
        session, present = dialect.connect(router, self.client_id, packet, will, identity.owner)
        self.session = session
        session.may_read = router.access.checker(self.username, self.client_id, READ, identity.subscribe)
        session.budget = (
            DeliveryBudget(self.max_delivery_rate, router, session, self.clock)
            if self.max_delivery_rate
            else None
        )
        self._enter("accept")
        self.write(dialect.connack(present, connack))
        if self.limits.connection_messages:
            self._log_connected(packet)
        self._count_version(1)
        dialect.attach(session, self, packet)
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
            size=self.dialect.max_packet_size,
        )
        self._close(publish_will=False, graceful=True)

    def _count_version(self, change):
        name = self.dialect.counter
        setattr(self.stats, name, getattr(self.stats, name) + change)

    def _log_connected(self, packet):
        self._flusher.connection_messages.info(
            CONNECTED,
            "client {client_id} connected from {peer} (MQTT {version},"
            " {session}, keepalive {keepalive}s, user {username})",
            client_id=self.log_id,
            peer=self.peer,
            username=printable(self.username),
            version=P.VERSION_NAMES[self.dialect.level],
            session=self.dialect.session_line(packet),
            keepalive=packet.keepalive,
        )

    def _token_expired(self):
        self._expiry = None
        log.info("client {client_id}: its token expired: closing", client_id=self.log_id)
        self.disconnect_first(R.NOT_AUTHORIZED, "token expired")
        self._close(publish_will=True, graceful=True)

    def _cancel_answers(self):
        """The timers of the handshake and the token, when the connection ends."""
        self._answer = cancel(self._answer)
        self._auth_deadline = cancel(self._auth_deadline)
        self._expiry = cancel(self._expiry)

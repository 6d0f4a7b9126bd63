"""
The handshake of a connection as a state machine: awaiting CONNECT,
logging in (the portal, or an authentication step), challenged (a 5.0
AUTH sent, the client's awaited), refusing (a refusal's answer waits),
connected; every transition in :data:`TRANSITIONS`, as h11 keeps them in
``_state.py``.  Closing is the connection's, from any state.  Also 5.0
enhanced authentication (section 4.12), at CONNECT and again later.
"""

from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger

from mqttgw.security.enhanced import Authenticated, Continue, Refused
from mqttgw.security.identity import Identity
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.printable import printable

log = Logger()

AWAITING_CONNECT = "AWAITING_CONNECT"
LOGGING_IN = "LOGGING_IN"
CHALLENGED = "CHALLENGED"
REFUSING = "REFUSING"
CONNECTED = "CONNECTED"
CLOSED = "CLOSED"

# State: {event: next state}.  Any state may close.
TRANSITIONS = {
    AWAITING_CONNECT: {"CONNECT": LOGGING_IN},
    LOGGING_IN: {"accept": CONNECTED, "challenge": CHALLENGED, "refuse": REFUSING},
    CHALLENGED: {"AUTH": LOGGING_IN, "refuse": REFUSING},
    REFUSING: {},
    CONNECTED: {},
    CLOSED: {},
}

# Where an answer is on its way (a login, a step, a delayed refusal): what
# the client sent after waits, and reading resumes with the answer.
ANSWERING = frozenset({LOGGING_IN, REFUSING})
# Where the CONNECT deadline still closes the connection.
BEFORE_CONNACK = frozenset({AWAITING_CONNECT, CHALLENGED})


def connack_refusal(code):
    """``code`` if a CONNACK may refuse with it, else Not authorized."""
    return code if code in R.CONNACK_CODES and code >= 0x80 else R.NOT_AUTHORIZED


def disconnect_refusal(code):
    """``code`` if a DISCONNECT may give it, else Not authorized."""
    return code if code in R.DISCONNECT_CODES and code >= 0x80 else R.NOT_AUTHORIZED


class Exchange:
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


def cancel(call):
    """Cancel a DelayedCall if it is still due; None, to assign."""
    if call is not None and call.active():
        call.cancel()
    return None


class Handshake:
    """
    The transitions of the handshake, and enhanced authentication; a
    mixin of :class:`~mqttgw.transports.protocol.MQTTServerProtocol`.
    """

    __slots__ = ()

    def _enter(self, event):
        """The transition ``event`` makes from the present state."""
        self.state = TRANSITIONS[self.state][event]

    def _auth_begin(self, exchange):
        """CONNECT named a method offered: its exchange starts."""
        self._auth = exchange
        # The CONNECT deadline bounds the whole exchange, however its steps
        # are answered.
        self._auth_deadline = cancel(self._auth_deadline)
        self._auth_deadline = self.clock.callLater(self.limits.connect_timeout, self._auth_too_long, exchange)
        self._auth_step(exchange.first_data)

    def _auth_too_long(self, exchange):
        self._auth_deadline = None
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
            self.write(self.dialect.fit(P.Auth, R.CONTINUE_AUTHENTICATION, properties=props, exempt=True))
            if not exchange.reauthenticating:
                # The client's AUTH is read next (and nothing else may come
                # before CONNACK, [MQTT-3.1.2-30]).
                self._enter("challenge")
                self._resume_packets_put_off()
            return
        if exchange.reauthenticating:
            if answer.username != self.username:
                raise Refused(f"re-authenticated as another user, {printable(answer.username)!r}")
            self._auth = None
            self.write(self.dialect.fit(P.Auth, R.SUCCESS, properties=props, exempt=True))
            return
        self._auth = None
        self._auth_deadline = cancel(self._auth_deadline)
        self.username = answer.username
        self.identity = Identity(answer.username)
        self.auth_method = exchange.method
        # After the answers already due for this user name, as a password's.
        delay = self._answered(True)
        if delay > 0:
            self._answer = self.clock.callLater(delay, self._auth_welcome, exchange, props)
        else:
            self._auth_welcome(exchange, props)

    def _auth_welcome(self, exchange, props):
        self._answer = None
        # CONNACK carries the method, and the last data if any ([MQTT-4.12.0-5]).
        self._logged_in(exchange.connect, exchange.will, props)
        self._resume_packets_put_off()

    def _answered(self, ok):
        """The throttle's delay before this login's answer (0 if none was begun)."""
        login, self._login = self._login, None
        return self.factory.throttle.answer(login, ok) if login is not None else 0.0

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
            self._close(publish_will=True, graceful=self.disconnect_first(disconnect_refusal(code), why))
            return
        self._auth_deadline = cancel(self._auth_deadline)
        self.router.stats.logins_refused += 1
        self._refuse_after(self._answered(False), connack_refusal(code), why)

    def _resume_packets_put_off(self):
        if self._packets_put_off is not None:
            self.clock.callLater(0, self._next_turn)

    def _challenge_answered(self, packet):
        """An AUTH while CHALLENGED."""
        exchange = self._auth
        method = (packet.properties or {}).get("authentication_method")
        if packet.reason_code != R.CONTINUE_AUTHENTICATION or method != exchange.method:
            self._auth = None
            # Before CONNACK, a refusing CONNACK says why ([MQTT-4.13.1-1]).
            return self._refuse(R.PROTOCOL_ERROR, "AUTH must continue the authentication CONNECT began")
        self._enter("AUTH")
        self._auth_step(packet.properties.get("authentication_data"))
        return self.state in ANSWERING

    def _challenge_dropped(self, packet):
        """A DISCONNECT while CHALLENGED."""
        self._auth = None
        return self._close(publish_will=False, graceful=True)

    def _challenge_broken(self, packet):
        """Any other packet while CHALLENGED."""
        self._auth = None
        if packet.packet_type == P.CONNECT:
            return self._refuse(R.PROTOCOL_ERROR, "second CONNECT during enhanced authentication")
        self._refuse(R.PROTOCOL_ERROR, f"{P.PACKET_NAMES[packet.packet_type]} during enhanced authentication")

    def handle_AUTH(self, packet):
        props = packet.properties or {}
        method = props.get("authentication_method")
        connect_method = self.auth_method
        if connect_method is None:
            # CONNECT named no method (it was refused with 0x8C if it named
            # one not offered).
            return self.protocol_error("AUTH without an authentication method", R.PROTOCOL_ERROR)
        if method != connect_method:
            # [MQTT-4.12.1-1]
            return self.protocol_error("AUTH with another authentication method than CONNECT's", R.PROTOCOL_ERROR)
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
            self._auth = Exchange(method, steps)
        elif packet.reason_code != R.CONTINUE_AUTHENTICATION or exchange is None:
            return self.protocol_error(f"AUTH {R.name(packet.reason_code)} out of turn", R.PROTOCOL_ERROR)
        self._auth_step(props.get("authentication_data"))


def challenged_handlers():
    """What CHALLENGED does with each packet type ([MQTT-3.1.2-30]: only AUTH or DISCONNECT)."""
    table = {t: Handshake._challenge_broken for t in P.PACKET_NAMES}
    table[P.AUTH] = Handshake._challenge_answered
    table[P.DISCONNECT] = Handshake._challenge_dropped
    return table

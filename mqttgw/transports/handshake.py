"""
The handshake of a connection as a state machine: awaiting CONNECT,
logging in (the portal, or an authentication step), challenged (a 5.0
AUTH sent, the client's awaited), refusing (a refusal's answer waits),
connected; every transition in :data:`TRANSITIONS`, as h11 keeps them in
``_state.py``.  Closing is the connection's, from any state.  Also 5.0
enhanced authentication (section 4.12), at CONNECT and again later: the
:class:`Handshake` part of
:class:`~mqttgw.transports.protocol.MQTTServerProtocol`.
"""

from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.security.enhanced import Authenticated, Continue, Refused
from mqttgw.security.identity import Identity
from mqttgw.transports.interfaces import IHandshake
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


@implementer(IHandshake)
class Handshake:
    """
    The 5.0 enhanced authentication of one connection (an
    :class:`~mqttgw.transports.interfaces.IConnecting`): the exchange
    CONNECT began, answered through its login (an
    :class:`~mqttgw.transports.interfaces.ILogin`), under the CONNECT
    deadline; later, re-authentication by the same method.
    """

    __slots__ = ("connection", "login", "clock", "connect_timeout", "methods", "method", "_exchange", "_deadline")

    def __init__(self, connection, login, clock, connect_timeout, methods):
        self.connection = connection
        self.login = login
        self.clock = clock
        self.connect_timeout = connect_timeout
        # The methods offered, by name (see mqttgw.security.enhanced).
        self.methods = methods
        # The method CONNECT authenticated with, once it has.
        self.method = None
        # The exchange under way (an Exchange), if any.
        self._exchange = None
        self._deadline = None

    def begin(self, exchange):
        """CONNECT named a method offered: its exchange starts."""
        self._exchange = exchange
        # The CONNECT deadline bounds the whole exchange, however its steps
        # are answered.
        self._deadline = cancel(self._deadline)
        self._deadline = self.clock.callLater(self.connect_timeout, self._too_long, exchange)
        self._step(exchange.first_data)

    def _too_long(self, exchange):
        self._deadline = None
        connection = self.connection
        if self._exchange is exchange and connection.state is not CLOSED:
            self._exchange = None
            log.info(
                "enhanced authentication of {client_id} from {peer} not finished in time: closing",
                client_id=connection.log_id,
                peer=connection.peer,
            )
            connection.close(publish_will=False, graceful=True)

    def _step(self, data):
        exchange = self._exchange
        exchange.pending = True
        d = maybeDeferred(exchange.steps.step, data)
        d.addCallback(self._answered, exchange)
        d.addErrback(self._failed, exchange)

    def _failed(self, reason, exchange):
        """A step refused, or failed, or its answer could not be acted on."""
        if self.connection.state is CLOSED:
            return
        if self._exchange is exchange:
            return self._refused(reason, exchange)
        # Its answer was being acted on when this came up.
        log.failure("enhanced authentication of {client_id} failed", reason, client_id=self.connection.log_id)
        self.connection.close(publish_will=False)

    def _answered(self, answer, exchange):
        connection = self.connection
        if self._exchange is not exchange or connection.state is CLOSED:
            return
        exchange.pending = False
        if not isinstance(answer, (Continue, Authenticated)):
            raise TypeError(f"{answer!r} is not Continue or Authenticated")
        props = {"authentication_method": exchange.method}
        if answer.data is not None:
            props["authentication_data"] = bytes(answer.data)
        if isinstance(answer, Continue):
            connection.write(connection.dialect.fit(P.Auth, R.CONTINUE_AUTHENTICATION, properties=props, exempt=True))
            if not exchange.reauthenticating:
                # The client's AUTH is read next (and nothing else may come
                # before CONNACK, [MQTT-3.1.2-30]).
                connection.enter("challenge")
                connection.resume()
            return
        if exchange.reauthenticating:
            if answer.username != connection.username:
                raise Refused(f"re-authenticated as another user, {printable(answer.username)!r}")
            self._exchange = None
            connection.write(connection.dialect.fit(P.Auth, R.SUCCESS, properties=props, exempt=True))
            return
        self._exchange = None
        self._deadline = cancel(self._deadline)
        connection.username = answer.username
        connection.identity = Identity(answer.username)
        self.method = exchange.method
        # CONNACK carries the method, and the last data if any
        # ([MQTT-4.12.0-5]), after the answers already due for this user
        # name, as a password's.
        self.login.welcome_after(self.login.answered(True), exchange.connect, exchange.will, props)

    def _refused(self, reason, exchange):
        self._exchange = None
        connection = self.connection
        if reason.check(Refused):
            code, why = reason.value.reason_code, str(reason.value)
        else:
            log.failure("enhanced authentication of {client_id} failed", reason, client_id=connection.log_id)
            code, why = R.UNSPECIFIED_ERROR, "authentication failed"
        if exchange.reauthenticating:
            # [MQTT-4.12.1-2], with a reason DISCONNECT may give.
            log.info("client {client_id} failed to re-authenticate: {why}", client_id=connection.log_id, why=why)
            connection.close(publish_will=True, graceful=connection.disconnect_first(disconnect_refusal(code), why))
            return
        self._deadline = cancel(self._deadline)
        self.login.refused(connack_refusal(code), why)

    def challenge_answered(self, packet):
        exchange = self._exchange
        method = (packet.properties or {}).get("authentication_method")
        if packet.reason_code != R.CONTINUE_AUTHENTICATION or method != exchange.method:
            self._exchange = None
            # Before CONNACK, a refusing CONNACK says why ([MQTT-4.13.1-1]).
            return self.login.refuse(R.PROTOCOL_ERROR, "AUTH must continue the authentication CONNECT began")
        self.connection.enter("AUTH")
        self._step(packet.properties.get("authentication_data"))
        return self.connection.state in ANSWERING

    def challenge_dropped(self, packet):
        self._exchange = None
        return self.connection.close(publish_will=False, graceful=True)

    def challenge_broken(self, packet):
        self._exchange = None
        if packet.packet_type == P.CONNECT:
            return self.login.refuse(R.PROTOCOL_ERROR, "second CONNECT during enhanced authentication")
        self.login.refuse(R.PROTOCOL_ERROR, f"{P.PACKET_NAMES[packet.packet_type]} during enhanced authentication")

    def handle_AUTH(self, packet):
        connection = self.connection
        props = packet.properties or {}
        method = props.get("authentication_method")
        if method != self.method:
            # [MQTT-4.12.1-1]
            return connection.protocol_error("AUTH with another authentication method than CONNECT's", R.PROTOCOL_ERROR)
        exchange = self._exchange
        if exchange is not None and exchange.pending:
            # The client answers only what the server has asked.
            return connection.protocol_error("AUTH before the last one was answered", R.PROTOCOL_ERROR)
        if packet.reason_code == R.RE_AUTHENTICATE and exchange is None:
            try:
                steps = self.methods[method].exchange(connection.client_id, connection.username)
            except Exception:
                log.failure("authentication method {method} failed", method=printable(method))
                return connection.protocol_error("re-authentication failed", R.UNSPECIFIED_ERROR)
            self._exchange = Exchange(method, steps)
        elif packet.reason_code != R.CONTINUE_AUTHENTICATION or exchange is None:
            return connection.protocol_error(f"AUTH {R.name(packet.reason_code)} out of turn", R.PROTOCOL_ERROR)
        self._step(props.get("authentication_data"))

    def ended(self):
        self._deadline = cancel(self._deadline)

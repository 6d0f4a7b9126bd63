"""
MQTT 5.0 enhanced authentication (section 4.12) through the plugin
interface of mqttgw.security.enhanced, with a challenge-response method
of this test's own: CONNECT's method and data, AUTH 0x18 both ways,
CONNACK with the method, refusals, the packets that may not come before
CONNACK, re-authentication (AUTH 0x19), and answers that take a while (a
Deferred, as a method that hashes in a thread gives).
"""

import pytest
from twisted.internet.defer import Deferred
from zope.interface import implementer

from mqttgw.schema import ConfigError
from mqttgw.security.enhanced import (
    Authenticated,
    Continue,
    IAuthenticationExchange,
    IAuthenticator,
    Refused,
)
from mqttgw.service import config
from mqttgw.service.build import check_auth_methods
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R

METHOD = "TEST-CHALLENGE"


@implementer(IAuthenticationExchange)
class ChallengeExchange:
    """Asks for ``nonce:secret`` after a hello; alice is the one who knows it."""

    def __init__(self, method, client_id, username):
        self.method = method
        self.client_id = client_id
        self.said_hello = False

    def step(self, data):
        answer = self._answer(data)
        if self.method.delay is None:
            return answer
        d = Deferred()
        self.method.clock.callLater(self.method.delay, d.callback, answer)
        return d

    def _answer(self, data):
        if not self.said_hello:
            if data != b"hello":
                raise Refused("no hello", R.BAD_AUTHENTICATION_METHOD)
            self.said_hello = True
            return Continue(b"nonce-1")
        if data == b"nonce-1:secret":
            return Authenticated(self.method.user, b"welcome")
        raise Refused("wrong proof", R.NOT_AUTHORIZED)


@implementer(IAuthenticator)
class ChallengeMethod:
    def __init__(self, clock, delay=None, user="alice"):
        self.clock = clock
        self.delay = delay
        self.user = user

    def exchange(self, client_id, username):
        return ChallengeExchange(self, client_id, username)


def broker_offering(delay=None, **limits):
    broker = FakeBroker(**limits)
    broker.method = ChallengeMethod(broker.clock, delay)
    broker.factory.auth_methods = {METHOD: broker.method}
    return broker


def connect5(data=b"hello", method=METHOD, client_id="c1"):
    props = {"authentication_method": method}
    if data is not None:
        props["authentication_data"] = data
    return P.Connect(client_id, protocol_level=P.MQTT_5, keepalive=0, properties=props)


def auth(code, data=None, method=METHOD):
    props = {"authentication_method": method}
    if data is not None:
        props["authentication_data"] = data
    return P.Auth(code, props)


def authenticated(broker):
    client = broker.client(connect5())
    [challenge] = client.received()
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    [connack] = client.received()
    assert connack.return_code == R.SUCCESS
    return client


def test_MQTT_4_12_0_2_and_4_12_0_5_a_challenge_then_a_connack_with_the_method():
    broker = broker_offering()
    client = broker.client(connect5())
    # [MQTT-4.12.0-2]: more data wanted is AUTH 0x18, naming the method.
    [challenge] = client.received()
    assert challenge == auth(R.CONTINUE_AUTHENTICATION, b"nonce-1")
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    [connack] = client.received()
    assert connack.return_code == R.SUCCESS
    # [MQTT-4.12.0-5]: CONNACK carries the same method, and the last data.
    assert connack.properties["authentication_method"] == METHOD
    assert connack.properties["authentication_data"] == b"welcome"
    # The method named the user: the session is alice's.
    assert client.protocol.username == "alice"
    client.send(P.Subscribe(1, [("t", 1)], {}), P.Publish("t", b"v", 1, message_id=2, properties={}))
    assert any(isinstance(p, P.Publish) and p.payload == b"v" for p in client.received())


def test_a_wrong_proof_is_connack_0x87_and_the_connection_closes():
    broker = broker_offering()
    client = broker.client(connect5())
    client.received()
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:guess"))
    # Failed logins are answered after the throttle's delay.
    broker.clock.advance(10)
    [connack] = client.received()
    assert connack.return_code == R.NOT_AUTHORIZED
    assert connack.properties["reason_string"] == "wrong proof"
    assert client.closed
    assert broker.router.stats.logins_refused == 1


def test_the_method_chooses_the_refusing_reason_code():
    broker = broker_offering()
    client = broker.client(connect5(data=b"bonjour"))
    broker.clock.advance(10)
    [connack] = client.received()
    assert connack.return_code == R.BAD_AUTHENTICATION_METHOD
    assert client.closed


def test_MQTT_3_1_2_30_only_auth_or_disconnect_before_connack():
    broker = broker_offering()
    client = broker.client(connect5())
    client.received()
    client.send(P.Publish("t", b"too soon", 0, properties={}))
    # Before CONNACK the refusal is a CONNACK.
    [connack] = client.received()
    assert connack.return_code == R.PROTOCOL_ERROR
    assert client.closed
    assert "t" not in broker.router.retained


def test_MQTT_3_1_2_30_a_disconnect_during_authentication_ends_it_quietly():
    broker = broker_offering()
    client = broker.client(connect5())
    client.received()
    client.send(P.Disconnect())
    assert client.closed
    assert "c1" not in broker.router.sessions


def test_an_auth_with_another_method_during_connect_is_a_protocol_error():
    broker = broker_offering()
    client = broker.client(connect5())
    client.received()
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret", method="OTHER"))
    [connack] = client.received()
    assert connack.return_code == R.PROTOCOL_ERROR
    assert client.closed
    assert "c1" not in broker.router.sessions


def test_a_method_not_offered_is_0x8c_at_once():
    broker = broker_offering()
    client = broker.client(connect5(method="SCRAM-SHA-1"))
    [connack] = client.received()
    assert connack.return_code == R.BAD_AUTHENTICATION_METHOD
    assert client.closed


def test_a_client_that_never_answers_the_challenge_is_closed_at_the_connect_deadline():
    broker = broker_offering(connect_timeout=10)
    client = broker.client(connect5())
    assert client.received() == [auth(R.CONTINUE_AUTHENTICATION, b"nonce-1")]
    broker.clock.advance(11)
    client.received()
    assert client.closed


def test_answers_that_take_a_while_hold_the_connection_without_blocking():
    broker = broker_offering(delay=0.5)
    client = broker.client(connect5())
    assert client.received() == []
    broker.clock.advance(0.5)
    assert client.received() == [auth(R.CONTINUE_AUTHENTICATION, b"nonce-1")]
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    assert client.received() == []
    # Another client is served meanwhile.
    other = broker.client(P.Connect("plain", protocol_level=P.MQTT_5, keepalive=0, properties={}))
    assert other.received()[0].return_code == R.SUCCESS
    broker.clock.advance(0.5)
    [connack] = client.received()
    assert connack.return_code == R.SUCCESS


# Re-authentication (section 4.12.1)


def test_re_authentication_runs_the_exchange_again_and_ends_with_auth_0x00():
    broker = broker_offering()
    client = authenticated(broker)
    client.send(auth(R.RE_AUTHENTICATE, b"hello"))
    assert client.received() == [auth(R.CONTINUE_AUTHENTICATION, b"nonce-1")]
    # The client may go on publishing meanwhile.
    client.send(P.Publish("t", b"during", 1, message_id=5, properties={}))
    [puback] = client.received()
    assert (type(puback), puback.message_id) == (P.Puback, 5)
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    assert client.received() == [auth(R.SUCCESS, b"welcome")]
    assert not client.closed


def test_MQTT_4_12_1_1_re_authenticating_with_another_method_is_a_protocol_error():
    broker = broker_offering()
    client = authenticated(broker)
    client.send(auth(R.RE_AUTHENTICATE, b"hello", method="OTHER"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert client.closed


def test_MQTT_4_12_1_2_a_failed_re_authentication_is_a_disconnect_and_the_end():
    broker = broker_offering()
    client = authenticated(broker)
    client.send(auth(R.RE_AUTHENTICATE, b"hello"))
    client.received()
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:guess"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.NOT_AUTHORIZED
    assert client.closed


def test_re_authenticating_as_another_user_is_refused():
    broker = broker_offering()
    client = authenticated(broker)
    broker.method.user = "mallory"
    client.send(auth(R.RE_AUTHENTICATE, b"hello"))
    client.received()
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.NOT_AUTHORIZED
    assert client.closed


def test_an_auth_continuing_nothing_is_a_protocol_error():
    broker = broker_offering()
    client = authenticated(broker)
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"out of turn"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert client.closed


def test_an_auth_from_a_client_that_used_no_method_is_a_protocol_error():
    broker = broker_offering()
    client = broker.client(P.Connect("plain", protocol_level=P.MQTT_5, keepalive=0, properties={}))
    client.received()
    client.send(auth(R.RE_AUTHENTICATE, b"hello"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert client.closed


# Configuration


def test_auth_methods_must_name_installed_plugins():
    settings = config.build({"auth.methods": ["NO-SUCH-METHOD"]}, {})
    with pytest.raises(ConfigError, match="auth.methods: no authentication method 'NO-SUCH-METHOD' is installed"):
        check_auth_methods(settings)


def test_no_method_is_offered_by_default():
    assert check_auth_methods(config.build({}, {})) == {}


# Exchanges that go wrong


def test_the_connect_deadline_holds_across_steps_that_take_a_while():
    broker = broker_offering(delay=0.5, connect_timeout=10)
    client = broker.client()
    broker.clock.advance(9.8)
    client.send(connect5())
    broker.clock.advance(0.5)
    # Challenged; the client never answers.
    assert client.received() == [auth(R.CONTINUE_AUTHENTICATION, b"nonce-1")]
    broker.clock.advance(10)
    client.received()
    assert client.closed


def test_an_auth_while_a_step_is_still_being_answered_is_a_protocol_error():
    broker = broker_offering()
    client = authenticated(broker)
    # From now on, steps are answered later.
    broker.method.delay = 5.0
    client.send(auth(R.RE_AUTHENTICATE, b"hello"))
    client.send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.PROTOCOL_ERROR
    assert client.closed


def test_a_failed_re_authentication_gives_a_reason_disconnect_may_have():
    broker = broker_offering()
    client = authenticated(broker)
    # The method refuses with 0x8C, which DISCONNECT has no place for.
    client.send(auth(R.RE_AUTHENTICATE, b"bonjour"))
    [disconnect] = client.received()
    assert disconnect.reason_code == R.NOT_AUTHORIZED
    assert client.closed


@implementer(IAuthenticator)
class BrokenMethod:
    def __init__(self, answer=None, raises=False):
        self.answer = answer
        self.raises = raises

    def exchange(self, client_id, username):
        if self.raises:
            raise RuntimeError("plugin bug")
        method = self

        @implementer(IAuthenticationExchange)
        class Steps:
            def step(self, data):
                return method.answer

        return Steps()


@pytest.mark.parametrize("answer", [None, "yes", Continue(data=12345)], ids=["none", "text", "bad-data"])
def test_an_answer_that_cannot_be_acted_on_closes_the_connection(answer, logged):
    broker = FakeBroker()
    broker.factory.auth_methods = {METHOD: BrokenMethod(answer)}
    client = broker.client(connect5())
    broker.clock.advance(10)
    client.received()
    assert client.closed
    assert "c1" not in broker.router.sessions


def test_a_method_whose_exchange_raises_refuses_with_0x80(logged):
    broker = FakeBroker()
    broker.factory.auth_methods = {METHOD: BrokenMethod(raises=True)}
    client = broker.client(connect5())
    [connack] = client.received()
    assert connack.return_code == R.UNSPECIFIED_ERROR
    assert client.closed
    assert any("authentication method TEST-CHALLENGE failed" in line for line in logged())


def test_a_second_connect_during_authentication_is_refused_with_0x82():
    broker = broker_offering()
    client = broker.client(connect5())
    client.received()
    client.send(connect5())
    [connack] = client.received()
    assert connack.return_code == R.PROTOCOL_ERROR
    assert client.closed


def test_no_method_is_offered_where_the_client_certificate_is_the_credential():
    broker = broker_offering()
    broker.factory.identity_as_username = True
    client = broker.client(connect5())
    [connack] = client.received()
    assert connack.return_code == R.BAD_AUTHENTICATION_METHOD
    assert client.closed


def test_enhanced_logins_are_bounded_and_throttled_as_password_logins_are():
    # Before: an exchange counted only a failure per address, with no
    # bound on those under way and no delay owed by the user name.
    from mqttgw.security.throttle import Throttle

    broker = broker_offering()
    broker.factory.throttle = Throttle(0.1, 10.0, max_waiting=2, seconds=broker.clock.seconds)
    waiting = [broker.client(connect5(client_id=f"w{n}")) for n in range(2)]
    assert all(len(c.received()) == 1 for c in waiting)  # each challenged, under way
    busy = broker.client(connect5(client_id="busy"))
    [connack] = busy.received()
    assert connack.return_code == R.SERVER_BUSY and busy.closed
    # A failure is answered after the delay it earned; the success is not.
    waiting[0].send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:guess"))
    assert waiting[0].received() == []
    broker.clock.advance(0.1)
    [refused] = waiting[0].received()
    assert refused.return_code == R.NOT_AUTHORIZED
    waiting[1].send(auth(R.CONTINUE_AUTHENTICATION, b"nonce-1:secret"))
    broker.clock.advance(10)
    [welcome] = waiting[1].received()
    assert welcome.return_code == R.SUCCESS

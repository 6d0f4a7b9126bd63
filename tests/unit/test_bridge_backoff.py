"""
The MQTT bridge's reconnects in-process: on a MemoryReactorClock the
upstream addresses are tried in turn, the waits between rounds back off
with jitter, and the state topics say 0 and 1.  Connections are answered
or refused by the test (tests/fake_network.py); tests/system/test_bridge.py does
the same against a real mosquitto under twistd.
"""

import socket

import pytest
from twisted.internet.endpoints import HostnameEndpoint

from mqttgw.bridges import bridge as bridge_module
from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.bridges.endpoint import SETTLE_SECONDS
from mqttgw.wire import packets as P
from tests import fake_network
from tests.fake_network import Listener, accept, attempts

# The fake reactor resolves every host name to 127.0.0.1: upstreams are
# told apart by their port.
FIRST, SECOND = "127.0.0.1:1001", "127.0.0.1:1002"
STATE = "mqttgw/bridge/up/state"
REMOTE_STATE = f"$SYS/broker/connection/{socket.gethostname()}.up/state"


class Jitter:
    """
    The bridge's source of jitter: these values, in turn.  The bridge
    calls random.random() of its module's ``random`` (it takes no jitter
    argument), so tests put one of these in its place.
    """

    def __init__(self, *values):
        self._values = iter(values)

    def random(self):
        return next(self._values)


def start_bridge(router, reactor, addresses=(FIRST, SECOND), **table):
    settings = MQTTBridgeKind.check(
        {"name": "up", "addresses": list(addresses), "rules": ["t/# out 1"], **table}
    )
    bridge = MQTTBridgeKind.make_service(router, settings, reactor)
    bridge.startService()
    return bridge


def refuse(reactor):
    """
    The latest attempt is refused.  HostnameEndpoint reports it at its
    next attempt tick, once it has no other address of that host to try.
    """
    fake_network.refuse(reactor)
    reactor.advance(HostnameEndpoint._DEFAULT_ATTEMPT_DELAY)


def wait_for_attempt(reactor):
    """Seconds on the clock until the bridge dials again."""
    before, started = len(reactor.tcpClients), reactor.seconds()
    for _ in range(1000):
        if len(reactor.tcpClients) != before:
            return reactor.seconds() - started
        calls = reactor.getDelayedCalls()
        assert calls, "nothing scheduled: the bridge gave up"
        reactor.advance(min(c.getTime() for c in calls) - reactor.seconds())
    raise AssertionError(f"no new attempt in {reactor.seconds() - started} s")


def connected(reactor, index=-1):
    """The attempt connects and the upstream accepts its CONNECT."""
    upstream = accept(reactor, index)
    [connect] = upstream.received()
    assert isinstance(connect, P.Connect)
    upstream.send(P.Connack(0))
    return upstream


def state(router, topic=STATE):
    """The retained value of ``topic``, or None."""
    message = router.retained.get(topic)
    return None if message is None else message.payload


# Failover


def test_addresses_are_tried_in_turn_the_first_one_first(router, reactor, logged):
    start_bridge(router, reactor)
    assert attempts(reactor) == [FIRST]
    refuse(reactor)
    # No wait between the addresses of one round.
    assert attempts(reactor) == [FIRST, SECOND]
    connected(reactor)
    assert any(m.startswith(f"bridge up: upstream {FIRST} unreachable: ") for m in logged())
    assert f"bridge up: connected to {SECOND}" in logged()


def test_an_upstream_refusing_the_connect_moves_on_saying_the_code_and_what_to_check(router, reactor, logged):
    start_bridge(router, reactor, client_id="site-7")
    upstream = accept(reactor)
    upstream.received()
    upstream.send(P.Connack(P.CONNACK_NOT_AUTHORIZED))
    assert upstream.closed
    assert attempts(reactor) == [FIRST, SECOND]
    assert (
        f"bridge up: upstream {FIRST} refused CONNECT: CONNACK 5: not authorized; check username"
        " and password, and the upstream's rights for client id 'site-7'"
    ) in logged()
    connected(reactor)
    assert state(router) == b"1"


def test_an_upstream_that_does_not_take_bridge_connects_is_asked_again_plainly_at_once(router, reactor, logged):
    start_bridge(router, reactor, addresses=[FIRST])
    upstream = accept(reactor)
    [connect] = upstream.received()
    # try_private: mosquitto's bridge flag on the protocol level.
    assert connect.protocol_level == P.MQTT_311 | 0x80
    upstream.send(P.Connack(P.CONNACK_UNACCEPTABLE_PROTOCOL))
    # Not a failed round: asked again at once, without waiting.
    assert attempts(reactor) == [FIRST, FIRST]
    [again] = accept(reactor).received()
    assert again.protocol_level == P.MQTT_311
    [line] = [line for line in logged() if "try_private" in line]
    assert line.startswith(
        f"bridge up: upstream {FIRST} refused CONNECT: CONNACK 1: unacceptable protocol version when"
        " the CONNECT announced a bridge (try_private, protocol level 0x84)"
    )
    assert "set try_private = false" in line


def test_a_connection_lost_before_its_connack_moves_on_to_the_next_address(router, reactor, logged):
    start_bridge(router, reactor, try_private=False, session_fallback="wait")
    upstream = accept(reactor)
    upstream.lose()
    assert attempts(reactor) == [FIRST, SECOND]
    assert state(router) == b"0"
    [line] = [line for line in logged() if line.startswith(f"bridge up: upstream {FIRST} ")]
    assert line.startswith(f"bridge up: upstream {FIRST} closed the connection before CONNACK; ")


# Backoff


def test_each_wait_is_drawn_between_reconnect_initial_and_the_doubled_cap(router, reactor, monkeypatch):
    monkeypatch.setattr(bridge_module, "random", Jitter(0.5, 0.25, 0.75, 0.0, 0.999))
    start_bridge(router, reactor, reconnect_initial=1.0, reconnect_max=8.0)
    waits = []
    for _ in range(5):
        refuse(reactor)
        refuse(reactor)
        waits.append(wait_for_attempt(reactor))
        assert attempts(reactor)[-1] == FIRST
    # Full jitter: after round n, 1 + r * (min(8, 2**n) - 1).  ClientService
    # counts the failed round before asking for its wait, so the first cap
    # is twice reconnect_initial.
    assert waits == pytest.approx([1.5, 1.75, 6.25, 1.0, 7.993])


def test_every_wait_lies_between_reconnect_initial_and_the_capped_doubling(router, reactor):
    start_bridge(router, reactor, addresses=[FIRST], reconnect_initial=0.5, reconnect_max=10.0)
    waits = []
    for _ in range(12):
        refuse(reactor)
        waits.append(wait_for_attempt(reactor))
    for n, wait in enumerate(waits, start=1):
        assert 0.5 <= wait <= min(0.5 * 2**n, 10.0), (n, wait)
    # Spread, not one value: what keeps a thousand sites apart.
    assert len({round(w, 6) for w in waits[4:]}) > 1


def test_after_a_connection_that_worked_the_backoff_starts_over(router, reactor, monkeypatch):
    # Jitter at its top: each wait is its round's cap.
    monkeypatch.setattr(bridge_module, "random", Jitter(*[1.0] * 10))
    start_bridge(router, reactor, addresses=[FIRST], reconnect_initial=1.0, reconnect_max=60.0)
    waits = []
    for _ in range(3):
        refuse(reactor)
        waits.append(wait_for_attempt(reactor))
    assert waits == pytest.approx([2.0, 4.0, 8.0])
    upstream = connected(reactor)
    reactor.advance(SETTLE_SECONDS)
    upstream.lose()
    # Lost after it worked: the waits begin again from the first.
    assert wait_for_attempt(reactor) == pytest.approx(2.0)
    refuse(reactor)
    assert wait_for_attempt(reactor) == pytest.approx(4.0)


def test_a_stopped_bridge_dials_no_more(router, reactor):
    bridge = start_bridge(router, reactor, addresses=[FIRST])
    refuse(reactor)
    bridge.stopService()
    reactor.advance(3600)
    assert attempts(reactor) == [FIRST]


# State topics


def test_the_state_topic_says_0_until_connected_1_while_connected_and_0_once_lost(router, reactor):
    start_bridge(router, reactor)
    watcher = Listener.of(router, reactor).client("watcher")
    watcher.send(P.Subscribe(1, [(STATE, 1)]))
    suback, retained = watcher.received()
    assert (retained.topic, retained.payload, retained.retain) == (STATE, b"0", True)
    refuse(reactor)
    assert watcher.received() == []
    upstream = connected(reactor)
    assert [(p.topic, p.payload) for p in watcher.received() if isinstance(p, P.Publish)] == [
        (STATE, b"1"),
    ]
    assert state(router) == b"1"
    upstream.lose()
    assert [(p.topic, p.payload) for p in watcher.received() if isinstance(p, P.Publish)] == [
        (STATE, b"0")
    ]
    assert state(router) == b"0"


def test_upstream_the_state_is_1_retained_and_the_will_says_0(router, reactor):
    # A plain CONNECT (not mosquitto's bridge flag), which the fake
    # upstream's framer reads whole.
    start_bridge(router, reactor, addresses=[FIRST], try_private=False)
    upstream = accept(reactor)
    [connect] = upstream.received()
    assert (connect.will_topic, connect.will_message, connect.will_retain, connect.will_qos) == (
        REMOTE_STATE, b"0", True, 1,
    )
    upstream.send(P.Connack(0))
    assert P.Publish(REMOTE_STATE, b"1", 0, True) in upstream.received()


def test_clients_may_not_write_the_state_topic(router, reactor):
    start_bridge(router, reactor, addresses=[FIRST])
    connected(reactor)
    client = Listener.of(router, reactor).client("spoof")
    client.send(P.Publish(STATE, b"0", 1, True, message_id=1))
    assert client.received() == [P.Puback(1)]
    assert state(router) == b"1"


# Client ids


def test_the_default_client_id_is_the_host_name_and_the_bridge_name(router, reactor):
    start_bridge(router, reactor, addresses=[FIRST], try_private=False)
    [connect] = accept(reactor).received()
    assert connect.client_id == f"{socket.gethostname()}.up"


def test_a_3_1_bridge_keeps_its_default_client_id_to_23_characters(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "a-rather-long-field-site-host")
    settings = MQTTBridgeKind.check(
        {"name": "centre", "addresses": [FIRST], "rules": ["t/# out 1"], "protocol": "mqttv31"}
    )
    # The end, where the bridge's name is.
    assert settings.client_id == "-field-site-host.centre"


def test_links_the_upstream_keeps_closing_at_once_suggest_a_shared_client_id(router, reactor, logged):
    # Another bridge with the same client id: the upstream closes this
    # one's connection each time the other connects.
    start_bridge(
        router, reactor, addresses=[FIRST], client_id="site", reconnect_initial=0.5, reconnect_max=1.0,
        session_fallback="wait",
    )
    for n in range(3):
        upstream = connected(reactor)
        reactor.advance(0.5)
        upstream.lose()
        assert not [line for line in logged() if "in a row" in line] or n == 2
        wait_for_attempt(reactor)
    [warning] = [line for line in logged() if "in a row" in line]
    assert "3 connections in a row were lost within 2 s" in warning and "'site'" in warning
    # A link that lasts starts the count again: two more short ones are
    # not three in a row.
    upstream = connected(reactor)
    reactor.advance(60)
    upstream.lose()
    for _ in range(2):
        wait_for_attempt(reactor)
        upstream = connected(reactor)
        reactor.advance(0.5)
        upstream.lose()
    assert len([line for line in logged() if "in a row" in line]) == 1


def test_a_stall_of_the_gateway_is_not_the_upstreams_silence():
    # Stopped (SIGSTOP) for 30 s with a keepalive of 10: the upstream's
    # answer waited unread, and the link stays; an upstream that then
    # stays silent is still given up 1.5 keepalives later.
    from twisted.internet.testing import StringTransport

    from mqttgw.bridges.client import MQTTClientProtocol
    from mqttgw.testing import IdleClock

    class Handler:
        def connected(self, protocol):
            pass

        def packet(self, protocol, packet):
            pass

    clock = IdleClock()
    link = MQTTClientProtocol(P.Connect("bridge", keepalive=10), Handler(), clock)
    transport = StringTransport()
    link.makeConnection(transport)
    link.dataReceived(P.Connack(0).encode())
    clock.advance(10)
    assert transport.value().endswith(P.Pingreq().encode())
    link.dataReceived(P.Pingresp().encode())
    transport.clear()
    clock.stall(30)
    assert not transport.disconnecting
    assert transport.value() == P.Pingreq().encode()
    link.dataReceived(P.Pingresp().encode())
    clock.advance(15)
    assert not transport.disconnecting
    clock.advance(5)
    assert transport.disconnecting

"""
A bridge meeting central brokers as they are, in-process on a
MemoryReactorClock (tests/fake_network.py plays the upstreams): an
upstream that closes the connection when the CONNECT announces a bridge
(try_private) or speaks 5.0, one that answers 5.0 with 0x84, cluster
nodes that accept CONNECT and drop it or refuse the persistent session,
and what the bridge tells operators about it.  tests/system/test_bridge.py runs
the failover against real mosquittos.
"""

import pytest

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.bridges.endpoint import SETTLE_SECONDS
from mqttgw.bridges.returns import PRIMARY_RETRY
from mqttgw.web.metrics import Metrics
from mqttgw.web.systopics import SysTopics
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from tests import fake_network
from tests.fake_network import Listener, accept, attempts

FIRST, SECOND = "127.0.0.1:1001", "127.0.0.1:1002"
PRIVATE_311 = P.MQTT_311 | 0x80


def start_bridge(router, reactor, addresses=(FIRST, SECOND), rules=("t/# out 1",), **table):
    settings = MQTTBridgeKind.check({"name": "up", "addresses": list(addresses), "rules": list(rules), **table})
    bridge = MQTTBridgeKind.make_service(router, settings, reactor)
    bridge.startService()
    return bridge


# What an upstream does with a connection, by address: each takes the
# cluster, the upstream's side of the connection and the CONNECT.


def accepts(cluster, upstream, connect):
    v5 = connect.protocol_level == P.MQTT_5
    upstream._framer.v5 = v5
    upstream.send(P.Connack(0, properties={} if v5 else None))
    cluster.links.append(upstream)


def closes_unless_plain_311(cluster, upstream, connect):
    """RabbitMQ 3.10's MQTT plugin: anything but a plain 3.1.1 CONNECT is closed unanswered."""
    if connect.protocol_level != P.MQTT_311:
        upstream.lose()
    else:
        accepts(cluster, upstream, connect)


def drops_the_persistent_session(cluster, upstream, connect):
    """A cluster node whose copy of the session's queue is on a dead node."""
    accepts(cluster, upstream, connect)
    if not connect.clean_session:
        upstream.lose()


def refuses_the_persistent_session(cluster, upstream, connect):
    if connect.clean_session:
        accepts(cluster, upstream, connect)
    else:
        upstream.send(P.Connack(P.CONNACK_SERVER_UNAVAILABLE))


class Cluster:
    """The upstreams of the fake network: each new attempt answered as its address's behaviour says."""

    def __init__(self, reactor, **behaviours):
        self.reactor = reactor
        self.behaviours = behaviours
        self.connects = []  # (address, CONNECT)
        self.probes = []  # addresses of connections that sent nothing
        self.links = []
        self._seen = 0

    def answer(self):
        reactor = self.reactor
        while self._seen < len(reactor.tcpClients):
            index, self._seen = self._seen, self._seen + 1
            address = attempts(reactor)[index]
            behaviour = self.behaviours.get(address, "dead")
            if behaviour == "dead":
                fake_network.refuse(reactor, index)
                continue
            upstream = accept(reactor, index)
            packets = upstream.received()
            if not packets:
                self.probes.append(address)
                continue
            [connect] = packets
            self.connects.append((address, connect))
            behaviour(self, upstream, connect)

    def run(self, seconds, until=lambda: False):
        """Answers and turns the clock until ``until()`` or ``seconds`` passed: whether it came true."""
        reactor = self.reactor
        deadline = reactor.seconds() + seconds
        for _ in range(10_000):
            self.answer()
            if until():
                return True
            calls = [c.getTime() for c in reactor.getDelayedCalls()]
            if not calls or min(calls) > deadline:
                reactor.advance(max(deadline - reactor.seconds(), 0))
                self.answer()
                return until()
            reactor.advance(max(min(calls) - reactor.seconds(), 0))
        raise AssertionError("the clock did not reach the deadline")

    def levels(self, address):
        return [c.protocol_level for a, c in self.connects if a == address]


def on(bridge, address):
    """Whether the bridge has a working link to ``address``."""
    return bridge.upstream is not None and bridge.status()["address"] == address and (
        bridge.status()["disconnected_since"] is None
    )


# try_private


def test_an_upstream_closing_a_try_private_connect_is_asked_again_plainly_at_once(router, reactor, logged):
    bridge = start_bridge(router, reactor, addresses=[FIRST])
    cluster = Cluster(reactor, **{FIRST: closes_unless_plain_311})
    cluster.answer()
    # No wait between the two: the second CONNECT follows the close.
    assert cluster.levels(FIRST) == [PRIVATE_311, P.MQTT_311]
    assert reactor.seconds() == 0
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    [line] = [line for line in logged() if "from now on" in line]
    assert line == (
        f"bridge up: upstream {FIRST} closed the connection before CONNACK when the CONNECT announced a"
        " bridge (try_private, protocol level 0x84): connecting there without it from now on; set"
        " try_private = false to leave it out from the start"
    )
    assert bridge.status()["fallbacks"] == {FIRST: ["try_private off"]}


def test_try_private_is_left_out_per_address_and_said_once_for_each(router, reactor, logged):
    bridge = start_bridge(router, reactor)
    cluster = Cluster(reactor, **{FIRST: closes_unless_plain_311, SECOND: "dead"})
    assert cluster.run(5, lambda: on(bridge, FIRST))
    # The first node goes; the second comes, and announces nothing yet.
    cluster.behaviours = {FIRST: "dead", SECOND: accepts}
    cluster.links[-1].lose()
    assert cluster.run(10, lambda: on(bridge, SECOND))
    assert cluster.levels(SECOND)[-1] == PRIVATE_311
    # And back to the first, which is asked plainly from the start.
    cluster.behaviours = {FIRST: closes_unless_plain_311, SECOND: "dead"}
    cluster.links[-1].lose()
    assert cluster.run(10, lambda: on(bridge, FIRST))
    assert cluster.levels(FIRST) == [PRIVATE_311, P.MQTT_311, P.MQTT_311]
    assert len([line for line in logged() if "from now on" in line]) == 1
    assert bridge.status()["fallbacks"] == {FIRST: ["try_private off"]}


def closes_everything(cluster, upstream, connect):
    """A proxy whose broker is down: it accepts the connection and closes it."""
    upstream.lose()


@pytest.mark.parametrize("protocol", ["mqttv5", "mqttv311"])
def test_a_close_that_is_not_about_the_protocol_changes_nothing(router, reactor, logged, protocol):
    bridge = start_bridge(router, reactor, addresses=[FIRST], protocol=protocol, session_fallback="wait")
    cluster = Cluster(reactor, **{FIRST: closes_everything})
    cluster.run(30)
    # Each step down was closed as well: each is taken back.
    assert bridge.status()["fallbacks"] == {}
    assert not [line for line in logged() if "from now on" in line]
    assert any(line.startswith(f"bridge up: upstream {FIRST} closed the connection before CONNACK; ")
               for line in logged())
    # The broker behind it is back, and takes what was first asked for.
    cluster.behaviours[FIRST] = accepts
    first_level = cluster.levels(FIRST)[0]
    assert cluster.run(120, lambda: on(bridge, FIRST))
    assert cluster.levels(FIRST)[-1] == first_level == (P.MQTT_5 if protocol == "mqttv5" else PRIVATE_311)


def test_try_private_false_sends_the_plain_level_from_the_start(router, reactor, logged):
    bridge = start_bridge(router, reactor, addresses=[FIRST], try_private=False)
    cluster = Cluster(reactor, **{FIRST: closes_unless_plain_311})
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    assert cluster.levels(FIRST) == [P.MQTT_311]
    assert bridge.status()["fallbacks"] == {}
    assert not [line for line in logged() if "try_private" in line]


# 5.0 refused


def test_a_5_0_bridge_answered_0x84_speaks_3_1_1_there_and_keeps_what_it_queued(router, reactor, logged):
    bridge = start_bridge(router, reactor, addresses=[FIRST], protocol="mqttv5", try_private=False)
    publisher = Listener.of(router, reactor).client("pub", keepalive=0)
    for i in range(3):
        publisher.send(P.Publish("t/a", str(i).encode(), 1, message_id=i + 1))
    upstream = accept(reactor)
    [connect] = upstream.received()
    assert connect.protocol_level == P.MQTT_5
    upstream.send(P.Connack(R.UNSUPPORTED_PROTOCOL_VERSION, properties={}))
    # Asked again at once, in 3.1.1.
    again = accept(reactor)
    [connect] = again.received()
    assert (connect.protocol_name, connect.protocol_level) == ("MQTT", P.MQTT_311)
    assert connect.properties is None
    again.send(P.Connack(0))
    sent = [p for p in again.received() if isinstance(p, P.Publish) and p.topic == "t/a"]
    assert [p.payload for p in sent] == [b"0", b"1", b"2"]
    [line] = [line for line in logged() if "speaking 3.1.1" in line]
    assert line.startswith(
        f"bridge up: upstream {FIRST} refused CONNECT: CONNACK 0x84: unsupported protocol version to an"
        " MQTT 5.0 CONNECT: speaking 3.1.1 there from now on"
    )
    assert 'set protocol = "mqttv311"' in line
    status = bridge.status()
    assert status["fallbacks"] == {FIRST: ["mqttv311"]}
    assert status["protocol"] == "mqttv311"


def test_a_5_0_bridge_closed_before_connack_falls_back_to_3_1_1_then_leaves_try_private_out(router, reactor, logged):
    # RabbitMQ closes both a 5.0 CONNECT and a try_private one unanswered.
    bridge = start_bridge(router, reactor, addresses=[FIRST], protocol="mqttv5")
    cluster = Cluster(reactor, **{FIRST: closes_unless_plain_311})
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    assert cluster.levels(FIRST) == [P.MQTT_5, PRIVATE_311, P.MQTT_311]
    assert bridge.status()["fallbacks"] == {FIRST: ["mqttv311", "try_private off"]}
    assert len([line for line in logged() if "from now on" in line]) == 2
    # A later reconnection goes straight to what worked.
    cluster.links[-1].lose()
    assert cluster.run(10, lambda: len(cluster.connects) == 4)
    assert cluster.levels(FIRST)[-1] == P.MQTT_311


# The state topic's will refused


def forbids_dollar_topics(cluster, upstream, connect):
    """ejabberd's mod_mqtt: a will on a $ topic is refused, 0x90 in 5.0 and 128 in 3.1.1."""
    if connect.protocol_level & 0x80:
        upstream.send(P.Connack(P.CONNACK_UNACCEPTABLE_PROTOCOL))
    elif connect.will_topic is not None and connect.will_topic.startswith("$"):
        v5 = connect.protocol_level == P.MQTT_5
        upstream.send(P.Connack(R.TOPIC_NAME_INVALID, properties={} if v5 else None))
    else:
        accepts(cluster, upstream, connect)


@pytest.mark.parametrize("protocol", ["mqttv5", "mqttv311"])
def test_an_upstream_refusing_the_state_topics_will_is_asked_again_without_it(router, reactor, logged, protocol):
    bridge = start_bridge(router, reactor, addresses=[FIRST], protocol=protocol)
    cluster = Cluster(reactor, **{FIRST: forbids_dollar_topics})
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    *_, (_, connect) = cluster.connects
    assert connect.will_topic is None
    # Nor the state message, which the upstream would refuse too.
    assert not [p for p in cluster.links[-1].received() if isinstance(p, P.Publish)]
    assert bridge.status()["fallbacks"][FIRST][-1] == "remote_state_topic off"
    [line] = [line for line in logged() if "remote_state_topic to a topic" in line]
    assert f"to a CONNECT whose will is on $SYS/broker/connection/{bridge.settings.client_id}/state" in line
    # It stays so for that address.
    cluster.links[-1].lose()
    assert cluster.run(10, lambda: len(cluster.links) == 2)
    assert cluster.connects[-1][1].will_topic is None


# Clusters


def test_a_node_that_accepts_and_drops_the_connect_is_a_failed_attempt_and_the_next_is_tried(router, reactor, logged):
    bridge = start_bridge(router, reactor, try_private=False, session_fallback="wait")
    cluster = Cluster(reactor, **{FIRST: drops_the_persistent_session, SECOND: accepts})
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, SECOND))
    assert [a for a, _ in cluster.connects] == [FIRST, SECOND]
    assert any(
        line.startswith(f"bridge up: upstream {FIRST} accepted CONNECT and closed the connection 0.0 s later; ")
        for line in logged()
    )


def test_a_killed_node_moves_the_bridge_to_another_within_10_s_with_a_clean_session(router, reactor, logged):
    bridge = start_bridge(router, reactor, rules=["t/# out 1", "cmd/# in 1"], try_private=False, client_id="site")
    cluster = Cluster(reactor, **{FIRST: accepts, SECOND: "dead"})
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    publisher = Listener.of(router, reactor).client("pub", keepalive=0)
    publisher.send(P.Publish("t/a", b"before", 1, message_id=1))
    # The node holding the session dies with the message unacknowledged;
    # the other one cannot resume the session without it.
    cluster.behaviours = {FIRST: "dead", SECOND: drops_the_persistent_session}
    killed = reactor.seconds()
    cluster.links[-1].lose()
    publisher.send(P.Publish("t/a", b"meanwhile", 1, message_id=2))
    assert cluster.run(10, lambda: on(bridge, SECOND))
    assert reactor.seconds() - killed < 10
    # Persistent first, then a clean session there, under a client id of
    # its own: the persistent session upstream is left as it is.
    address, connect = cluster.connects[-1]
    assert (address, connect.clean_session, connect.client_id) == (SECOND, True, "site/clean")
    assert any(a == SECOND and not c.clean_session for a, c in cluster.connects)
    upstream = cluster.links[-1]
    received = upstream.received()
    # The in rules subscribed again; nothing held here was dropped for it.
    assert P.Subscribe(1, [("cmd/#", 1)]) in received
    assert [p.payload for p in received if isinstance(p, P.Publish) and p.topic == "t/a"] == [b"before", b"meanwhile"]
    status = bridge.status()
    assert status["clean_fallback"] is True
    [line] = [line for line in logged() if "no address resumed the persistent session" in line]
    assert 'session_fallback = "clean"' in line and "nothing held here is dropped" in line
    assert "'site/clean'" in line


def test_a_link_dropped_once_as_it_was_accepted_resumes_the_persistent_session(router, reactor):
    # A bad link (a reset, a stall) right after CONNACK is not a node that
    # cannot serve the session: the next round resumes it.
    bridge = start_bridge(router, reactor, addresses=[FIRST], try_private=False)
    dropped = []

    def drops_once(cluster, upstream, connect):
        accepts(cluster, upstream, connect)
        if not dropped:
            dropped.append(connect)
            upstream.lose()

    cluster = Cluster(reactor, **{FIRST: drops_once})
    assert cluster.run(SETTLE_SECONDS + 3, lambda: on(bridge, FIRST))
    assert [c.clean_session for _, c in cluster.connects] == [False, False]
    assert bridge.status()["clean_fallback"] is False


def test_a_node_refusing_the_persistent_session_gets_a_clean_one(router, reactor):
    bridge = start_bridge(router, reactor, try_private=False)
    cluster = Cluster(reactor, **{FIRST: refuses_the_persistent_session, SECOND: refuses_the_persistent_session})
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    assert [(a, c.clean_session) for a, c in cluster.connects] == [(FIRST, False), (SECOND, False), (FIRST, True)]
    status = bridge.status()
    assert status["clean_fallback"] is True
    assert status["last_failure"]["reason"] == "refused CONNECT: CONNACK 3: server unavailable"


def test_with_session_fallback_wait_it_says_so_once_and_backs_off(router, reactor, logged):
    bridge = start_bridge(router, reactor, try_private=False, session_fallback="wait")
    cluster = Cluster(reactor, **{FIRST: drops_the_persistent_session, SECOND: drops_the_persistent_session})
    cluster.run(120)
    assert not bridge.status()["connected"]
    assert all(not c.clean_session for _, c in cluster.connects)
    # Not stuck cycling: rounds back off as for an unreachable upstream.
    assert len(cluster.connects) < 30
    [line] = [line for line in logged() if "no address resumed the persistent session" in line]
    assert 'session_fallback = "wait"' in line
    # Each address in turn, not the first one over and over.
    assert {a for a, _ in cluster.connects} == {FIRST, SECOND}


def test_on_a_clean_session_the_persistent_one_is_tried_again_after_session_fallback_retry(router, reactor, logged):
    bridge = start_bridge(router, reactor, addresses=[FIRST], try_private=False, session_fallback_retry=60)
    cluster = Cluster(reactor, **{FIRST: drops_the_persistent_session})
    # Dropped in two rounds in a row (the second after a reconnect delay
    # of at most 2 s), then a clean session.
    assert cluster.run(SETTLE_SECONDS + 2, lambda: bridge.status()["clean_fallback"] and on(bridge, FIRST))
    clean_link = cluster.links[-1]
    # The node gets its session back: after 60 s the bridge closes its
    # clean link (with DISCONNECT) and resumes it at once.
    cluster.behaviours = {FIRST: accepts}
    started = reactor.seconds()
    assert cluster.run(120, lambda: clean_link.closed)
    assert reactor.seconds() - started == pytest.approx(60)
    assert P.Disconnect() in clean_link.received()
    clean_link.lose()
    resumed = reactor.seconds()
    assert cluster.run(SETTLE_SECONDS, lambda: not bridge.status()["clean_fallback"] and on(bridge, FIRST))
    assert reactor.seconds() - resumed == pytest.approx(SETTLE_SECONDS)
    assert [(a, c.clean_session) for a, c in cluster.connects] == [
        (FIRST, False), (FIRST, False), (FIRST, True), (FIRST, False),
    ]
    assert any("trying the persistent session again" in line for line in logged())


# Where it goes back to


def test_with_round_robin_false_it_goes_back_to_the_first_address_once_it_takes_connections(router, reactor):
    bridge = start_bridge(router, reactor, try_private=False)
    cluster = Cluster(reactor, **{FIRST: "dead", SECOND: accepts})
    assert cluster.run(SETTLE_SECONDS + 1, lambda: on(bridge, SECOND))
    # Probed over TCP every 5 s while it is down.
    assert cluster.run(PRIMARY_RETRY * 3, lambda: False) is False
    assert on(bridge, SECOND)
    cluster.behaviours[FIRST] = accepts
    second_link = cluster.links[-1]
    assert cluster.run(PRIMARY_RETRY + 1, lambda: cluster.probes == [FIRST])
    assert P.Disconnect() in second_link.received()
    second_link.lose()
    # At once, not after a reconnect wait.
    assert cluster.run(SETTLE_SECONDS + 0.5, lambda: on(bridge, FIRST))


def test_with_round_robin_true_it_stays_where_the_link_works(router, reactor):
    bridge = start_bridge(router, reactor, try_private=False, round_robin=True)
    cluster = Cluster(reactor, **{FIRST: "dead", SECOND: accepts})
    assert cluster.run(SETTLE_SECONDS + 1, lambda: on(bridge, SECOND))
    cluster.behaviours[FIRST] = accepts
    cluster.run(60)
    assert on(bridge, SECOND)
    assert cluster.probes == []
    assert [a for a, _ in cluster.connects] == [SECOND]


# What operators see


def test_status_metrics_and_sys_say_where_it_is_since_when_and_what_the_upstream_said(router, reactor):
    bridge = start_bridge(router, reactor)

    def rabbit_without_the_session(cluster, upstream, connect):
        if connect.protocol_level == P.MQTT_311:
            refuses_the_persistent_session(cluster, upstream, connect)
        else:
            upstream.lose()

    cluster = Cluster(reactor, **{FIRST: rabbit_without_the_session, SECOND: "dead"})
    reactor.advance(5)
    status = bridge.status()
    assert (status["address"], status["disconnected_since"], status["disconnected_s"]) == (FIRST, 0, 5)
    assert (status["last_failure"], status["fallbacks"], status["clean_fallback"]) == (None, {}, False)
    cluster.run(0.5)
    status = bridge.status()
    assert status["address"] == FIRST
    assert status["last_failure"]["address"] == SECOND
    assert status["last_failure"]["reason"].startswith("unreachable: ")
    assert status["failures"] == {FIRST: {"refused": 1}, SECOND: {"unreachable": 1}}
    assert status["clean_fallback"] is True
    assert status["fallbacks"] == {FIRST: ["try_private off"]}

    def samples(name):
        [family] = [f for f in Metrics(router, bridges=[bridge]).collect() if f.name == name]
        return {tuple(sorted(s.labels.items())): s.value for s in family.samples}

    assert samples("mqttgw_bridge_address") == {
        (("address", FIRST), ("bridge", "up")): 1, (("address", SECOND), ("bridge", "up")): 0,
    }
    assert samples("mqttgw_bridge_fallback") == {
        (("address", FIRST), ("bridge", "up"), ("fallback", "try_private_off")): 1,
    }
    assert samples("mqttgw_bridge_connect_failures")[
        (("address", FIRST), ("bridge", "up"), ("reason", "refused"))
    ] == 1
    assert samples("mqttgw_bridge_clean_fallback") == {(("bridge", "up"),): 1}
    assert samples("mqttgw_bridge_down_seconds") == {(("bridge", "up"),): pytest.approx(5.5, abs=0.3)}
    values = SysTopics(router, reactor, 10, bridges=[bridge]).values()
    prefix = "$SYS/broker/bridge/up/"
    assert values[prefix + "link/address"] == FIRST
    assert values[prefix + "link/fallbacks"] == f"{FIRST}: try_private off"
    assert values[prefix + "link/clean_fallback"] == 1
    assert values[prefix + "link/failure"].startswith(f"{SECOND}: unreachable: ")
    assert cluster.run(SETTLE_SECONDS, lambda: on(bridge, FIRST))
    assert samples("mqttgw_bridge_down_seconds") == {(("bridge", "up"),): 0}
    assert SysTopics(router, reactor, 10, bridges=[bridge]).values()[prefix + "link/down"] == 0

"""
What an idle connection costs: the memory the gateway's own code holds
for each idle MQTT 3.1.1 client (its connection, parts, framer and
session; not the transport, which a test's fake is), measured with
tracemalloc over many of them, and the parts an idle client does without
until it needs them.
"""

import os
import tracemalloc

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

import mqttgw
from mqttgw.broker.session import NO_SUBSCRIPTIONS, made
from mqttgw.testing import FakeBroker, publishes
from mqttgw.transports.handshake import CLOSED
from mqttgw.wire import packets as P

CONNECTIONS = 1000
# Bytes the gateway's code holds per idle connection with a keepalive:
# 971 when this was written (1,611 before its parts were made on
# first use), with room for a slot or two.
BOUND = 1080


def idle_connection(broker, n):
    """A client connected with a keepalive, that does nothing more."""
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 10000 + n))
    protocol = broker.factory.buildProtocol(transport.getPeer())
    protocol.makeConnection(transport)
    protocol.dataReceived(P.Connect(client_id=f"idle-{n:05d}", keepalive=60).encode())
    broker.clock.advance(0)
    assert transport.value() == P.Connack(0).encode()
    transport.clear()
    return transport, protocol


def test_an_idle_connection_holds_at_most_its_bound_of_memory():
    broker = FakeBroker()
    # What the first connections make once (handler tables, caches) is not theirs.
    warm = [idle_connection(broker, n) for n in range(20)]
    own_code = tracemalloc.Filter(True, os.path.join(os.path.dirname(mqttgw.__file__), "*"))
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces([own_code])
        held = [idle_connection(broker, n) for n in range(20, 20 + CONNECTIONS)]
        after = tracemalloc.take_snapshot().filter_traces([own_code])
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert broker.router.stats.clients_connected == len(warm) + len(held)
    per_connection = grown / CONNECTIONS
    # Something is held: the measurement sees the connections.
    assert 500 < per_connection <= BOUND, per_connection


def test_an_idle_client_holds_no_publishing_part_no_session_parts_and_no_subscriptions_dictionary():
    broker = FakeBroker()
    _, protocol = idle_connection(broker, 1)
    session = protocol.session
    assert protocol.publishing is None and protocol.subscribing is None and protocol.login is None
    assert session.subscriptions is NO_SUBSCRIPTIONS
    assert all(made(session, part) is None for part in ("deliveries", "window", "outbox"))
    # What is read of them before they exist is what an empty one holds.
    assert session.connection is protocol
    assert session.queued == session.dropped == 0 and not session.inflight
    assert session.oldest_waiting() is None


def test_the_parts_are_made_when_a_client_first_subscribes_and_publishes():
    broker = FakeBroker()
    subscriber = broker.client(client_id="s")
    publisher = broker.client(client_id="p")
    assert subscriber.received() == [P.Connack(0)] and publisher.received() == [P.Connack(0)]
    subscriber.send(P.Subscribe(1, [("t", 1)]))
    assert subscriber.received() == [P.Suback(1, [1])]
    publisher.send(P.Publish("t", b"m", 1, message_id=7))
    # The publisher's first PUBLISH is acknowledged, and delivered.
    assert publisher.received() == [P.Puback(7)]
    delivered = publishes(subscriber.received())
    assert [(p.topic, p.payload, p.qos) for p in delivered] == [("t", b"m", 1)]
    assert publisher.protocol.publishing is not None
    session = subscriber.protocol.session
    assert made(session, "outbox") is not None and len(session.inflight) == 1
    subscriber.send(P.Puback(delivered[0].message_id))
    assert not session.inflight
    # Unsubscribed from everything: the dictionary goes again.
    subscriber.send(P.Unsubscribe(2, ["t"]))
    assert subscriber.received() == [P.Unsuback(2)]
    assert session.subscriptions is NO_SUBSCRIPTIONS



def client_without_keepalive(broker, n):
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 20000 + n))
    protocol = broker.factory.buildProtocol(transport.getPeer())
    protocol.makeConnection(transport)
    protocol.dataReceived(P.Connect(client_id=f"no-keepalive-{n}", keepalive=0).encode())
    broker.clock.advance(0)
    return transport, protocol


def test_clients_without_keepalive_keep_no_time_of_their_last_packet():
    broker = FakeBroker()
    clients = [client_without_keepalive(broker, n) for n in range(2)]
    broker.clock.advance(5)
    for transport, protocol in clients:
        transport.clear()
        protocol.dataReceived(P.Pingreq().encode())
        broker.clock.advance(0)
        assert transport.value() == P.PINGRESP_WIRE
    first, second = (protocol.reading.last_received for _, protocol in clients)
    # One 0.0 they share, not a float each.
    assert first == 0.0 and first is second


def test_a_client_with_keepalive_keeps_the_time_it_was_last_heard_from():
    broker = FakeBroker()
    transport, protocol = idle_connection(broker, 2)
    # Heard from at its CONNECT.
    assert protocol.reading.last_received == broker.clock.seconds()
    broker.clock.advance(30)
    protocol.dataReceived(P.Pingreq().encode())
    assert protocol.reading.last_received == broker.clock.seconds()
    # 1.5 times its keepalive (60 s) from then, not from its CONNECT.
    broker.clock.advance(60)
    assert protocol.state is not CLOSED
    broker.clock.advance(31)
    assert protocol.state is CLOSED

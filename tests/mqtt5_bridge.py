"""
An MQTT 5.0 bridge started in process on a MemoryReactorClock, the
upstream it dials played by tests/fake_network.py, and local 5.0 clients
of its router.
"""

import socket

from twisted.internet.address import IPv4Address

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.testing import FakeClient
from mqttgw.wire import packets as P
from tests.fake_network import Listener, accept

UPSTREAM = "127.0.0.1:1001"
REMOTE_STATE = f"$SYS/broker/connection/{socket.gethostname()}.up/state"


def start_bridge(router, reactor, rules=("t/# out 1",), **table):
    settings = MQTTBridgeKind.check(
        {"name": "up", "addresses": [UPSTREAM], "rules": list(rules), "protocol": "mqttv5", **table}
    )
    bridge = MQTTBridgeKind.make_service(router, settings, reactor)
    bridge.startService()
    return bridge


def upstream_connect(reactor):
    """The bridge's connection, seen from the upstream: its CONNECT."""
    upstream = accept(reactor)
    [connect] = upstream.received()
    # What follows the CONNECT is in 5.0's form.
    upstream._framer.v5 = True
    return upstream, connect


def connected(reactor, **connack_properties):
    upstream, _ = upstream_connect(reactor)
    upstream.send(P.Connack(0, properties=connack_properties))
    return upstream


def published(upstream):
    """The messages the bridge forwarded (its state topic aside)."""
    return [p for p in upstream.received() if isinstance(p, P.Publish) and p.topic != REMOTE_STATE]


def local5(router, reactor, client_id, **properties):
    """A local 5.0 client of the gateway, connected."""
    listener = Listener.of(router, reactor)
    client = FakeClient(listener, IPv4Address("TCP", "127.0.0.1", 40000 + len(router.sessions)))
    client.send(P.Connect(client_id=client_id, protocol_level=P.MQTT_5, properties=properties))
    [connack] = client.received()
    assert connack.return_code == 0
    return client

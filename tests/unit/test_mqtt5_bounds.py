"""
The bounds of what a 5.0 client can make the gateway hold, each stated in
the MQTT 5.0 guide (docs/guide/mqtt5.rst): user properties (a count per packet, their bytes within the
maximum packet size), topic aliases, subscription identifiers, shared
groups across the gateway and members of one group.
"""

import pytest

from mqttgw.testing import V5, FakeBroker, close_reason, connect5, connected
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.properties import MAX_USER_PROPERTIES


def suback_codes(client, mid, *filters, v5=True):
    if v5:
        client.send(P.Subscribe(mid, [(f, 1) for f in filters], {}))
    else:
        client.send(P.Subscribe(mid, [(f, 1) for f in filters]))
    [suback] = [p for p in client.received() if isinstance(p, P.Suback)]
    return suback.granted_qos


# User properties


def test_user_properties_up_to_the_count_bound_travel_in_order(broker):
    sub = connected(broker, "sub", version=V5)
    assert suback_codes(sub, 1, "t") == [1]
    pub = connected(broker, "pub", version=V5)
    pairs = [(f"k{i}", "v") for i in range(MAX_USER_PROPERTIES)]
    pub.send(P.Publish("t", b"x", 0, properties={"user_property": pairs}))
    [message] = [p for p in sub.received() if isinstance(p, P.Publish)]
    assert message.properties["user_property"] == pairs


def test_one_user_property_past_the_count_bound_is_an_implementation_specific_error(broker):
    pub = connected(broker, "pub", version=V5)
    pairs = [(f"k{i}", "v") for i in range(MAX_USER_PROPERTIES + 1)]
    pub.send(P.Publish("t", b"x", 0, properties={"user_property": pairs}))
    [disconnect] = pub.received()
    # A bound of this implementation, not of the standard: 0x83.
    assert disconnect.reason_code == R.IMPLEMENTATION_SPECIFIC_ERROR
    assert disconnect.properties["reason_string"] == "more than 256 user properties"
    assert pub.closed


def test_user_property_bytes_are_bounded_by_the_maximum_packet_size():
    broker = FakeBroker(max_packet_size=4096)
    pub = connected(broker, "pub", version=V5)
    # 16 properties of 300 bytes: each allowed, together too large.
    pairs = [(f"k{i}", "v" * 300) for i in range(16)]
    pub.send(P.Publish("t", b"x", 0, properties={"user_property": pairs}))
    [disconnect] = pub.received()
    assert disconnect.reason_code == R.PACKET_TOO_LARGE
    assert pub.closed


def test_a_connects_user_properties_are_bounded_by_max_connect_size(logged):
    broker = FakeBroker(max_connect_size=1024)
    client = broker.client(connect5("big", properties={"user_property": [("k", "v" * 2000)]}))
    # Refused before it is read whole: nothing held for it.
    assert client.received() == []
    assert close_reason(client, logged()) == "packet of 2026 bytes exceeds maximum CONNECT size 1024"
    assert "big" not in broker.router.sessions


# Topic aliases and subscription identifiers


def test_inbound_topic_aliases_are_bounded_by_max_topic_alias():
    broker = FakeBroker(max_topic_alias=3)
    pub = connected(broker, "pub", version=V5)
    assert pub.connack.properties["topic_alias_maximum"] == 3
    for alias in (1, 2, 3):
        pub.send(P.Publish(f"t/{alias}", b"x", 0, properties={"topic_alias": alias}))
    assert pub.received() == []
    pub.send(P.Publish("t/4", b"x", 0, properties={"topic_alias": 4}))
    [disconnect] = pub.received()
    assert disconnect.reason_code == R.TOPIC_ALIAS_INVALID


def test_outbound_aliases_are_bounded_by_the_servers_maximum_whatever_the_client_allows():
    broker = FakeBroker(max_topic_alias=2)
    sub = connected(broker, "sub", properties={"topic_alias_maximum": 65535}, version=V5)
    assert suback_codes(sub, 1, "t/#") == [1]
    pub = connected(broker, "pub")
    for i in range(5):
        pub.send(P.Publish(f"t/{i}", b"x", 0))
    aliases = [p.properties.get("topic_alias") for p in sub.received() if isinstance(p, P.Publish)]
    assert aliases == [1, 2, None, None, None]
    assert len(sub.protocol.dialect.connection5.aliases_out) == 2


def test_a_subscription_identifier_past_its_range_is_malformed(broker):
    sub = connected(broker, "sub", version=V5)
    # The largest a variable byte integer holds, 268,435,455, is accepted.
    sub.send(P.Subscribe(1, [("a", 1)], {"subscription_identifier": 268_435_455}))
    [suback] = sub.received()
    assert suback.granted_qos == [1]
    # 0 is not an identifier ([MQTT-3.8.2-...]: 1 to 268,435,455).
    sub.send(P.Subscribe(2, [("b", 1)], {"subscription_identifier": 0}))
    [disconnect] = sub.received()
    assert disconnect.reason_code in (R.PROTOCOL_ERROR, R.MALFORMED_PACKET)


# Shared subscriptions


def test_shared_groups_across_the_gateway_are_bounded(broker):
    broker.router.max_shared_groups = 2
    a = connected(broker, "a", version=V5)
    # The third group of one SUBSCRIBE is past the bound.
    assert suback_codes(a, 1, "$share/g1/x", "$share/g2/x", "$share/g3/x") == [1, 1, R.QUOTA_EXCEEDED]
    # Another client too, and a 3.1.1 one is told with 0x80.
    b = connected(broker, "b", version=V5)
    assert suback_codes(b, 1, "$share/g4/x") == [R.QUOTA_EXCEEDED]
    c = connected(broker, "c")
    assert suback_codes(c, 1, "$share/g4/x", v5=False) == [P.SUBACK_FAILURE]
    # Joining a group that exists is not making one.
    assert suback_codes(b, 2, "$share/g1/x") == [1]
    assert len(broker.router.shared) == 2
    # Once a group is gone, a new one may be made.
    a.send(P.Unsubscribe(3, ["$share/g2/x"], {}))
    a.received()
    assert suback_codes(c, 2, "$share/g4/x", v5=False) == [1]


def test_members_of_one_group_are_bounded(broker):
    broker.router.max_shared_group_members = 2
    members = [connected(broker, f"m{i}", version=V5) for i in range(3)]
    assert suback_codes(members[0], 1, "$share/g/x") == [1]
    assert suback_codes(members[1], 1, "$share/g/x") == [1]
    assert suback_codes(members[2], 1, "$share/g/x") == [R.QUOTA_EXCEEDED]
    # A member may subscribe again (it is one already).
    assert suback_codes(members[1], 2, "$share/g/x") == [1]
    members[0].send(P.Unsubscribe(3, ["$share/g/x"], {}))
    members[0].received()
    assert suback_codes(members[2], 2, "$share/g/x") == [1]
    assert broker.router.stats.subscriptions_refused == 1


def test_shared_bounds_are_configuration_keys():
    from mqttgw.service import config
    from mqttgw.service.build import build_router

    settings = config.build({"limits.max_shared_groups": 5, "limits.max_shared_group_members": 7}, {})
    router = build_router(settings, None)
    assert (router.max_shared_groups, router.max_shared_group_members) == (5, 7)

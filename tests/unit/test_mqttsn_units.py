"""
The MQTT-SN listener in-process, on a fake clock and a fake datagram
transport: its parts provide their declared interfaces, and the timing
rules (keep alive and sleep at 1.5 times, held deliveries on waking), the
bounds on half-open state and the no-amplification rule hold without a
test waiting on the wall clock.
"""

import random

import pytest
from zope.interface.verify import verifyObject

from mqttgw.broker.interfaces import IClientConnection, IFrames
from mqttgw.transports.mqttsn.client import ASLEEP, SnClient
from mqttgw.transports.mqttsn.frames import SnFrames
from mqttgw.transports.mqttsn.interfaces import ISnClient, ISnListener
from mqttgw.transports.mqttsn.options import parse_multicast
from mqttgw.transports.mqttsn.publishing import ISnPublishing
from mqttgw.transports.mqttsn.service import udp_address
from mqttgw.transports.mqttsn.subscribing import ISnSubscribing
from mqttgw.transports.mqttsn.topics import LAST_TOPIC_ID, MAX_TOPICS, TopicRegistry
from mqttgw.wire import mqttsn as S
from mqttgw.wire.mqttsn import constants as C
from mqttgw.wire import packets as P
from tests.mqttsn_listener import Listener


def test_the_listener_and_a_clients_parts_provide_their_interfaces():
    listener = Listener()
    client = listener.connect("c1")
    listener.send(S.Subscribe(1, "t", qos=0))
    assert verifyObject(ISnListener, listener.protocol)
    assert verifyObject(IClientConnection, client)
    assert verifyObject(ISnClient, client)
    assert verifyObject(IFrames, client.frames) and isinstance(client.frames, SnFrames)
    assert verifyObject(ISnPublishing, client.publishing)
    assert verifyObject(ISnSubscribing, client.subscribing)
    # The broker holds the client as its session's carrier, nothing else.
    assert client.session.connection is client and isinstance(client, SnClient)


def test_keepalive_at_one_and_a_half_times_then_lost_with_the_will_published():
    listener = Listener()
    watcher = listener.mqtt_subscriber("wills/#")
    listener.connect("k1", duration=10, will=("wills/k1", b"gone"))
    clock = listener.broker.clock
    clock.advance(14.9)
    assert ("127.0.0.1", 5000, None) in listener.protocol.clients
    assert [p for p in watcher.received() if isinstance(p, P.Publish)] == []
    clock.advance(0.2)
    assert listener.protocol.clients == {}
    [will] = [p for p in watcher.received() if isinstance(p, P.Publish)]
    assert (will.topic, will.payload) == ("wills/k1", b"gone")


def test_a_datagram_moves_the_keepalive_deadline():
    listener = Listener()
    listener.connect("k2", duration=10)
    clock = listener.broker.clock
    for _ in range(5):
        clock.advance(10)
        listener.send(S.Pingreq())
        assert listener.out() == [S.Pingresp()]
    assert ("127.0.0.1", 5000, None) in listener.protocol.clients


def test_a_sleeper_holds_deliveries_until_its_pingreq_and_is_lost_past_its_duration():
    listener = Listener()
    client = listener.connect("sleepy", duration=10, will=("wills/sleepy", b"lost"))
    listener.send(S.Subscribe(1, "news", qos=1))
    assert listener.out()[0].return_code == 0
    listener.send(S.Disconnect(100))
    assert listener.out() == [S.Disconnect()]
    assert client.state is ASLEEP
    publisher = listener.broker.client(client_id="pub")
    publisher.send(P.Publish("news", b"one", 1, message_id=1), P.Publish("news", b"two", 0))
    clock = listener.broker.clock
    clock.advance(60)
    assert listener.out() == []
    listener.send(S.Pingreq("sleepy"))
    woke = listener.out()
    # (QoS 0 and QoS 1 messages each in order; not one order between them.)
    assert sorted(m.data for m in woke if isinstance(m, S.Publish)) == [b"one", b"two"]
    assert S.Pingresp() not in woke
    [first] = [m for m in woke if isinstance(m, S.Publish) and m.qos == 1]
    listener.send(S.Puback(first.topic_id, first.message_id, 0))
    assert listener.out() == [S.Pingresp()]
    assert client.state is ASLEEP
    # Asleep again: 100 x 1.5 from its last datagram it is lost.
    watcher = listener.mqtt_subscriber("wills/#")
    clock.advance(149)
    assert client.state is ASLEEP
    clock.advance(2)
    assert ("127.0.0.1", 5000, None) not in listener.protocol.clients
    assert [p.payload for p in watcher.received() if isinstance(p, P.Publish)] == [b"lost"]


def test_a_wildcard_delivery_is_registered_first_and_held_until_regack():
    listener = Listener()
    listener.connect("w")
    listener.send(S.Subscribe(1, "s/+", qos=0))
    assert listener.out() == [S.Suback(0, 1, 0, 0)]
    listener.broker.client(client_id="p").send(P.Publish("s/a", b"x", 0), P.Publish("s/a", b"y", 0))
    [register] = listener.out()
    assert isinstance(register, S.Register) and register.topic_name == "s/a" and register.topic_id == 1
    listener.send(S.Regack(register.topic_id, register.message_id, 0))
    assert [m.data for m in listener.out()] == [b"x", b"y"]


def test_the_topic_registry_is_idempotent_bounded_and_below_0x8000():
    registry = TopicRegistry("c")
    assert registry.register("a/b") == registry.register("a/b") == 1
    ids = [registry.register(f"t/{n}") for n in range(MAX_TOPICS + 10)]
    assert ids.count(None) == 11 and max(i for i in ids if i) <= LAST_TOPIC_ID < 0x8000


def test_half_open_connects_are_bounded_and_expire():
    listener = Listener(max_half_open=8, half_open_timeout=5.0)
    for port in range(6000, 6100):
        listener.send(S.Connect(f"c{port}", 10, will=True), ("10.0.0.1", port))
    assert len(listener.protocol.login.waiting) == 8
    listener.broker.clock.advance(6)
    listener.send(S.Connect("late", 10, will=True), ("10.0.0.2", 1))
    assert list(listener.protocol.login.waiting) == [("10.0.0.2", 1, None)]
    assert listener.broker.router.stats.mqttsn_dropped >= 92


def test_no_unconnected_address_is_answered_with_more_bytes_than_it_sent():
    listener = Listener()
    rng = random.Random(56)
    sent = {}
    valid = [S.SearchGw(0).encode(), S.Connect("x", 5, will=True).encode(), S.Pingreq().encode(),
             S.Pingreq("nobody").encode(), S.Publish(1, b"", -1, topic_id_type=1).encode(),
             S.Subscribe(1, "a/#").encode(), S.Register(0, 1, "t").encode(), S.WillMsg(b"m").encode()]
    for n in range(3000):
        addr = ("192.0.2.1", 1000 + n % 300)
        if n % 3 == 0:
            data = rng.choice(valid)
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
            if n % 3 == 1:
                data = bytes((len(data),)) + data[1:]
        sent[addr] = sent.get(addr, 0) + len(data)
        listener.send(data, addr)
    answered = {}
    for data, addr in listener.transport.written:
        answered[addr] = answered.get(addr, 0) + len(data)
    # A CONNECT makes a client: only addresses that never completed one are held to it.
    connected = {(h, p) for h, p, _ in listener.protocol.clients} | {
        (h, p) for h, p, _ in listener.protocol.login.waiting
    }
    assert answered and all(answered[a] <= sent[a] for a in answered if a not in connected)


def test_a_forwarders_node_is_answered_through_the_forwarder_with_its_node_id():
    listener = Listener()
    node = b"\x01\x02\x03"
    listener.send(S.Encapsulated(S.Connect("node1", 30), node), ("127.0.0.1", 7000))
    [(data, addr)] = listener.transport.written
    answer = S.decode(data)
    assert addr == ("127.0.0.1", 7000)
    assert answer == S.Encapsulated(S.Connack(0), node)
    assert ("127.0.0.1", 7000, node) in listener.protocol.clients


@pytest.mark.parametrize(
    "text, expected",
    [("10000", ("", 10000)), ("127.0.0.1:2442", ("127.0.0.1", 2442)), ("[::1]:0", ("::1", 0)),
     ("udp:1884:interface=127.0.0.1", ("127.0.0.1", 1884))],
)
def test_listener_addresses_as_the_other_listeners_take_them(text, expected):
    assert udp_address(text) == expected


@pytest.mark.parametrize("text", ["tcp:1883", "host.example:1", "70000", "udp:1:backlog=3"])
def test_a_listener_address_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError):
        udp_address(text)


def test_the_multicast_setting_is_a_group_and_a_port():
    assert parse_multicast("") is None
    assert parse_multicast("225.1.1.1:1883") == ("225.1.1.1", 1883)
    for bad in ("10.0.0.1:1883", "225.1.1.1", "225.1.1.1:0"):
        with pytest.raises(ValueError):
            parse_multicast(bad)


def _mutations(rng, valid):
    data = bytearray(rng.choice(valid))
    for _ in range(rng.randrange(1, 4)):
        what = rng.randrange(4)
        if what == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif what == 1:
            data = data[: rng.randrange(len(data) + 1)]
        elif what == 2:
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        elif data:
            # A Length field that tells the truth about the damaged datagram.
            data[0] = len(data) if len(data) < 256 else data[0]
    return bytes(data)


def test_damaged_messages_from_connected_and_unconnected_addresses_raise_nothing():
    listener = Listener()
    listener.connect("fuzzed", addr=("127.0.0.1", 5000))
    listener.connect("other", addr=("127.0.0.1", 5001))
    listener.send(S.Subscribe(1, "#", qos=2), ("127.0.0.1", 5001))
    rng = random.Random(1256)
    valid = [m.encode() for m in (
        S.Register(0, 1, "a/b"), S.Publish(1, b"x", 1, message_id=2), S.Publish(1, b"x", 2, message_id=3),
        S.Publish(1, b"x", -1, topic_id_type=2), S.Pubrel(3), S.Puback(1, 1, 0), S.Pubrec(1), S.Pubcomp(1),
        S.Subscribe(4, "a/+", qos=1), S.Subscribe(5, topic_id=1, topic_id_type=1), S.Unsubscribe(6, "a/+"),
        S.Pingreq("fuzzed"), S.Disconnect(5), S.Disconnect(), S.WillTopicUpd("w", 1, True), S.WillMsgUpd(b"m"),
        S.Regack(1, 1, 0), S.Connect("fuzzed", 10, will=True), S.WillTopic("w/t", 1), S.WillMsg(b"w"),
        S.SearchGw(0), S.Encapsulated(S.Connect("n", 5), b"\x01"),
    )]
    for n in range(5000):
        port = rng.choice((5000, 5001, 5002, 6000 + n % 50))
        listener.send(_mutations(rng, valid), ("127.0.0.1", port))
        if n % 500 == 0:
            listener.broker.clock.advance(7)
    assert listener.broker.router.stats.mqttsn_dropped > 0


def test_the_admin_api_lists_an_mqtt_sn_client_as_such():
    from mqttgw.service.gateway import Gateway

    listener = Listener()
    listener.connect("listed", duration=30)
    gateway = Gateway(listener.broker.router, listener.broker.clock)
    [entry] = [c for c in gateway.clients() if c["client_id"] == "listed"]
    assert (entry["listener"], entry["protocol"], entry["address"], entry["keepalive"]) == (
        "mqttsn", "MQTT-SN 1.2", "127.0.0.1:5000", 30
    )
    assert listener.broker.router.stats.clients_mqttsn == 1


def test_mqtt_sn_clients_are_bounded_apart_from_the_stream_listeners_connections():
    from mqttgw.transports.protocol import ConnectionLimits

    listener = Listener()
    listener.protocol.limits = ConnectionLimits(max_connections=3)
    for port in range(4):
        listener.send(S.Connect(f"c{port}", 30), ("192.0.2.9", port + 1))
    answers = listener.out()
    assert answers == [S.Connack(0)] * 3 + [S.Connack(C.REJECTED_CONGESTION)]
    assert len(listener.protocol.clients) == 3
    # The TCP side's count is untouched: spoofed datagrams take no TCP client's place.
    assert listener.broker.router.stats.connections == 0


def test_what_a_sleeper_holds_is_bounded_by_the_session_limits_and_the_overflow_counted():
    from mqttgw.broker.session import SessionLimits

    listener = Listener()
    listener.broker.router.limits = SessionLimits(max_queued_messages=3)
    listener.connect("bounded", duration=10, clean=False)
    listener.send(S.Subscribe(1, "flood", qos=1))
    listener.out()
    listener.send(S.Disconnect(600))
    listener.out()
    publisher = listener.broker.client(client_id="flooder", keepalive=0)
    publisher.send(*[P.Publish("flood", b"%d" % n, 1, message_id=n + 1) for n in range(10)])
    session = listener.broker.router.sessions["bounded"]
    assert session.queued == 3 and session.dropped == 7
    listener.send(S.Pingreq("bounded"))
    assert [m.data for m in listener.out() if isinstance(m, S.Publish)] == [b"0", b"1", b"2"]


def test_a_client_connecting_again_from_its_address_with_a_will_gets_its_will_asked_for():
    listener = Listener()
    listener.connect("again", duration=30)
    listener.send(S.Disconnect(60))
    listener.out()
    client = listener.connect("again", duration=30, will=("wills/again", b"w"))
    assert client.session.will.topic == "wills/again"


def test_clients_from_one_address_are_bounded_and_counted_back_when_they_go():
    listener = Listener(max_clients_per_address=2)
    for port in (1, 2, 3):
        listener.send(S.Connect(f"h{port}", 30), ("198.51.100.7", port))
    assert listener.out() == [S.Connack(0), S.Connack(0), S.Connack(C.REJECTED_CONGESTION)]
    listener.send(S.Connect("elsewhere", 30), ("198.51.100.8", 1))
    assert listener.out() == [S.Connack(0)]
    listener.send(S.Disconnect(), ("198.51.100.7", 1))
    listener.out()
    listener.send(S.Connect("h3", 30), ("198.51.100.7", 3))
    assert listener.out() == [S.Connack(0)]
    assert listener.protocol.per_host == {"198.51.100.7": 2, "198.51.100.8": 1}


def test_qos_minus_one_is_read_against_the_acl_for_anonymous_or_the_listed_client_id():
    from mqttgw.security.mqttsn_clients import ClientList
    from mqttgw.security.predefined_topics import PredefinedTopics

    acl = ["topic read #", "topic write open/#", "user meter-9", "topic write meters/9/#"]
    predefined = PredefinedTopics.parse(["*, open/a, 1", "*, closed/a, 2", "*, meters/9/kwh, 3"])
    anonymous = Listener(acl=acl, qos_minus_one=True, predefined=predefined)
    watcher = anonymous.mqtt_subscriber("#")
    for topic_id in (1, 2, 3):
        anonymous.send(S.Publish(topic_id, b"%d" % topic_id, -1, topic_id_type=1), ("192.0.2.50", 9))
    assert [(p.topic, p.payload) for p in watcher.received() if isinstance(p, P.Publish)] == [("open/a", b"1")]
    assert anonymous.out() == []
    clients = ClientList.parse(["meter-9, 192.0.2.50:9, QoS-1"])
    listed = Listener(acl=acl, qos_minus_one=True, predefined=predefined, clients=clients)
    watcher = listed.mqtt_subscriber("#")
    for addr in (("192.0.2.50", 9), ("192.0.2.51", 9)):
        listed.send(S.Publish(3, b"as meter-9", -1, topic_id_type=1), addr)
    assert [(p.topic, p.payload) for p in watcher.received() if isinstance(p, P.Publish)] == [
        ("meters/9/kwh", b"as meter-9")
    ]
    off = Listener(predefined=predefined)
    watcher = off.mqtt_subscriber("#")
    off.send(S.Publish(1, b"off", -1, topic_id_type=1), ("192.0.2.50", 9))
    assert [p for p in watcher.received() if isinstance(p, P.Publish)] == []
    assert off.broker.router.stats.mqttsn_dropped == 1


def test_metrics_count_mqtt_sn_clients_by_protocol_and_their_dropped_datagrams():
    from mqttgw.web.metrics import Metrics

    listener = Listener()
    listener.connect("counted")
    listener.send(b"\x02\x99", ("192.0.2.1", 1))
    text = Metrics(listener.broker.router).text().decode()
    assert 'mqttgw_clients_by_protocol{protocol="MQTT-SN 1.2"} 1.0' in text
    assert "mqttgw_mqttsn_datagrams_dropped_total 1.0" in text


def test_a_sleep_shorter_than_the_keep_alive_is_watched_from_its_own_deadline():
    listener = Listener()
    quiet = listener.connect("quiet", duration=60)
    chatty = listener.connect("chatty", addr=("127.0.0.1", 5001), duration=60)
    listener.send(S.Disconnect(2))
    clock = listener.broker.clock
    for _ in range(4):
        clock.advance(1)
        listener.send(S.Pingreq(), ("127.0.0.1", 5001))
    # Lost within a second of 2 x 1.5, not at 60 x 1.5; the other one is there.
    assert quiet.state == "lost" and chatty.state == "active"
    clock.advance(95)
    assert chatty.state == "lost" and listener.protocol.watchdog.buckets == {}


def test_a_publish_is_taken_only_from_an_active_client_and_counted_dropped_otherwise():
    # A connected client's PUBLISH is read without a message object; from
    # a sleeper, with a reserved TopicIdType, or from an address not
    # connected, it goes where decode() sends it: dropped and counted.
    listener = Listener()
    stats = listener.broker.router.stats
    watcher = listener.mqtt_subscriber("ab")
    client = listener.connect("c1")
    short = S.short_topic_id("ab")
    listener.send(S.Publish(short, b"awake", topic_id_type=C.SHORT_TOPIC_NAME))
    assert [p.payload for p in watcher.received() if isinstance(p, P.Publish)] == [b"awake"]
    listener.send(bytes((10, C.PUBLISH, 0x03)) + short.to_bytes(2, "big") + b"\x00\x00" + b"bad")
    listener.send(S.Publish(short, b"stranger", topic_id_type=C.SHORT_TOPIC_NAME), ("127.0.0.1", 5999))
    assert stats.mqttsn_dropped == 2
    listener.send(S.Disconnect(100))
    assert listener.out() == [S.Disconnect()] and client.state is ASLEEP
    listener.send(S.Publish(short, b"asleep", topic_id_type=C.SHORT_TOPIC_NAME))
    assert stats.mqttsn_dropped == 3
    assert watcher.received() == []

"""
MQTT-SN registrations of persistent sessions in a real store (in a tmp
directory, committed when the test says): written as made and forgotten,
given back after a restart, gone with their session, and bounded.
"""

from mqttgw.testing import FakeBroker
from mqttgw.transports.mqttsn.kept import KeptTopics
from mqttgw.transports.mqttsn.listener import MqttSnProtocol
from mqttgw.transports.mqttsn.options import MqttSnOptions
from mqttgw.transports.mqttsn.topics import LAST_TOPIC_ID, MAX_TOPIC_BYTES, MAX_TOPICS, TopicRegistry
from mqttgw.wire import mqttsn as S
from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import constants as C
from tests.mqttsn_listener import FakeDatagramTransport, Listener

HERE = ("127.0.0.1", 5000)


class StoredListener(Listener):
    """A listener on a FakeBroker with a store in ``directory``, given what it held."""

    def __init__(self, directory, broker=None, **options):
        self.broker = broker if broker is not None else FakeBroker(store_dir=directory)
        options = MqttSnOptions(**options)
        kept = KeptTopics.restored(self.broker.router.store, options, self.broker.restored[1])
        self.protocol = MqttSnProtocol(self.broker.router, self.broker.clock, options, kept=kept)
        self.transport = FakeDatagramTransport()
        self.protocol.transport = self.transport

    def restart(self, **options):
        """SIGKILL: what is not committed is lost; a new broker and listener on the store."""
        return StoredListener(None, self.broker.restart(), **options)

    def register(self, name, mid=1, addr=HERE):
        self.send(S.Register(0, mid, name), addr)
        [regack] = self.out(addr)
        assert regack.return_code == C.ACCEPTED
        return regack.topic_id

    def stored(self):
        """client id -> {topic id: name}, as the store holds it committed."""
        return {s.client_id: s.topic_ids for s in self.broker.store.load()[1]}


def test_registrations_of_a_persistent_session_are_stored_and_given_back_after_a_restart(tmp_path):
    listener = StoredListener(tmp_path)
    listener.connect("p", clean=False)
    up = listener.register("p/up")
    # REGISTER before every PUBLISH: the same id, no new row.
    assert listener.register("p/up", mid=2) == up
    listener.send(S.Subscribe(3, "p/down", qos=1))
    [suback] = listener.out()
    down = suback.topic_id
    listener.send(S.Subscribe(4, "p/w/+", qos=0))
    listener.out()
    publisher = listener.broker.client(client_id="pub")
    publisher.send(P.Publish("p/w/yes", b"1", 0), P.Publish("p/w/no", b"2", 0))
    first, second = listener.out()
    # The gateway's REGISTERs: one acknowledged (stored), one refused (not).
    listener.send(S.Regack(first.topic_id, first.message_id, C.ACCEPTED))
    listener.send(S.Regack(second.topic_id, second.message_id, C.REJECTED_INVALID_TOPIC_ID))
    assert [m.data for m in listener.out()] == [b"1"]
    # A clean session's registrations are not stored.
    listener.connect("c", addr=("127.0.0.1", 5001))
    listener.register("c/up", addr=("127.0.0.1", 5001))
    listener.broker.commit()
    assert listener.stored() == {"p": {up: "p/up", down: "p/down", first.topic_id: "p/w/yes"}}

    listener = listener.restart()
    listener.connect("p", clean=False)
    listener.send(S.Publish(up, b"again", 1, message_id=5))
    assert listener.out() == [S.Puback(up, 5, C.ACCEPTED)]
    publisher = listener.broker.client(client_id="pub")
    publisher.send(P.Publish("p/w/yes", b"3", 0), P.Publish("p/down", b"4", 0))
    delivered = listener.out()
    assert [(m.topic_id, m.data) for m in delivered] == [(first.topic_id, b"3"), (down, b"4")]
    # A new registration does not take an old id.
    assert listener.register("p/new", mid=6) not in (up, down, first.topic_id)


def test_an_id_the_client_lost_is_deleted_and_a_clean_session_drops_them_all(tmp_path):
    listener = StoredListener(tmp_path)
    listener.connect("p", clean=False)
    listener.send(S.Subscribe(1, "p/a", qos=1))
    [suback] = listener.out()
    listener.register("p/b", mid=2)
    listener.broker.client(client_id="pub").send(P.Publish("p/a", b"x", 1, message_id=1))
    [delivered] = listener.out()
    listener.send(S.Puback(suback.topic_id, delivered.message_id, C.REJECTED_INVALID_TOPIC_ID))
    listener.broker.commit()
    assert list(listener.stored()["p"].values()) == ["p/b"]
    listener.send(S.Disconnect())
    listener.out()
    listener.connect("p", clean=True)
    listener.broker.commit()
    assert listener.stored() == {}
    listener = listener.restart()
    listener.connect("p", clean=False)
    listener.send(S.Publish(1, b"no id", 1, message_id=3))
    assert listener.out() == [S.Puback(1, 3, C.REJECTED_INVALID_TOPIC_ID)]


def test_a_gateway_register_left_unanswered_is_stored_once_the_client_is_back(tmp_path):
    listener = StoredListener(tmp_path)
    listener.connect("p", clean=False)
    listener.send(S.Subscribe(1, "p/+", qos=0))
    listener.out()
    listener.broker.client(client_id="pub").send(P.Publish("p/x", b"x", 0))
    [register] = listener.out()
    listener.send(S.Disconnect())
    listener.out()
    listener.broker.commit()
    assert listener.stored() == {"p": {}}
    # As before a restart: the id is taken as known when its session comes back.
    listener.connect("p", clean=False)
    listener.broker.commit()
    assert listener.stored() == {"p": {register.topic_id: "p/x"}}


def test_the_registrations_kept_for_sessions_away_are_bounded_in_memory_and_in_the_store(tmp_path):
    listener = StoredListener(tmp_path, max_kept_registries=2)
    for n in range(3):
        addr = ("127.0.0.1", 5000 + n)
        listener.connect(f"p{n}", addr=addr, clean=False)
        listener.register(f"t/{n}", addr=addr)
        listener.send(S.Disconnect(), addr)
        listener.out(addr)
    listener.broker.commit()
    assert list(listener.protocol.kept.registries) == ["p1", "p2"]
    assert listener.stored() == {"p0": {}, "p1": {1: "t/1"}, "p2": {1: "t/2"}}
    # Fewer kept after a restart: the store lets go of the others too.
    listener = listener.restart(max_kept_registries=1)
    assert len(listener.protocol.kept.registries) == 1
    listener.broker.commit()
    assert sum(1 for ids in listener.stored().values() if ids) == 1


def test_a_registry_restored_from_the_store_keeps_its_bounds():
    registry = TopicRegistry("r")
    names = {n + 1: f"n/{n}" for n in range(MAX_TOPICS + 5)}
    names[0] = "zero"
    names[LAST_TOPIC_ID + 1] = "too high"
    registry.restore(names)
    assert len(registry) == MAX_TOPICS and registry.size <= MAX_TOPIC_BYTES
    assert "zero" not in registry.ids and "too high" not in registry.ids
    assert registry.topic_name(C.NORMAL_TOPIC_ID, 1) == "n/0"
    assert registry.register("new") is None
    big = TopicRegistry("b")
    big.restore({1: "x" * MAX_TOPIC_BYTES, 2: "y", 3: "x" * MAX_TOPIC_BYTES})
    assert big.names == {1: "x" * MAX_TOPIC_BYTES}

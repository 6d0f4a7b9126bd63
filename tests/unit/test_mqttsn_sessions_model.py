"""
MQTT-SN sessions against a model, in-process (a FakeBroker with a real
store, a fake datagram transport, a fake clock): after any sequence of
connects from a few addresses, registrations, subscriptions, publishes
at QoS -1 to 2 (from MQTT-SN clients and an MQTT client), acks, sleep,
wake, address changes, time passing and kills with restarts, nothing
acknowledged to its publisher is lost for a persistent session
subscribed to it, no datagram to an address carries a delivery for a
client other than the one connected from it, and a client back with its
persistent session present publishes at once on the ids it registered
(committed ones, after a restart).
"""

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mqttgw.broker.session import SessionLimits
from mqttgw.broker.topics import matches
from mqttgw.security.predefined_topics import PredefinedTopics
from mqttgw.testing import FakeBroker
from mqttgw.transports.mqttsn.kept import KeptTopics
from mqttgw.transports.mqttsn.listener import MqttSnProtocol
from mqttgw.transports.mqttsn.options import MqttSnOptions
from mqttgw.wire import mqttsn as S
from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import constants as C
from tests.mqttsn_listener import FakeDatagramTransport

CLIENT_IDS = ["s1", "s2"]
ADDRESSES = [("127.0.0.1", 5001), ("127.0.0.1", 5002), ("127.0.0.2", 5001)]
# Each client's topics are its own: a delivery's payload names the topic,
# so the client it is for.  Short names ("k1") and pre-defined ids too.
SHORT = {"s1": "k1", "s2": "k2"}
PREDEFINED_ID = {"s1": 11, "s2": 12}
KEEPALIVE = 60
RETRY = 20.0


def topics_of(client_id):
    return [f"to/{client_id}/a", f"to/{client_id}/b", SHORT[client_id], f"to/{client_id}/p"]


def filters_of(client_id):
    return [f"to/{client_id}/a", f"to/{client_id}/+", f"to/{client_id}/#", SHORT[client_id]]


ALL_TOPICS = [t for c in CLIENT_IDS for t in topics_of(c)]
PREDEFINED_LINES = [f"{c}, to/{c}/p, {PREDEFINED_ID[c]}" for c in CLIENT_IDS]


def owner_of_topic(topic):
    for client_id in CLIENT_IDS:
        if topic in topics_of(client_id):
            return client_id
    raise AssertionError(f"a delivery on a topic no client has: {topic!r}")


def payload_topic(data):
    """The topic a delivery's payload names (every payload is b"TOPIC|N")."""
    return data.split(b"|", 1)[0].decode()


class SnSessions(RuleBasedStateMachine):
    @initialize(
        qos=st.lists(st.integers(0, 2), min_size=2, max_size=2),
        kinds=st.lists(st.integers(0, 4), min_size=2, max_size=2),
        committed=st.booleans(),
    )
    def start(self, qos, kinds, committed):
        self.directory = tempfile.mkdtemp(prefix="mqttgw-snmodel-")
        self.limits = SessionLimits(
            max_inflight_messages=4, max_queued_messages=10_000, max_queued_bytes=1 << 24, retry_interval=RETRY
        )
        self.broker = None
        self.use(FakeBroker(self.limits, store_dir=self.directory))
        self.next_payload = 0
        self.next_mid = 0
        # The model.  Persistent sessions (client id -> {(filter, granted qos)}),
        # as acknowledged and as committed.
        self.persistent = {}
        self.committed = {}
        # The ids each persistent session's client registered (name -> id),
        # as acknowledged and as committed.
        self.known = {}
        self.known_committed = {}
        # Messages acknowledged to their publisher that each client id must get.
        self.expected = {c: set() for c in CLIENT_IDS}
        # Payloads each client id was ever delivered.
        self.received = {c: set() for c in CLIENT_IDS}
        # Each client with a persistent session subscribed to its topics (often enough to matter).
        for client_id, addr, granted, kind in zip(CLIENT_IDS, ADDRESSES, qos, kinds):
            self.connect(client_id, addr, clean=False)
            self.subscribe(ADDRESSES.index(addr), kind=kind, qos=granted)
        if committed:
            self.commit()

    def use(self, broker):
        """A (new) broker and a new listener on it: nobody is connected."""
        self.broker = broker
        broker.router.persistent_client_expiration = None
        self.options = MqttSnOptions(
            qos_minus_one=True, predefined=PredefinedTopics.parse(PREDEFINED_LINES)
        )
        kept = KeptTopics.restored(broker.router.store, self.options, broker.restored[1])
        self.listener = MqttSnProtocol(broker.router, broker.clock, self.options, kept=kept)
        self.transport = FakeDatagramTransport()
        self.listener.transport = self.transport
        self.mqtt = broker.client(client_id="mqtt-pub", keepalive=0)
        self.mqtt.received()
        # address -> client id connected from it (as its answers showed).
        self.owner = {}
        # address -> messages received and not yet answered.
        self.inbox = {a: [] for a in ADDRESSES}
        # address -> the client id's topic ids it registered: name -> id.
        self.registered = {a: {} for a in ADDRESSES}
        # (address, message id) -> (payload, targets) of an SN publish
        # waiting for its PUBACK / PUBCOMP; the same for the MQTT client.
        self.unacked = {}
        self.mqtt_unacked = {}

    def teardown(self):
        try:
            if getattr(self, "listener", None) is not None:
                # At the end of every run, each client collects what it must have.
                for client_id in CLIENT_IDS:
                    self.drain(client_id)
        finally:
            if getattr(self, "broker", None) is not None:
                self.broker.close()
            if getattr(self, "directory", None) is not None:
                shutil.rmtree(self.directory, ignore_errors=True)

    # The wire

    def send(self, message, addr):
        self.listener.datagramReceived(message.encode(), addr)
        self.broker.clock.advance(0)
        self.pump()

    def pump(self, connecting=None):
        """
        Read what the gateway wrote, in order: an owner learnt from a
        CONNACK (``connecting``: (address, client id, clean)); deliveries
        checked against the address's owner.
        """
        written, self.transport.written = self.transport.written, []
        for data, addr in written:
            message = S.decode(data)
            if connecting is not None and addr == connecting[0] and isinstance(message, S.Connack):
                if message.return_code == C.ACCEPTED:
                    self.connected(*connecting)
                connecting = None
            if isinstance(message, S.Publish):
                topic = payload_topic(message.data)
                assert self.owner.get(addr) == owner_of_topic(topic), (
                    f"a delivery on {topic} to {addr}, whose client is {self.owner.get(addr)}"
                )
                self.received[self.owner[addr]].add(message.data)
            if addr in self.inbox:
                self.inbox[addr].append(message)
            self.answered(addr, message)

    def connected(self, addr, client_id, clean):
        for where, who in list(self.owner.items()):
            if who == client_id or where == addr:
                del self.owner[where]
        self.owner[addr] = client_id
        self.inbox[addr] = []
        present = not clean and client_id in self.persistent
        if not present:
            self.known.pop(client_id, None)
        # Its session's registrations come back with it.
        self.registered[addr] = dict(self.known.get(client_id, {}))
        if clean:
            self.persistent.pop(client_id, None)
            self.expected[client_id] = set()
            for _, targets in list(self.unacked.values()) + list(self.mqtt_unacked.values()):
                targets.discard(client_id)
        else:
            self.persistent.setdefault(client_id, set())

    def moved(self, addr, client_id):
        old = [where for where, who in self.owner.items() if who == client_id]
        for where in old:
            del self.owner[where]
            self.registered[addr] = self.registered[where]
            self.registered[where] = {}
        self.owner[addr] = client_id

    def answered(self, addr, message):
        """An acknowledgement of an MQTT-SN client's publish: its message must arrive."""
        assert not (isinstance(message, S.Puback) and message.return_code == C.REJECTED_INVALID_TOPIC_ID), (
            f"{self.owner.get(addr)} at {addr} published on topic id {message.topic_id}, which it registered"
            f" ({self.registered[addr]}), and the gateway knows it not"
        )
        if isinstance(message, S.Puback) and message.return_code == C.ACCEPTED:
            self.acknowledged(self.unacked.pop((addr, message.message_id), None))
        elif isinstance(message, S.Pubcomp):
            self.acknowledged(self.unacked.pop((addr, message.message_id), None))
        elif isinstance(message, S.Pubrec) and (addr, message.message_id) in self.unacked:
            self.listener.datagramReceived(S.Pubrel(message.message_id).encode(), addr)

    def acknowledged(self, entry):
        if entry is None:
            return
        payload, targets = entry
        for client_id in targets:
            self.expected[client_id].add(payload)

    def targets(self, topic, qos):
        """The persistent sessions a QoS ``qos`` message on ``topic`` must reach once acknowledged."""
        if qos < 1:
            return set()
        return {
            client_id
            for client_id, subscriptions in self.persistent.items()
            if any(granted >= 1 and matches(f, topic) for f, granted in subscriptions)
        }

    def payload(self, topic):
        self.next_payload += 1
        return b"%s|%d" % (topic.encode(), self.next_payload)

    def mid(self):
        self.next_mid = self.next_mid % 0x7FFF + 1
        return self.next_mid

    def address_of(self, client_id):
        for addr, who in self.owner.items():
            if who == client_id:
                return addr
        return None

    # Connections

    @rule(client_id=st.sampled_from(CLIENT_IDS), addr=st.sampled_from(ADDRESSES),
          clean=st.sampled_from([False, False, True]))
    def connect(self, client_id, addr, clean):
        self.listener.datagramReceived(S.Connect(client_id, KEEPALIVE, clean_session=clean).encode(), addr)
        self.broker.clock.advance(0)
        self.pump(connecting=(addr, client_id, clean))

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3), duration=st.sampled_from([None, 30, 600]))
    def disconnect_or_sleep(self, which, duration):
        addr = sorted(self.owner)[which % len(self.owner)]
        self.send(S.Disconnect(duration), addr)
        if duration is None:
            self.owner.pop(addr, None)

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3))
    def wake(self, which):
        addr = sorted(self.owner)[which % len(self.owner)]
        self.send(S.Pingreq(self.owner[addr]), addr)

    @precondition(lambda self: self.owner and len(self.owner) < len(ADDRESSES))
    @rule(which=st.integers(0, 3), to=st.integers(0, 3), by_connect=st.booleans())
    def address_changes(self, which, to, by_connect):
        """A client comes back from an address nobody has (NAT rebinding, a new route)."""
        client_id = self.owner[sorted(self.owner)[which % len(self.owner)]]
        free = [a for a in ADDRESSES if a not in self.owner]
        addr = free[to % len(free)]
        if by_connect:
            self.listener.datagramReceived(S.Connect(client_id, KEEPALIVE, clean_session=False).encode(), addr)
            self.broker.clock.advance(0)
            self.pump(connecting=(addr, client_id, False))
        else:
            self.listener.datagramReceived(S.Pingreq(client_id).encode(), addr)
            self.broker.clock.advance(0)
            # It moves if the gateway still had it (not lost in silence), and then it is answered:
            # what was held for it, a REGISTER first if need be, or PINGRESP.
            there = self.listener.clients.get((addr[0], addr[1], None))
            if there is None:
                assert not any(where == addr for _, where in self.transport.written)
            else:
                assert there.client_id == client_id
                self.moved(addr, client_id)
                if not any(where == addr for _, where in self.transport.written):
                    # A stored QoS 2 delivery goes once its message id is committed.
                    self.broker.commit()
                    self.committed = {c: set(s) for c, s in self.persistent.items()}
                    self.known_committed = {c: dict(ids) for c, ids in self.known.items()}
                    self.mqtt_reads()
                assert any(where == addr for _, where in self.transport.written), (
                    f"no answer to the PINGREQ of {client_id}, moved to {addr}"
                )
            self.pump()

    # Topics

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3), whose=st.sampled_from(CLIENT_IDS), topic=st.integers(0, 1))
    def register(self, which, whose, topic):
        addr = sorted(self.owner)[which % len(self.owner)]
        name = topics_of(whose)[topic]
        mid = self.mid()
        self.send(S.Register(0, mid, name), addr)
        for message in self.inbox[addr]:
            if isinstance(message, S.Regack) and message.message_id == mid and message.return_code == 0:
                self.registered[addr][name] = message.topic_id
                if self.owner.get(addr) in self.persistent:
                    self.known.setdefault(self.owner[addr], {})[name] = message.topic_id

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3), kind=st.integers(0, 4), qos=st.integers(0, 2))
    def subscribe(self, which, kind, qos):
        addr = sorted(self.owner)[which % len(self.owner)]
        client_id = self.owner[addr]
        mid = self.mid()
        if kind < 3:
            # A name, a "+" and a "#" wildcard.
            topic_filter = filters_of(client_id)[kind]
            message = S.Subscribe(mid, topic_filter, qos=qos)
        elif kind == 3:
            topic_filter = SHORT[client_id]
            message = S.Subscribe(mid, topic_filter, qos=qos, topic_id_type=C.SHORT_TOPIC_NAME)
        else:
            topic_filter = f"to/{client_id}/p"
            message = S.Subscribe(mid, topic_id=PREDEFINED_ID[client_id], qos=qos,
                                  topic_id_type=C.PREDEFINED_TOPIC_ID)
        self.send(message, addr)
        subacks = [m for m in self.inbox[addr] if isinstance(m, S.Suback) and m.message_id == mid]
        if not subacks:
            # The gateway lost it (silent past its keep alive) or it sleeps.
            return
        [suback] = subacks
        assert suback.return_code == C.ACCEPTED
        if client_id in self.persistent:
            subscriptions = self.persistent[client_id]
            subscriptions -= {s for s in subscriptions if s[0] == topic_filter}
            subscriptions.add((topic_filter, suback.qos))

    # Publishing

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3), topic=st.integers(0, 3), qos=st.integers(0, 2),
          whose=st.sampled_from(CLIENT_IDS))
    def sn_publishes(self, which, topic, qos, whose):
        """A connected client publishes (on a topic of ``whose``'s) by registered id, short name or pre-defined id."""
        addr = sorted(self.owner)[which % len(self.owner)]
        name = topics_of(whose)[topic]
        if topic < 2:
            if name not in self.registered[addr]:
                # As a client does: REGISTER first.
                self.register(sorted(self.owner).index(addr), whose, topic)
            topic_id = self.registered[addr].get(name)
            if topic_id is None:
                return
            kind = C.NORMAL_TOPIC_ID
        elif topic == 2:
            topic_id, kind = S.short_topic_id(name), C.SHORT_TOPIC_NAME
        else:
            if whose != self.owner[addr]:
                return
            topic_id, kind = PREDEFINED_ID[whose], C.PREDEFINED_TOPIC_ID
        mid = self.mid() if qos > 0 else 0
        payload = self.payload(name)
        if qos > 0:
            self.unacked[(addr, mid)] = (payload, self.targets(name, qos))
        self.send(S.Publish(topic_id, payload, qos, message_id=mid, topic_id_type=kind), addr)

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3), topic=st.integers(0, 3), qos=st.integers(1, 2),
          whose=st.sampled_from(CLIENT_IDS))
    def sn_publishes_to_be_kept(self, which, topic, qos, whose):
        """(As ``sn_publishes``, at QoS 1 and 2 only: the messages that matter here, more often.)"""
        self.sn_publishes(which, topic, qos, whose)

    @rule(whose=st.sampled_from(CLIENT_IDS), addr=st.sampled_from(ADDRESSES))
    def qos_minus_one(self, whose, addr):
        """A publish on a short name from an address, connected or not; nothing to acknowledge."""
        if addr in self.owner:
            return
        name = SHORT[whose]
        self.send(S.Publish(S.short_topic_id(name), self.payload(name), -1, topic_id_type=C.SHORT_TOPIC_NAME),
                  addr)

    @rule(topic=st.sampled_from(ALL_TOPICS), qos=st.integers(0, 2), count=st.integers(1, 3))
    def mqtt_publishes(self, topic, qos, count):
        self.mqtt_publish(topic, qos, count)

    @rule(topic=st.sampled_from(ALL_TOPICS), qos=st.integers(1, 2), count=st.integers(1, 8))
    def mqtt_publishes_to_be_kept(self, topic, qos, count):
        """(As ``mqtt_publishes``, at QoS 1 and 2 only: the messages that matter here, more often.)"""
        self.mqtt_publish(topic, qos, count)

    def mqtt_publish(self, topic, qos, count):
        for _ in range(count):
            mid = self.mid() if qos else None
            payload = self.payload(topic)
            if qos:
                self.mqtt_unacked[mid] = (payload, self.targets(topic, qos))
            self.mqtt.send(P.Publish(topic, payload, qos, message_id=mid))
            self.mqtt_reads()
            self.pump()

    def mqtt_reads(self):
        for packet in self.mqtt.received():
            if isinstance(packet, P.Puback):
                self.acknowledged(self.mqtt_unacked.pop(packet.message_id, None))
            elif isinstance(packet, P.Pubrec):
                self.mqtt.send(P.Pubrel(packet.message_id))
            elif isinstance(packet, P.Pubcomp):
                self.acknowledged(self.mqtt_unacked.pop(packet.message_id, None))

    # Acknowledging deliveries

    @precondition(lambda self: self.owner)
    @rule(which=st.integers(0, 3), how_many=st.sampled_from([1, 3, 100]))
    def acknowledge(self, which, how_many):
        addr = sorted(self.owner)[which % len(self.owner)]
        self.answer(addr, how_many)

    def answer(self, addr, how_many=100):
        due, self.inbox[addr] = self.inbox[addr][:how_many], self.inbox[addr][how_many:]
        for message in due:
            if isinstance(message, S.Publish) and message.qos == 1:
                reply = S.Puback(message.topic_id, message.message_id, C.ACCEPTED)
            elif isinstance(message, S.Publish) and message.qos == 2:
                reply = S.Pubrec(message.message_id)
            elif isinstance(message, S.Pubrel):
                reply = S.Pubcomp(message.message_id)
            elif isinstance(message, S.Register):
                reply = S.Regack(message.topic_id, message.message_id, C.ACCEPTED)
            else:
                continue
            self.send(reply, addr)
        return bool(due)

    # Time, the store, the process

    @rule(seconds=st.sampled_from([1.0, RETRY, 100.0, 1000.0]))
    def time_passes(self, seconds):
        self.broker.clock.advance(seconds)
        self.mqtt_reads()
        self.pump()

    @rule()
    def commit(self):
        self.broker.commit()
        self.committed = {c: set(s) for c, s in self.persistent.items()}
        self.known_committed = {c: dict(ids) for c, ids in self.known.items()}
        self.mqtt_reads()
        self.pump()

    @rule()
    def kill_and_restart(self):
        """SIGKILL: what was not committed is lost; a new process and listener on the store."""
        self.persistent = {c: set(s) for c, s in self.committed.items()}
        self.known = {c: dict(ids) for c, ids in self.known_committed.items() if c in self.persistent}
        for client_id in CLIENT_IDS:
            if client_id not in self.persistent:
                self.expected[client_id] = set()
        self.use(self.broker.restart())

    # Nothing acknowledged lost

    @rule(client_id=st.sampled_from(CLIENT_IDS))
    def collect(self, client_id):
        self.drain(client_id)

    def drain(self, client_id):
        """
        The client comes back (CONNECT, clean session 0) and acknowledges
        everything until what it must get has come.
        """
        addr = self.address_of(client_id) or ADDRESSES[CLIENT_IDS.index(client_id)]
        self.listener.datagramReceived(S.Connect(client_id, KEEPALIVE, clean_session=False).encode(), addr)
        self.broker.clock.advance(0)
        self.pump(connecting=(addr, client_id, False))
        assert self.owner.get(addr) == client_id
        for _ in range(200):
            if self.expected[client_id] <= self.received[client_id]:
                break
            if not self.answer(addr):
                # Nothing came: what is in flight goes again after the retry interval.
                self.broker.clock.advance(RETRY)
                self.send(S.Pingreq(), addr)
        missing = self.expected[client_id] - self.received[client_id]
        assert not missing, f"acknowledged to their publisher, never delivered to {client_id}: {sorted(missing)}"

    @invariant()
    def an_answer_goes_only_to_its_owner(self):
        # Checked in pump() datagram by datagram; here, that the tables agree.
        for addr, client_id in self.owner.items():
            client = self.listener.clients.get((addr[0], addr[1], None))
            assert client is None or client.client_id == client_id


SnSessions.TestCase.settings = settings(
    max_examples=600,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_mqttsn_sessions_against_a_model = SnSessions.TestCase


def test_a_register_unanswered_as_the_client_fell_asleep_is_sent_again_when_it_wakes():
    """
    The model's first find: a wildcard delivery waits for the REGACK of a
    REGISTER the client missed as it went to sleep; on waking (here from
    a new address) it was sent nothing at all, its QoS 0 message held for
    ever.  The REGISTER goes again, then the message, then PINGRESP.
    """
    from tests.mqttsn_listener import Listener

    listener = Listener()
    listener.connect("dozy", duration=60)
    listener.send(S.Subscribe(1, "news/+", qos=0))
    assert listener.out() == [S.Suback(0, 1, C.ACCEPTED, 0)]
    listener.broker.client(client_id="p").send(P.Publish("news/a", b"held", 0))
    [register] = listener.out()
    assert isinstance(register, S.Register) and register.topic_name == "news/a"
    listener.send(S.Disconnect(300))
    assert listener.out() == [S.Disconnect()]
    moved = ("127.0.0.1", 5009)
    listener.send(S.Pingreq("dozy"), moved)
    [again] = listener.out(moved)
    assert (again.topic_id, again.topic_name) == (register.topic_id, "news/a")
    listener.send(S.Regack(again.topic_id, again.message_id, C.ACCEPTED), moved)
    [delivered, pingresp] = listener.out(moved)
    assert delivered.data == b"held" and pingresp == S.Pingresp()

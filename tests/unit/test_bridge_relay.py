"""
What the bridge's session writes, as the upstream receives it: topics
rewritten by the out rules, frames whose topic stays passed on unchanged,
first sends counted and archived, and nothing an out rule does not take.
"""

from types import SimpleNamespace

from mqttgw.bridges.bridge import MQTTBridge, MQTTBridgeKind
from mqttgw.bridges.relay import Relay
from mqttgw.bridges.versions import upstream_version
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer


class Upstream:
    def __init__(self):
        self.data = []

    def write(self, data):
        self.data.append(data)

    def packets(self):
        return list(Framer(1 << 20).feed(b"".join(self.data)))


class Recorder:
    def __init__(self):
        self.rows = []

    def record(self, direction, client_id, message, listener=""):
        self.rows.append((direction, client_id, listener, message.topic, message.payload, message.qos))


def relay(*rules, recorder=None):
    bridge = MQTTBridge.__new__(MQTTBridge)
    bridge.settings = MQTTBridgeKind.check({"name": "up", "addresses": ["127.0.0.1:1"], "rules": list(rules)})
    bridge.router = SimpleNamespace(recorder=recorder)
    bridge.sent = 0
    bridge.version = upstream_version(bridge.settings)
    upstream = Upstream()
    return bridge, upstream, Relay(bridge, upstream)


def test_a_topic_kept_upstream_goes_on_as_it_was_framed():
    bridge, upstream, r = relay("sensors/# out 1")
    frame = P.Publish("sensors/a", b"21.5", 1, message_id=7).encode()
    r.write(frame)
    assert upstream.data == [frame]
    assert bridge.sent == 1


def test_prefixes_are_rewritten_with_the_rest_of_the_frame_intact():
    bridge, upstream, r = relay('sensors/# out 1 site/ field/site-7/')
    long_payload = b"x" * 300  # a two-byte Remaining Length either side
    r.write(P.Publish("site/sensors/a", long_payload, 1, True, message_id=9).encode())
    r.write(P.Publish("site/sensors/b", b"2", 2, message_id=10).encode())
    assert upstream.packets() == [
        P.Publish("field/site-7/sensors/a", long_payload, 1, True, False, 9),
        P.Publish("field/site-7/sensors/b", b"2", 2, False, False, 10),
    ]


def test_topics_no_out_rule_takes_are_not_sent_and_other_packets_pass():
    bridge, upstream, r = relay("sensors/# out 1", "commands/# in 1")
    r.write(
        P.Publish("commands/x", b"no", 1, message_id=1).encode()
        + P.Pubrel(2).encode()
        + P.Publish("sensors/é", b"yes", 1, message_id=3).encode()
    )
    assert upstream.packets() == [P.Pubrel(2), P.Publish("sensors/é", b"yes", 1, False, False, 3)]
    assert bridge.sent == 1


def test_a_resend_is_not_counted_or_archived_again():
    recorder = Recorder()
    bridge, upstream, r = relay("a/# out 1 l/ r/", recorder=recorder)
    message = P.Publish("l/a/1", b"v", 1)
    r.write(message.frame(1, 5))
    r.write(message.frame(1, 5, dup=True))
    assert bridge.sent == 1
    assert recorder.rows == [("bridge_out", "up", "bridge", "r/a/1", b"v", 1)]
    assert [p.dup for p in upstream.packets()] == [False, True]
    # QoS 0 has no message id before its payload; kept topics are archived too.
    r.write(P.Publish("l/a/2", b"w", 0).encode() + P.Publish("a/kept", b"x", 0).encode())
    assert recorder.rows[1:] == [("bridge_out", "up", "bridge", "r/a/2", b"w", 0)]


def test_routes_are_remembered_up_to_a_bound():
    bridge, upstream, r = relay("t/# out 0")
    r.ROUTES = 3
    for i in range(10):
        r.write(P.Publish(f"t/{i}", b"", 0).encode())
    assert len(r._routes) <= 3
    assert [p.topic for p in upstream.packets()] == [f"t/{i}" for i in range(10)]

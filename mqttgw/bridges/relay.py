"""
The bridge session's connection: the frames the session writes go
upstream, their topics rewritten by the out rules.
"""

from zope.interface import implementer

from mqttgw.bridges.deaths import node_topic
from mqttgw.broker.interfaces import ISessionCarrier
from mqttgw.wire import packets as P


@implementer(ISessionCarrier)
class Relay:
    """
    The bridge session's connection: PUBLISH and PUBREL packets the session
    sends go upstream, topics rewritten by the out rules.

    The session writes whole frames, so only their headers are read here;
    a frame whose topic stays the same upstream goes on as it is.  A 5.0
    frame's topic is where a 3.1.1 frame's is, its properties after it.
    """

    # Topics whose route is remembered, at most (then it starts over).
    ROUTES = 10_000

    def __init__(self, bridge, upstream):
        self.bridge = bridge
        self.upstream = upstream
        # The version spoken upstream, which reads back what was sent.
        self.version = bridge.version
        # Local topic (wire bytes) -> remote topic (wire bytes), or None
        # when no out rule takes it.
        self._routes = {}
        # Local topic (wire bytes) of an edge node's NBIRTH or NDEATH ->
        # (its kind, local NDEATH topic, remote NDEATH topic), while the
        # bridge carries Sparkplug deaths upstream (bridges.deaths).
        self._nodes = {}
        self._deaths = getattr(bridge, "deaths", None)

    def _route(self, topic_wire):
        topic = topic_wire[2:].decode("utf-8")
        rule = self.bridge.out_rule(topic)
        route = None if rule is None else P.encode_string(rule.to_remote(topic))
        if len(self._routes) >= self.ROUTES:
            self._routes.clear()
            self._nodes.clear()
        if route is not None and self._deaths is not None:
            self._node(topic_wire, topic)
        self._routes[topic_wire] = route
        return route

    def _node(self, topic_wire, topic):
        node = node_topic(topic)
        if node is None:
            return
        kind, death = node
        rule = self.bridge.out_rule(death)
        if rule is not None:
            self._nodes[topic_wire] = (kind, death, rule.to_remote(death))

    def write(self, data):
        out = []
        o, end = 0, len(data)
        while o < end:
            first = data[o]
            body, length = P.decode_remaining_length(data, o + 1)
            stop = body + length
            if first >> 4 != P.PUBLISH:
                out.append(data[o:stop])
                o = stop
                continue
            topic_end = body + 2 + ((data[body] << 8) | data[body + 1])
            topic_wire = data[body:topic_end]
            routes = self._routes
            remote = routes[topic_wire] if topic_wire in routes else self._route(topic_wire)
            if remote is None:
                o = stop
                continue
            if remote == topic_wire:
                frame = data[o:stop]
            else:
                rest = data[topic_end:stop]
                frame = b"".join((
                    bytes((first,)), P.encode_remaining_length(len(remote) + len(rest)), remote, rest,
                ))
            out.append(frame)
            if topic_wire in self._nodes:
                kind, local, remote_death = self._nodes[topic_wire]
                qos = (first >> 1) & 3
                mid = (data[topic_end] << 8 | data[topic_end + 1]) if qos else None
                self._deaths.forwarded(local, remote_death, kind, qos, mid)
            o = stop
            if not first & 0x08:  # not a DUP: a first send
                self.bridge.sent += 1
                recorder = self.bridge.router.recorder
                if recorder is not None:
                    message = self.version.sent(first, remote, data[topic_end:stop])
                    recorder.record("bridge_out", self.bridge.settings.name, message, "bridge")
        if out:
            self.upstream.write(b"".join(out) if len(out) != 1 else out[0])

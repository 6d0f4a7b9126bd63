"""
Sparkplug edge nodes' deaths carried upstream (Sparkplug 3.0): for each
edge node whose NBIRTH the bridge has forwarded, one more connection
upstream whose will is that node's NDEATH as the node registered it here,
on the topic the out rules give it.  The node's own will fires at this
gateway, not at the upstream, and only when the node's link to this
gateway breaks: if instead the uplink is lost for good, the upstream
publishes these wills once it notices (1.5 keepalives), and a host
application there sees each node's NDEATH with the bdSeq of the NBIRTH
it saw, as if the node had been connected to it.

A carrier ends without its will (DISCONNECT) once the node's own NDEATH
has gone upstream and been acknowledged, or when the node is born again
with another will; it is not reconnected after a lost link, since the
upstream has published its will by then and the host asks for a rebirth
(NCMD) when it hears from the node again.  When the bridge stops, the
carriers are dropped without DISCONNECT: the nodes are cut off from the
upstream.
"""

from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqttgw.bridges.client import MQTTClientProtocol
from mqttgw.bridges.endpoint import address_endpoint
from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import topics

log = Logger()

_DISCONNECT = bytes((P.DISCONNECT << 4, 0))


def node_topic(topic):
    """``(kind, NDEATH topic)`` for a node's NBIRTH or NDEATH topic, else None."""
    parsed = topics.parse(topic)
    if parsed is None or parsed[1] not in ("NBIRTH", "NDEATH"):
        return None
    group, kind, node, _ = parsed
    return kind, f"{topics.PREFIX}{group}/NDEATH/{node}"


class Carrier:
    """One node's connection upstream: CONNECT with its NDEATH as will, pings, nothing else."""

    def __init__(self, deaths, key, will):
        self.deaths = deaths
        self.key = key
        self.will = will
        self.protocol = None
        # Ended before it was connected: closed as soon as it is.
        self.ended = False

    # The MQTTClientProtocol handler

    def connected(self, protocol):
        self.protocol = protocol
        if self.ended:
            self.close(clean=True)

    def packet(self, protocol, packet):
        """Nothing but PINGRESP is expected."""

    def disconnected(self, protocol, reason):
        self.protocol = None
        self.deaths.lost(self)

    def close(self, clean):
        """Ends it: with DISCONNECT (its will discarded) or without (published upstream)."""
        self.ended = True
        protocol = self.protocol
        if protocol is None:
            return
        if clean:
            protocol.transport.write(_DISCONNECT)
            protocol.transport.loseConnection()
        else:
            protocol.transport.abortConnection()


class DeathCarriers:
    """The bridge's carriers, by remote NDEATH topic; at most ``limit`` at once."""

    def __init__(self, bridge, limit):
        self.bridge = bridge
        self.limit = limit
        self.carriers = {}
        # Message id of a forwarded NDEATH -> its remote topic, until acknowledged.
        self._deaths_in_flight = {}
        self._made = 0
        # Births whose node had no will here, or beyond the limit.
        self.uncarried = 0

    def forwarded(self, local, remote, kind, qos, message_id):
        """A node's NBIRTH or NDEATH (local and remote NDEATH topics) went upstream."""
        if kind == "NBIRTH":
            self._born(local, remote)
        elif qos:
            self._deaths_in_flight[message_id] = remote
        else:
            self._end(remote)

    def acknowledged(self, message_id):
        remote = self._deaths_in_flight.pop(message_id, None)
        if remote is not None:
            self._end(remote)

    def link_lost(self):
        """The bridge's link broke: NDEATHs in flight go again on the next."""
        self._deaths_in_flight.clear()

    def _born(self, local, remote):
        will = self._registered_will(local)
        current = self.carriers.get(remote)
        if current is not None:
            if will is not None and current.will == (will.payload, will.qos):
                return  # born again on the same connection (a rebirth)
            self._end(remote)
        if will is None or len(self.carriers) >= self.limit:
            self.uncarried += 1
            self.bridge.router.limited(f"bridge {self.bridge.settings.name} deaths", log).warn(
                "bridge {name}: no NDEATH carried upstream for {topic}: {why}",
                name=self.bridge.settings.name,
                topic=remote,
                why="its will is not registered here" if will is None
                else f"max_sparkplug_wills ({self.limit}) reached",
            )
            return
        carrier = self.carriers[remote] = Carrier(self, remote, (will.payload, will.qos))
        self._connect(carrier)

    def _registered_will(self, topic):
        """The NDEATH will a connected client registered on ``topic``, if any."""
        for session in self.bridge.router.sessions.values():
            will = session.will
            if will is not None and session.connection is not None and will.topic == topic:
                return will
        return None

    def _connect(self, carrier):
        bridge = self.bridge
        s = bridge.settings
        self._made += 1
        payload, qos = carrier.will
        # Where the bridge is, in the version spoken there; Sparkplug:
        # NDEATH at QoS 1, not retained.
        version = bridge.version
        connect = version.carrier_connect(f"{s.client_id}/{self._made}", carrier.key, payload, max(1, qos))
        factory = Factory.forProtocol(lambda: MQTTClientProtocol(connect, carrier, bridge.reactor, version=version))
        factory.noisy = False
        d = address_endpoint(bridge.reactor, s, bridge.upstreams.current.text).connect(factory)
        d.addCallback(lambda protocol: protocol.connack)
        d.addErrback(self._not_connected, carrier)

    def _not_connected(self, failure, carrier):
        log.info(
            "bridge {name}: no connection upstream for the NDEATH of {topic}: {reason}",
            name=self.bridge.settings.name, topic=carrier.key, reason=failure.getErrorMessage(),
        )
        self.lost(carrier)

    def _end(self, remote):
        carrier = self.carriers.pop(remote, None)
        if carrier is not None:
            carrier.close(clean=True)

    def lost(self, carrier):
        if self.carriers.get(carrier.key) is carrier:
            del self.carriers[carrier.key]

    def stop(self):
        """The bridge stops: every carrier's will goes upstream."""
        for carrier in self.carriers.values():
            carrier.close(clean=False)
        self.carriers.clear()
        self._deaths_in_flight.clear()

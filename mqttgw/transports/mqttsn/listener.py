"""
The MQTT-SN 1.2 listener: a UDP datagram protocol that decodes each
datagram, takes a forwarder's encapsulation off, and hands the message
to the client connected at that address, or to what an address not
connected may do (CONNECT, its will, SEARCHGW, QoS -1, a sleeper's
PINGREQ from a new address).  Anything else is dropped, counted, and
logged once per address per interval.
"""

from twisted.internet.protocol import DatagramProtocol
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.logsummary import BySource
from mqttgw.security.throttle import ConnectionRate
from mqttgw.transports.mqttsn.anonymous import QosMinusOne
from mqttgw.transports.mqttsn.interfaces import ISnListener
from mqttgw.transports.mqttsn.kept import KeptTopics
from mqttgw.transports.mqttsn.login import SnLogin, listed
from mqttgw.transports.mqttsn.route import Route
from mqttgw.transports.mqttsn.watchdog import Watchdog
from mqttgw.transports.protocol import ConnectionLimits, refusal_log
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.mqttsn import Encapsulated, GwInfo, MalformedDatagram, decode, publish_fields
from mqttgw.wire.mqttsn import constants as C

log = Logger()

LOG_PREFIX = "MQTT-SN listener"
# The will's messages of a CONNECT (which may come from a connected client's address).
_WILL = ("WillTopic", "WillMsg")
_PUBLISH = C.PUBLISH


@implementer(ISnListener)
class MqttSnProtocol(DatagramProtocol):
    """
    One MQTT-SN UDP port on the ``router``: its clients by address (and
    forwarder node) and by client id, the topic registrations of
    persistent sessions (``kept``: a KeptTopics, shared by the gateway's
    MQTT-SN listeners, or one of its own), its CONNECTs waiting for their
    wills.
    """

    noisy = False

    def __init__(
        self, router, clock, options, limits=ConnectionLimits(), connection_rate=None, refusals=None, kept=None
    ):
        self.router = router
        self.clock = clock
        self.options = options
        self.limits = limits
        self.stats = router.stats
        self.connection_rate = connection_rate if connection_rate is not None else ConnectionRate()
        self.refusals = refusals if refusals is not None else refusal_log(clock)
        self.drops = BySource(
            log, clock,
            "dropped {count} more MQTT-SN datagrams from {source} in the last {interval:.0f}s; the last: {reason}",
        )
        self.clients = {}  # route key -> SnClient
        self.by_id = {}  # client id -> SnClient
        self.per_host = {}  # host -> clients connected from it
        self.watchdog = Watchdog(clock)
        if kept is None:
            kept = KeptTopics(router.store, options.max_kept_registries, options.predefined)
        self.kept = kept
        self.login = SnLogin(self)
        self.anonymous = QosMinusOne(self)
        self._unconnected = {
            "Connect": self.login.handle_CONNECT,
            "WillTopic": self.login.handle_WILLTOPIC,
            "WillMsg": self.login.handle_WILLMSG,
            "SearchGw": self.handle_SEARCHGW,
            "Publish": self.anonymous.handle_PUBLISH,
            "Pingreq": self.handle_PINGREQ,
        }

    def logPrefix(self):
        # Twisted's line "... starting on PORT" names the listener so.
        return LOG_PREFIX

    def stopProtocol(self):
        self.drops.stop()
        self.watchdog.stop()

    # Datagrams in

    def datagramReceived(self, data, addr):
        stats = self.stats
        stats.packets_received += 1
        stats.bytes_received += len(data)
        host, port = addr[0], addr[1]
        if len(data) > 6 and data[1] == _PUBLISH:
            # Most datagrams: a connected client's PUBLISH, read without a message object.
            client = self.clients.get((host, port, None))
            if client is not None:
                fields = publish_fields(data)
                if fields is not None and len(data) <= self.options.max_datagram_size:
                    try:
                        if client.received_publish(fields):
                            return None
                    except ProtocolViolation as e:
                        return self.drop(client.route, str(e))
        try:
            message = decode(data, self.options.max_datagram_size)
        except MalformedDatagram as e:
            return self.drop(Route(host, port), str(e))
        node = None
        if type(message) is Encapsulated:
            clients = self.options.clients
            if clients is not None and not getattr(clients.at(host, port), "forwarder", False):
                return self.drop(Route(host, port), "encapsulated message from an address not listed as a forwarder")
            node, message = message.wireless_node_id, message.message
        client = self.clients.get((host, port, node))
        route = client.route if client is not None else Route(host, port, node)
        try:
            self._dispatch(route, client, message)
        except ProtocolViolation as e:
            self.drop(route, str(e))
        return None

    def _dispatch(self, route, client, message):
        name = type(message).__name__
        if client is not None:
            if name == "Connect" or (name in _WILL and route.key in self.login.waiting):
                # Connecting again from where it is: the login's, not the client's.
                self._unconnected[name](route, message)
            elif not client.received(message):
                self.drop(route, f"{C.message_name(message.message_type)} from a client {client.state}")
            return
        handler = self._unconnected.get(name)
        if handler is None:
            self.drop(route, f"{C.message_name(message.message_type)} from an address not connected")
            return
        handler(route, message)

    def drop(self, route, reason):
        """A datagram not taken: counted, and logged once per address per interval."""
        self.stats.mqttsn_dropped += 1
        self.drops.info(route.host, "dropped an MQTT-SN datagram from {peer}: {reason}", peer=str(route), reason=reason)

    # What an address not connected may do

    def handle_SEARCHGW(self, route, message):
        # GWINFO from a gateway is three bytes, as SEARCHGW is.
        self.send(route, GwInfo(self.options.gateway_id).encode())

    def handle_PINGREQ(self, route, message):
        """A sleeper's PINGREQ from another address: it moved (NAT, a new radio route)."""
        client = self.by_id.get(message.client_id) if message.client_id else None
        if client is None:
            return self.drop(route, "PINGREQ from an address not connected")
        clients = self.options.clients
        if clients is not None and not listed(clients, route, client.client_id):
            return self.drop(route, f"PINGREQ of {client.log_id} from an address mqttsn.clients does not list")
        self.move(client, route)
        client.received(message)
        return None

    def move(self, client, route):
        """``client`` is reached at ``route`` from now on; its old address is forgotten."""
        log.info(
            "MQTT-SN client {client_id} moved from {old} to {new}",
            client_id=client.log_id,
            old=str(client.route),
            new=str(route),
        )
        if self.clients.get(client.route.key) is client:
            del self.clients[client.route.key]
            self._count(client.route.host, -1)
        other = self.clients.get(route.key)
        if other is not None:
            other.close(publish_will=True, reason="its address was taken by another client")
        client.route = route
        self.clients[route.key] = client
        self._count(route.host, 1)

    # The tables

    def add(self, client):
        self.clients[client.route.key] = client
        self.by_id[client.client_id] = client
        self._count(client.route.host, 1)

    def _count(self, host, change):
        per_host = self.per_host
        count = per_host.get(host, 0) + change
        if count > 0:
            per_host[host] = count
        else:
            per_host.pop(host, None)

    def forget(self, client):
        if self.clients.get(client.route.key) is client:
            del self.clients[client.route.key]
            self._count(client.route.host, -1)
        if self.by_id.get(client.client_id) is client:
            del self.by_id[client.client_id]
        session = client.session
        if session is not None and not session.ends_with_connection and client.topics:
            # Its registrations wait for it, within a bound.
            self.kept.keep(client.topics)

    def topics_for(self, client_id, session, present):
        """The registry of a client that connects with ``session``: its own if that was present."""
        return self.kept.take(client_id, session, present)

    # Datagrams out

    def send(self, route, frame):
        data = route.wrap(frame)
        stats = self.stats
        stats.packets_sent += 1
        stats.bytes_sent += len(data)
        try:
            self.transport.write(data, route.address)
        except OSError as e:
            # An address the network cannot reach: that datagram is lost, as any may be.
            self.router.limited("MQTT-SN send failures", log).warn(
                "cannot send to MQTT-SN client at {peer}: {error}", peer=str(route), error=str(e)
            )

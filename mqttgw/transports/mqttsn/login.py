"""
An MQTT-SN CONNECT to its CONNACK: the checks it passes (protocol id,
client id, the clients file, the listener's bounds), the will asked for
(WILLTOPICREQ, WILLMSGREQ) while the CONNECT waits in a bounded table
that expires, then the session claimed from the router as a 3.1.1
client's, and the client made.  Answers to an address not yet connected
are never longer than what it sent.
"""

from collections import OrderedDict

from twisted.logger import Logger

from mqttgw.broker.access import READ, WRITE
from mqttgw.broker.session import NEVER_EXPIRES
from mqttgw.broker.sessions import owner_name
from mqttgw.broker.topics import InvalidTopic, validate_topic_name
from mqttgw.transports.mqttsn.client import SnClient
from mqttgw.transports.publishing import write_allowed
from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import Connack, WillMsgReq, WillTopicReq
from mqttgw.wire.mqttsn import constants as C
from mqttgw.wire.printable import printable

log = Logger()

# MQTT-SN's client ids are 1 to 23 characters; longer ones as MQTT's
# allow_long_client_ids allows.
MAX_CLIENT_ID = 23
MAX_LONG_CLIENT_ID = 1024


class Waiting:
    """A CONNECT waiting for its will: the WILLTOPIC's fields once it came."""

    __slots__ = ("connect", "since", "will_topic", "will_qos", "will_retain")

    def __init__(self, connect, since):
        self.connect = connect
        self.since = since
        self.will_topic = None
        self.will_qos = 0
        self.will_retain = False


class SnLogin:
    """The CONNECTs of one listener (an ISnListener with its tables)."""

    __slots__ = ("listener", "router", "clock", "waiting")

    def __init__(self, listener):
        self.listener = listener
        self.router = listener.router
        self.clock = listener.clock
        # route key -> (route, Waiting), oldest first.
        self.waiting = OrderedDict()

    def handle_CONNECT(self, route, message):
        refusal = self._refusal(route, message)
        if refusal is not None:
            return self.refuse(route, message.client_id, *refusal)
        if message.will:
            self._wait(route, Waiting(message, self.clock.seconds()))
            self.listener.send(route, WillTopicReq().encode())
            return None
        return self.accept(route, message, None)

    def _wait(self, route, waiting):
        """Held within the bound, the oldest (and any expired) going first."""
        table = self.waiting
        table.pop(route.key, None)
        options = self.listener.options
        now = self.clock.seconds()
        while table:
            first_route, first = next(iter(table.values()))
            if first.since + options.half_open_timeout > now and len(table) < options.max_half_open:
                break
            table.popitem(last=False)
            self.listener.drop(first_route, "CONNECT whose will did not come in time, or too many waiting")
        table[route.key] = (route, waiting)

    def handle_WILLTOPIC(self, route, message):
        entry = self.waiting.get(route.key)
        if entry is None or entry[1].will_topic is not None:
            return self.listener.drop(route, "WILLTOPIC without a CONNECT waiting for it")
        waiting = entry[1]
        if message.will_topic is None:
            # An empty WILLTOPIC: no will after all.
            del self.waiting[route.key]
            return self.accept(route, waiting.connect, None)
        try:
            validate_topic_name(message.will_topic)
        except InvalidTopic as e:
            del self.waiting[route.key]
            return self.refuse(route, waiting.connect.client_id, C.REJECTED_NOT_SUPPORTED, f"invalid will topic: {e}")
        waiting.will_topic = message.will_topic
        waiting.will_qos = max(message.qos, 0)
        waiting.will_retain = message.retain
        self.listener.send(route, WillMsgReq().encode())
        return None

    def handle_WILLMSG(self, route, message):
        entry = self.waiting.get(route.key)
        if entry is None or entry[1].will_topic is None:
            return self.listener.drop(route, "WILLMSG without a WILLTOPIC before it")
        del self.waiting[route.key]
        waiting = entry[1]
        will = P.Publish(waiting.will_topic, message.will_message, waiting.will_qos, waiting.will_retain)
        return self.accept(route, waiting.connect, will)

    def _refusal(self, route, message):
        """(return code, why) when the CONNECT is refused before any session is touched, else None."""
        listener = self.listener
        if message.protocol_id != C.PROTOCOL_ID:
            return C.REJECTED_NOT_SUPPORTED, f"protocol id {message.protocol_id:#04x}, not MQTT-SN 1.2's"
        client_id = message.client_id
        longest = MAX_LONG_CLIENT_ID if listener.limits.allow_long_client_ids else MAX_CLIENT_ID
        if not client_id or len(client_id) > longest or "\x00" in client_id:
            return C.REJECTED_NOT_SUPPORTED, f"client id of {len(client_id)} characters (1 to {longest})"
        clients = listener.options.clients
        if clients is not None and not listed(clients, route, client_id):
            return C.REJECTED_NOT_SUPPORTED, "not listed at this address in mqttsn.clients"
        if self._known(route, client_id):
            return None
        refusal = self._over_bounds(route)
        if refusal is not None:
            return refusal
        if not listener.connection_rate.allows(route.host):
            return C.REJECTED_CONGESTION, "over limits.max_connection_rate"
        return None

    def _known(self, route, client_id):
        """Whether the client takes the place of one connected (at its address, or by its client id)."""
        listener = self.listener
        return listener.clients.get(route.key) is not None or client_id in listener.by_id

    def _over_bounds(self, route):
        """(return code, why) when one more client at ``route`` is over the listener's bounds, else None."""
        listener = self.listener
        # Counted apart from the stream listeners' connections: CONNECTs
        # from spoofed addresses cost nothing to send, and must not take
        # the places of TCP clients.
        if len(listener.clients) >= listener.limits.max_connections:
            return C.REJECTED_CONGESTION, f"{listener.limits.max_connections} MQTT-SN clients is the limit"
        bound = listener.options.max_clients_per_address
        if bound and listener.per_host.get(route.host, 0) >= bound:
            return C.REJECTED_CONGESTION, f"{bound} MQTT-SN clients from this address is the limit"
        return None

    def refuse(self, route, client_id, code, why):
        """A CONNACK with ``code``: three bytes, never more than the CONNECT."""
        listener = self.listener
        self.router.stats.connections_refused += 1
        listener.refusals.info(
            route.host,
            "refusing MQTT-SN CONNECT from {peer} (client {client_id}): {reason}",
            peer=str(route),
            client_id=printable(client_id),
            reason=why,
        )
        listener.send(route, Connack(code).encode())

    def _session_refusal(self, client_id, owner, will, may_write, persistent):
        router = self.router
        username = owner or None
        if will is not None and not write_allowed(may_write, router.access, username, client_id, will.topic):
            return C.REJECTED_NOT_SUPPORTED, f"may not publish its will on {printable(will.topic)!r}"
        refusal = router.owner_refusal(client_id, owner)
        if refusal is not None:
            return C.REJECTED_NOT_SUPPORTED, f"{owner_name(owner)}: {refusal}"
        if persistent:
            store = router.store
            if store is not None and store.failed is not None and not router.resumes_session(client_id, False, owner):
                return C.REJECTED_CONGESTION, "the store cannot be written: no new persistent sessions"
            if not router.may_start_session(client_id, False):
                return C.REJECTED_CONGESTION, f"max_persistent_sessions ({router.max_persistent_sessions}) reached"
        return None

    def accept(self, route, connect, will):
        """The client is who the configuration lets it be: its session, CONNACK, and its client."""
        listener, router = self.listener, self.router
        client_id = connect.client_id
        # The client id is the identity when the clients file vouches for
        # it (by its address); else the client is anonymous.
        username = client_id if listener.options.clients is not None else None
        owner = username or ""
        access = router.access
        may_write = access.checker(username, client_id, WRITE) if access.acl is not None else None
        # Checked again: others may have taken the places left while its will came.
        refusal = None if self._known(route, client_id) else self._over_bounds(route)
        if refusal is None:
            refusal = self._session_refusal(client_id, owner, will, may_write, not connect.clean_session)
        if refusal is not None:
            return self.refuse(route, client_id, *refusal)
        self._make_way(route, client_id)
        expiry = 0 if connect.clean_session else NEVER_EXPIRES
        session, present = router.connect(client_id, connect.clean_session, will, expiry, owner=owner)
        session.may_read = access.checker(username, client_id, READ)
        client = SnClient(listener, route, client_id, username, connect.duration,
                          listener.topics_for(client_id, session, present))
        listener.add(client)
        listener.send(route, Connack(C.ACCEPTED).encode())
        if listener.limits.connection_messages:
            log.info(
                "client {client_id} connected from {peer} (MQTT-SN 1.2, clean session {clean},"
                " keepalive {keepalive}s)",
                client_id=client.log_id,
                peer=str(route),
                clean=int(connect.clean_session),
                keepalive=connect.duration,
            )
        client.attach(session, may_write)
        return None

    def _make_way(self, route, client_id):
        """
        The client this address had, and the one this client id had here
        (a sleeper back, or one that moved), go: the same client id
        quietly, another one's as lost, its will published.
        """
        listener = self.listener
        same = listener.by_id.get(client_id)
        if same is not None:
            same.close(publish_will=False, reason="connected again")
        other = listener.clients.get(route.key)
        if other is not None:
            other.close(publish_will=True, reason="its address connected as another client")


def listed(clients, route, client_id):
    """Whether the clients file lets ``client_id`` connect along ``route``."""
    if route.node is None:
        return clients.may_connect(client_id, route.host, route.port)
    # Behind a forwarder the file cannot name a node: the client id must
    # be listed, and the forwarder listed as one (checked on arrival).
    return bool(clients.addresses(client_id))

"""
Fakes for testing code built on mqttgw without sockets or real time: a
broker on a :class:`~twisted.internet.task.Clock` and clients whose
connections are :class:`~twisted.internet.testing.StringTransport`; and
the steps most tests begin with (a client connected, subscribed) for each
protocol version.
"""

import re

import attr
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttgw.broker.access import Access
from mqttgw.broker.router import Router
from mqttgw.broker.session import SessionLimits
from mqttgw.broker.store import Store
from mqttgw.security.acl import ACL
from mqttgw.security.passwords import (
    PasswordChecker,
    PasswordTable,
    hash_password,
    parse_entry,
)
from mqttgw.security.portal import credentials_checker, make_portal
from mqttgw.transports.protocol import ConnectionLimits, MQTTServerFactory
from mqttgw.wire import packets as P
from mqttgw.wire.framing import Framer


class IdleClock(Clock):
    """
    A Clock that, told to advance, wakes at each call's time on the way,
    as an idle reactor does, so that no timer runs late; :meth:`stall`
    passes time the way a stopped process or a jump of the clock does,
    every call due meanwhile run late at its end.
    """

    def advance(self, amount):
        end = self.rightNow + amount
        Clock.advance(self, 0)
        calls = self.calls
        # Each round runs the calls due at the next one's time (and those
        # they make for then): the clock only moves forward.
        while calls and calls[0].getTime() <= end:
            self.rightNow = max(self.rightNow, calls[0].getTime())
            Clock.advance(self, 0)
        self.rightNow = max(self.rightNow, end)

    def stall(self, amount):
        Clock.advance(self, amount)


class ImmediateThreadPool:
    """A thread pool that runs its work at once, in the caller's thread."""

    def callInThreadWithCallback(self, on_result, f, *args, **kwargs):
        try:
            result = f(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class FakeBroker:
    """A router and server factory driven by a fake clock."""

    def __init__(
        self,
        session_limits=SessionLimits(),
        store_dir=None,
        passwords=None,
        acl=None,
        allow_anonymous=None,
        analytics_writers=("mqttgw-pipeline",),
        tokens=None,
        **connection_limits,
    ):
        """
        ``passwords``: {user: password} to check logins against (hashed as
        a password file would hold them); ``acl``: the lines of an ACL file.
        """
        self.clock = IdleClock()
        # What deferToThreadPool needs of a reactor.
        self.clock.callFromThread = lambda f, *a, **kw: f(*a, **kw)
        self.store = None
        if store_dir is not None:
            # A real SQLite store, committed only when the test says so.
            self.store = Store(store_dir, self.clock)
        self.router = Router(self.clock, session_limits, store=self.store)
        # What the store held at start-up: (retained, sessions).
        self.restored = ((), ())
        if self.store is not None:
            self.restored = self.store.load()
            self.router.restore(*self.restored)
        self.router.access = Access(ACL.parse(acl) if acl is not None else None, analytics_writers)
        self.checker = None
        portal = None
        if allow_anonymous is None:
            allow_anonymous = passwords is None and tokens is None
        if passwords is not None:
            table = PasswordTable(
                "passwords",
                {u: parse_entry(hash_password(p, iterations=1)) for u, p in passwords.items()},
            )
            self.checker = PasswordChecker(table, self.clock, ImmediateThreadPool())
        if passwords is not None or tokens is not None or not allow_anonymous:
            checker = credentials_checker(self.checker, tokens, self.clock, ImmediateThreadPool())
            portal = make_portal(checker, allow_anonymous)
        self.factory = MQTTServerFactory(
            self.router, ConnectionLimits(**connection_limits), self.clock, portal=portal
        )
        self._port = 40000

    def commit(self):
        """The store's writer commits everything written so far."""
        self.store.run_pending()
        self.clock.advance(0)

    def restart(self):
        """
        A new broker on the same store, as after a crash: what was not
        committed is lost.
        """
        path = self.store.path.parent
        self.close()
        return FakeBroker(self.router.limits, store_dir=path)

    def close(self):
        """Its store's files closed, what was not committed lost."""
        if self.store is not None:
            self.store.file.close()

    def client(self, connect=None, **connect_fields):
        """
        A new connection; with ``connect`` (a Connect packet) or connect
        fields given, its CONNECT is sent at once.
        """
        self._port += 1
        client = FakeClient(self, IPv4Address("TCP", "127.0.0.1", self._port))
        if connect is None and connect_fields:
            connect = P.Connect(**connect_fields)
        if connect is not None:
            client.send(connect)
        return client


class FakeClient:
    """One connection to a FakeBroker, speaking packets or raw bytes."""

    def __init__(self, broker, peer):
        self.broker = broker
        self.transport = StringTransport(peerAddress=peer)
        self.protocol = broker.factory.buildProtocol(peer)
        self.protocol.makeConnection(self.transport)
        self._framer = Framer(P.MAX_REMAINING_LENGTH + 5)
        self._framer.from_client = False
        self._lost = False
        # The version of the first CONNECT sent (None until one is): a
        # second is a protocol error to test, not a change of version.
        self.protocol_level = None

    def send(self, *packets):
        """
        Send ``packets``, in the form of the version this client connected
        with (see :func:`in_version`).
        """
        wire = []
        for p in packets:
            if isinstance(p, P.Connect) and self.protocol_level is None:
                self.protocol_level = p.protocol_level
                # What the broker sends back is in 5.0's form.
                self._framer.v5 = p.protocol_level == P.MQTT_5
            elif self.protocol_level == P.MQTT_5:
                p = in_version(V5, p)
            wire.append(p.encode())
        self.send_bytes(b"".join(wire))

    def send_bytes(self, data):
        self.protocol.dataReceived(data)
        # The reactor turn ends: queued output is written.
        self.broker.clock.advance(0)

    def received(self):
        """Packets the broker has written since the last call."""
        # Output made outside a read (timers, other connections ending) is
        # flushed on the next reactor turn.
        self.broker.clock.advance(0)
        data = self.transport.value()
        self.transport.clear()
        return list(self._framer.feed(data))

    @property
    def closed(self):
        """Whether the broker closed (or aborted) this connection."""
        return self.transport.disconnecting or getattr(
            self.transport, "disconnected", False
        )

    def lose_connection(self):
        """The network drops: the broker sees connectionLost."""
        if not self._lost:
            self._lost = True
            from twisted.internet.error import ConnectionLost
            from twisted.python.failure import Failure

            self.protocol.connectionLost(Failure(ConnectionLost()))

    def finish_close(self):
        """Complete a close the broker started, as the reactor would."""
        if self.closed:
            self.lose_connection()


# The protocol versions, as CONNECT fields: ``broker.client(client_id="c", **V5)``.
V31 = {"protocol_level": P.MQTT_31}
V311 = {"protocol_level": P.MQTT_311}
V5 = {"protocol_level": P.MQTT_5}


def in_version(version, packet):
    """
    ``packet`` in ``version``'s form: in 5.0 a packet that has properties
    has them, none unless given (a PUBLISH or SUBSCRIBE without them is
    another packet there). What a 5.0 client reads has them too.
    """
    if version["protocol_level"] == P.MQTT_5 and getattr(packet, "properties", {}) is None:
        return attr.evolve(packet, properties={})
    return packet


def connect(client_id, version=V311, clean_start=None, **fields):
    """
    A CONNECT. ``clean_start`` is 5.0's name for 3.x's ``clean_session``
    (either may be given; True unless one is). A 5.0 CONNECT has its
    properties (none unless given) and keep alive off unless asked, so
    that a test's clock can run.
    """
    if clean_start is not None:
        fields["clean_session"] = clean_start
    if version["protocol_level"] == P.MQTT_5:
        fields.setdefault("keepalive", 0)
        fields["properties"] = dict(fields.get("properties") or {})
    return P.Connect(client_id, **version, **fields)


def connect5(client_id, **fields):
    """A 5.0 CONNECT (see :func:`connect`)."""
    return connect(client_id, V5, **fields)


def connected(broker, client_id, version=V311, **fields):
    """
    A client of ``broker`` whose CONNECT (:func:`connect`'s fields) was
    accepted; its CONNACK is ``client.connack``.
    """
    client = broker.client(connect(client_id, version, **fields))
    packets = client.received()
    assert len(packets) == 1 and isinstance(packets[0], P.Connack), packets
    assert packets[0].return_code == 0, packets
    client.connack = packets[0]
    return client


def subscribe(client, *filters, mid=1, **properties):
    """
    SUBSCRIBE ``(filter, QoS)`` pairs (in 5.0 the whole options byte, see
    :func:`options`) and return the SUBACK; what follows it (retained
    messages) is left for the test to read.
    """
    v5 = client.protocol_level == P.MQTT_5
    client.send(P.Subscribe(mid, list(filters), properties if v5 else None))
    split = frames(raw(client))
    assert split, "no SUBACK"
    [suback] = client._framer.feed(split[0])
    assert isinstance(suback, P.Suback), suback
    client.transport.write(b"".join(split[1:]))
    return suback


def subscribed(
    broker,
    client_id,
    *filters,
    version=V311,
    clean_start=None,
    clean_session=True,
    properties=None,
    **subscribe_properties,
):
    """
    A client connected (``clean_start`` or ``clean_session``, and
    ``properties`` are the CONNECT's, see :func:`connect`) and subscribed
    to ``filters`` (``subscribe_properties`` are the SUBSCRIBE's), each
    granted; what follows the SUBACK is left for the test to read.
    """
    if clean_start is None:
        clean_start = clean_session
    client = connected(broker, client_id, version, clean_start=clean_start, properties=properties)
    suback = subscribe(client, *filters, **subscribe_properties)
    assert all(code < 0x80 for code in suback.granted_qos), suback
    return client


def options(qos=0, no_local=False, retain_as_published=False, retain_handling=0):
    """A 5.0 SUBSCRIBE's options byte."""
    return qos | 4 * no_local | 8 * retain_as_published | 16 * retain_handling


def publish(topic, payload=b"x", qos=0, mid=None, retain=False, **properties):
    """A 5.0 PUBLISH from a client."""
    return P.Publish(topic, payload, qos, retain, message_id=mid, properties=properties)


def publishes(packets):
    """The PUBLISH packets among ``packets``."""
    return [p for p in packets if isinstance(p, P.Publish)]


def deliveries(packets):
    """(topic, payload, QoS) of each PUBLISH among ``packets``."""
    return [(p.topic, p.payload, p.qos) for p in publishes(packets)]


def payloads(packets):
    return [p.payload for p in publishes(packets)]


def close_reason(client, lines):
    """
    Why the broker closed ``client``'s connection, as its log line says
    ("closing connection of client ID from ADDRESS: REASON", or "refusing
    CONNECT from ADDRESS (client ID): REASON"); ``lines`` are the lines
    logged (the tests' ``logged`` fixture).
    """
    assert client.closed
    peer = client.transport.getPeer()
    address = f"{peer.host}:{peer.port}"
    reasons = []
    for line in lines:
        if line.startswith("closing connection of ") and f" from {address}: " in line:
            reasons.append(line.partition(f" from {address}: ")[2])
        elif line.startswith(f"refusing CONNECT from {address}"):
            # The client identifier is named when the CONNECT has one.
            rest = line[len(f"refusing CONNECT from {address}") :]
            reasons.append(re.match(r"(?: \(client .*?\))?: (.*)", rest).group(1))
    assert len(reasons) == 1, lines
    return reasons[0]


def disconnect_of(client):
    """The DISCONNECT the broker sent (it must be the last packet), its connection closed."""
    packets = client.received()
    assert packets and isinstance(packets[-1], P.Disconnect), packets
    assert client.closed
    return packets[-1]


def raw(client):
    """The bytes the broker has written to ``client`` since the last read."""
    client.broker.clock.advance(0)
    data = client.transport.value()
    client.transport.clear()
    return data


def frames(data):
    """Split wire bytes into whole frames (fixed header included)."""
    out = []
    offset = 0
    while offset < len(data):
        pos = offset + 1
        length = shift = 0
        # A Remaining Length has at most four bytes.
        for pos in range(pos, pos + 4):
            byte = data[pos]
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        pos += 1
        out.append(data[offset : pos + length])
        offset = pos + length
    return out


def decode5(data):
    """The packets a 5.0 client reads from ``data``."""
    framer = Framer(P.MAX_REMAINING_LENGTH + 5)
    framer.from_client = False
    framer.v5 = True
    return list(framer.feed(data))

"""
Fakes for testing code built on mqttgw without sockets or real time: a
broker on a :class:`~twisted.internet.task.Clock` and clients whose
connections are :class:`~twisted.internet.testing.StringTransport`.
"""

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
        if self.store is not None:
            self.router.restore(*self.store.load())
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
        self.store._db.close()
        self.store._lock.close()
        self.store._record.close()
        return FakeBroker(self.router.limits, store_dir=path)

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

    def send(self, *packets):
        for p in packets:
            if isinstance(p, P.Connect) and p.protocol_level == P.MQTT_5:
                # What the broker sends back is in 5.0's form.
                self._framer.v5 = True
        self.send_bytes(b"".join(p.encode() for p in packets))

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

"""
Reload in-process: the service makeService builds, on a MemoryReactorClock,
given a changed configuration file and ReloadService.reload() called as
the SIGHUP handler calls it.  tests/system/test_operations.py sends the signal
to a gateway under twistd.
"""

import signal

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.internet.threads import deferToThreadPool
from twisted.logger import LogLevel

from mqttgw.service import logs
from mqttgw.service import reload as reload_module
from mqttgw.service.reload import ReloadService
from mqttgw.service.tap import Options, makeService
from mqttgw.testing import ImmediateThreadPool
from mqttgw.wire import packets as P
from tests.fake_network import Listener, accept, attempts

UPSTREAM, OTHER_UPSTREAM = "127.0.0.1:1884", "127.0.0.1:1885"
STATE = "mqttgw/bridge/up/state"
# Each [[bridge]] table here names the same bridge, "up".
BRIDGE = '[[bridge]]\nname = "up"\naddresses = ["{address}"]\nrules = ["t out 1"]\n'
SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class Running:
    """
    The gateway's service started on a MemoryReactorClock, with its
    configuration file at ``config``.  What reload reads is handed to
    deferToThread; here that runs it through a thread pool that runs work
    at once, in the caller's thread, with the Deferred plumbing
    deferToThread uses (``threaded`` lists what it was given).
    """

    def __init__(self, tmp_path, monkeypatch, text):
        self.config = tmp_path / "mqttgw.toml"
        self.config.write_text(text)
        self.reactor = reactor = MemoryReactorClock()
        # What deferToThreadPool asks of a reactor.
        reactor.callFromThread = lambda f, *a, **kw: f(*a, **kw)
        self.threaded = []

        def deferToThread(f, *args, **kwargs):
            self.threaded.append(f)
            return deferToThreadPool(reactor, ImmediateThreadPool(), f, *args, **kwargs)

        monkeypatch.setattr(reload_module, "deferToThread", deferToThread)
        options = Options()
        options.parseOptions(["--config", str(self.config), "--no-persistence", "--tcp", "1883"])
        self.top = makeService(options, reactor)
        self.router = self.top.router
        [self.reloader] = [s for s in self.top if isinstance(s, ReloadService)]
        # The reload service installs the signal handlers: not in the
        # process running the tests.
        saved = {s: signal.getsignal(s) for s in SIGNALS}
        try:
            self.top.startService()
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)
        self.listener = Listener(self.top.factories[0], reactor)

    def reload(self, text):
        """The file now says ``text``; reload it, as SIGHUP does."""
        self.config.write_text(text)
        d = self.reloader.reload()
        # Reading and applying are both done: the Deferred has fired.
        results = []
        d.addBoth(results.append)
        assert results == [None]

    def client(self, client_id, **fields):
        return self.listener.client(client_id, **fields)

    def stop(self):
        self.top.stopService()
        self.top.pool.stop()


@pytest.fixture
def running(tmp_path, monkeypatch):
    started = []

    def start(text=""):
        gateway = Running(tmp_path, monkeypatch, text)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
    # The log level is the process's: back to the default.
    logs.set_level("info")


def publishes(packets):
    return [(p.topic, len(p.payload)) for p in packets if isinstance(p, P.Publish)]


def upstream_connected(reactor):
    """The bridge's latest attempt connects and its CONNECT is accepted."""
    upstream = accept(reactor)
    assert isinstance(upstream.received()[0], P.Connect)
    upstream.send(P.Connack(0))
    upstream.received()
    return upstream


# What applies


def test_the_file_is_read_through_deferToThread(running):
    gateway = running()
    gateway.reload("[limits]\nmax_packet_size = 1000\n")
    assert gateway.threaded == [gateway.reloader.read]


def test_new_limits_apply_to_new_connections_and_those_made_before_keep_theirs(running, logged):
    gateway = running("[limits]\nmax_packet_size = 100000\nmax_inflight_messages = 20\n")
    kept = gateway.client("kept")
    kept.send(P.Subscribe(1, [("t", 1)]))
    kept.received()
    gateway.reload("[limits]\nmax_packet_size = 1000\nmax_inflight_messages = 5\n")
    assert any(m.startswith("reloaded: ") and "limits" in m for m in logged())
    # The connection made before keeps its limits.
    kept.send(P.Publish("t", b"x" * 2000, 1, message_id=1))
    got = kept.received()
    assert P.Puback(1) in got and publishes(got) == [("t", 2000)]
    assert not kept.closed
    # A new one has the new packet size limit.
    new = gateway.client("new")
    new.send(P.Publish("t", b"y" * 2000, 0))
    assert new.closed
    # New sessions have the new limits.
    assert gateway.router.limits.max_inflight_messages == 5


def test_a_changed_acl_file_applies_to_the_next_publish(running, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite a/#\ntopic read b/#\n")
    gateway = running(f'[auth]\nacl_file = "{acl}"\n')
    watcher = gateway.client("watcher")
    watcher.send(P.Subscribe(1, [("a/#", 0), ("b/#", 0)]))
    assert watcher.received() == [P.Suback(1, [0, 0])]
    publisher = gateway.client("publisher")
    publisher.send(P.Publish("b/1", b"denied", 0), P.Publish("a/1", b"allowed", 0))
    assert publishes(watcher.received()) == [("a/1", 7)]

    acl.write_text("topic read a/#\ntopic readwrite b/#\n")
    gateway.reload(f'[auth]\nacl_file = "{acl}"\n')
    publisher.send(P.Publish("b/1", b"allowed", 0), P.Publish("a/1", b"denied", 0))
    assert publishes(watcher.received()) == [("b/1", 7)]


def test_an_acl_file_no_longer_set_is_dropped_and_says_so(running, tmp_path, logged):
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite a/#\n")
    gateway = running(f'[auth]\nacl_file = "{acl}"\n')
    watcher = gateway.client("watcher")
    watcher.send(P.Subscribe(1, [("#", 0)]))
    watcher.received()
    publisher = gateway.client("publisher")
    publisher.send(P.Publish("b/1", b"denied", 0))
    assert publishes(watcher.received()) == []
    gateway.reload("")
    publisher.send(P.Publish("b/1", b"allowed", 0))
    assert publishes(watcher.received()) == [("b/1", 7)]
    assert any("acl_file is no longer set" in m for m in logged())


def test_a_bridge_added_is_started_and_one_removed_is_stopped(running, logged):
    gateway = running()
    # No keepalive: an hour passes below without a ping.
    kept = gateway.client("kept", keepalive=0)
    gateway.reload(BRIDGE.format(address=UPSTREAM))
    assert any(m.endswith("bridges +up") for m in logged())
    assert attempts(gateway.reactor) == [UPSTREAM]
    upstream = upstream_connected(gateway.reactor)
    assert gateway.router.retained.get(STATE).payload == b"1"
    kept.send(P.Publish("t", b"up", 1, message_id=1))
    assert kept.received() == [P.Puback(1)]
    assert publishes(upstream.received()) == [("t", 2)]

    gateway.reload("")
    assert any(m.endswith("bridges -up") for m in logged())
    assert upstream.closed
    # The reactor completes the close.
    upstream.lose()
    assert gateway.top.bridges == []
    # Its state topic is cleared, and nothing more goes upstream.
    assert gateway.router.retained.get(STATE) is None
    kept.send(P.Publish("t", b"up", 1, message_id=2))
    assert kept.received() == [P.Puback(2)]
    assert upstream.received() == []
    gateway.reactor.advance(3600)
    assert attempts(gateway.reactor) == [UPSTREAM]
    assert not kept.closed


def test_a_changed_bridge_is_stopped_and_started_again_with_its_new_settings(running, logged):
    gateway = running(BRIDGE.format(address=UPSTREAM))
    upstream = upstream_connected(gateway.reactor)
    [before] = gateway.top.bridges
    gateway.reload(BRIDGE.format(address=OTHER_UPSTREAM))
    assert any(m.endswith("bridges ~up") for m in logged())
    assert upstream.closed
    upstream.lose()
    [after] = gateway.top.bridges
    assert after is not before and after.settings.addresses == [OTHER_UPSTREAM]
    assert attempts(gateway.reactor) == [UPSTREAM, OTHER_UPSTREAM]


def test_an_unchanged_bridge_keeps_its_connection(running, logged):
    gateway = running(BRIDGE.format(address=UPSTREAM) + "[limits]\nmax_packet_size = 100000\n")
    upstream = upstream_connected(gateway.reactor)
    [before] = gateway.top.bridges
    gateway.reload(BRIDGE.format(address=UPSTREAM) + "[limits]\nmax_packet_size = 1000\n")
    assert any(m.endswith("bridges unchanged") for m in logged())
    assert gateway.top.bridges == [before]
    assert not upstream.closed


def test_the_sys_interval_applies(running):
    gateway = running("[mqtt]\nsys_interval = 0\n")
    watcher = gateway.client("watcher")
    watcher.send(P.Subscribe(1, [("$SYS/broker/uptime", 0)]))
    assert watcher.received() == [P.Suback(1, [0])]
    gateway.reload("[mqtt]\nsys_interval = 5\n")
    assert publishes(watcher.received()) == [("$SYS/broker/uptime", len(b"0 seconds"))]
    gateway.reactor.advance(5)
    assert [p.payload for p in watcher.received()] == [b"5 seconds"]


def test_what_needs_a_restart_is_named_and_the_log_level_applies(running, logged):
    gateway = running('[persistence]\ndurability = "fsync"\n')
    gateway.reload('[persistence]\ndurability = "os"\n[log]\nlevel = "debug"\n')
    assert "reload: changed but needs a restart: persistence.durability" in logged()
    assert logs.level_filter.logLevelForNamespace("mqttgw") == LogLevel.debug


# What does not


BROKEN = [
    pytest.param('[limits]\nmax_packet_size = "big"\n', "limits.max_packet_size must be an integer", id="wrong-type"),
    pytest.param("[limits\n", "not valid TOML", id="not-toml"),
    pytest.param("[limits]\nmax_pakcet_size = 10\n", "unknown key limits.max_pakcet_size", id="unknown-key"),
    pytest.param(
        BRIDGE.format(address=UPSTREAM) + "reconnect_initial = 10.0\nreconnect_max = 5.0\n",
        "reconnect_max must not be below",
        id="bad-bridge",
    ),
    pytest.param('[auth]\nacl_file = "/nonexistent/acl"\n', "/nonexistent/acl", id="missing-acl"),
]


@pytest.mark.parametrize("text, error", BROKEN)
def test_a_file_that_fails_its_checks_changes_nothing(running, logged, text, error):
    gateway = running(BRIDGE.format(address=UPSTREAM) + "[limits]\nmax_packet_size = 1000\n")
    upstream = upstream_connected(gateway.reactor)
    [bridge] = gateway.top.bridges
    limits, session_limits = gateway.top.factories[0].limits, gateway.router.limits
    gateway.reload(text)
    [failed] = [m for m in logged() if m.startswith("reload failed, nothing changed: ")]
    assert error in failed
    assert gateway.top.factories[0].limits is limits
    assert gateway.router.limits is session_limits
    assert gateway.top.bridges == [bridge] and not upstream.closed
    assert attempts(gateway.reactor) == [UPSTREAM]
    # The old limit still holds for new connections.
    client = gateway.client("new")
    client.send(P.Publish("t", b"z" * 900, 0))
    assert not client.closed
    assert publishes(upstream.received()) == [("t", 900)]
    client.send(P.Publish("t", b"z" * 2000, 0))
    assert client.closed

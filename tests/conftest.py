import os
import shutil
import subprocess
from pathlib import Path

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from mqttgw.testing import FakeBroker

# What tests report for people to read (tables of measurements), shown at
# the end of the run whatever the tests' outcomes; see the ``report`` fixture.
REPORTS = []


def pytest_terminal_summary(terminalreporter):
    for title, lines in REPORTS:
        terminalreporter.section(title, sep="-")
        for line in lines:
            terminalreporter.line(line)


@pytest.fixture
def report(request):
    """``report(lines)``: lines shown under the test's name in the run's summary."""
    return lambda lines: REPORTS.append((request.node.nodeid, list(lines)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the end of each gateway's log it
    started (tests/gateway.py), where a CI run shows why it failed."""
    from tests.gateway import STARTED

    report = yield
    if report.failed and call.when == "call":
        for gw in STARTED:
            try:
                text = gw.log()
            except OSError as e:
                text = f"(unreadable: {e})"
            report.sections.append((f"gateway log {gw.log_path}", text[-4000:]))
    return report


# The in-process stores' files opened by the running test (StoreFile).
_STORE_FILES = []


@pytest.fixture(autouse=True, scope="session")
def _store_files_kept():
    from mqttgw.broker.storefile import StoreFile

    opened = StoreFile.__init__

    def kept(self, *args, **kwargs):
        opened(self, *args, **kwargs)
        _STORE_FILES.append(self)

    StoreFile.__init__ = kept
    yield
    StoreFile.__init__ = opened


@pytest.fixture(autouse=True)
def _stop_leftovers(_store_files_kept):
    """Gateways' logs are one test's; paho clients a test left running stop
    with it, so none reconnects into a later test's gateway, and stores a
    test left open are closed.  A long run would otherwise pass 1,024
    descriptors, past which paho's select() fails every client."""
    from tests.gateway import STARTED
    from tests.paho import RUNNING

    STARTED.clear()
    yield
    while _STORE_FILES:
        _STORE_FILES.pop().close()
    # DISCONNECT all first: each ends its thread's wait at once.
    left = RUNNING[:]
    RUNNING.clear()
    for c in left:
        c.client.disconnect()
    for c in left:
        c.client.loop_stop()


UNIT = Path(__file__).resolve().parent / "unit"


def pytest_collection_modifyitems(items):
    # tests/unit/ runs in process (``pytest -m unit``); tests/system/ runs
    # gateways and the programs nobody here wrote.
    for item in items:
        if UNIT in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.unit)


@pytest.fixture
def broker():
    return FakeBroker()


@pytest.fixture
def store_broker(tmp_path):
    """A broker with a real SQLite store in ``tmp_path``, committed when the test says so."""
    return FakeBroker(store_dir=tmp_path)


@pytest.fixture
def logged():
    """Messages logged through twisted.logger while the test runs."""
    events = []
    globalLogPublisher.addObserver(events.append)
    yield lambda: [formatEvent(e) for e in events]
    globalLogPublisher.removeObserver(events.append)


def require_program(name, path=None):
    """
    The path of an outside program the test needs (looked for in ``path``,
    a directory list, if given; else in PATH).  Missing, it skips the test
    locally and fails it under CI, so nothing goes silently untested.
    """
    found = shutil.which(name, path=path)
    if found is None:
        cannot_run(f"{name} is not installed")
    return found


def cannot_run(why):
    """What the test needs is not here: skipped locally, failed under CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(why + " (required under CI)")
    pytest.skip(why)


@pytest.fixture
def start_mosquitto():
    """
    Start a real mosquitto (tests/mosquitto_broker.py's arguments); each
    one started is stopped after the test, whatever happens in it.
    """
    from tests.mosquitto_broker import Mosquitto

    started = []

    def start(workdir, **kwargs):
        broker = Mosquitto(workdir, **kwargs)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def gateway(tmp_path):
    """The gateway running under twistd on a free loopback port."""
    from tests.gateway import Gateway

    gw = Gateway(tmp_path)
    yield gw
    gw.stop()
    log = gw.log()
    assert "Traceback" not in log and "Unhandled" not in log, log
    check_log_is_readable(log)


def check_log_is_readable(log):
    """No NUL (grep would take the file for binary), no object reprs."""
    assert "\x00" not in log, "a NUL byte in the log"
    assert " object at 0x" not in log, [l for l in log.splitlines() if " object at 0x" in l]


@pytest.fixture
def gateway_with(tmp_path):
    """Start gateways with the given twistd options; all stopped and checked after."""
    started = []

    def start(*args):
        from tests.gateway import Gateway

        workdir = tmp_path / f"gateway-{len(started)}"
        workdir.mkdir()
        gw = Gateway(workdir, *args)
        started.append(gw)
        return gw

    yield start
    # All stopped before any is checked: a failed check leaves none running.
    for gw in started:
        gw.stop()
    for gw in started:
        assert "Traceback" not in gw.log(), gw.log()
        check_log_is_readable(gw.log())


@pytest.fixture
def reactor():
    """A MemoryReactorClock: connections a test answers, time it turns."""
    from twisted.internet.testing import MemoryReactorClock

    return MemoryReactorClock()


@pytest.fixture
def router(reactor):
    """A router on that reactor, with an ACL-less access policy (bridge tests)."""
    from mqttgw.broker.access import Access
    from mqttgw.broker.router import Router

    router = Router(reactor)
    router.access = Access()
    return router


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, and a client certificate (paths by name)."""
    import trustme

    from tests.network import LOCAL

    ca = trustme.CA()
    d = tmp_path_factory.mktemp("pki")
    server = ca.issue_cert(LOCAL, "localhost")
    client = ca.issue_cert("device-1@example.test", common_name="device-1")
    files = {
        "ca": d / "ca.pem",
        "cert": d / "server.pem",
        "key": d / "server.key",
        "client_cert": d / "client.pem",
        "client_key": d / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(files["cert"]), append=True)
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    other = trustme.CA()
    files["other_ca"] = d / "other-ca.pem"
    other.cert_pem.write_to_path(str(files["other_ca"]))
    return {k: str(v) for k, v in files.items()}


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium (tests/cdp.py) with a profile of its own, closed after the test."""
    from tests.cdp import Chromium

    chromium = require_program("chromium")
    b = Chromium(chromium, tmp_path / "profile")
    yield b
    b.close()


@pytest.fixture(scope="module")
def tahu():
    """Eclipse Tahu's sparkplug-client, installed from npm once (tests/tahu.py); node's path."""
    from tests.tahu import TAHU, TAHU_VERSION

    node = require_program("node")
    if not (TAHU / "node_modules" / "sparkplug-client").is_dir():
        npm = require_program("npm")
        subprocess.run(
            [npm, "install", "--prefix", str(TAHU), "--no-audit", "--no-fund",
             f"sparkplug-client@{TAHU_VERSION}"],
            check=True, capture_output=True, timeout=300,
        )
    return node

"""
The package's layers as written in setup.cfg's import-linter contracts,
and no import cycle anywhere, not even one dodged by an import inside a
function; its classes within their size bounds, composed of parts that
declare their interfaces (verified here) rather than inheriting them.
"""

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from twisted.internet.task import Clock
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementedBy
from zope.interface.interface import InterfaceClass
from zope.interface.verify import verifyClass, verifyObject

from mqttgw.bridges.relay import Relay
from mqttgw.broker import interfaces
from mqttgw.broker.deliveryframes import PLAIN, EncodedFrames
from mqttgw.broker.router import Router
from mqttgw.broker.session import Session
from mqttgw.broker.subscriptions import SharedGroup
from mqttgw.testing import FakeBroker
from mqttgw.transports import interfaces as I
from mqttgw.transports.handshake import Handshake
from mqttgw.transports.login import Login
from mqttgw.transports.reading import receiver
from mqttgw.wire import packets as P

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mqttgw"
# Imported where they are used, for what they need that is optional:
# pyarrow (the archive), PySpark (the pipeline's tables), protobuf (the
# Sparkplug payload codec) and, for the pipeline's --publish alone, the
# MQTT client (attrs, which a Spark driver need not have).  And what
# only a configuration that asks for it loads (tests/system/test_footprint.py):
# the gateway's assembly (after the options are read), TLS, WebSocket,
# the HTTP surfaces, the store and MQTT-SN.
OPTIONAL = {
    "mqttgw.archive.segments", "mqttgw.pipeline.tables", "mqttgw.pipeline.publish",
    "mqttgw.wire.sparkplug.payload",
    "mqttgw.wire.sparkplug.seq",
    "mqttgw.service.assembly", "mqttgw.transports.tls", "mqttgw.transports.websocket",
    "mqttgw.transports.httpguard", "mqttgw.web.admin", "mqttgw.web.dashboard",
    "mqttgw.web.metrics", "mqttgw.broker.store",
    # OpenTelemetry (the otel extra), loaded only with otel.endpoint set.
    "mqttgw.service.tracing",
    # MQTT-SN, loaded only with listeners.mqttsn set.
    "mqttgw.transports.mqttsn.listener", "mqttgw.transports.mqttsn.service",
    "mqttgw.transports.mqttsn.options", "mqttgw.transports.mqttsn.kept", "mqttgw.security.mqttsn_clients",
    "mqttgw.security.predefined_topics",
}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run(
        [str(lint), "--config", str(REPO / "setup.cfg"), "--no-cache"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout and "3 kept" in run.stdout, run.stdout


def test_no_module_of_the_package_imports_itself_back():
    graph = grimp.build_graph("mqttgw")
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            assert chain is None, f"{module} -> {imported} -> ... -> {module}: {chain}"


def test_imports_inside_functions_are_only_of_optional_dependencies():
    found = []
    for name, path in modules():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and id(node) not in top:
                imported = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
                if node.module.startswith("mqttgw") and not imported & OPTIONAL:
                    found.append(f"{name}:{node.lineno} from {node.module}")
            elif isinstance(node, ast.Import) and id(node) not in top:
                found += [f"{name}:{node.lineno} import {a.name}" for a in node.names if a.name.startswith("mqttgw")]
    assert found == []


def test_every_module_imports_first_in_a_fresh_interpreter():
    # __main__ modules run their command when imported.
    names = [name for name, _ in modules() if not name.endswith(".__main__")]
    # Each imported with no other module of the package loaded before it,
    # in an order shuffled anew each run.
    script = (
        "import importlib, random, sys\n"
        f"names = {names!r}\n"
        "random.shuffle(names)\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m == 'mqttgw' or m.startswith('mqttgw.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == len(names) > 40


# The size bounds below hold over the whole package: every function, and
# every class counted with the in-package classes it inherits from.
# Packages whose classes are composed: their parts declared with
# zope.interface and verified, inheritance one level deep, and a class's
# size counted with the in-package classes it inherits from.  (The
# others join as theirs are.)
COMPOSED = ["transports", "broker"]
# Modules exempt from the size bounds, and why.
SIZE_EXEMPT = set()  # none: every module within the bounds
# Classes whose in-package inheritance is deeper than one level, and why.
DEEPER_INHERITANCE = {}  # none
MAX_METHOD_LINES = 60
MAX_CLASS_LINES = 400


def package_modules(packages):
    """(module name, path) of every module of ``packages`` (names under mqttgw/)."""
    for package in packages:
        for path in sorted((PACKAGE / package).glob("*.py")):
            if str(path.relative_to(REPO)) not in SIZE_EXEMPT:
                parts = path.relative_to(REPO).with_suffix("").parts
                yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def class_lines():
    """Lines of every class of the package, by (module, qualified name), from its source."""
    lines = {}

    def visit(module, node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                lines[module, name] = child.end_lineno - child.lineno + 1
                visit(module, child, name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(module, child, prefix + child.name + ".<locals>.")

    for name, path in modules():
        visit(name, ast.parse(path.read_text()), "")
    return lines


def package_classes(packages):
    """Every class defined in ``packages``' modules (interfaces are not classes)."""
    for name, _ in package_modules(packages):
        yield from module_classes(name)


def module_classes(name):
    """Every class defined in module ``name``."""
    module = importlib.import_module(name)
    for value in vars(module).values():
        if inspect.isclass(value) and value.__module__ == name:
            yield value


def size_bounded_modules():
    """(module name, path) of every module of the package held to the size bounds."""
    for name, path in modules():
        if str(path.relative_to(REPO)) not in SIZE_EXEMPT:
            yield name, path


def has_a_class_statement(cls):
    try:
        inspect.getsource(cls)
    except OSError:
        return False
    return True


def in_package(cls):
    return cls.__module__.startswith("mqttgw.")


def inheritance_depth(cls):
    """How many in-package classes deep ``cls`` inherits (0: from none)."""
    return max((1 + inheritance_depth(b) for b in cls.__bases__ if in_package(b)), default=0)


def lines_with_bases(cls, lines):
    """A class's lines with those of every in-package class it inherits from."""
    return sum(lines[c.__module__, c.__qualname__] for c in cls.__mro__ if in_package(c))


def calls_on_self(cls, lines):
    """Names a class's own methods call on ``self`` (``self.name(...)``)."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    node = next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__
        and n.end_lineno - n.lineno + 1 == lines[cls.__module__, cls.__qualname__]
    )
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"
        ):
            yield call.func.attr


def test_no_method_over_60_lines_and_no_class_over_400():
    over = []
    for name, path in size_bounded_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = node.end_lineno - node.lineno + 1
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_METHOD_LINES
                if lines > limit:
                    over.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert over == []


def test_no_class_over_400_lines_counted_with_the_classes_it_inherits_from():
    lines = class_lines()
    # __main__ modules run their command when imported.
    classes = [
        cls for name, _ in size_bounded_modules() if not name.endswith(".__main__") for cls in module_classes(name)
    ]
    # A class made by calling type() (as wire/packets.py's acknowledgements
    # are) has no lines of its own: the function that makes it is bounded.
    made = [cls for cls in classes if (cls.__module__, cls.__qualname__) not in lines]
    assert not [cls for cls in made if has_a_class_statement(cls)], made
    over = [
        f"{cls.__module__}.{cls.__qualname__}: {lines_with_bases(cls, lines)} lines"
        for cls in classes
        if cls not in made and lines_with_bases(cls, lines) > MAX_CLASS_LINES
    ]
    assert len(classes) > 200 and over == []


def test_inheritance_within_the_package_is_one_level_deep_from_one_class():
    """Inheritance for "is a kind of", one level: parts are held, not mixed in."""
    classes = list(package_classes(COMPOSED))
    deeper = {
        f"{cls.__module__}.{cls.__qualname__}": inheritance_depth(cls)
        for cls in classes
        if inheritance_depth(cls) > 1
    }
    assert set(deeper) == set(DEEPER_INHERITANCE), deeper
    mixed = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in classes
        if sum(in_package(b) for b in cls.__bases__) > 1
    ]
    assert classes and mixed == []


def test_no_base_class_calls_a_method_only_a_subclass_defines():
    lines = class_lines()
    classes = list(package_classes(COMPOSED))
    bases = {b for cls in classes for b in cls.__bases__ if in_package(b)}
    missing = []
    for base in bases:
        slots = {s for c in base.__mro__ for s in getattr(c, "__slots__", ())}
        for name in calls_on_self(base, lines):
            if not hasattr(base, name) and name not in slots:
                missing.append(f"{base.__module__}.{base.__qualname__} calls self.{name}")
    assert bases and missing == []


# Verified on their classes here; the broker's on live objects (DECLARED
# below), since some of its methods are another class's functions.
CLASS_VERIFIED = ["transports"]


def test_every_interface_declared_is_verified_on_its_classes():
    declared = 0
    for cls in package_classes(CLASS_VERIFIED):
        for interface in implementedBy(cls).declared:
            if interface.__module__.startswith("mqttgw."):
                assert verifyClass(interface, cls)
                declared += 1
    # Every interface of the composed packages has an implementation.
    interfaces = {
        value for name, _ in package_modules(CLASS_VERIFIED) for value in vars(importlib.import_module(name)).values()
        if isinstance(value, InterfaceClass) and value.__module__ == name
    }
    implemented = {i for cls in package_classes(CLASS_VERIFIED) for i in implementedBy(cls).flattened()}
    assert interfaces and interfaces <= implemented, interfaces - implemented
    assert declared


def test_a_connection_and_its_parts_provide_their_interfaces():
    """Verified on live objects: a connected client's connection and every part it holds."""
    broker = FakeBroker()
    client = broker.client(P.Connect("c", protocol_level=P.MQTT_5, properties={}))
    client.send(P.Subscribe(1, [("t", 1)], {}))
    connection = client.protocol
    # Publishing is a part from the client's first PUBLISH.
    assert connection.publishing is None
    client.send(P.Publish("t", b"x", 1, message_id=1, properties={}))
    login = Login(connection, broker.router, broker.clock, connection.limits, broker.factory.flusher.connection_messages)
    handshake = Handshake(connection, login, broker.clock, 10.0, {})
    provided = [
        (connection, I.IConnecting), (connection, I.IReadingConnection), (connection, I.IScheduledConnection),
        (connection, IPushProducer), (connection.reading, I.IReading), (login, I.ILogin),
        (handshake, I.IHandshake), (connection.publishing, I.IPublishing),
        (connection.subscribing, I.ISubscribing),
    ]
    for part, interface in provided:
        assert verifyObject(interface, part), (part, interface)
    # The parts a connected client's connection holds are those, and the
    # reading hands its packets to them.
    receivers = {receiver(connection, which) for which, _ in connection.reading.handlers.values()}
    assert receivers == {connection, connection.reading, connection.publishing}


# verified on the broker's own implementations and on the carriers.


def _session():
    return Session("c", 0, Clock())


def _bridge_link():
    class Bridge:
        version = deaths = None

    return Relay(Bridge(), upstream=None)


DECLARED = [
    (interfaces.IRouter, lambda: Router(Clock())),
    (interfaces.ISession, _session),
    (interfaces.ISubscriber, _session),
    (interfaces.ISubscriber, lambda: SharedGroup("g", "t/#", None)),
    (interfaces.IOutbox, lambda: _session().outbox),
    (interfaces.IOutbox, lambda: SharedGroup("g", "t/#", None)),
    (interfaces.IFrames, lambda: PLAIN),
    (interfaces.IFrames, lambda: EncodedFrames(encoder=None, session=_session())),
    (interfaces.ISessionCarrier, _bridge_link),
]


@pytest.mark.parametrize(
    "interface, make", DECLARED, ids=[f"{i.__name__}-{n}" for n, (i, _) in enumerate(DECLARED)]
)
def test_each_implementation_declares_and_provides_its_interface(interface, make):
    assert verifyObject(interface, make())


def test_a_client_connection_has_what_the_broker_and_the_gateway_ask_of_it():
    client = FakeBroker().client(client_id="c")
    assert verifyObject(interfaces.IClientConnection, client.protocol)
    assert client.protocol.session.connection is client.protocol


EXPIRY_ONLY = ["broker"]


def test_the_broker_knows_no_clean_session_only_an_expiry():
    found = []
    for package in EXPIRY_ONLY:
        for path in sorted((PACKAGE / package).glob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if "clean_session" in line:
                    found.append(f"{path.relative_to(REPO)}:{n}")
    assert found == []


# Where a session's stored-message gauges may change (see
# broker/deliveries.py: push, pop, fly, discard and release).
GAUGES = {"stored_messages", "queued_bytes"}
GAUGES_KEPT_IN = {"mqttgw/broker/deliveries.py"}


def test_the_stored_message_gauges_change_in_the_deliveries_bookkeeping_only():
    found = []
    for path in sorted((PACKAGE / "broker").glob("*.py")):
        name = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in GAUGES and name not in GAUGES_KEPT_IN:
                    found.append(f"{name}:{node.lineno} {target.attr}")
    assert found == []


def test_no_two_classes_of_the_package_share_a_name():
    # MQTT-SN's packets are named, as MQTT's are, after their standard.
    standards = {"mqttgw/wire/packets.py", "mqttgw/wire/mqttsn/packets.py"}
    where = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, set()).add(relative)
    shared = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1 and not paths <= standards}
    assert not shared, shared


def test_module_docstrings_hold_no_measurements_that_go_stale():
    # Figures belong to the bench's results and the performance page.
    figure = re.compile(r"\d[\d,.]*\s*(?:µs|us|ms|KiB|MiB|KB|MB|bytes each|instructions)\b")
    found = []
    for name, path in modules():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        found += [(name, m.group(0)) for m in figure.finditer(doc)]
    assert not found, found

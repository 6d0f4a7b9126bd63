"""
The package's layers as written in setup.cfg's import-linter contracts,
and no import cycle anywhere, not even one dodged by an import inside a
function.
"""

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from twisted.internet.task import Clock
from zope.interface import Interface
from zope.interface.verify import verifyObject

from mqttgw.bridges.relay import Relay
from mqttgw.broker import interfaces
from mqttgw.broker.frames import PLAIN, EncodedFrames
from mqttgw.broker.router import Router
from mqttgw.broker.session import Session
from mqttgw.broker.subscriptions import SharedGroup
from mqttgw.testing import FakeBroker

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mqttgw"
# Imported where they are used, for what they need that is optional:
# pyarrow (the archive), PySpark (the pipeline's tables), protobuf (the
# Sparkplug payload codec) and, for the pipeline's --publish alone, the
# MQTT client (attrs, which a Spark driver need not have).  And what
# only a configuration that asks for it loads (tests/test_footprint.py):
# the gateway's assembly (after the options are read), TLS, WebSocket,
# the HTTP surfaces and the store.
OPTIONAL = {
    "mqttgw.data.archive", "mqttgw.pipeline.tables", "mqttgw.pipeline.publish",
    "mqttgw.wire.sparkplug.payload",
    "mqttgw.wire.sparkplug.seq",
    "mqttgw.service.assembly", "mqttgw.transports.tls", "mqttgw.transports.websocket",
    "mqttgw.transports.httpguard", "mqttgw.web.admin", "mqttgw.web.dashboard",
    "mqttgw.web.metrics", "mqttgw.broker.store",
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


# Packages held to the size bounds below.
SIZE_BOUNDED = ["transports", "bridges", "broker"]
# Modules of those packages exempt, and why.
SIZE_EXEMPT = set()  # none: every module within the bounds
MAX_METHOD_LINES = 60
MAX_CLASS_LINES = 400


def test_no_method_over_60_lines_and_no_class_over_400():
    over = []
    for package in SIZE_BOUNDED:
        for path in sorted((PACKAGE / package).glob("*.py")):
            name = str(path.relative_to(REPO))
            if name in SIZE_EXEMPT:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    lines = node.end_lineno - node.lineno + 1
                    limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_METHOD_LINES
                    if lines > limit:
                        over.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert over == []


# The parts and their seams: broker/interfaces.py's interfaces, each
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
    # Declared by the transports; here, what it must provide.
    client = FakeBroker().client(client_id="c")
    assert verifyObject(interfaces.IClientConnection, client.protocol, tentative=True)
    assert client.protocol.session.connection is client.protocol


def classes_of(package):
    """Every class defined in the package's modules, imported."""
    for path in sorted((PACKAGE / package).glob("*.py")):
        module = importlib.import_module(f"mqttgw.{package}.{path.stem}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                yield cls


def is_interface(cls):
    return isinstance(cls, type(Interface))


def in_package_bases(cls):
    """The package's own classes ``cls`` inherits from, interfaces left out."""
    return [
        base for base in cls.__mro__[1:] if base.__module__.startswith("mqttgw.") and not is_interface(base)
    ]


# Packages whose classes hold their parts rather than inherit them: no
# class with more than one in-package class above it (a zope interface is
# not one; Twisted's and the standard library's classes are not in it).
COMPOSED = ["broker"]
# Classes allowed a longer chain, and why.
CHAIN_EXEMPT = {}


def test_no_in_package_inheritance_chain_of_more_than_one_level():
    long = []
    for package in COMPOSED:
        for cls in classes_of(package):
            if is_interface(cls):
                continue
            bases = in_package_bases(cls)
            name = f"{cls.__module__}.{cls.__qualname__}"
            if len(bases) > 1 and name not in CHAIN_EXEMPT:
                long.append(f"{name}: {[b.__qualname__ for b in bases]}")
    assert long == []


# Packages whose classes are held to MAX_CLASS_LINES counted together with
# the in-package classes they inherit from: an object spread over several
# files by inheritance is one object.
SIZE_WITH_BASES = ["broker"]


def class_lengths():
    """(module, class name) -> lines, for every top-level class of the package."""
    lengths = {}
    for name, path in modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                lengths[(name, node.name)] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_over_400_lines_counted_with_the_classes_it_inherits_from():
    lengths = class_lengths()
    over = []
    for package in SIZE_WITH_BASES:
        for cls in classes_of(package):
            own = lengths.get((cls.__module__, cls.__name__))
            if own is None:
                continue
            lines = own + sum(lengths.get((b.__module__, b.__name__), 0) for b in in_package_bases(cls))
            if lines > MAX_CLASS_LINES:
                over.append(f"{cls.__module__}.{cls.__name__}: {lines} lines with its bases")
    assert over == []


# Packages where a session's persistence is its expiry alone: 3.1.1's
# flag stays in the 3.x dialect and the wire.
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

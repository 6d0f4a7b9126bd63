"""
The package's layers as written in setup.cfg's import-linter contracts,
and no import cycle anywhere, not even one dodged by an import inside a
function.
"""

import ast
import subprocess
import sys
from pathlib import Path

import grimp

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

"""
Which build runs.  The hot-path modules below are compiled to C
extensions by Cython from these same .py files when the package is
installed where a C compiler is (setup.py), and run as plain Python where
none is.  ``MQTTGW_NO_EXTENSIONS=1`` asks for plain Python: at install
time nothing is compiled, and at run time (see mqttgw/__init__.py) the
.py files are loaded even where compiled modules lie beside them.  Only
the standard library is imported here: setup.py reads HOT_PATH from this
file.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

# The modules every message passes through that compile to faster code
# as they are: the wire codecs, 5.0 properties and topic aliases, topic
# matching and the subscription index (7-11% fewer instructions per
# message in bench.hotpath).  The router, sessions and the connection's
# dispatch, compiled untyped as well, took back half of that gain (4-5%
# fewer in all), so they stay plain Python until typed declarations
# (.pxd files) make them worth compiling.
HOT_PATH = (
    "mqttgw.wire.encoding",
    "mqttgw.wire.framing",
    "mqttgw.wire.packets",
    "mqttgw.wire.properties",
    "mqttgw.broker.topics",
    "mqttgw.broker.subscriptions",
    "mqttgw.transports.mqtt5",
)


def pure_requested(environ=os.environ):
    return environ.get("MQTTGW_NO_EXTENSIONS", "") not in ("", "0")


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the hot-path modules' .py files, never their compiled twins."""

    def find_spec(self, name, path=None, target=None):
        if name not in HOT_PATH or not path:
            return None
        leaf = name.rpartition(".")[2] + ".py"
        for directory in path:
            source = os.path.join(directory, leaf)
            if os.path.exists(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


def prefer_source():
    if not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


def compiled_modules():
    """The hot-path modules loaded, loaded from C extensions."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [
        name for name in HOT_PATH
        if name in sys.modules and (getattr(sys.modules[name], "__file__", None) or "").endswith(suffixes)
    ]


def stale():
    """Compiled modules older than their .py files: an in-place build
    (pip install -e) not redone after an edit runs the old code."""
    out = []
    for name in compiled_modules():
        compiled = sys.modules[name].__file__
        source = os.path.join(os.path.dirname(compiled), name.rpartition(".")[2] + ".py")
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(compiled):
            out.append(name)
    return out


def build():
    """Which build this is, in a few words: for the start-up log and --version."""
    for name in HOT_PATH:
        importlib.import_module(name)
    done = compiled_modules()
    if not done:
        return "pure Python build"
    if len(done) == len(HOT_PATH):
        return f"compiled build: {len(done)} hot-path modules in C (Cython)"
    return f"partly compiled build: {len(done)} of {len(HOT_PATH)} hot-path modules in C (Cython)"

"""
mqttgw's hot path (mqttgw/compiled.py's HOT_PATH) compiled to C
extensions by Cython from the same .py files, as aiohttp, yarl and
msgpack ship theirs.  Without a C compiler, or with
MQTTGW_NO_EXTENSIONS=1 in the environment, the package installs as plain
Python and runs the same.  Everything else is in setup.cfg.
"""

import os
import runpy
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def say(text):
    print(f"mqttgw setup: {text}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """A module that does not compile stays plain Python."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all
            say(f"not compiled, plain Python instead: {e}")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            say(f"{ext.name} not compiled, plain Python instead: {e}")


def extensions():
    if os.environ.get("MQTTGW_NO_EXTENSIONS", "") not in ("", "0"):
        say("MQTTGW_NO_EXTENSIONS is set: plain Python build")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        say("Cython is not installed: plain Python build")
        return []
    hot_path = runpy.run_path(os.path.join(HERE, "mqttgw", "compiled.py"))["HOT_PATH"]
    # optional: one module that does not compile leaves the others compiled.
    modules = [Extension(name, [name.replace(".", "/") + ".py"], optional=True) for name in hot_path]
    return cythonize(
        modules,
        compiler_directives={"language_level": "3", "binding": True, "embedsignature": True},
        quiet=True,
        nthreads=os.cpu_count() or 1,
    )


if __name__ == "__main__":
    setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})

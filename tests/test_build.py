"""
The build: the hot path compiled by Cython where a C compiler was at
install time, plain Python where none was or MQTTGW_NO_EXTENSIONS=1 asked
for it (at install time or at run time), and the start-up log and
--version saying which runs.
"""

import os
import runpy
import subprocess
import sys

from mqttgw.compiled import HOT_PATH, build, compiled_modules, pure_requested, stale
from tests.gateway import REPO, TWISTD, Gateway, gateway_env

SETUP = os.path.join(REPO, "setup.py")


def test_the_build_is_the_one_asked_for():
    line = build()
    if pure_requested():
        assert compiled_modules() == [] and line == "pure Python build"
    elif os.environ.get("CI") == "true":
        # CI installs with a compiler: every hot-path module is compiled,
        # so the suite is not run twice on plain Python unawares.
        assert compiled_modules() == list(HOT_PATH), line
        assert line == f"compiled build: {len(HOT_PATH)} hot-path modules in C (Cython)", line


def test_no_compiled_module_is_older_than_its_source():
    build()
    assert stale() == [], "edited since compiled: run pip install -e . again (or MQTTGW_NO_EXTENSIONS=1)"


def test_the_environment_variable_turns_the_extensions_off_at_install_time(monkeypatch):
    setup = runpy.run_path(SETUP, run_name="setup")
    monkeypatch.setenv("MQTTGW_NO_EXTENSIONS", "1")
    assert setup["extensions"]() == []
    monkeypatch.setenv("MQTTGW_NO_EXTENSIONS", "0")
    names = [e.name for e in setup["extensions"]()]
    # Cython: a build requirement, and in the test extra.
    assert names == list(HOT_PATH)


def test_at_run_time_it_loads_the_plain_python_modules_beside_compiled_ones():
    code = (
        "import mqttgw.wire.framing as f, mqttgw.compiled as c;"
        "print(f.__file__.endswith('framing.py'), c.compiled_modules(), c.build())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(gateway_env(), MQTTGW_NO_EXTENSIONS="1"),
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert out.split()[:2] == ["True", "[]"] and out.strip().endswith("pure Python build")


def test_version_and_the_start_up_line_name_the_build(tmp_path):
    out = subprocess.run(
        [str(TWISTD), "mqttgw", "--version"], env=gateway_env(), capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout
    assert out.startswith("mqttgw ") and f"; {build()})" in out, out
    gw = Gateway(tmp_path, "--no-persistence")
    try:
        gw.wait_for_log(f"({build()}) running:")
    finally:
        gw.stop()

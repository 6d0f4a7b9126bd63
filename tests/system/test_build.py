"""
The build: plain Python, one wheel for every platform, no C compiler
wanted at install; --version and the start-up line say what runs.
"""

import platform
import subprocess
import sys

import twisted

from mqttgw import __version__
from tests.gateway import REPO, TWISTD, Gateway, gateway_env


def test_the_package_builds_one_wheel_for_every_platform(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(REPO)],
        env=dict(gateway_env(), CC="/bin/false", CXX="/bin/false"),
        capture_output=True, text=True, timeout=300, check=True,
    )
    wheels = [p.name for p in tmp_path.glob("*.whl")]
    assert wheels == [f"mqttgw-{__version__}-py3-none-any.whl"]


def test_no_compiled_module_lies_in_the_package():
    assert sorted(p.name for p in (REPO / "mqttgw").rglob("*") if p.suffix in (".so", ".pyd", ".c")) == []


def test_version_and_the_start_up_line_name_what_runs(tmp_path):
    out = subprocess.run(
        [str(TWISTD), "mqttgw", "--version"], env=gateway_env(), capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout
    assert out.strip() == (
        f"mqttgw {__version__} (Twisted {twisted.__version__}, Python {platform.python_version()})"
    )
    gw = Gateway(tmp_path, "--no-persistence")
    try:
        gw.wait_for_log(f"mqttgw {__version__} (Python {platform.python_version()}) running:")
    finally:
        gw.stop()

"""The project's own promises: README commands, CI script, deploy files."""

import re
import subprocess
import sys

import pytest

from mqttgw.service import config
from tests.gateway import REPO


def readme_commands():
    text = (REPO / "README.rst").read_text()
    return re.findall(r"::\n\n    (.+)\n", text)[:2]


def test_readme_opens_with_the_run_and_test_commands():
    run, test = readme_commands()
    assert "twistd -n mqttgw --tcp 1883" in run
    assert "pytest" in test


def test_ci_runs_exactly_the_readme_test_command():
    _, test = readme_commands()
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in lines


def ci_packages():
    """What .ci/run has apt-get install (its options and redirections left out)."""
    script = (REPO / ".ci" / "run").read_text().replace("\\\n", " ")
    packages = set()
    for command in re.findall(r"apt-get install ([^>|&\n]+)", script):
        packages.update(word for word in command.split() if not word.startswith("-"))
    return packages


def test_readme_names_the_debian_packages_ci_installs():
    """The programs from outside the tests use: the README's list is what CI installs."""
    text = (REPO / "README.rst").read_text()
    listed = re.search(r"Some tests use programs from outside\s+\(Debian:\s+``apt-get install ([^`]+)``", text)
    assert listed, "the README's list of Debian packages for the tests"
    assert set(listed.group(1).split()) == ci_packages()


REGENERATE = "python -m mqttgw.service.example --output deploy/mqttgw.toml"


def test_example_config_is_the_one_written_from_the_schema():
    from mqttgw.service.example import render

    text = (REPO / "deploy" / "mqttgw.toml").read_text()
    assert text == render(), f"deploy/mqttgw.toml is out of date with the schema rows: {REGENERATE}"


def test_example_config_tables_load_once_uncommented(tmp_path):
    """The commented [[listener]] and [[bridge]] tables are usable as they stand."""
    from mqttgw.bridges import settings as bridge_settings

    text = (REPO / "deploy" / "mqttgw.toml").read_text()
    tables = []
    for name in ("listener", "bridge"):
        block = text.split(f"\n# [[{name}]]\n", 1)[1].split("\n\n", 1)[0]
        tables += [f"[[{name}]]"] + [line.removeprefix("# ") for line in block.splitlines()]
    path = tmp_path / "tables.toml"
    path.write_text("\n".join(tables) + "\n")
    values = config.build(config.load_file(str(path)), {})
    assert [t["kind"] for t in values["listener_tables"]] == ["tcp"]
    (bridge,) = values["bridges"]
    assert bridge_settings.check(bridge).name == "central"


def test_example_config_documents_every_key_with_its_default():
    path = REPO / "deploy" / "mqttgw.toml"
    values = config.build(config.load_file(str(path)), {})
    defaults = config.build({}, {})
    for key in config.KEYS:
        assert values[key.path] == defaults[key.path], key.path
        # A key whose default is worked out at start-up is shown commented.
        shown = f"\n# {key.name} = " if key.default is None else f"\n{key.name} = "
        assert shown in path.read_text(), key.path


def test_example_config_documents_every_pipeline_key_with_its_default():
    from mqttgw.pipeline.settings import KEYS

    path = REPO / "deploy" / "mqttgw.toml"
    section = config.load_file(str(path))["pipeline"]
    assert section == {key: default for key, (_, default, _) in KEYS.items()}


def test_example_config_documents_every_bridge_key():
    from mqttgw.bridges.settings import BRIDGE_KEYS

    text = (REPO / "deploy" / "mqttgw.toml").read_text()
    for key in BRIDGE_KEYS:
        assert f"\n# {key.name} = " in text, key.name


def test_systemd_unit_runs_the_plugin_with_the_config_file():
    unit = (REPO / "deploy" / "mqttgw.service").read_text()
    assert re.search(r"^ExecStart=.*twistd .*mqttgw --config /etc/mqttgw/mqttgw.toml --data-dir /var/lib/mqttgw$", unit, re.M)


def test_no_package_init_hides_twisted_plugins():
    assert not (REPO / "twisted" / "__init__.py").exists()
    assert not (REPO / "twisted" / "plugins" / "__init__.py").exists()


CONFORMANCE_MAPS = ("CONFORMANCE.md", "CONFORMANCE5.md", "CONFORMANCE_SPARKPLUG.md")


def cited_tests(text):
    """
    The tests a conformance map cites as ``file::test`` (or one case,
    ``file::test[id]``), each file an alias its introduction names
    (`` `tp` is `tests/unit/test_connect.py` ``) or a path.
    """
    aliases = dict(re.findall(r"`(\w+)`\s+is\s+`(tests/[\w/]+\.py)`", text))
    return [
        (aliases.get(file, file), name)
        for file, name in re.findall(r"([\w/.]+)::(test_\w+(?:\[[^\]|]*\])?)", text)
    ]


@pytest.fixture(scope="module")
def collected():
    """The ids of the tests pytest collects from the files the maps cite."""
    files = sorted(
        {f for m in CONFORMANCE_MAPS for f, _ in cited_tests((REPO / "tests" / m).read_text())}
    )
    assert all(f.startswith("tests/") for f in files), files
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {line for line in result.stdout.splitlines() if "::" in line}


@pytest.mark.parametrize("name", CONFORMANCE_MAPS)
def test_conformance_map_names_only_tests_that_exist(collected, name):
    """
    Every test a conformance map cites is one pytest collects: a test
    function names all its cases (and a state machine's class its run),
    ``test[0]`` the cases whose ids begin with ``0-``.
    """
    cited = cited_tests((REPO / "tests" / name).read_text())
    assert len(cited) > (100 if name != "CONFORMANCE_SPARKPLUG.md" else 5)
    names = set()
    for node in collected:
        test, case = re.match(r"([^\[]*?)(?:::runTest)?(?:\[(.*)\])?$", node).groups()
        names.add(test)
        parts = (case or "").split("-")
        names.update(f"{test}[{'-'.join(parts[:n])}]" for n in range(1, len(parts) + 1) if case)
    missing = [f"{file}::{test}" for file, test in cited if f"{file}::{test}" not in names]
    assert not missing, missing


# The README: short, its examples working, its figures the manual's.


def test_readme_stays_an_overview():
    """The guides live in docs/; the README names them and stays short."""
    lines = (REPO / "README.rst").read_text().splitlines()
    assert len(lines) <= 200, len(lines)


def test_readme_links_only_pages_that_exist():
    text = (REPO / "README.rst").read_text()
    links = re.findall(r"<(docs/[^>]+)>`_", text)
    assert len(links) >= 10
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, missing


def test_readme_configuration_example_is_valid(tmp_path):
    from mqttgw.bridges.bridge import MQTTBridgeKind

    text = (REPO / "README.rst").read_text()
    example = re.search(r"centre::\n\n(.*?)\n\n(?! )", text, re.S).group(1)
    path = tmp_path / "example.toml"
    path.write_text("\n".join(line[4:] for line in example.splitlines()) + "\n")
    values = config.load_file(str(path))
    assert values["auth.password_file"] == "/etc/mqttgw/passwd"
    [bridge] = values["bridges"]
    checked = MQTTBridgeKind.check(bridge)
    assert [r.direction for r in checked.rules] == ["out", "in"]


def test_readme_and_performance_page_show_the_same_results_file():
    from bench import run

    results = run.headline(run.RESULTS.read_text())
    assert results.count("\n=") == 3
    assert run.readme_results((REPO / "README.rst").read_text()) == results
    page = (REPO / "docs" / "guide" / "performance.rst").read_text()
    assert ".. include:: ../../bench/results/latest.rst" in page
    # What python -m bench writes in the README's place: the same file's text.
    readme = (REPO / "README.rst").read_text()
    assert run.with_results(readme, results) == readme
    assert run.readme_results(run.with_results(readme, "new table\n")) == "new table\n"


def test_readme_shows_the_architecture_pages_data_flow():
    """The README's picture of a message's way through is the manual's, not a drifting copy."""
    readme = (REPO / "README.rst").read_text()
    page = (REPO / "docs" / "guide" / "architecture.rst").read_text()
    picture = re.search(r"\n(    bytes ──▶.*?)\n\n", page, re.S).group(1)
    assert picture in readme
    for seam in ("transports/dialects", "transports/handshake", "broker/session", "broker/router",
                 "broker/deliveries", "dialect frame"):
        assert seam in picture

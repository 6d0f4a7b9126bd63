"""The project's own promises: README commands, CI script, deploy files."""

import re

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


CONFORMANCE_FILES = {
    "tf": "test_framing.py",
    "tp": "test_protocol.py",
    "tt": "test_topics.py",
    "paho": "test_interop_paho.py",
    "mc": "test_interop_mosquitto_clients.py",
    "ts": "test_store.py",
    "td": "test_durability.py",
    "te": "test_protocol_edges.py",
    "ta": "test_auth.py",
    "ti": "test_auth_interop.py",
}


def test_conformance_map_names_only_tests_that_exist():
    text = (REPO / "tests" / "CONFORMANCE.md").read_text()
    references = re.findall(r"\b(tf|tp|tt|paho|mc|ts|td|te|ta|ti)::(test_\w+)", text)
    assert len(references) > 100
    for prefix, name in references:
        source = (REPO / "tests" / CONFORMANCE_FILES[prefix]).read_text()
        assert f"def {name}(" in source, f"{prefix}::{name}"

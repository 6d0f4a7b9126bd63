"""Bridge rules and configuration, checked before anything connects."""

import attr
import pytest

from mqttgw.bridges.bridge import MQTTBridgeKind
from mqttgw.bridges.settings import BridgeRule
from mqttgw.service.config import ConfigError
from tests.config_files import parse, write


@pytest.mark.parametrize(
    "text,rule",
    [
        ("sensors/#", BridgeRule("sensors/#", "out", 0)),
        ("topic sensors/# in 2", BridgeRule("sensors/#", "in", 2)),
        ("# both 1 site/ up/site/", BridgeRule("#", "both", 1, "site/", "up/site/")),
        ('"" out 1 local/state remote/state', BridgeRule("", "out", 1, "local/state", "remote/state")),
    ],
)
def test_rules_read_as_mosquitto_reads_them(text, rule):
    assert BridgeRule.parse(text) == rule


def test_rule_rewrites_topics_between_prefixes():
    rule = BridgeRule.parse("a/# both 1 site/ up/site/")
    assert rule.local_filter == "site/a/#" and rule.remote_filter == "up/site/a/#"
    assert rule.to_remote("site/a/b") == "up/site/a/b"
    assert rule.to_local("up/site/a/b") == "site/a/b"


@pytest.mark.parametrize(
    "text,message",
    [
        ("a/# sideways", "direction must be in, out or both"),
        ("a/# out 3", "QoS must be 0, 1 or 2"),
        ("a/# out 1 only-one-prefix", "expected PATTERN"),
        ("a/#/b out 1", "'#' must be the whole last level"),
        ("", "expected PATTERN"),
    ],
)
def test_bad_rules_are_refused_with_a_reason(text, message):
    with pytest.raises(ValueError, match=message):
        BridgeRule.parse(text)


def test_bridge_flags_make_a_bridge_named_default():
    options = parse("--bridge", "central:1883", "--bridge", "backup:1883",
                    "--bridge-topic", "sensors/# out 1", "--bridge-topic", "cmd/# in 2")
    [(kind, bridge)] = options.bridges
    assert kind.name == "mqtt"
    assert bridge.name == "default"
    assert bridge.addresses == ["central:1883", "backup:1883"]
    assert [r.direction for r in bridge.rules] == ["out", "in"]
    assert bridge.state_topic == "mqttgw/bridge/default/state"


def test_bridge_topic_without_address_is_refused():
    with pytest.raises(SystemExit, match="needs an address"):
        parse("--bridge-topic", "sensors/# out 1")


@pytest.mark.parametrize(
    "table,message",
    [
        ({"name": "b", "addresses": ["h:1"], "rules": ["a out 1"], "colour": "red"}, "unknown key bridge.colour"),
        ({"name": "b", "addresses": ["h:1"]}, "bridge.rules is required"),
        ({"name": "b", "addresses": ["nohost"], "rules": ["a"]}, "is not HOST:PORT"),
        ({"name": "b", "addresses": ["h:1"], "rules": ["a"], "keepalive": "60"}, "bridge.keepalive must be an integer"),
        ({"name": "b", "addresses": ["h:1"], "rules": ["a"], "protocol": "mqttv6"}, "bridge.protocol must be one of mqttv31, mqttv311, mqttv5, mqttv50"),
        ({"name": "b", "addresses": ["h:1"], "rules": ["a"], "protocol_version": 6}, "bridge.protocol_version must be one of 0, 3, 4, 5"),
        ({"name": "b", "addresses": ["h:1"], "rules": ["a"], "protocol": "mqttv311", "protocol_version": 5}, "disagree"),
        ({"name": "b", "addresses": ["h:1"], "rules": ["a"], "session_expiry_interval": -1}, "bridge.session_expiry_interval"),
        ({"name": "b", "addresses": ["h:1"], "rules": ["a"], "tls": True, "ca": "/nonexistent.pem"}, "cannot read"),
    ],
)
def test_bad_bridge_tables_name_the_key(table, message):
    with pytest.raises(ConfigError, match=message):
        MQTTBridgeKind.check(table)


def test_bridge_tables_in_the_config_file_are_checked_at_start_up(tmp_path):
    path = write(tmp_path, '[[bridge]]\nname = "x"\naddresses = ["h:1"]\nrules = ["a out 5"]\n')
    with pytest.raises(SystemExit, match="QoS must be 0, 1 or 2"):
        parse("--config", path)
    path = write(tmp_path, '[[bridge]]\nkind = "carrier-pigeon"\nname = "x"\n')
    with pytest.raises(SystemExit, match="bridge.kind 'carrier-pigeon' is not installed"):
        parse("--config", path)


def test_duplicate_bridge_names_are_refused(tmp_path):
    table = '[[bridge]]\nname = "x"\naddresses = ["h:1"]\nrules = ["a"]\n'
    with pytest.raises(SystemExit, match="used twice"):
        parse("--config", write(tmp_path, table + table))


def test_a_bridge_names_itself_in_log_lines_and_keeps_its_password_out():
    from mqttgw.bridges.endpoint import FailoverEndpoint

    options = parse("--bridge", "central:1883", "--bridge-topic", "sensors/# out 1")
    [(_, bridge)] = options.bridges
    bridge = attr.evolve(bridge, password="s3cret")
    # ClientService logs its endpoint on every retry.
    endpoint = repr(FailoverEndpoint(None, bridge, None, None))
    assert endpoint == "bridge default upstream central:1883"
    assert "s3cret" not in repr(bridge)

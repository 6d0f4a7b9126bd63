"""Settings as the service reads them: sections as objects, one list of listeners however declared."""

import attr
import pytest

from mqttgw.service import build, config


def _load(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return config.build(config.load_file(str(path)), {})


def test_a_listeners_entry_and_an_equivalent_listener_table_give_the_same_table(tmp_path):
    listed = _load(tmp_path, '[listeners]\nws = ["127.0.0.1:8080"]\n')
    tabled = _load(tmp_path, '[[listener]]\nkind = "ws"\naddress = "127.0.0.1:8080"\n')
    [from_list], [from_table] = listed.all_listeners, tabled.all_listeners
    assert from_list.table == from_table.table == {"kind": "ws", "address": "127.0.0.1:8080"}
    # Errors name them as they were written.
    assert (from_list.where, from_table.where) == ("listeners.ws", "listener ws 127.0.0.1:8080")
    # What each leaves out is the main sections'.
    [checked_list] = build.check_listener_tables(listed)
    [checked_table] = build.check_listener_tables(tabled)
    assert checked_list.pop("main") is True and "main" not in checked_table
    assert checked_list == checked_table


def test_every_listener_is_in_one_list_in_the_order_they_start(tmp_path):
    settings = _load(
        tmp_path,
        '[listeners]\nwss = ["8884"]\ntcp = ["1883", "1884"]\nmqttsn = ["1885"]\n'
        '[tls]\ncert = "c.pem"\nkey = "k.pem"\n'
        '[[listener]]\nkind = "tls"\naddress = "8883"\n',
    )
    assert [(t.table["kind"], t.table["address"], t.declared_in) for t in settings.all_listeners] == [
        ("tcp", "1883", "listeners.tcp"),
        ("tcp", "1884", "listeners.tcp"),
        ("wss", "8884", "listeners.wss"),
        ("tls", "8883", None),
        ("mqttsn", "1885", "listeners.mqttsn"),
    ]


def test_with_no_listener_declared_the_list_holds_tcp_1883():
    settings = config.build({}, {})
    assert [(t.table, t.declared_in) for t in settings.all_listeners] == [
        ({"kind": "tcp", "address": "1883"}, "listeners.tcp")
    ]


def test_flags_declare_listeners_in_the_same_list():
    settings = config.build({}, {"listeners.mqttsn": ["1885"], "listeners.ws": ["8080"]})
    assert [t.table for t in settings.all_listeners] == [
        {"kind": "ws", "address": "8080"},
        {"kind": "mqttsn", "address": "1885"},
    ]


def test_each_section_is_an_object_with_its_keys_as_attributes():
    settings = config.build({"tls.cert": "c.pem", "tls.key": "k.pem", "auth.password_file": "p"}, {"listeners.tls": ["8883"]})
    assert (settings.tls.cert, settings.tls.key, settings.tls.ca) == ("c.pem", "k.pem", "")
    assert settings.auth.password_file == "p"
    assert settings.limits.max_packet_size == 1024 * 1024
    assert settings.listeners.tls == ["8883"]
    # Worked out when built: what the attribute holds is the checked value.
    assert settings.persistence.persistent_client_expiration is None
    # The same value by its path, for what goes through keys generically.
    assert settings["tls.cert"] is settings.tls.cert
    assert settings.bridges == [] and settings.listener_tables == []


def test_a_section_is_immutable():
    settings = config.build({}, {})
    # attrs' FrozenInstanceError is an AttributeError.
    with pytest.raises(AttributeError):
        settings.tls.cert = "other.pem"
    assert settings.tls.cert == ""


def test_an_unknown_key_or_section_is_an_attribute_error_naming_it():
    settings = config.build({}, {})
    with pytest.raises(AttributeError, match=r"\[tls\] has no key 'certificate'"):
        settings.tls.certificate
    with pytest.raises(AttributeError, match="settings have no section 'tlss'"):
        settings.tlss
    assert not hasattr(settings.auth, "password")


def test_each_section_has_its_keys_from_one_module_and_only_its_own():
    for name, keys in config.SECTION_KEYS.items():
        assert keys and {key.section for key in keys} == {name}
        assert len({key.name for key in keys}) == len(keys)
        assert list(attr.fields_dict(config.SECTION_CLASSES[name])) == [key.name for key in keys]
    assert config.KEYS == [key for keys in config.SECTION_KEYS.values() for key in keys]
    assert set(config.SECTION_KEYS) == set(config.SECTIONS)

"""
The Paho MQTT-SN Gateway's own files, read as a site moving from it has
them: ``clients.conf`` (who may connect, from where) and
``predefinedTopic.conf`` (pre-defined topic ids); what they hold that
cannot be used is one line naming the file and line.
"""

import pytest

from mqttgw.schema import ConfigError
from mqttgw.security.files import AuthConfigError
from mqttgw.security.mqttsn_clients import ClientList, address_key, parse_address
from mqttgw.security.predefined_topics import PredefinedTopics

# The clients.conf the Paho MQTT-SN Gateway ships: its comment block
# (with the example lines of every flag) and its entries, as written
# there, the stray space after a comma included.
PAHO_CLIENTS_CONF = """\
#
# File format is:
#     Lines bigning with # are comment line.
#     ClientId, SensorNetAddress, "unstableLine", "secureConnection"
#     in case of UDP, SensorNetAddress format is IPAddress: port no.
#
# Ex:
#     #Client List
#     ClientId1,192.168.10.10:11200
#     ClientID2,192.168.50.200:35000,unstableLine
#     ClientID3,192.168.200.50:40000,secureConnection
#     ClientID4,192.168.200.52:41000,unstableLine,secureConnection
#     ClientID5,192.168.200.53:41000,unstableLine,secureConnection,QoS-1 
#     ClientID6,192.168.200.54:41000,unstableLine,secureConnection,forwarder
#
GatewayTester, 172.16.1.11:20020
ClientPUB,172.16.1.11:2010
Client01,172.16.1.11:12001
Client02,172.16.1.11:12002
Client03,172.16.1.11:13003

QoS-1_Client01,172.16.1.11:20001,QoS-1
QoS-1_Client02,172.16.1.11:20002,QoS-1
QoS-1_Client03,172.16.1.11:20003,QoS-1

Forwarder01,172.16.1.11:22002,forwarder
Forwarder02,172.16.1.11:22003,forwarder
Forwarder03,172.16.1.11:22004,forwarder

"""

# The predefinedTopic.conf it ships.
PAHO_PREDEFINED_TOPIC_CONF = """\
#
#  pre-defined-topics are defined by this file.
#  A format of this file is in CSV as follows:
#
#     ClientID, TopicName, TopicID
#
#     Topics is common to all clients, ClientID should be *.

#
#  pre-defined-topics for Clients
#

*,ty4tw/predefinedTopic1, 1
GatewayTestClient,ty4tw/predefinedTopic2, 2
GatewayTestClient,ty4tw/predefinedTopic3, 3

#
#  pre-defined-topics for QoS-1 clients.
# 


QoS-1_Client03,ty4tw/proxy/predefTopic4, 1
QoS-1_Client03,ty4tw/proxy/predefTopic5, 2
QoS-1_Client03,ty4tw/proxy/predefTopic6, 3
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_pahos_clients_conf_lists_its_clients_by_address(tmp_path):
    clients = ClientList.from_file(write(tmp_path, "clients.conf", PAHO_CLIENTS_CONF))
    assert len(clients.by_address) == 11
    tester = clients.at("172.16.1.11", 20020)
    assert tester.client_id == "GatewayTester"
    assert (tester.forwarder, tester.qos_minus_one, tester.unstable_line) == (False, False, False)
    assert clients.at("172.16.1.11", 20003).client_id == "QoS-1_Client03"
    assert clients.at("172.16.1.11", 20003).qos_minus_one
    assert clients.at("172.16.1.11", 22002).forwarder
    assert clients.at("172.16.1.11", 22002).client_id == "Forwarder01"
    assert clients.at("172.16.1.11", 22005) is None
    assert clients.at("172.16.1.12", 20020) is None
    assert clients.addresses("Client02") == [("172.16.1.11", 12002)]


def test_a_listed_client_may_connect_from_its_address_and_from_no_other(tmp_path):
    clients = ClientList.from_file(write(tmp_path, "clients.conf", PAHO_CLIENTS_CONF))
    assert clients.may_connect("Client01", "172.16.1.11", 12001)
    assert not clients.may_connect("Client01", "172.16.1.11", 12002)
    assert not clients.may_connect("Client02", "172.16.1.11", 12001)
    assert not clients.may_connect("Someone", "10.0.0.1", 12001)
    # A forwarder's line lists a forwarder, not a client.
    assert not clients.may_connect("Forwarder01", "172.16.1.11", 22002)
    # An IPv4 peer as a dual-stack socket reports it.
    assert clients.may_connect("Client01", "::ffff:172.16.1.11", 12001)


def test_the_example_lines_of_every_flag_in_pahos_comment_parse():
    examples = [
        line.strip().lstrip("#").strip()
        for line in PAHO_CLIENTS_CONF.splitlines()
        if line.startswith("#     Client") and ":" in line
    ]
    clients = ClientList.parse(examples, "clients.conf")
    by_id = {entry.client_id: entry for entry in clients.by_address.values()}
    assert sorted(by_id) == [
        "ClientID2", "ClientID3", "ClientID4", "ClientID5", "ClientID6", "ClientId1",
    ]
    assert by_id["ClientID2"].unstable_line and not by_id["ClientID2"].secure_connection
    assert by_id["ClientID3"].secure_connection
    assert by_id["ClientID5"].qos_minus_one and by_id["ClientID5"].unstable_line
    assert by_id["ClientID6"].forwarder and not by_id["ClientID6"].qos_minus_one
    assert (by_id["ClientId1"].host, by_id["ClientId1"].port) == ("192.168.10.10", 11200)


def test_the_port_at_address_form_of_earlier_paho_releases_is_read():
    clients = ClientList.parse(
        ["ClientId1,11200@192.168.10.10", "ClientID2,35000@192.168.50.200,unstableLine"]
    )
    assert clients.at("192.168.10.10", 11200).client_id == "ClientId1"
    assert clients.at("192.168.50.200", 35000).unstable_line


def test_ipv6_addresses_are_written_in_brackets_and_read_in_one_form():
    clients = ClientList.parse(["Node6,[FE80:0:0::1]:2000", "Mapped,[::ffff:10.0.0.1]:5"])
    assert clients.at("fe80::1", 2000).client_id == "Node6"
    assert clients.at("10.0.0.1", 5).client_id == "Mapped"
    assert parse_address("[2001:db8::1]:1883") == ("2001:db8::1", 1883)
    assert address_key("not-an-address", 1883) is None


@pytest.mark.parametrize(
    "lines, says",
    [
        (["Client01"], "clients.conf:1: 'Client01' has no address (ClientId, ADDRESS:PORT)"),
        (["Client01,"], "clients.conf:1: 'Client01' has no address"),
        (["# one", "Client01,172.16.1.11"], "clients.conf:2: '172.16.1.11' has no port"),
        (
            ["Client01,172.16.1.11:0"],
            "clients.conf:1: '172.16.1.11:0': the port must be a number from 1 to 65535",
        ),
        (["Client01,172.16.1.11:65536"], "the port must be a number from 1 to 65535"),
        (["Client01,172.16.1.11:+80"], "the port must be a number from 1 to 65535"),
        (
            ["Client01,sensor.local:2000"],
            "clients.conf:1: 'sensor.local:2000': 'sensor.local' is not an IP address",
        ),
        (["Client01,172.16.1.300:2000"], "'172.16.1.300' is not an IP address"),
        (["Client01,::1:2000"], "'::1:2000': an IPv6 address is written [ADDRESS]:PORT"),
        (["Client01,[::1:2000"], "'[::1:2000': an IPv6 address is written [ADDRESS]:PORT"),
        (
            ["Client01,172.16.1.11:2000,stable"],
            "clients.conf:1: unknown flag 'stable' "
            "(the flags are unstableLine, secureConnection, forwarder, QoS-1)",
        ),
        (["Client01,172.16.1.11:2000,qos-1"], "unknown flag 'qos-1'"),
        ([",172.16.1.11:2000"], "clients.conf:1: no client id before the first comma"),
        (["Client 01,172.16.1.11:2000"], "clients.conf:1: client id 'Client 01' holds white space"),
        (
            ["A,172.16.1.11:2000", "", "B,172.16.1.11:2000"],
            "clients.conf:3: address 172.16.1.11:2000 is already 'A''s, on line 1",
        ),
        (
            ["A,[::1]:2000", "B,[0:0::1]:2000"],
            "clients.conf:2: address [::1]:2000 is already 'A''s, on line 1",
        ),
    ],
)
def test_a_clients_line_that_cannot_be_used_is_one_error_naming_file_and_line(lines, says):
    with pytest.raises(AuthConfigError) as raised:
        ClientList.parse(lines, "clients.conf")
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_clients_file_that_cannot_be_read_is_one_error_naming_it(tmp_path):
    missing = tmp_path / "absent.conf"
    with pytest.raises(ConfigError, match=f"{missing}: cannot read: No such file or directory"):
        ClientList.from_file(missing)
    binary = tmp_path / "binary.conf"
    binary.write_bytes(b"Client01,\xff\xfe:1\n")
    with pytest.raises(AuthConfigError, match=f"{binary}: cannot read"):
        ClientList.from_file(binary)


def test_a_byte_order_mark_and_windows_line_ends_are_read_through(tmp_path):
    path = tmp_path / "clients.conf"
    path.write_bytes(b"\xef\xbb\xbfClient01,10.0.0.1:2000\r\nClient02,10.0.0.1:2001\r\n")
    clients = ClientList.from_file(path)
    assert clients.at("10.0.0.1", 2000).client_id == "Client01"
    assert clients.at("10.0.0.1", 2001).client_id == "Client02"


def test_pahos_predefined_topic_conf_gives_every_client_and_named_clients_their_ids(tmp_path):
    topics = PredefinedTopics.from_file(
        write(tmp_path, "predefinedTopic.conf", PAHO_PREDEFINED_TOPIC_CONF)
    )
    assert topics.common.names == {1: "ty4tw/predefinedTopic1"}
    assert sorted(topics.by_client) == ["GatewayTestClient", "QoS-1_Client03"]
    assert topics.topic_name("GatewayTestClient", 2) == "ty4tw/predefinedTopic2"
    assert topics.topic_name("GatewayTestClient", 3) == "ty4tw/predefinedTopic3"
    # Every client has id 1 from the "*" line ...
    assert topics.topic_name("GatewayTestClient", 1) == "ty4tw/predefinedTopic1"
    assert topics.topic_name("AnyOtherClient", 1) == "ty4tw/predefinedTopic1"
    # ... unless its own line gives 1 another topic.
    assert topics.topic_name("QoS-1_Client03", 1) == "ty4tw/proxy/predefTopic4"
    assert topics.topic_name("AnyOtherClient", 2) is None
    # And the way back, for publishing to a client.
    assert topics.topic_id("QoS-1_Client03", "ty4tw/proxy/predefTopic6") == 3
    assert topics.topic_id("QoS-1_Client03", "ty4tw/predefinedTopic1") == 1
    assert topics.topic_id("AnyOtherClient", "ty4tw/predefinedTopic2") is None


def test_a_topic_name_may_hold_commas_and_the_id_comes_after_the_last():
    topics = PredefinedTopics.parse(["*, site/a,b/temp, 7"])
    assert topics.topic_name("c", 7) == "site/a,b/temp"


def test_an_empty_predefined_topics_file_defines_nothing():
    topics = PredefinedTopics.parse(["# nothing yet", ""])
    assert topics.topic_name("c", 1) is None and topics.topic_id("c", "a") is None


@pytest.mark.parametrize(
    "lines, says",
    [
        (["GatewayTestClient,ty4tw/x"], "conf:1: expected ClientId, TopicName, TopicId"),
        (["GatewayTestClient 5"], "expected ClientId, TopicName, TopicId"),
        (["*,a/b, 0"], "predefinedTopic.conf:1: topic id '0' is not a number from 1 to 65534"),
        (["*,a/b, 65535"], "topic id '65535' is not a number from 1 to 65534"),
        (["*,a/b, 0x10"], "topic id '0x10' is not a number"),
        (["*,a/b, -5"], "topic id '-5' is not a number"),
        (["*,a/b, " + "9" * 5000], "is not a number from 1 to 65534"),
        (["*,a/b,"], "topic id '' is not a number"),
        (["*,a/+, 5"], "predefinedTopic.conf:1: topic name 'a/+' contains a wildcard"),
        (["*,a/#, 5"], "topic name 'a/#' contains a wildcard"),
        (["*, , 5"], "predefinedTopic.conf:1: topic name is empty"),
        ([", a/b, 5"], "predefinedTopic.conf:1: no client id (or *) before the first comma"),
        (["*, a b, 5"], "predefinedTopic.conf:1: topic name 'a b' holds white space"),
        (["Client 1, a/b, 5"], "client id 'Client 1' holds white space"),
        (
            ["*, a/b, 1", "# another", "*, a/c, 1"],
            "predefinedTopic.conf:3: every client's topic id 1 is already on line 1",
        ),
        (
            ["C1, a/b, 1", "C1, a/b, 2"],
            "predefinedTopic.conf:2: 'C1''s topic name 'a/b' is already on line 1",
        ),
    ],
)
def test_a_predefined_line_that_cannot_be_used_is_one_error_naming_file_and_line(lines, says):
    with pytest.raises(AuthConfigError) as raised:
        PredefinedTopics.parse(lines, "predefinedTopic.conf")
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_same_id_or_name_for_different_clients_is_no_conflict():
    topics = PredefinedTopics.parse(["C1, a/b, 1", "C2, a/c, 1", "C2, a/b, 2", "*, a/b, 3"])
    assert topics.topic_name("C1", 1) == "a/b"
    assert topics.topic_name("C2", 1) == "a/c"
    assert topics.topic_id("C2", "a/b") == 2
    assert topics.topic_id("C3", "a/b") == 3

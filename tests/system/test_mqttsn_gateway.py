"""
The MQTT-SN listener from outside, over real UDP on 127.0.0.1, against a
gateway run as a user runs it (``twistd -n mqttgw --mqttsn ...``): the
mqtt-sn-12 package's tools and library, a raw socket for what no library
sends, and paho-mqtt or mosquitto's clients on the MQTT side.  One test
(or a few) per numbered item of issue 56, named for it.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


from mqttgw.wire import mqttsn as S
from mqttgw.wire.mqttsn import constants as C
from tests.conftest import require_program
from tests.gateway import Gateway, gateway_env
from tests.mqttsn_raw import RawSn
from tests.paho import PahoClient

BIN = str(Path(sys.executable).parent)
TIMEOUT = 10


def tool(name, *args, timeout=TIMEOUT):
    """Run mqtt-sn-12's ``mqtt_sn_pub``/``mqtt_sn_sub`` to its end; its result."""
    path = require_program(name, BIN)
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout)


def start_tool(name, *args):
    path = require_program(name, BIN)
    return subprocess.Popen([path, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def mqtt_subscriber(gw, topic_filter, client_id="watcher"):
    sub = PahoClient(gw.port, client_id, "MQTTv311")
    sub.connect()
    sub.subscribe(topic_filter, 1)
    return sub


def sn_gateway(gateway_with, *args):
    return gateway_with("--mqttsn", "127.0.0.1:0", *args)


def wait_for(condition, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


# 1. Every packet of 1.2


def test_item_1_every_packet_of_mqtt_sn_1_2_in_both_length_forms(gateway_with):
    gw = sn_gateway(gateway_with, "--sys-interval", "0")
    assert "(mqttsn) accepts any client id" in gw.log()
    watcher = mqtt_subscriber(gw, "walk/#")
    a = RawSn(gw.mqttsn_port)
    # SEARCHGW -> GWINFO, three bytes for three.
    a.send(S.SearchGw(1))
    assert a.expect(S.GwInfo)[0] == S.GwInfo(1)
    # CONNECT with a will: WILLTOPICREQ, WILLTOPIC, WILLMSGREQ, WILLMSG, CONNACK.
    assert a.connect("walker", will=("walk/will", b"bye", 1, False)) == 0
    a.send(S.Register(0, 1, "walk/t"))
    regack = a.expect(S.Regack)[0]
    assert regack.return_code == 0 and regack.message_id == 1 and 0 < regack.topic_id < 0x8000
    tid = regack.topic_id
    a.send(S.Publish(tid, b"q0", 0))
    a.send(S.Publish(tid, b"q1", 1, message_id=2))
    assert a.expect(S.Puback)[0] == S.Puback(tid, 2, 0)
    a.send(S.Publish(tid, b"q2", 2, message_id=3))
    assert a.expect(S.Pubrec)[0] == S.Pubrec(3)
    a.send(S.Pubrel(3))
    assert a.expect(S.Pubcomp)[0] == S.Pubcomp(3)
    # The long length form (0x01 and two bytes) both ways.
    big = bytes(range(256)) + b"x" * 44
    a.send(S.Publish(tid, big, 1, message_id=4))
    assert a.expect(S.Puback)[0].message_id == 4
    assert [m.payload for m in watcher.receive(4)] == [b"q0", b"q1", b"q2", big]
    # SUBSCRIBE to a wildcard: SUBACK with topic id 0, then a REGISTER
    # from the gateway before the first delivery, QoS 2 outbound.
    b = RawSn(gw.mqttsn_port)
    assert b.connect("reader") == 0
    b.send(S.Subscribe(1, "walk/+", qos=2))
    assert b.expect(S.Suback)[0] == S.Suback(0, 1, 0, 2)
    a.send(S.Publish(tid, big, 2, message_id=5))
    a.expect(S.Pubrec)
    a.send(S.Pubrel(5))
    a.expect(S.Pubcomp)
    assert watcher.receive()[0].payload == big
    register = b.expect(S.Register)[0]
    assert register.topic_name == "walk/t"
    b.send(S.Regack(register.topic_id, register.message_id, 0))
    raw = b.recv_raw()
    assert raw[0] == 0x01 and S.decode(raw).data == big and S.decode(raw).qos == 2
    b.send(S.Pubrec(S.decode(raw).message_id))
    assert b.expect(S.Pubrel)[0] == S.Pubrel(S.decode(raw).message_id)
    b.send(S.Pubcomp(S.decode(raw).message_id))
    # UNSUBSCRIBE, PINGREQ, the will's updates, DISCONNECT.
    b.send(S.Unsubscribe(2, "walk/+"))
    assert b.expect(S.Unsuback)[0] == S.Unsuback(2)
    b.send(S.Pingreq())
    assert b.expect(S.Pingresp)[0] == S.Pingresp()
    a.send(S.WillTopicUpd("walk/will2", 0, False))
    assert a.expect(S.WillTopicResp)[0] == S.WillTopicResp(0)
    a.send(S.WillMsgUpd(b"bye2"))
    assert a.expect(S.WillMsgResp)[0] == S.WillMsgResp(0)
    b.send(S.Disconnect())
    assert b.expect(S.Disconnect)[0] == S.Disconnect()
    # A forwarder's node: answered encapsulated, with its node id.
    f = RawSn(gw.mqttsn_port)
    f.send(S.Encapsulated(S.Connect("behind", 30), b"\x00\x13\xa2"))
    assert S.decode(f.recv_raw()) == S.Encapsulated(S.Connack(0), b"\x00\x13\xa2")
    f.send(S.Encapsulated(S.Publish(S.short_topic_id("wf"), b"via", 1, message_id=7, topic_id_type=2), b"\x00\x13\xa2"))
    assert S.decode(f.recv_raw()) == S.Encapsulated(S.Puback(S.short_topic_id("wf"), 7, 0), b"\x00\x13\xa2")
    # The will as updated, when the walker is taken over by an MQTT client.
    taker = PahoClient(gw.port, "walker", "MQTTv311")
    taker.connect()
    [will] = watcher.receive()
    assert (will.topic, will.payload) == ("walk/will2", b"bye2")
    for raw_client in (a, b, f):
        raw_client.close()


def test_item_1_mqtt_sn_pub_at_qos_0_1_and_2_reaches_a_paho_subscriber(gateway_with):
    gw = sn_gateway(gateway_with)
    watcher = mqtt_subscriber(gw, "tools/#")
    for qos in ("0", "1", "2"):
        run = tool("mqtt_sn_pub", "-p", str(gw.mqttsn_port), "-t", "tools/t", "-m", f"at {qos}", "-q", qos,
                   "--timeout", "5")
        assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(m.payload for m in watcher.receive(3)) == [b"at 0", b"at 1", b"at 2"]


def test_item_1_mqtt_sn_sub_receives_what_mosquitto_pub_publishes(gateway_with):
    gw = sn_gateway(gateway_with)
    sub = start_tool("mqtt_sn_sub", "-p", str(gw.mqttsn_port), "-t", "from/+", "-q", "1", "-1", "--timeout", "5")
    try:
        assert wait_for(lambda: "connected from" in gw.log() and "MQTT-SN" in gw.log())
        mosquitto_pub = require_program("mosquitto_pub")
        # Published until the subscriber has subscribed and prints it.
        deadline = time.monotonic() + TIMEOUT
        while sub.poll() is None and time.monotonic() < deadline:
            subprocess.run([mosquitto_pub, "-p", str(gw.port), "-h", "127.0.0.1", "-t", "from/mqtt",
                            "-m", "hello sn", "-q", "1"], check=True, timeout=TIMEOUT)
            try:
                sub.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        out = sub.communicate(timeout=TIMEOUT)[0]
    finally:
        if sub.poll() is None:
            sub.kill()
    assert "hello sn" in out, out


# 2. Topics: normal ids, short names, pre-defined ids


def test_item_2_topics_short_names_predefined_ids_and_idempotent_register(gateway_with, tmp_path):
    predefined = tmp_path / "predefinedTopic.conf"
    predefined.write_text("# Paho's format\n*, sensors/predefined, 5\nspecial, sensors/special, 5\n")
    gw = sn_gateway(gateway_with, "--mqttsn-predefined-topics", str(predefined))
    watcher = mqtt_subscriber(gw, "#")
    port = str(gw.mqttsn_port)
    assert tool("mqtt_sn_pub", "-p", port, "-T", "5", "-m", "pre", "-q", "1", "--timeout", "5").returncode == 0
    assert tool("mqtt_sn_pub", "-p", port, "-i", "special", "-T", "5", "-m", "own", "--timeout", "5").returncode == 0
    assert tool("mqtt_sn_pub", "-p", port, "-t", "ab", "-m", "short", "--timeout", "5").returncode == 0
    got = {(m.topic, m.payload) for m in watcher.receive(3)}
    assert got == {("sensors/predefined", b"pre"), ("sensors/special", b"own"), ("ab", b"short")}
    raw = RawSn(gw.mqttsn_port)
    assert raw.connect("reg") == 0
    ids = set()
    for mid in (1, 2, 3):
        raw.send(S.Register(0, mid, "same/name"))
        ids.add(raw.expect(S.Regack)[0].topic_id)
    assert len(ids) == 1
    # A pre-defined id subscribed: SUBACK carries it, deliveries use it.
    raw.send(S.Subscribe(4, topic_id=5, topic_id_type=1, qos=0))
    assert raw.expect(S.Suback)[0] == S.Suback(5, 4, 0, 0)
    pub = PahoClient(gw.port, "p2", "MQTTv311")
    pub.connect()
    pub.publish("sensors/predefined", b"down", 0)
    delivered = raw.expect(S.Publish)[0]
    assert (delivered.topic_id_type, delivered.topic_id, delivered.data) == (1, 5, b"down")
    # A wildcard in a short name is refused.
    raw.send(S.Subscribe(5, "a+", topic_id_type=2))
    assert raw.expect(S.Suback)[0].return_code == 2
    raw.close()


# 3. Sessions like every other client's


def test_item_3_sessions_persist_in_the_store_survive_sigkill_and_show_as_mqtt_sn(tmp_path):
    gw = Gateway(tmp_path, "--mqttsn", "127.0.0.1:0", "--sys-interval", "1")
    try:
        sn = RawSn(gw.mqttsn_port)
        assert sn.connect("keeper", clean=False) == 0
        sn.send(S.Subscribe(1, "persist/+", qos=1))
        assert sn.expect(S.Suback)[0].return_code == 0
        # Shown as MQTT-SN where clients are counted by protocol.
        sys_sub = mqtt_subscriber(gw, "$SYS/broker/clients/protocol/mqtt-sn", "sys")
        assert sys_sub.receive()[0].payload == b"1"
        sn.send(S.Disconnect())
        sn.expect(S.Disconnect)
        pub = PahoClient(gw.port, "pub", "MQTTv311")
        pub.connect()
        # Acknowledged: committed to the store before the PUBACK.
        pub.publish("persist/t", b"kept across a crash", 1)
        pub.disconnect()
    finally:
        gw.stop(signal.SIGKILL)
    gw = Gateway(tmp_path, "--mqttsn", "127.0.0.1:0")
    try:
        sn = RawSn(gw.mqttsn_port)
        assert sn.connect("keeper", clean=False) == 0
        register = sn.expect(S.Register)[0]
        assert register.topic_name == "persist/t"
        sn.send(S.Regack(register.topic_id, register.message_id, 0))
        delivered = sn.expect(S.Publish)[0]
        assert delivered.data == b"kept across a crash" and delivered.qos == 1
        sn.send(S.Puback(delivered.topic_id, delivered.message_id, 0))
        sn.close()
    finally:
        gw.stop()
        assert "Traceback" not in gw.log(), gw.log()



def test_item_3_registrations_of_a_persistent_session_survive_sigkill(tmp_path):
    port = _free_udp_port()
    gw = Gateway(tmp_path, "--mqttsn", f"127.0.0.1:{port}", "--sys-interval", "0")
    sn = RawSn(port)
    try:
        assert sn.connect("registrar", clean=False) == 0
        # The client's REGISTER, a SUBSCRIBE by name, and the gateway's REGISTER (acknowledged).
        sn.send(S.Register(0, 1, "reg/up"))
        regack = sn.expect(S.Regack)[0]
        assert regack.return_code == 0
        up = regack.topic_id
        sn.send(S.Subscribe(2, "reg/down", qos=1))
        suback = sn.expect(S.Suback)[0]
        assert suback.return_code == 0 and suback.topic_id not in (0, up)
        down = suback.topic_id
        sn.send(S.Subscribe(3, "reg/wild/+", qos=1))
        assert sn.expect(S.Suback)[0].return_code == 0
        pub = PahoClient(gw.port, "pub", "MQTTv311")
        pub.connect()
        pub.publish("reg/wild/x", b"first", 1)
        register = sn.expect(S.Register)[0]
        assert register.topic_name == "reg/wild/x"
        wild = register.topic_id
        sn.send(S.Regack(wild, register.message_id, 0))
        delivered = sn.expect(S.Publish)[0]
        assert (delivered.topic_id, delivered.data) == (wild, b"first")
        sn.send(S.Puback(wild, delivered.message_id, 0))
        # Acknowledged once committed, with every write before it: the REGACK's too.
        pub.publish("reg/down", b"second", 1)
        delivered = sn.expect(S.Publish)[0]
        assert (delivered.topic_id, delivered.data) == (down, b"second")
        sn.send(S.Puback(down, delivered.message_id, 0))
        assert sn.nothing() == []
        pub.disconnect()
    finally:
        gw.stop(signal.SIGKILL)
    gw = Gateway(tmp_path, "--mqttsn", f"127.0.0.1:{port}", "--sys-interval", "0")
    try:
        watcher = mqtt_subscriber(gw, "reg/#")
        # From the same address, clean session 0: no REGISTER, either way.
        assert sn.connect("registrar", clean=False) == 0
        sn.send(S.Publish(up, b"by its old id", 1, message_id=4))
        assert sn.expect(S.Puback)[0] == S.Puback(up, 4, 0)
        [got] = watcher.receive()
        assert (got.topic, got.payload) == ("reg/up", b"by its old id")
        pub = PahoClient(gw.port, "pub", "MQTTv311")
        pub.connect()
        for topic, topic_id in (("reg/down", down), ("reg/wild/x", wild)):
            pub.publish(topic, b"to " + topic.encode(), 1)
            delivered, before = sn.expect(S.Publish)
            assert before == []
            assert (delivered.topic_id, delivered.data) == (topic_id, b"to " + topic.encode())
            sn.send(S.Puback(topic_id, delivered.message_id, 0))
        pub.disconnect()
        # A clean session: its registrations go with the old one.
        sn.send(S.Disconnect())
        sn.expect(S.Disconnect)
        assert sn.connect("registrar", clean=True) == 0
        sn.send(S.Publish(up, b"gone", 1, message_id=5))
        assert sn.expect(S.Puback)[0] == S.Puback(up, 5, C.REJECTED_INVALID_TOPIC_ID)
        sn.close()
    finally:
        gw.stop()
        assert "Traceback" not in gw.log(), gw.log()


def test_item_3_take_over_by_the_same_client_id_across_listener_kinds(gateway_with):
    gw = sn_gateway(gateway_with)
    watcher = mqtt_subscriber(gw, "twins/#")
    sn = RawSn(gw.mqttsn_port)
    assert sn.connect("twin", will=("twins/will", b"sn gone", 0, False)) == 0
    tcp = PahoClient(gw.port, "twin", "MQTTv311")
    tcp.connect()
    assert watcher.receive()[0].payload == b"sn gone"
    # The MQTT-SN client was let go: its address is not connected.
    sn.send(S.Pingreq())
    assert sn.nothing(0.5) == []
    # And back the other way.
    again = RawSn(gw.mqttsn_port)
    assert again.connect("twin") == 0
    assert tcp.disconnected.wait(TIMEOUT)


# 4. Sleeping clients


def test_item_4_sleeping_client_holds_messages_until_its_pingreq_then_is_lost_past_1_5_times(gateway_with):
    gw = sn_gateway(gateway_with)
    watcher = mqtt_subscriber(gw, "sleep/will")
    sleeper = RawSn(gw.mqttsn_port)
    assert sleeper.connect("sleeper", clean=False) == 0
    sleeper.send(S.Subscribe(1, "sleep/news", qos=1))
    topic_id = sleeper.expect(S.Suback)[0].topic_id
    sleeper.send(S.Disconnect(60))
    assert sleeper.expect(S.Disconnect)[0] == S.Disconnect()
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    for n in range(3):
        pub.publish("sleep/news", b"held %d" % n, 1)
    assert sleeper.nothing(0.5) == []
    sleeper.send(S.Pingreq("sleeper"))
    held = []
    while len(held) < 3:
        message, before = sleeper.expect(S.Publish)
        assert before == [] and message.topic_id == topic_id
        held.append(message.data)
        sleeper.send(S.Puback(topic_id, message.message_id, 0))
    assert held == [b"held 0", b"held 1", b"held 2"]
    assert sleeper.expect(S.Pingresp)[0] == S.Pingresp()
    # A sleeper that misses its duration x 1.5 is lost: its will goes.
    brief = RawSn(gw.mqttsn_port)
    assert brief.connect("brief", will=("sleep/will", b"missed", 0, False)) == 0
    brief.send(S.Disconnect(1))
    brief.expect(S.Disconnect)
    started = time.monotonic()
    will = watcher.receive()[0]
    assert (will.topic, will.payload) == ("sleep/will", b"missed")
    assert time.monotonic() - started >= 1.0


# 5. Addresses change


def test_item_5_address_change_a_sleeper_waking_or_connecting_from_a_new_port_resumes(gateway_with):
    gw = sn_gateway(gateway_with)
    first = RawSn(gw.mqttsn_port)
    assert first.connect("mover", clean=False) == 0
    first.send(S.Subscribe(1, "move/t", qos=1))
    topic_id = first.expect(S.Suback)[0].topic_id
    first.send(S.Disconnect(60))
    first.expect(S.Disconnect)
    pub = PahoClient(gw.port, "pub", "MQTTv311")
    pub.connect()
    pub.publish("move/t", b"to the new port", 1)
    second = RawSn(gw.mqttsn_port)
    second.send(S.Pingreq("mover"))
    message = second.expect(S.Publish)[0]
    assert (message.topic_id, message.data) == (topic_id, b"to the new port")
    second.send(S.Puback(topic_id, message.message_id, 0))
    second.expect(S.Pingresp)
    # The old address is forgotten.
    first.send(S.Pingreq())
    assert first.nothing(0.5) == []
    pub.publish("move/t", b"after a CONNECT", 1)
    third = RawSn(gw.mqttsn_port)
    assert third.connect("mover", clean=False) == 0
    message = third.expect(S.Publish)[0]
    assert message.data == b"after a CONNECT"
    third.send(S.Puback(message.topic_id, message.message_id, 0))
    second.send(S.Pingreq())
    assert second.nothing(0.5) == []


# 6. QoS -1


def test_item_6_qos_minus_one_is_routed_only_when_enabled(gateway_with, tmp_path):
    predefined = tmp_path / "predefinedTopic.conf"
    predefined.write_text("*, field/minus, 7\n")
    on = sn_gateway(gateway_with, "--mqttsn-predefined-topics", str(predefined), "--mqttsn-qos-minus-one")
    off = sn_gateway(gateway_with, "--mqttsn-predefined-topics", str(predefined))
    watchers = {gw: mqtt_subscriber(gw, "#") for gw in (on, off)}
    for gw in (on, off):
        port = str(gw.mqttsn_port)
        for topic in (["-T", "7", "-m", "no connect"], ["-t", "mo", "-m", "short"]):
            assert tool("mqtt_sn_pub", "-p", port, "-q", "-1", *topic, "--timeout", "3").returncode == 0
    got = {(m.topic, m.payload) for m in watchers[on].receive(2)}
    assert got == {("field/minus", b"no connect"), ("mo", b"short")}
    assert watchers[off].nothing_more(0.5)
    off.wait_for_log("QoS -1 PUBLISH while mqttsn.qos_minus_one is off")


# 7. Discovery


def _free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_item_7_discovery_advertise_on_the_group_and_gwinfo_for_searchgw(gateway_with):
    group, group_port = "225.1.56.1", _free_udp_port()
    gw = sn_gateway(gateway_with, "--mqttsn-multicast", f"{group}:{group_port}", "--mqttsn-advertise-interval", "1",
                    "--mqttsn-gateway-id", "42")
    member = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    member.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        member.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    member.bind(("", group_port))
    member.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      socket.inet_aton(group) + socket.inet_aton("127.0.0.1"))
    member.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    member.settimeout(5)
    try:
        seen = []
        deadline = time.monotonic() + TIMEOUT
        while S.Advertise(42, 1) not in seen and time.monotonic() < deadline:
            seen.append(S.decode(member.recvfrom(1000)[0]))
        assert S.Advertise(42, 1) in seen
        member.sendto(S.SearchGw(1).encode(), (group, group_port))
        answers = []
        while S.GwInfo(42) not in answers and time.monotonic() < deadline:
            answers.append(S.decode(member.recvfrom(1000)[0]))
        assert S.GwInfo(42) in answers
    finally:
        member.close()
    # The library's SEARCHGW, sent to the listener's port.
    from mqttsn12.client.MqttSnClient import MqttSnClient

    client = MqttSnClient()
    client.set_timeout(5)
    client.open("127.0.0.1", gw.mqttsn_port)
    try:
        client.send_search_gateway(1)
    finally:
        client.close()
    unicast = RawSn(gw.mqttsn_port)
    unicast.send(S.SearchGw(0))
    assert unicast.expect(S.GwInfo)[0] == S.GwInfo(42)


# 8. Who may connect


def test_item_8_with_a_clients_file_only_listed_ids_from_their_addresses_connect(gateway_with, tmp_path):
    listed, elsewhere = RawSn(0), RawSn(0)
    clients = tmp_path / "clients.conf"
    clients.write_text(f"# Paho's clients.conf\nmeter-1, 127.0.0.1:{listed.port}\n")
    acl = tmp_path / "acl"
    acl.write_text("topic read meters/#\nuser meter-1\ntopic write meters/1/#\n")
    gw = sn_gateway(gateway_with, "--mqttsn-clients", str(clients), "--acl-file", str(acl))
    assert "accepts any client id" not in gw.log()
    watcher = mqtt_subscriber(gw, "meters/#")
    for raw in (listed, elsewhere):
        raw.address = ("127.0.0.1", gw.mqttsn_port)
    assert elsewhere.connect("meter-1") != 0
    assert listed.connect("intruder") != 0
    assert listed.connect("meter-1") == 0
    # Its identity for the ACL is its client id.
    for topic, payload in (("meters/1/kwh", b"allowed"), ("meters/2/kwh", b"denied")):
        listed.send(S.Register(0, 1, topic))
        topic_id = listed.expect(S.Regack)[0].topic_id
        listed.send(S.Publish(topic_id, payload, 1, message_id=2))
        listed.expect(S.Puback)
    assert [m.payload for m in watcher.receive()] == [b"allowed"]
    assert watcher.nothing_more(0.5)


# 9. Hostile input


def test_item_9_hostile_input_is_dropped_counted_and_never_amplified(gateway_with):
    gw = sn_gateway(gateway_with, "--max-packet-size", "512")
    hostile = RawSn(gw.mqttsn_port)
    bad = [
        b"\x01",  # truncated
        b"\x05\x04\x00",  # a Length that lies
        b"\x01\x00\x05\x0c\x00",  # three-byte Length, lying
        b"\x03\x99\x00",  # unknown type
        bytes((0x01, 0x03, 0x00, 0x0c)) + b"x" * 764,  # oversized
        S.Puback(1, 1, 0).encode(),  # wrong state: not connected
        S.Subscribe(1, "a/#").encode(),
        S.WillMsg(b"nothing asked for this").encode(),
        S.Pingreq().encode(),
        S.Publish(1, b"normal id, not connected", 0).encode(),
        b"\x04\xfe\x00\x00",  # an encapsulation with nothing inside
        S.SearchGw(0).encode(),
    ]
    for _ in range(20):
        for data in bad:
            hostile.send(data)
    answers = hostile.nothing(1.0)
    assert hostile.received <= hostile.sent
    assert all(S.decode(a) == S.GwInfo(1) for a in answers)
    # The gateway is alive and serves others.
    good = RawSn(gw.mqttsn_port)
    assert good.connect("fine") == 0
    good.send(S.Pingreq())
    assert good.expect(S.Pingresp)[0] == S.Pingresp()
    # Logged once per address per interval, not once per datagram.
    assert gw.log().count("dropped an MQTT-SN datagram") == 1
    assert "Traceback" not in gw.log()


# 10. Routed, bridged and archived like any other


def test_item_10_messages_from_mqtt_sn_clients_are_archived_with_their_client_id_and_listener(tmp_path):
    import pyarrow.dataset as ds

    archive_dir = tmp_path / "archive"
    gw = Gateway(tmp_path, "--mqttsn", "127.0.0.1:0", "--archive", str(archive_dir), "--no-persistence")
    try:
        run = tool("mqtt_sn_pub", "-p", str(gw.mqttsn_port), "-i", "sn-meter", "-t", "archive/t", "-m", "kept",
                   "-q", "1", "--timeout", "5")
        assert run.returncode == 0, run.stdout + run.stderr
    finally:
        gw.stop()
    rows = ds.dataset(archive_dir, format="parquet", partitioning="hive", exclude_invalid_files=True).to_table()
    found = [(r["direction"], r["client_id"], r["listener"], r["topic"], r["payload"]) for r in rows.to_pylist()]
    assert ("in", "sn-meter", "mqttsn", "archive/t", b"kept") in found


def test_settings_a_bad_mqttsn_address_or_key_is_one_line_at_start_up(tmp_path):
    twistd = Path(sys.executable).parent / "twistd"
    for args, text in (
        (["--mqttsn", "tcp:1883"], "listeners.mqttsn"),
        (["--mqttsn", "0", "--mqttsn-gateway-id", "300"], "gateway-id"),
        (["--mqttsn", "0", "--mqttsn-multicast", "10.0.0.1:1883"], "mqttsn.multicast"),
    ):
        run = subprocess.run([str(twistd), "-n", "--pidfile=", "mqttgw", *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60, env=gateway_env())
        assert run.returncode != 0
        assert text in run.stderr + run.stdout, run.stderr + run.stdout
        assert "Traceback" not in run.stderr


def test_item_4_the_mqtt_sn_12_library_with_a_will_clean_session_0_and_a_sleep_it_misses(gateway_with):
    from mqttsn12.client.MqttSnClient import MqttSnClient

    gw = sn_gateway(gateway_with)
    watcher = mqtt_subscriber(gw, "#")
    client = MqttSnClient()
    client.set_client_id("lib-node")
    client.set_keep_alive(30)
    client.set_timeout(5)
    client.set_clean_session(False)
    client.set_will("lib/will", "asleep too long", 1, False)
    client.open("127.0.0.1", gw.mqttsn_port)
    try:
        client.send_connect()
        client.send_publish("lib/data", b"qos 1", 1)
        client.send_publish("lib/data", b"qos 2", 2)
        client.send_publish_short(S.short_topic_id("lb"), b"short", 0)
        client.send_will_message_update("asleep far too long")
        # Asleep for 1 s; it never wakes (the library cannot), so at 1.5 s it is lost.
        client.send_disconnect(1)
    finally:
        client.close()
    got = [(m.topic, m.payload) for m in watcher.receive(4)]
    assert got[:3] == [("lib/data", b"qos 1"), ("lib/data", b"qos 2"), ("lb", b"short")]
    assert got[3] == ("lib/will", b"asleep far too long")


def test_item_5_an_ipv6_listener_serves_clients_on_its_address(gateway_with):
    gw = gateway_with("--mqttsn", "[::1]:0")
    watcher = mqtt_subscriber(gw, "v6/#")
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    client.settimeout(5)
    try:
        client.sendto(S.Connect("six", 30).encode(), ("::1", gw.mqttsn_port))
        assert S.decode(client.recvfrom(100)[0]) == S.Connack(0)
        client.sendto(S.Publish(S.short_topic_id("v6"), b"over ::1", 1, message_id=1, topic_id_type=2).encode(),
                      ("::1", gw.mqttsn_port))
        assert S.decode(client.recvfrom(100)[0]) == S.Puback(S.short_topic_id("v6"), 1, 0)
    finally:
        client.close()
    assert watcher.receive()[0].payload == b"over ::1"
    assert "client six connected from [::1]:" in gw.log()


def test_item_10_messages_from_mqtt_sn_clients_are_bridged_upstream_like_any_other(gateway_with, start_mosquitto,
                                                                                    tmp_path):
    upstream = start_mosquitto(tmp_path / "mosquitto")
    gw = sn_gateway(gateway_with, "--bridge", f"127.0.0.1:{upstream.port}", "--bridge-topic", "field/# out 1")
    gw.wait_for_log("bridge default: upstream accepted CONNECT")
    central = PahoClient(upstream.port, "central", "MQTTv311")
    central.connect()
    central.subscribe("field/#", 1)
    run = tool("mqtt_sn_pub", "-p", str(gw.mqttsn_port), "-t", "field/meter", "-m", "upstream", "-q", "1",
               "--timeout", "5")
    assert run.returncode == 0, run.stdout + run.stderr
    message = central.receive()[0]
    assert (message.topic, message.payload) == ("field/meter", b"upstream")


def test_item_4_mqtt_sn_pub_with_a_will_that_sleeps_and_never_wakes_is_lost_and_its_will_sent(gateway_with):
    gw = sn_gateway(gateway_with)
    watcher = mqtt_subscriber(gw, "tool/#")
    run = tool("mqtt_sn_pub", "-p", str(gw.mqttsn_port), "-i", "tool-sleeper", "-t", "tool/data", "-m", "last words",
               "-q", "1", "--will-topic", "tool/will", "--will-payload", "slept too long", "--will-qos", "1",
               "-e", "1", "--timeout", "5")
    assert run.returncode == 0, run.stdout + run.stderr
    got = [(m.topic, m.payload) for m in watcher.receive(2)]
    assert got == [("tool/data", b"last words"), ("tool/will", b"slept too long")]
    assert "MQTT-SN client tool-sleeper at 127.0.0.1:" in gw.log() and "silent past its sleep duration" in gw.log()

"""The ``[mqttsn]`` section's keys: the MQTT-SN listeners' discovery, clients and topics (schema rows)."""

from mqttgw.schema import Key

MQTTSN_KEYS = [
    Key(
        "mqttsn", "gateway_id", int, 1, "the gateway id MQTT-SN's ADVERTISE and GWINFO carry", 1, 255,
        flag_name="mqttsn-gateway-id",
    ),
    Key(
        "mqttsn", "multicast", str, "", "multicast GROUP:PORT for ADVERTISE and SEARCHGW (empty: no discovery)",
        flag_name="mqttsn-multicast",
        doc=(
            'E.g. ``"225.1.1.1:1883"``.  The group is joined, and ADVERTISE '
            "sent, on the listener's address when it is an IPv4 address; "
            "SEARCHGW on the group is answered with GWINFO to the group and "
            "to the asker.  A SEARCHGW sent to the listener's port is always "
            "answered, to its sender."
        ),
    ),
    Key(
        "mqttsn", "advertise_interval", int, 900, "seconds between ADVERTISE messages on the multicast group",
        1, 65535, flag_name="mqttsn-advertise-interval",
        doc="900 (15 minutes) is the Paho MQTT-SN Gateway's default; ADVERTISE carries it as its Duration.",
    ),
    Key(
        "mqttsn", "predefined_topics", str, "",
        "pre-defined topic ids, in the Paho MQTT-SN Gateway's predefinedTopic.conf format",
        flag_name="mqttsn-predefined-topics",
        doc=(
            "One ``ClientId, TopicName, TopicId`` a line, ``*`` for every "
            "client; a client's own line wins over a ``*`` line."
        ),
    ),
    Key(
        "mqttsn", "clients", str, "",
        "who may connect over MQTT-SN, from where: the Paho gateway's clients.conf format (empty: anyone)",
        flag_name="mqttsn-clients",
        doc=(
            "One ``ClientId, ADDRESS:PORT[, flag...]`` a line.  With a file, "
            "only listed client ids from their listed addresses connect, the "
            "client id is the identity the ACL and session ownership read, "
            "a ``forwarder`` line's encapsulated messages are taken, and a "
            "``QoS-1`` line's address may publish at QoS -1 as that client."
            "  Without one, any client id connects as an anonymous client."
        ),
    ),
    Key(
        "mqttsn", "max_clients_per_address", int, 1000,
        "MQTT-SN clients connected from one IP address at most, a forwarder's nodes included (0: no bound)",
        0, flag_name="mqttsn-max-clients-per-address",
        doc=(
            "A CONNECT past it is refused with CONNACK \"Rejected: congestion\".  "
            "Datagrams cost nothing to send from a spoofed address: this "
            "keeps one source from taking every place under "
            "``limits.max_connections``."
        ),
    ),
    Key(
        "mqttsn", "qos_minus_one", bool, False,
        "route QoS -1 PUBLISH (no CONNECT) on pre-defined ids and short names",
        flag_name="mqttsn-qos-minus-one",
        doc=(
            "Off by default: a QoS -1 sender is not even asked who it is.  "
            "The ACL is read for the anonymous identity, or for the client "
            "id the clients file gives the sender's address."
        ),
    ),
]

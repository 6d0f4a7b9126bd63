"""
What an MQTT-SN listener runs with, from the ``[mqttsn]`` section: the
gateway's id, discovery, QoS -1, the clients and pre-defined topics files
(parsed), and the bounds on datagrams and on state kept for addresses
that have not completed CONNECT.
"""

import ipaddress

import attr

from mqttgw.wire.mqttsn import constants as C


def parse_multicast(text):
    """(group, port) of ``"GROUP:PORT"``, None for "" (discovery off); ValueError naming what is wrong."""
    if not text:
        return None
    group, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{text!r} is not GROUP:PORT")
    try:
        address = ipaddress.IPv4Address(group)
    except ValueError:
        raise ValueError(f"{group!r} is not an IPv4 address") from None
    if not address.is_multicast:
        raise ValueError(f"{group} is not a multicast group (224.0.0.0/4)")
    return group, int(port)


@attr.s(frozen=True, slots=True)
class MqttSnOptions:
    gateway_id = attr.ib(default=1)
    # (group, port), or None: no ADVERTISE, no SEARCHGW on a group.
    multicast = attr.ib(default=None)
    advertise_interval = attr.ib(default=900)
    qos_minus_one = attr.ib(default=False)
    # mqttgw.security.mqttsn_clients.ClientList, or None: any client id
    # from anywhere.
    clients = attr.ib(default=None)
    # mqttgw.security.predefined_topics.PredefinedTopics, or None.
    predefined = attr.ib(default=None)
    # Datagrams longer are dropped (and no PUBLISH longer is sent).
    max_datagram_size = attr.ib(default=C.MAX_LENGTH)
    # CONNECTs waiting for their will (WILLTOPIC, WILLMSG) at most, and
    # how long one waits.
    max_half_open = attr.ib(default=1024)
    half_open_timeout = attr.ib(default=10.0)
    # Clients connected from one host (a forwarder's nodes too) at most; 0: no bound.
    max_clients_per_address = attr.ib(default=1000)
    # Persistent sessions whose topic registrations are kept while their
    # client is away.
    max_kept_registries = attr.ib(default=100_000)

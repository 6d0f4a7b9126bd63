"""
An MQTT-SN listener as a service: its UDP port bound at start-up (one
line naming it when it cannot be), its discovery started, and what it is
bound to for the start-up summary, readiness and the admin API.
"""

import ipaddress

from twisted.application.service import Service
from twisted.internet.error import CannotListenError

from mqttgw.transports.mqttsn.discovery import Discovery


def udp_address(text):
    """
    (interface, port) of ``PORT``, ``HOST:PORT``, ``[IPv6]:PORT`` or
    ``udp:PORT[:interface=HOST]``; ValueError naming what is wrong.
    """
    text = str(text).strip()
    interface = ""
    if text.startswith(("udp:", "udp6:")):
        fields = text.split(":", 1)[1]
        port, _, rest = fields.partition(":")
        if rest:
            name, eq, value = rest.partition("=")
            if name != "interface" or not eq:
                raise ValueError(f"{text!r}: only interface= may follow the port")
            interface = value.replace("\\:", ":")
    elif text.isdigit():
        port = text
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} is not PORT, HOST:PORT or udp:PORT:interface=HOST")
        interface = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: port {port!r} is not in 0-65535")
    if interface:
        try:
            ipaddress.ip_address(interface)
        except ValueError:
            raise ValueError(f"{text!r}: {interface!r} is not an IP address") from None
    return interface, int(port)


class MqttSnListenerService(Service):
    """``port`` is the bound UDP port once listening, None before and after."""

    kind = "mqttsn"
    secure = False

    def __init__(self, reactor, address, protocol, anonymous=False, discovery=None):
        self.reactor = reactor
        self.interface, self.port_number = udp_address(address)
        self.description = self.label = address
        self.name = f"mqttsn {address}"
        self.protocol = protocol
        self.anonymous = anonymous
        self.discovery = discovery
        self.port = None

    def privilegedStartService(self):
        try:
            self.port = self.reactor.listenUDP(
                self.port_number, self.protocol, interface=self.interface, maxPacketSize=65536
            )
        except CannotListenError as e:
            reason = getattr(e.socketError, "strerror", None) or e.socketError
            raise SystemExit(f"mqttgw: mqttsn listener {self.label}: cannot listen: {reason}") from None
        super().privilegedStartService()

    def startService(self):
        super().startService()
        if self.discovery is not None:
            self.discovery.start()

    def stopService(self):
        super().stopService()
        if self.discovery is not None:
            self.discovery.stop()
        port, self.port = self.port, None
        if port is not None:
            return port.stopListening()
        return None

    @property
    def address(self):
        if self.port is None:
            return self.label
        host = self.port.getHost()
        return f"{host.host}:{host.port}"

    def as_dict(self):
        return {
            "kind": self.kind,
            "address": self.address,
            "listening": self.port is not None,
            "tls": False,
            "anonymous": self.anonymous,
        }


def make_discovery(reactor, options, interface):
    """The listener's discovery, sent on its interface when that is an IPv4 address."""
    if options.multicast is None:
        return None
    try:
        ipv4 = ipaddress.ip_address(interface).version == 4 if interface else False
    except ValueError:
        ipv4 = False
    return Discovery(reactor, options.gateway_id, options.multicast, options.advertise_interval,
                     interface if ipv4 else "")

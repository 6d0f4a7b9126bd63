"""
Who may connect over MQTT-SN, from where: a clients file in the Paho
MQTT-SN Gateway's ``clients.conf`` format, one client a line:
``ClientId, Address[, flag...]``.  A parsed :class:`ClientList` is
immutable; a reload builds a new one.
"""

import ipaddress
import re

import attr

from mqttgw.security.files import AuthConfigError, read_lines

# The flags the Paho gateway reads after the address, and what they are
# here.  unstableLine: Paho parses it and acts on it nowhere; kept, with
# no effect.  secureConnection: Paho's link to its broker uses TLS for
# this client; messages here go into the router in-process, so there is
# no such link to secure.  forwarder: the address is a forwarder, whose
# Encapsulated messages are taken.  QoS-1: the address may publish at
# QoS -1, under this client id.
FLAGS = {
    "unstableLine": "unstable_line",
    "secureConnection": "secure_connection",
    "forwarder": "forwarder",
    "QoS-1": "qos_minus_one",
}

_PORT = re.compile(r"[0-9]{1,5}")


class AddressError(ValueError):
    """An address that is not one of the forms the clients file takes."""


def parse_address(text):
    """
    (host, port) from the Paho gateway's address forms: ``A.B.C.D:PORT``
    (UDP), ``[IPv6]:PORT`` (UDP6), and ``PORT@A.B.C.D`` of its earlier
    releases.  Numeric addresses only: a name would need a DNS lookup at
    every reload.  The host comes back as :func:`address_key` writes it.
    """
    if "@" in text:
        port, _, host = text.partition("@")
    elif text.startswith("["):
        host, separator, port = text[1:].partition("]:")
        if not separator:
            raise AddressError(f"{text!r}: an IPv6 address is written [ADDRESS]:PORT")
    else:
        host, separator, port = text.rpartition(":")
        if not separator:
            raise AddressError(f"{text!r} has no port: write ADDRESS:PORT")
        if ":" in host:
            raise AddressError(f"{text!r}: an IPv6 address is written [ADDRESS]:PORT")
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise AddressError(f"{text!r}: the port must be a number from 1 to 65535")
    key = address_key(host, int(port))
    if key is None:
        raise AddressError(f"{text!r}: {host!r} is not an IP address")
    return key


def address_key(host, port):
    """
    A datagram's source as the lists key it: the address written the one
    way ``ipaddress`` writes it, an IPv4-mapped IPv6 address as IPv4 (a
    dual-stack socket reports IPv4 peers so); None for no IP address.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


def show_address(host, port):
    """An address as the clients file writes it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@attr.s(frozen=True, slots=True)
class ListedClient:
    """One line of a clients file: a client id, its address, its flags."""

    client_id = attr.ib()
    host = attr.ib()
    port = attr.ib()
    unstable_line = attr.ib(default=False)
    secure_connection = attr.ib(default=False)
    forwarder = attr.ib(default=False)
    qos_minus_one = attr.ib(default=False)
    # Where it was read ("FILE:LINE"), for log lines and errors.
    where = attr.ib(default="", eq=False)


@attr.s(frozen=True, slots=True)
class ClientList:
    """
    The clients a file lists, by address: one client id per address,
    and a client id may be listed at several addresses.
    """

    by_address = attr.ib()

    @classmethod
    def from_file(cls, path):
        return cls.parse(read_lines(path), path)

    @classmethod
    def parse(cls, lines, where="clients"):
        by_address = {}
        for number, raw in enumerate(lines, 1):
            line = raw.strip().lstrip("\ufeff")
            if not line or line.startswith("#"):
                continue
            entry = _parse_line(line, f"{where}:{number}")
            earlier = by_address.get((entry.host, entry.port))
            if earlier is not None:
                raise AuthConfigError(
                    f"{entry.where}: address {show_address(entry.host, entry.port)} is already "
                    f"{earlier.client_id!r}'s, on line {earlier.where.rpartition(':')[2]}"
                )
            by_address[entry.host, entry.port] = entry
        return cls(by_address)

    def at(self, host, port):
        """The client listed at a datagram's source, or None."""
        return self.by_address.get(address_key(host, port))

    def may_connect(self, client_id, host, port):
        """Whether ``client_id`` is listed as a client (not a forwarder) at this address."""
        entry = self.at(host, port)
        return entry is not None and not entry.forwarder and entry.client_id == client_id

    def addresses(self, client_id):
        """Where ``client_id`` is listed, as (host, port) pairs."""
        return [key for key, entry in self.by_address.items() if entry.client_id == client_id]


def _parse_line(line, where):
    fields = [field.strip() for field in line.split(",")]
    client_id = fields[0]
    if not client_id:
        raise AuthConfigError(f"{where}: no client id before the first comma")
    if any(c.isspace() for c in client_id):
        # The Paho gateway deletes white space anywhere in the line: a
        # client id it would have read differently is named, not guessed.
        raise AuthConfigError(f"{where}: client id {client_id!r} holds white space")
    if len(fields) < 2 or not fields[1]:
        raise AuthConfigError(f"{where}: {client_id!r} has no address (ClientId, ADDRESS:PORT)")
    try:
        host, port = parse_address(fields[1])
    except AddressError as e:
        raise AuthConfigError(f"{where}: {e}") from None
    flags = {}
    for word in fields[2:]:
        if word not in FLAGS:
            raise AuthConfigError(
                f"{where}: unknown flag {word!r} (the flags are {', '.join(FLAGS)})"
            )
        flags[FLAGS[word]] = True
    return ListedClient(client_id, host, port, where=where, **flags)

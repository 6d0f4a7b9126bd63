"""
What every HTTP listener does before any resource runs: it answers only
requests for its own host names (a page whose name an attacker re-pointed
at this machine, DNS rebinding, is refused), takes state changes only
from pages of its own origin, holds a bounded number of connections and
closes idle ones.
"""

import socket
from ipaddress import ip_address
from urllib.parse import urlsplit

import attr
from twisted.logger import Logger
from twisted.web import http
from twisted.protocols.policies import WrappingFactory
from twisted.web.pages import errorPage
from twisted.web.server import Site

from mqttgw.broker.logsummary import RateLimited
from mqttgw.wire.printable import printable

log = Logger()

MISDIRECTED = 421
# twisted.web knows no phrase for 421 (RFC 9110), and its error pages
# write the status line as they render, before a phrase could be given.
http.RESPONSES.setdefault(MISDIRECTED, b"Misdirected Request")
# Methods that change nothing: any page may cause them (a link, an image).
SAFE_METHODS = frozenset((b"GET", b"HEAD", b"OPTIONS"))
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _is_loopback(address):
    try:
        return ip_address(address).is_loopback
    except ValueError:
        return False


def split_host(value):
    """(name, port or None) of a Host header's value: ``[::1]:80``, ``name``."""
    value = value.strip()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, sep, port = value.rpartition(":")
        if not sep or ":" in name:
            # No port, or an IPv6 address without brackets.
            name, port = value, ""
    return name.lower().rstrip("."), int(port) if port.isdigit() else None


def _normalize(names):
    return frozenset(n.strip().lower().rstrip(".").strip("[]") for n in names)


@attr.s(frozen=True)
class HostNames:
    """
    The names a listener answers to, judged per connection from the
    address it was accepted on: the loopback names (``localhost``,
    ``127.0.0.1``, ``::1``) when that is a loopback address, that address
    itself, the machine's host name, and ``allowed`` (``http.allowed_hosts``;
    ``*`` for any).
    """

    allowed = attr.ib(converter=_normalize, default=())
    machine = attr.ib(factory=lambda: socket.gethostname().lower())

    def allows(self, name, local):
        """Whether ``name`` (no port) names a listener reached at address ``local``."""
        name = name.lower().rstrip(".").strip("[]")
        if "*" in self.allowed or name in self.allowed or name == self.machine:
            return True
        if local is not None and name == local.lower():
            return True
        return _is_loopback(local or "") and (name == "localhost" or _is_loopback(name))

    def origin_allowed(self, origin, host_header, local, secure, allowed_origins=frozenset()):
        """
        Whether a page from ``origin`` may act here: one of
        ``allowed_origins`` (exact, or ``*``), or of this listener's scheme
        and one of its names, never merely because it equals the request's
        own Host.  The port is the one the browser was told (``host_header``'s,
        once its name is one of ours) or else the listener's own: a mapped
        port (a container's) still matches, another site on this machine
        does not.
        """
        origin = origin.strip().rstrip("/").lower()
        if "*" in allowed_origins or origin in allowed_origins:
            return True
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:
            return False
        scheme = "https" if secure else "http"
        host = getattr(local, "host", None)
        if parts.scheme != scheme or not parts.hostname or not self.allows(parts.hostname, host):
            return False
        expected = getattr(local, "port", None)
        if host_header:
            name, host_port = split_host(host_header)
            if self.allows(name, host):
                expected = host_port or _DEFAULT_PORTS[scheme]
        return (port or _DEFAULT_PORTS[scheme]) == expected


def _origins(origins):
    return frozenset(o.strip().rstrip("/").lower() for o in origins)


class HostSite(Site):
    """
    A Site that refuses, before any resource runs, requests naming a host
    that is not one of ``hosts`` (421 Misdirected Request) and state
    changes (PUT, DELETE, POST...) from a page of another origin (403).
    ``hosts`` None: a local socket, no names to check.  With
    ``upgrades_by_origin`` a WebSocket upgrade's Host is left to the
    Origin check of the WebSocket factory (an MQTT client that is not a
    browser may name the broker as it likes).  ``timeout``: seconds an
    idle connection is kept.
    """

    def __init__(self, resource, hosts, secure=False, allowed_origins=(), upgrades_by_origin=False, timeout=60.0):
        super().__init__(resource, timeout=timeout)
        self.noisy = False
        self.hosts = hosts
        self.secure = secure
        self.allowed_origins = _origins(allowed_origins)
        self.upgrades_by_origin = upgrades_by_origin
        self.refused = 0
        self._limited = RateLimited(log)

    def log(self, request):
        # No access log: no line per health check, and no URL in the log.
        pass

    def getResourceFor(self, request):
        refusal = self.refusal(request)
        if refusal is None:
            return super().getResourceFor(request)
        request.site = self
        request.sitepath = []
        return refusal

    def refusal(self, request):
        hosts = self.hosts
        if hosts is None:
            return None
        local = request.getHost()
        raw = request.getHeader(b"host")
        host = raw.decode("latin-1") if raw is not None else None
        upgrade = request.getHeader(b"upgrade")
        is_upgrade = upgrade is not None and upgrade.lower() == b"websocket"
        if host is not None and not (is_upgrade and self.upgrades_by_origin):
            name, _ = split_host(host)
            if not hosts.allows(name, getattr(local, "host", None)):
                return self._refuse(
                    request, MISDIRECTED, "Misdirected Request",
                    f"{host} is not a name of this listener (http.allowed_hosts)",
                    f"host {printable(host)} is not one of its names",
                )
        origin = request.getHeader(b"origin")
        if origin is not None and request.method not in SAFE_METHODS:
            origin = origin.decode("latin-1")
            if not hosts.origin_allowed(origin, host, local, self.secure, self.allowed_origins):
                return self._refuse(
                    request, 403, "Forbidden", f"a page from {origin} may not change anything here",
                    f"a {request.method.decode('latin-1')} from a page of origin {printable(origin)}",
                )
        return None

    def _refuse(self, request, code, brief, detail, why):
        self.refused += 1
        peer = request.getClientAddress()
        self._limited.info(
            "refusing HTTP request from {peer}: {why}",
            peer=getattr(peer, "host", peer),
            why=why,
        )
        # One request, then the connection closes.
        request.setHeader(b"connection", b"close")
        request.channel.persistent = False
        return errorPage(code, brief, detail)



class ConnectionSlots:
    """
    Connections an HTTP listener holds at once: at most ``limit``
    (``http.max_connections``, within its share of descriptors).
    """

    def __init__(self, limit):
        self.limit = limit
        self.held = 0
        self.refused = 0
        self._limited = RateLimited(log)

    def take(self, addr, name):
        if self.held < self.limit:
            self.held += 1
            return True
        self.refused += 1
        self._limited.warn(
            "refusing connection from {addr} to the {name} listener: {n} connections"
            " is the limit (http.max_connections)",
            addr=getattr(addr, "host", addr),
            name=name,
            n=self.limit,
        )
        return False

    def release(self):
        self.held -= 1


class BoundedFactory(WrappingFactory):
    """
    A listener's factory (a Site) behind ``slots``: past the limit a new
    connection is closed as it is accepted, before anything is read or
    allocated for it.
    """

    def __init__(self, wrapped, slots, name):
        super().__init__(wrapped)
        self.slots = slots
        self.name = name
        self.noisy = False

    def buildProtocol(self, addr):
        if not self.slots.take(addr, self.name):
            return None
        return super().buildProtocol(addr)

    def unregisterProtocol(self, p):
        super().unregisterProtocol(p)
        self.slots.release()

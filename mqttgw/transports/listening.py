"""
A listener as a service: one line naming it when its port cannot be had
(stopping start-up, or, for one the gateway can do without, going on
without it), and what it is bound to for the start-up summary, readiness
and the admin API.
"""

import os

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.protocols.haproxy._wrapper import HAProxyWrappingFactory
from zope.interface import implementer

from mqttgw.transports import leanreactor, tcp

PROXY_PREFIX = "haproxy:"

log = Logger()


class _QuietProxyFactory(HAProxyWrappingFactory):
    # Twisted's own logs a line naming the object at each start and stop.
    noisy = False


@implementer(IStreamServerEndpoint)
class ProxyProtocolEndpoint:
    """
    What Twisted's ``haproxy:`` prefix makes (a listener behind a load
    balancer speaking the PROXY protocol, v1 or v2: each connection's
    peer is the address its header names), without its log lines.
    """

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def listen(self, factory):
        return self.endpoint.listen(_QuietProxyFactory(factory))


def server_endpoint(reactor, description):
    if description.startswith(PROXY_PREFIX):
        return ProxyProtocolEndpoint(server_endpoint(reactor, description[len(PROXY_PREFIX):]))
    return serverFromString(reactor, description)


class ListenerService(StreamServerEndpointService):
    """
    ``kind`` is what it speaks (tcp, tls, ws, wss, http), ``description``
    the endpoint string it was given; ``port`` is the listening port once
    bound, None before and after.
    """

    port = None

    def __init__(
        self, reactor, kind, description, factory, secure=False, anonymous=False, name=None,
        required=True,
    ):
        super().__init__(server_endpoint(reactor, description), factory)
        self.reactor = reactor
        self.kind = kind
        self.description = description
        # As the configuration gave it.
        self.label = name or description
        # The service's name among the gateway's: a TCP and an admin
        # listener may be given the same endpoint string (port 0).
        self.name = f"{kind} {self.label}"
        self.secure = secure
        self.anonymous = anonymous
        # Whether start-up stops when it cannot listen (else an error line,
        # and the gateway goes on without it).
        self.required = required
        # Errors at start-up are raised, not just logged: twistd stops.
        self._raiseSynchronously = True

    def privilegedStartService(self):
        # Before the first connection: see transports.leanreactor.
        leanreactor.poll_lean(self.reactor)
        # A Unix socket is made with no permission for others from the
        # start, not only once its mode is set just after.
        umask = os.umask(0o177) if self.description.startswith("unix:") else None
        try:
            super().privilegedStartService()
        except (CannotListenError, OSError) as e:
            # (A Unix socket's lock file that cannot be made is an OSError.)
            error = e.socketError if isinstance(e, CannotListenError) else e
            reason = getattr(error, "strerror", None) or error
            if self.required:
                raise SystemExit(f"mqttgw: {self.kind} listener {self.label}: cannot listen: {reason}") from None
            log.error(
                "{kind} listener {label}: cannot listen: {reason}; going on without it",
                kind=self.kind,
                label=self.label,
                reason=str(reason),
            )
            return
        finally:
            if umask is not None:
                os.umask(umask)
        self._waitingForPort.addCallback(self._bound)

    def _bound(self, port):
        # A listener whose connections speak MQTT from their first byte
        # accepts as its flusher has room (not WebSocket's or TLS's, whose
        # first bytes are a handshake).
        # One that counts its connections holds sockets a storm brings
        # beyond the kernel's queue while they wait for room.
        self.port = tcp.serve_lean(
            port, getattr(self.factory, "flusher", None), getattr(self.factory, "vacancies", None)
        )
        return port

    def setServiceParent(self, parent):
        if self.name in getattr(parent, "namedServices", {}):
            raise SystemExit(f"mqttgw: {self.kind} listener {self.label}: given twice")
        return super().setServiceParent(parent)

    def stopService(self):
        self.port = None
        return super().stopService()

    @property
    def address(self):
        """``host:port`` once bound, else the description."""
        if self.port is None:
            return self.label
        host = self.port.getHost()
        return f"{getattr(host, 'host', '?')}:{getattr(host, 'port', '?')}"

    def as_dict(self):
        return {
            "kind": self.kind,
            "address": self.address,
            "listening": self.port is not None,
            "tls": self.secure,
            "anonymous": self.anonymous,
        }

"""
The upstream as one endpoint: each address tried in turn, over TLS if
the bridge asks for it, a connection counted only once CONNECT is accepted.
"""

from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.bridges.client import ConnectRefused
from mqttgw.bridges.settings import parse_address
from mqttgw.bridges.tls import client_tls_options

log = Logger()


@implementer(IStreamClientEndpoint)
class FailoverEndpoint:
    """
    Tries each upstream address in turn, the first one first.  A connection
    counts only once the upstream has accepted CONNECT, so a failed TLS
    handshake or a refusal moves on to the next address, and when all fail
    the reconnect backs off.
    """

    def __init__(self, reactor, settings, on_refused):
        self.reactor = reactor
        self.settings = settings
        self.on_refused = on_refused

    def __repr__(self):
        # ClientService names its endpoint when it logs a retry.
        return f"bridge {self.settings.name} upstream {', '.join(self.settings.addresses)}"

    def _endpoint(self, address):
        host, port = parse_address(address)
        endpoint = HostnameEndpoint(self.reactor, host, port, timeout=10)
        if self.settings.tls:
            endpoint = TLSEndpoint(client_tls_options(self.settings, host), endpoint)
        return endpoint

    @inlineCallbacks
    def connect(self, factory):
        failure = None
        for address in self.settings.addresses:
            try:
                protocol = yield self._endpoint(address).connect(factory)
                try:
                    yield protocol.connack
                except Exception:
                    _forget_loss(protocol)
                    raise
                log.info(
                    "bridge {name}: connected to {address}",
                    name=self.settings.name,
                    address=address,
                )
                return protocol
            except Exception as e:
                failure = e
                log.warn(
                    "bridge {name}: upstream {address} unreachable: {error}",
                    name=self.settings.name,
                    address=address,
                    error=_describe(e),
                )
                if isinstance(e, ConnectRefused):
                    self.on_refused(e)
        raise failure


@implementer(IStreamClientEndpoint)
class TLSEndpoint:
    """
    ``endpoint`` with TLS over it, as Twisted's ``wrapClientTLS`` would
    make it; that one needs TLS loaded with the reactor, which a gateway
    without TLS listeners leaves out (see mqttgw.service.footprint).
    """

    def __init__(self, options, endpoint):
        self.options = options
        self.endpoint = endpoint

    def connect(self, factory):
        from twisted.protocols.tls import TLSMemoryBIOFactory

        connecting = self.endpoint.connect(TLSMemoryBIOFactory(self.options, True, factory))
        return connecting.addCallback(lambda protocol: protocol.wrappedProtocol)


def _forget_loss(protocol):
    """
    A connection that failed before its CONNACK is an attempt that failed,
    which ClientService learns from connect() failing.  The wrapper it put
    around the protocol would also report the connection's loss, for
    which ClientService has no transition while connecting or waiting
    (automat's NoTransition, logged as a traceback); so that report is
    dropped.  The protocol itself still sees connectionLost.
    """
    if "_lostNotification" in vars(protocol):
        protocol._lostNotification = lambda reason: None


def _describe(error):
    """A one-line reason, TLS errors included."""
    text = str(error) or type(error).__name__
    reasons = getattr(error, "reason", None)
    if hasattr(reasons, "getErrorMessage"):
        text = reasons.getErrorMessage()
    return text.replace("\n", " ")

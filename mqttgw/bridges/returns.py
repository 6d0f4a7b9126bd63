"""
When a bridge that is somewhere it would rather not be goes back: to the
first address while round_robin is false (probed over TCP every few
seconds, as mosquitto's bridges do), and from a fallback clean session to
the persistent one every session_fallback_retry seconds.
"""

from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from mqttgw.bridges.settings import parse_address

log = Logger()

# Seconds between probes of the first address (mosquitto's), doubled
# after each return that did not last, up to PRIMARY_RETRY_MAX.
PRIMARY_RETRY = 5.0
PRIMARY_RETRY_MAX = 300.0


class _Probe(Protocol):
    """A TCP connection, as mosquitto's probe: closed once made, no TLS, no MQTT."""

    def connectionMade(self):
        self.transport.abortConnection()


class Returns:
    """Timers of the link the bridge is on (FailoverEndpoint's on_link)."""

    def __init__(self, reactor, settings, upstreams):
        self.reactor = reactor
        self.settings = settings
        self.upstreams = upstreams
        self._protocol = None
        self._timer = None
        self._probing = None
        self._primary_retry = PRIMARY_RETRY
        # Where a return was going, until the next link says if it worked.
        self._returning = None

    def link(self, protocol, address, clean_fallback):
        """A link to ``address`` lasted."""
        s = self.settings
        first = self.upstreams.addresses[0]
        if self._returning is first:
            if address is first:
                self._primary_retry = PRIMARY_RETRY
            else:
                self._primary_retry = min(self._primary_retry * 2, PRIMARY_RETRY_MAX)
        self._returning = None
        self._protocol = protocol
        protocol.lost.addCallback(self._lost, protocol)
        if clean_fallback and s.session_fallback_retry:
            self._timer = self.reactor.callLater(s.session_fallback_retry, self._to_persistent, address)
        elif not s.round_robin and address is not first:
            self._timer = self.reactor.callLater(self._primary_retry, self._probe)

    def _lost(self, reason, protocol):
        if self._protocol is protocol:
            self._protocol = None
            self.stop()
        return reason

    def stop(self):
        self._protocol = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._probing is not None:
            self._probing.cancel()
            self._probing = None

    def _to_persistent(self, address):
        self._timer = None
        log.info(
            "bridge {name}: trying the persistent session again at {address} after {seconds:g} s"
            " on a clean one (session_fallback_retry)",
            name=self.settings.name, address=address.text, seconds=self.settings.session_fallback_retry,
        )
        self._move(address)

    def _probe(self):
        self._timer = None
        host, port = parse_address(self.upstreams.addresses[0].text)
        factory = Factory.forProtocol(_Probe)
        factory.noisy = False
        probing = self._probing = HostnameEndpoint(self.reactor, host, port, timeout=5).connect(factory)
        probing.addCallbacks(lambda _: self._probed(True), lambda _: self._probed(False))

    def _probed(self, reachable):
        self._probing = None
        if self._protocol is None:
            return
        if not reachable:
            self._timer = self.reactor.callLater(self._primary_retry, self._probe)
            return
        first = self.upstreams.addresses[0]
        log.info(
            "bridge {name}: {address}, the first address, takes connections again: moving back"
            " to it (round_robin = false)",
            name=self.settings.name, address=first.text,
        )
        self._returning = first
        self._move(first)

    def _move(self, address):
        """Close the link on purpose; the next round starts at ``address`` at once."""
        self.upstreams.plan(address)
        self._protocol.disconnect()


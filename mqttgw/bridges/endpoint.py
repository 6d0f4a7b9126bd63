"""
The upstream as one endpoint: one round over its addresses in the order
bridges.upstreams keeps, over TLS if the bridge asks for it.  What an
address refuses of the protocol (try_private, 5.0) is dropped there and
the CONNECT sent again at once; where no address resumes the persistent
session, a clean session is tried if session_fallback allows.  An attempt
counts only once its link has lasted its first seconds, so an upstream
that accepts CONNECT and drops it at once is one that failed.
"""

from twisted.internet.defer import CancelledError, Deferred, inlineCallbacks
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.error import ConnectingCancelledError
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqttgw.bridges.client import ConnectRefused
from mqttgw.bridges.failures import (
    AttemptFailed, ClosedBeforeConnack, Dropped, NoConnack, Unreachable, UpstreamRefused, lost_before_connack,
)
from mqttgw.bridges.settings import parse_address
from mqttgw.bridges.tls import client_tls_options
from mqttgw.bridges.upstreams import FALLBACK_NAMES
from mqttgw.bridges.versions import fallback_client_id
from mqttgw.wire import reasons as R

log = Logger()

# A link lost this soon after CONNACK is an attempt that failed.
SETTLE_SECONDS = 2.0
# Seconds a connection may wait for its CONNACK.
CONNACK_TIMEOUT = 10.0
# Rounds in a row in which links were dropped as soon as they were
# accepted before a clean session stands in for the persistent one: a
# node that cannot serve the session does it every time, a bad link once.
DROPPED_ROUNDS = 2
# CONNECTs sent to one address in one round: its fallbacks are at most
# three steps (5.0, try_private, a 5.0 will's retain and QoS).
MAX_CONNECTS = 5

# What a fallback says, once per address.
_FALLBACK_LINES = {
    "try_private": (
        "bridge {name}: upstream {address} {reason} when the CONNECT announced a bridge"
        " (try_private, protocol level {protocol_level:#04x}): connecting there without it from now on;"
        " set try_private = false to leave it out from the start"
    ),
    "mqttv311": (
        "bridge {name}: upstream {address} {reason} to an MQTT 5.0 CONNECT: speaking 3.1.1"
        ' there from now on (no properties, no reason codes); set protocol = "mqttv311" to'
        " start with it"
    ),
    "remote_state": (
        "bridge {name}: upstream {address} {reason} to a CONNECT whose will is on {topic}:"
        " connecting there without it from now on (no state upstream); set"
        " remote_state_topic to a topic the upstream lets the bridge publish to"
    ),
}


def address_endpoint(reactor, settings, address):
    """The client endpoint of one ``host:port``, with TLS if the bridge asks for it."""
    host, port = parse_address(address)
    endpoint = HostnameEndpoint(reactor, host, port, timeout=10)
    if settings.tls:
        endpoint = TLSEndpoint(client_tls_options(settings, host), endpoint)
    return endpoint


@implementer(IStreamClientEndpoint)
class FailoverEndpoint:
    """
    ``upstreams``: the addresses (bridges.upstreams).  ``prepare(address,
    clean_fallback)`` makes the factory's next CONNECT for ``address``, a
    clean session standing in for the persistent one or not, and returns
    ``(connect, version)``; ``on_link(protocol, address,
    clean_fallback)`` hears of each link that lasted.
    """

    def __init__(self, reactor, settings, upstreams, prepare, on_link=None):
        self.reactor = reactor
        self.settings = settings
        self.upstreams = upstreams
        self.prepare = prepare
        self.on_link = on_link
        # The persistent session's loss said, until it is resumed.
        self._session_said = False
        # Rounds in a row that dropped the persistent session (DROPPED_ROUNDS).
        self._dropped_rounds = 0

    def __repr__(self):
        # ClientService names its endpoint when it logs a retry.
        return f"bridge {self.settings.name} upstream {', '.join(self.settings.addresses)}"

    def connect(self, factory):
        d = self._round(factory)
        d.addErrback(self._unexpected)
        return d

    def _unexpected(self, failure):
        # ClientService says only that it will retry: a fault here is said too.
        if not failure.check(AttemptFailed, CancelledError):
            log.failure("bridge {name}: connecting upstream failed", failure, name=self.settings.name)
        return failure

    @inlineCallbacks
    def _round(self, factory):
        """One round: each address once, then at once with a clean session if that is the way left."""
        s = self.settings
        failure = suspect = None
        refused = False
        for address in self.upstreams.round():
            try:
                return (yield self._attempt(factory, address, False))
            except AttemptFailed as e:
                failure = e
                if e.session_suspect:
                    suspect = suspect or address
                    refused = refused or isinstance(e, UpstreamRefused)
        self._dropped_rounds = self._dropped_rounds + 1 if suspect is not None else 0
        # A refusal says so; a drop must repeat, unless the session failed so before.
        sure = refused or self._session_said or self._dropped_rounds >= DROPPED_ROUNDS
        if suspect is not None and sure and not s.clean_session and self._fall_back_to_clean(suspect):
            for address in self.upstreams.round(start=suspect):
                try:
                    return (yield self._attempt(factory, address, True))
                except AttemptFailed as e:
                    failure = e
        raise failure

    def _fall_back_to_clean(self, address):
        """Whether session_fallback allows a clean session; said once until the persistent one works."""
        clean = self.settings.session_fallback == "clean"
        if not self._session_said:
            self._session_said = True
            fields = dict(name=self.settings.name, address=address.text)
            if clean:
                log.warn(
                    "bridge {name}: no address resumed the persistent session (the first to fail"
                    " it: {address}): connecting with a clean session as {client_id!r} instead"
                    " (session_fallback = \"clean\"). The out rules keep flowing and nothing held"
                    " here is dropped; the in rules get what is published from now on, and what"
                    " the upstream holds for the persistent session comes once it is resumed (tried"
                    " at each reconnection)",
                    client_id=fallback_client_id(self.settings), **fields,
                )
            else:
                log.warn(
                    "bridge {name}: no address resumed the persistent session (the first to fail"
                    " it: {address}): nothing flows until one does (session_fallback = \"wait\");"
                    " session_fallback = \"clean\" would connect with a clean session meanwhile",
                    **fields,
                )
        return clean

    @inlineCallbacks
    def _attempt(self, factory, address, clean_fallback):
        """One address: its link once it lasted, or AttemptFailed; its fallbacks taken at once."""
        # Steps taken after a close before CONNACK: said once the next
        # CONNECT is answered, taken back if it is closed too.
        pending = []

        def answered():
            for step, error, connect in pending:
                self._say(step, address, error, connect)
            pending.clear()

        for _ in range(MAX_CONNECTS):
            connect, version = self.prepare(address, clean_fallback)
            self.upstreams.trying(address, clean_fallback)
            try:
                protocol = yield self._link(factory, address, clean_fallback, answered)
            except AttemptFailed as e:
                failure = e
                if isinstance(e, UpstreamRefused):
                    answered()
                step = self._fall_back(address, e, connect, version)
                if step in _FALLBACK_LINES and isinstance(e, ClosedBeforeConnack):
                    pending.append((step, e, connect))
                elif step in _FALLBACK_LINES:
                    self._say(step, address, e, connect)
                if step is not None:
                    continue
                break
            self.upstreams.settled(address)
            if not clean_fallback:
                self._session_said = False
                self._dropped_rounds = 0
            protocol.lost.addCallback(self._lost, address)
            if self.on_link is not None:
                self.on_link(protocol, address, clean_fallback)
            return protocol
        for step, _, _ in pending:
            address.take_back(step)
        self.upstreams.failed(address, failure)
        advice = failure.advice(self.settings)
        log.warn(
            "bridge {name}: upstream {address} {reason}{advice}",
            name=self.settings.name, address=address.text, reason=failure.reason,
            advice=f"; {advice}" if advice else "",
        )
        raise failure

    def _lost(self, reason, address):
        self.upstreams.lost(address)
        return reason

    def _fall_back(self, address, error, connect, version):
        """
        What to change before sending CONNECT again at once: a fallback
        step at ``address`` (its name) where the upstream refused the
        protocol or will topic the CONNECT announced, "will" where a 5.0
        upstream takes the will otherwise; None when nothing is left.
        """
        refused = isinstance(error, UpstreamRefused)
        if refused and version.will_refused(error):
            log.info(
                "bridge {name}: upstream refused the will ({reason}); asking again with"
                " will QoS {qos}, {retain}",
                name=self.settings.name, reason=R.name(error.code), qos=version.will_qos,
                retain="retained" if version.will_retain else "not retained",
            )
            return "will"
        if isinstance(error, ClosedBeforeConnack) or (refused and version.protocol_refused(error.code)):
            return address.fall_back()
        if refused and connect.will_topic is not None and version.will_topic_refused(error.code):
            return address.leave_state_out()
        return None

    def _say(self, step, address, error, connect):
        """A fallback taken at ``address``, said once: what the upstream did, what avoids it."""
        log.warn(
            _FALLBACK_LINES[step], name=self.settings.name, address=address.text, reason=error.reason,
            protocol_level=connect.protocol_level, topic=connect.will_topic,
        )

    @inlineCallbacks
    def _link(self, factory, address, clean_fallback, answered):
        """
        Dial, CONNECT and wait for the link to last: the protocol, or
        AttemptFailed; ``answered()`` once CONNECT is accepted.
        """
        try:
            protocol = yield address_endpoint(self.reactor, self.settings, address.text).connect(factory)
        except (CancelledError, ConnectingCancelledError):
            # Stopped: no other address is tried.
            raise CancelledError() from None
        except Exception as e:
            raise Unreachable(e)
        try:
            yield self._connack(protocol)
            answered()
            notes = [FALLBACK_NAMES[f] for f in address.fallbacks]
            if clean_fallback:
                notes.append("clean session fallback")
            log.info(
                "bridge {name}: connected to {address}{notes}",
                name=self.settings.name, address=address.text,
                notes=f" ({', '.join(notes)})" if notes else "",
            )
            yield self._settle(protocol)
        except BaseException as e:
            _forget_loss(protocol)
            if isinstance(e, CancelledError):
                protocol.transport.abortConnection()
            raise
        return protocol

    def _connack(self, protocol):
        """``protocol.connack``, failing with AttemptFailed; unanswered for long, closed."""
        timed_out = []

        def give_up():
            timed_out.append(True)
            protocol.transport.abortConnection()

        timer = self.reactor.callLater(CONNACK_TIMEOUT, give_up)

        def done(result):
            if timer.active():
                timer.cancel()
            if not isinstance(result, Failure) or result.check(CancelledError):
                return result
            if timed_out:
                raise NoConnack(CONNACK_TIMEOUT)
            if result.check(ConnectRefused):
                raise UpstreamRefused(result.value)
            raise lost_before_connack(result.value)

        return protocol.connack.addBoth(done)

    def _settle(self, protocol):
        """Fires once the link has lasted SETTLE_SECONDS; fails with Dropped if lost sooner."""
        accepted = self.reactor.seconds()

        def cancel(_):
            if timer.active():
                timer.cancel()

        settled = Deferred(cancel)

        def lasted():
            settled.callback(protocol)

        def lost(reason):
            if not settled.called:
                timer.cancel()
                settled.errback(Dropped(self.reactor.seconds() - accepted, protocol.disconnect_packet))
            return reason

        timer = self.reactor.callLater(SETTLE_SECONDS, lasted)
        protocol.lost.addCallback(lost)
        return settled


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
    A connection that failed before it counted is an attempt that failed,
    which ClientService learns from connect() failing.  The wrapper it put
    around the protocol would also report the connection's loss, for
    which ClientService has no transition while connecting or waiting
    (automat's NoTransition, logged as a traceback); so that report is
    dropped.  The protocol itself still sees connectionLost.
    """
    if "_lostNotification" in vars(protocol):
        protocol._lostNotification = lambda reason: None

"""
One MQTT connection's bytes: packets read through the framer, at most
``PACKETS_PER_TURN`` a reactor turn; output written once a turn; reading
paused while the peer's output is full or its input waits for a later
turn; closed gracefully or at once.  What the packets mean is the
subclass's (:class:`~mqttgw.transports.protocol.MQTTServerProtocol`), as
Twisted's amp keeps ``BinaryBoxProtocol`` apart from ``BoxDispatcher``.
"""

from twisted.internet.interfaces import IPushProducer, ISSLTransport, ITCPTransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.transports.handshake import ANSWERING, AWAITING_CONNECT, CHALLENGED, CLOSED, CONNECTED, cancel
from mqttgw.wire.framing import ProtocolViolation

# The packets of a connection held before any was decoded.
_NOTHING = ()

log = Logger()

# Output of one reactor turn is written at once past this many bytes, so
# that a full socket pauses delivery (and reading) before more piles up.
OUTPUT_HIGH_WATER = 64 * 1024

# ``MQTTConnection._out`` when the connection has no output this turn and
# is not in the flusher's list; a list (empty, too) once it is.
_UNMARKED = ()


@implementer(IPushProducer)
class MQTTConnection(Protocol):
    # One per connection, so its attributes are slots: an idle client costs
    # no instance dictionary (see the connections benchmark).
    __slots__ = (
        "transport", "connected", "router", "limits", "clock", "_flusher",
        "framer", "stats", "log_id", "state", "_host", "_last_received",
        "_close_grace", "_packets_put_off", "_work", "_held", "reading_paused", "_handlers",
        "_output_full", "_awaiting_admission", "_out", "_out_size", "opening",
    )
    # Packets handled per reactor turn before the rest wait for the next.
    PACKETS_PER_TURN = 256
    # Output is written at the end of the turn, one write per connection;
    # but where this connection alone has output, it is written after
    # every this many packets read.  A client draining a backlog through
    # its in-flight window then gets the next messages while the rest of
    # its PUBACKs are handled, not after; where others have output too
    # the broker is busy, and fewer writes serve it better.
    FLUSH_EVERY = 8
    # Seconds a peer has to close its side after we closed ours.
    CLOSE_GRACE = 2.0
    # Handlers by packet type (the subclass's): before CONNECT, and while
    # CHALLENGED; once connected, ``_handlers``, those of the version the
    # client speaks.
    _before_connect = _challenged = None

    def __init__(self, router, limits, clock, flusher, framer):
        self.transport = None
        self.connected = 0
        self.router = router
        self.limits = limits
        self.clock = clock
        self._flusher = flusher
        self.framer = framer
        self.stats = router.stats
        self.log_id = None
        self.state = AWAITING_CONNECT
        self._host = None
        self._last_received = 0.0
        self._close_grace = None
        self._handlers = None
        self._packets_put_off = None
        self._work = None
        # Data read while reading was paused (a list, once there is some).
        self._held = ()
        self.reading_paused = False
        self._output_full = False
        self._awaiting_admission = False
        # Admitted and not yet read from (see Flusher.admit).
        self.opening = False
        # Bytes written this reactor turn: a list once there are some.
        self._out = _UNMARKED
        self._out_size = 0

    # Connection life

    def connectionMade(self):
        # Writes are already batched per reactor turn; Nagle would only delay.
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        self._host = getattr(self.transport.getPeer(), "host", None)
        stats = self.stats
        stats.connections += 1
        stats.connections_accepted += 1
        if stats.connections > stats.clients_maximum:
            stats.clients_maximum = stats.connections
        # We are the producer of the bytes the transport sends: it tells us
        # when its buffer is full so a slow reader can't grow it without end.
        self.transport.registerProducer(self, True)
        if not self._flusher.admit(self):
            # Many new connections not yet read from: this one waits its turn.
            self._awaiting_admission = True
            self._pause_reading()


    @property
    def peer(self):
        """The peer's address for log lines (made when needed: idle
        connections are many, log lines about them few)."""
        transport = self.transport
        if transport is None:
            return "?"
        peer = transport.getPeer()
        host = getattr(peer, "host", None)
        return f"{host}:{peer.port}" if host else str(peer)


    @property
    def unread(self):
        """Whether nothing has been read from this connection yet."""
        return self._packets_put_off is None and not self._held


    def admitted(self):
        """Our turn has come to be read from (see :meth:`Flusher.admit`)."""
        self._awaiting_admission = False
        if self._packets_put_off is not None:
            # Held while the store was behind: what came meanwhile first.
            self._next_turn()
        else:
            self._resume_reading()


    def dataReceived(self, data):
        if self.opening:
            self._flusher.opened(self)
        if self.state is CLOSED:
            # Closing: whatever the peer still sends is ignored.
            return
        self.stats.bytes_received += len(data)
        if self._packets_put_off is not None:
            # Reading is paused; what was already on its way waits here.
            if self._held:
                self._held.append(data)
            else:
                self._held = [data]
            return
        if self._flusher.reading_held:
            # The store is behind: this connection waits its turn, its data
            # with it (see Flusher.hold_reading).
            self._held = [data]
            self._packets_put_off = _NOTHING
            self._awaiting_admission = True
            self._pause_reading()
            self._flusher.admit(self)
            return
        self._consume(self.framer.feed(data))


    def _consume(self, packets):
        """
        Handle ``packets`` (the framer's iterator), at most
        ``PACKETS_PER_TURN`` of them: the rest wait for the next reactor
        turn with reading paused, so a peer that sends a great many packets
        at once takes no more than its share of a turn.
        """
        budget = self.PACKETS_PER_TURN
        packet = None
        try:
            for packet in packets:
                state = self.state
                # A handler returns True when what follows must wait (a
                # login, or a packet handled over several turns).
                if state is CONNECTED:
                    wait = self._handlers[packet.packet_type](self, packet)
                elif state is AWAITING_CONNECT:
                    wait = self._before_connect[packet.packet_type](self, packet)
                elif state is CHALLENGED:
                    wait = self._challenged[packet.packet_type](self, packet)
                else:
                    break
                budget -= 1
                if not budget % self.FLUSH_EVERY and self._out and self._flusher.alone(self):
                    # See FLUSH_EVERY.  It stays in the flusher's list for
                    # what comes next.
                    self.flush()
                    if self.state is not CLOSED:
                        self._out = []
                if (wait or budget <= 0) and self.state is not CLOSED:
                    self._packets_put_off = packets
                    self._pause_reading()
                    # After a login, its answer carries on.
                    if self.state not in ANSWERING:
                        self.clock.callLater(0, self._next_turn)
                    break
            # Keepalive counts whole packets only: a peer dripping the bytes
            # of a packet it never finishes is not alive for MQTT.
            if packet is not None:
                self._last_received = self.clock.seconds()
                self.stats.packets_received += self.PACKETS_PER_TURN - budget
        except ProtocolViolation as e:
            self.protocol_error(str(e), e.reason_code)
        except Exception:
            log.failure(
                "internal error handling data from {client_id} at {peer}",
                client_id=self.log_id,
                peer=self.peer,
            )
            self._close(publish_will=True)


    def _next_turn(self):
        if self.state is CLOSED:
            self._packets_put_off = self._work = None
            return
        if self._work is not None:
            try:
                more = next(self._work, True) is not True
            except ProtocolViolation as e:
                self._work = None
                self.protocol_error(str(e), e.reason_code)
                return
            except Exception:
                self._work = None
                log.failure("internal error handling a packet from {client_id}", client_id=self.log_id)
                self._close(publish_will=True)
                return
            if more:
                self.clock.callLater(0, self._next_turn)
                return
            self._work = None
        packets, self._packets_put_off = self._packets_put_off, None
        if packets is not None:
            self._consume(packets)
        if self._packets_put_off is None and self._held:
            held, self._held = self._held, ()
            self._consume(self.framer.feed(b"".join(held)))
        if self._packets_put_off is None:
            self._resume_reading()


    def _pause_reading(self):
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pauseProducing()


    def _resume_reading(self):
        if (
            self.reading_paused
            and not self._output_full
            and self._packets_put_off is None
            and not self._awaiting_admission
        ):
            self.reading_paused = False
            if self.state is not CLOSED:
                self.transport.resumeProducing()


    def write(self, data):
        """
        Queue bytes for this connection.  Everything written in one reactor
        turn goes out in a single transport write.
        """
        out = self._out
        if out is not _UNMARKED:
            out.append(data)
        else:
            self._flusher.mark(self)
            self._out = [data]
        self._out_size += len(data)
        if self._out_size > OUTPUT_HIGH_WATER:
            self.flush()


    def flush(self):
        out = self._out
        self._out = _UNMARKED
        if out:
            # Counted per flush, not per packet: one write is one packet.
            stats = self.stats
            stats.packets_sent += len(out)
            stats.bytes_sent += self._out_size
            self._out_size = 0
            try:
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            except Exception:
                self.flush_failed()


    def flush_failed(self):
        """Writing to the transport raised: this connection cannot go on."""
        self._out = _UNMARKED
        self._out_size = 0
        if self.state is CLOSED:
            return
        log.failure(
            "cannot write to client {client_id} at {peer}: closing",
            client_id=self.log_id,
            peer=self.peer,
        )
        self._close(publish_will=True)


    def protocol_error(self, reason, reason_code=None):
        """
        Log, count and close: the peer broke the protocol.  ``reason_code``
        is the 5.0 reason (see :mod:`mqttgw.wire.reasons`), for a subclass
        that tells the peer.
        """
        # Under a flood of broken clients: some lines, then a count.
        self.router.limited("protocol errors", log).warn(
            "closing connection of client {client_id} from {peer}: {reason}",
            client_id=self.log_id,
            peer=self.peer,
            reason=reason,
        )
        self.router.stats.protocol_errors += 1
        self._close(publish_will=True, graceful=True)


    def _close(self, publish_will, graceful=False):
        if self.state is CLOSED:
            return
        self._closed(publish_will)
        if graceful:
            self._close_gracefully()
        else:
            self._out = _UNMARKED
            self._out_size = 0
            self.transport.abortConnection()


    def _close_gracefully(self):
        """
        What is queued (a CONNACK with a refusal, say) goes out, then our
        side closes, so the peer reads an orderly end of stream rather than
        a reset.  What it still sends is read and ignored until it closes
        too; a peer that does not within ``CLOSE_GRACE`` is cut off.
        """
        self.flush()
        transport = self.transport
        if self.reading_paused:
            self.reading_paused = False
            transport.resumeProducing()
        if ITCPTransport.providedBy(transport) and not ISSLTransport.providedBy(transport):
            transport.loseWriteConnection()
        else:
            transport.loseConnection()
        self._close_grace = self.clock.callLater(self.CLOSE_GRACE, transport.abortConnection)


    def pauseProducing(self):
        # The peer is not reading what we send: stop reading its requests,
        # whose answers would pile up here.
        self._output_full = True
        self._output_paused()
        self._pause_reading()


    def resumeProducing(self):
        self._output_full = False
        if self.state is CLOSED:
            return
        self._resume_reading()
        self._output_resumed()


    def stopProducing(self):
        pass

    def connectionLost(self, reason):
        if self.opening:
            self._flusher.opened(self)
        self.stats.connections -= 1
        if self.state is not CLOSED:
            self._lost(reason)
            self._closed(publish_will=True)
        self._close_grace = cancel(self._close_grace)

    def _closed(self, publish_will):
        """What closing leaves behind, once, whichever side closed first."""
        self.state = CLOSED
        self._ended(publish_will)

    # What the subclass does at these moments.

    def _lost(self, reason):
        """The peer went away before we closed."""

    def _ended(self, publish_will):
        """The connection is closed: release what it held."""

    def _output_paused(self):
        """The peer stopped reading what we send."""

    def _output_resumed(self):
        """The peer reads again."""

"""
What one connection reads: bytes through the framer, each packet to the
handler its state has for it, at most ``PACKETS_PER_TURN`` a reactor
turn; the rest, and whatever arrives meanwhile, held with reading paused
until a later turn; and the deadlines of hearing from the peer (CONNECT,
keepalive).  A part of :class:`~mqttgw.transports.protocol.MQTTServerProtocol`.
"""

from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.transports.handshake import ANSWERING, BEFORE_CONNACK, CLOSED, CONNECTED
from mqttgw.transports.interfaces import IReading
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import STRICT, STRICT_TEXT, Framer, ProtocolViolation

# These lines keep the namespaces they were first written in (log
# filters and JSON readers key on them).
log = Logger(namespace="mqttgw.transports.connection")
keepalive_log = Logger(namespace="mqttgw.transports.protocol")

# The packets of a connection held before any was decoded.
_NOTHING = ()

# Who handles a packet, as a handler table names it: the connection, this
# reading, or the part the connection holds as ``handshake`` or
# ``publishing`` (read from it as each packet comes: a tuple of them per
# connection cost an idle client 80 bytes).
CONNECTION, READING, HANDSHAKE, PUBLISHING = range(4)


_PAUSED, _OUTPUT_FULL, _AWAITING_ADMISSION = 1, 2, 4


def _flag(bit, doc):
    """A flag of ``Reading._flags`` as a boolean attribute."""

    def set_flag(reading, value):
        reading._flags = reading._flags | bit if value else reading._flags & ~bit

    return property(lambda reading: bool(reading._flags & bit), set_flag, doc=doc)


def receiver(connection, which):
    """The one of ``connection`` and its parts that a handler table names ``which``."""
    if which == PUBLISHING:
        return connection.publishing
    if which == CONNECTION:
        return connection
    return connection.reading if which == READING else connection.handshake


@implementer(IReading)
class Reading:
    """
    The packets of one connection (an
    :class:`~mqttgw.transports.interfaces.IReadingConnection`), read and
    handed to their handlers by the state of its handshake: the
    connection sets :attr:`handlers` as it moves from one to the next.
    """

    # One per connection: slots, so an idle client costs no dictionary.
    __slots__ = (
        "connection", "framer", "handlers",
        "last_received", "_flags", "_put_off", "_held", "_work",
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

    def __init__(self, connection, limits, handlers):
        self.connection = connection
        self.framer = Framer(
            limits.max_packet_size,
            first_packet=P.CONNECT,
            # A CONNECT is small; until one arrives little is buffered.
            first_packet_size=min(limits.max_connect_size, limits.max_packet_size),
            strict_for_311=STRICT_TEXT if limits.reject_control_characters else STRICT,
        )
        # By packet type, (receiver, function): the handlers of the present
        # state (the receiver one of CONNECTION, READING, HANDSHAKE and
        # PUBLISHING); None where nothing is read (an answer is awaited, or
        # closing).
        self.handlers = handlers
        # When the peer was last heard from (a whole packet), kept only
        # while it has a keepalive: idle clients without one share this 0.0.
        self.last_received = 0.0
        # paused, output_full and awaiting_admission (see below), in one
        # small integer rather than a slot each.
        self._flags = 0
        # Packets put off to a later turn (an iterator), or None.
        self._put_off = None
        # Data read while reading was paused (a list, once there is some).
        self._held = ()
        # What is left of a packet handled over several turns (see in_steps).
        self._work = None

    paused = _flag(_PAUSED, "Whether the transport is not read from.")
    # Whether the peer does not read what it is sent (its requests are not
    # read either: their answers would pile up).
    output_full = _flag(_OUTPUT_FULL, "Whether the peer does not read what it is sent.")
    awaiting_admission = _flag(_AWAITING_ADMISSION, "Whether it waits for its turn to be read from (see Flusher).")

    # The listener's (a slot each would cost every connection).
    clock = property(lambda self: self.connection.factory.clock, doc="The clock (the listener's).")
    flusher = property(lambda self: self.connection.factory.flusher, doc="The listener's Flusher.")
    stats = property(lambda self: self.connection.factory.router.stats, doc="The router's counters.")

    @property
    def unread(self):
        return self._put_off is None and not self._held

    def wait_for_admission(self):
        """Many new connections are not yet read from: this one waits its turn."""
        self.awaiting_admission = True
        self.pause()

    def admitted(self):
        self.awaiting_admission = False
        if self._put_off is not None:
            # Held while the store was behind: what came meanwhile first.
            self._next_turn()
        else:
            self.resume()

    def received(self, data):
        factory = self.connection.factory
        factory.router.stats.bytes_received += len(data)
        if self._put_off is not None:
            # Reading is paused; what was already on its way waits here.
            if self._held:
                self._held.append(data)
            else:
                self._held = [data]
            return
        flusher = factory.flusher
        if flusher.reading_held:
            # The store is behind: this connection waits its turn, its data
            # with it (see Flusher.hold_reading).
            self._held = [data]
            self._put_off = _NOTHING
            self.awaiting_admission = True
            self.pause()
            flusher.admit(self.connection)
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
        connection = self.connection
        factory = connection.factory
        try:
            for packet in packets:
                handlers = self.handlers
                if handlers is None:
                    break
                which, handler = handlers[packet.packet_type]
                # A handler returns True when what follows must wait (a
                # login, or a packet handled over several turns).  Most
                # packets are publishing's: asked first, without a call.
                if which == PUBLISHING:
                    wait = handler(connection.publishing, packet)
                else:
                    wait = handler(receiver(connection, which), packet)
                budget -= 1
                if not budget % self.FLUSH_EVERY:
                    connection.flush_alone()
                if (wait or budget <= 0) and connection.state is not CLOSED:
                    self._put_off = packets
                    self.pause()
                    # After a login, its answer carries on.
                    if connection.state not in ANSWERING:
                        factory.clock.callLater(0, self._next_turn)
                    break
            # Keepalive counts whole packets only: a peer dripping the bytes
            # of a packet it never finishes is not alive for MQTT.
            if packet is not None:
                if connection.keepalive:
                    self.last_received = factory.clock.seconds()
                factory.router.stats.packets_received += self.PACKETS_PER_TURN - budget
        except ProtocolViolation as e:
            connection.protocol_error(str(e), e.reason_code)
        except Exception:
            log.failure(
                "internal error handling data from {client_id} at {peer}",
                client_id=connection.log_id,
                peer=connection.peer,
            )
            connection.close(publish_will=True)

    def _next_turn(self):
        """What was put off for a later turn (and held meanwhile) is handled."""
        connection = self.connection
        if connection.state is CLOSED:
            self._put_off = self._work = None
            return
        if self._work is not None:
            try:
                more = next(self._work, True) is not True
            except ProtocolViolation as e:
                self._work = None
                connection.protocol_error(str(e), e.reason_code)
                return
            except Exception:
                self._work = None
                log.failure("internal error handling a packet from {client_id}", client_id=connection.log_id)
                connection.close(publish_will=True)
                return
            if more:
                self.clock.callLater(0, self._next_turn)
                return
            self._work = None
        packets, self._put_off = self._put_off, None
        if packets is not None:
            self._consume(packets)
        if self._put_off is None and self._held:
            held, self._held = self._held, ()
            self._consume(self.framer.feed(b"".join(held)))
        if self._put_off is None:
            self.resume()

    def resume_put_off(self):
        """An answer came: the packets put off while it was awaited are handled next."""
        if self._put_off is not None:
            self.clock.callLater(0, self._next_turn)

    def in_steps(self, work):
        try:
            more = next(work, True) is not True
        except ProtocolViolation as e:
            # Closed for it, as a handler would have closed it.
            self.connection.protocol_error(str(e), e.reason_code)
            return False
        if more:
            self._work = work
        return more

    def pause(self):
        if not self.paused:
            self.paused = True
            self.connection.transport.pauseProducing()

    def resume(self):
        if self._flags == _PAUSED and self._put_off is None:
            self.paused = False
            connection = self.connection
            if connection.state is not CLOSED:
                connection.transport.resumeProducing()

    def closing(self):
        """The connection closes gracefully: what the peer still sends is read, and ignored."""
        if self.paused:
            self.paused = False
            self.connection.transport.resumeProducing()

    # Deadlines of hearing from the peer.

    def connect_due(self):
        """The CONNECT deadline came (see :class:`ConnectDeadlines`)."""
        connection = self.connection
        if connection.state in BEFORE_CONNACK:
            # Idle connections by the thousand: one line per address.
            connection.factory.refusals.info(
                connection.host,
                "no CONNECT from {peer} in time: closing",
                peer=connection.peer,
                reason="no CONNECT in time",
            )
            connection.close(publish_will=False, graceful=True)

    def keepalive_due(self, now, stalls):
        """
        The keepalive's deadline came (see :class:`KeepaliveTimers`): None
        when the client is gone or expired, else its next deadline.
        Rather than re-arming a timer per packet, check now how long it has
        really been since the client was last heard from, less the time
        the gateway could not read it (``stalls``, a :class:`Stalls`).
        """
        connection = self.connection
        if connection.state is not CONNECTED:
            return None
        limit = connection.keepalive * 1.5
        if self.awaiting_admission:
            # Not read from because of us (see Flusher): its silence is ours.
            return now + limit
        last = self.last_received
        idle = now - last
        if idle >= limit:
            stalled = stalls.since(last)
            if idle - stalled < limit:
                return last + stalled + limit
            keepalive_log.info(
                "client {client_id} keepalive expired ({idle:.1f}s silent)",
                client_id=connection.log_id,
                idle=idle - stalled,
            )
            connection.close(publish_will=True, graceful=connection.disconnect_first(R.KEEP_ALIVE_TIMEOUT))
            return None
        return last + limit

    # The handlers of packets the state does not take.

    def not_connected(self, packet):
        self.connection.protocol_error(f"{P.PACKET_NAMES[packet.packet_type]} before CONNECT")

    def second_connect(self, packet):
        self.connection.protocol_error("second CONNECT")

    def unexpected(self, packet):
        self.connection.protocol_error(f"unexpected {P.PACKET_NAMES[packet.packet_type]} from a client")

    def count_protocol_error(self, reason):
        """Log and count: the peer broke the protocol (its connection closes)."""
        connection = self.connection
        # Under a flood of broken clients: some lines, then a count.
        connection.router.limited("protocol errors", log).warn(
            "closing connection of client {client_id} from {peer}: {reason}",
            client_id=connection.log_id,
            peer=connection.peer,
            reason=reason,
        )
        self.stats.protocol_errors += 1

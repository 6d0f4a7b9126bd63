"""
The seams of one MQTT connection: what its parts (reading, login,
handshake, publishing, subscribing) may ask of the connection they work
for and what it asks of each, and what the schedulers every connection
shares ask of one, declared as Twisted declares ``ITransport`` and
``IProtocol``.  Every implementation says so with ``@implementer``; the
tests verify each (``zope.interface.verify``).
"""

from zope.interface import Attribute, Interface

# What the connection is, to its parts


class IConnection(Interface):
    """
    What any part may ask of the connection it works for, and read of it:
    the facts its handshake established, nothing of the bytes below.
    """

    state = Attribute("The handshake's state (see handshake.TRANSITIONS); CLOSED once closing.")
    log_id = Attribute("The client id made safe for a log line once CONNECT named one, else None.")
    peer = Attribute("The peer's address for a log line.")
    client_id = Attribute("The client identifier, from CONNECT or assigned; None before.")
    username = Attribute("The user name the client logged in as, or None.")
    identity = Attribute("Who the client is once logged in (a security.identity.Identity).")

    def write(data):
        """Queue ``data``, whole packets' bytes; a turn's output leaves in one transport write."""

    def close(publish_will, graceful=False):
        """
        Close the connection: ``graceful``, what is queued goes out first
        and the peer may close its side; else at once.  The session's
        will is published if ``publish_will``.
        """

    def protocol_error(reason, reason_code=None):
        """The peer broke the protocol: tell a 5.0 client ``reason_code``, log, count, close."""

    def disconnect_first(reason_code, reason=None):
        """Send the DISCONNECT the dialect has for ``reason_code`` before a close; True if one was."""

    def in_steps(work):
        """
        Run ``work``, a generator that yields between steps of bounded
        size; what is left of it runs over the next reactor turns, before
        any further packet of this connection.  True when some is left.
        """


class IConnecting(IConnection):
    """
    What the login and the handshake may also ask of the connection while
    its client connects: the handshake's transitions, what CONNECT
    chooses, and the answer.  They set ``client_id``, ``log_id``,
    ``username`` and ``identity`` as they learn them.
    """

    dialect = Attribute("What the client's protocol version says and does (see dialects).")
    transport = Attribute("The connection's transport (a TLS one has the client's certificate).")
    host = Attribute("The peer's host, which the throttles count by.")
    factory = Attribute("The listener's MQTTServerFactory: its portal, throttle and methods.")
    max_delivery_rate = Attribute("Messages a second the client is sent at most (0: no bound).")

    def enter(event):
        """The handshake makes the transition ``event`` from its present state."""

    def speak(dialect):
        """CONNECT chose ``dialect``: the connection reads and answers in it from now on."""

    def authenticating(handshake):
        """CONNECT began an enhanced authentication: ``handshake`` takes its AUTH packets."""

    def accepted(session, may_write):
        """
        The client is accepted with ``session``: its packets are handled as
        a connected client's from now on; ``may_write`` is the ACL's cached
        check of what it may publish, or None.
        """

    def keep_alive(seconds):
        """The keep alive the server takes (0: none): its deadline is watched from now on."""

    def logged_in():
        """The login holds nothing more (no token to expire): the connection lets it go."""

    def resume():
        """An answer came: what the client sent meanwhile is handled next."""


class IReadingConnection(IConnection):
    """What the reading may also ask of the connection it reads."""

    transport = Attribute("The connection's transport, paused and resumed.")
    router = Attribute("The router, whose summarised warnings a protocol error's line goes through.")
    factory = Attribute("The listener's MQTTServerFactory, whose refusals log is per address.")
    host = Attribute("The peer's host.")
    keepalive = Attribute("The keep alive the server took, in seconds (0: none).")

    def flush_alone():
        """Where this connection alone has output this turn, write it now."""


class IScheduledConnection(Interface):
    """What the schedulers every connection shares (see schedulers) ask of one."""

    state = Attribute("The handshake's state: those BEFORE_CONNACK have a CONNECT deadline.")
    opening = Attribute("Whether it holds one of the places of connections not yet read from.")
    unread = Attribute("Whether nothing has been read from it yet.")
    log_id = Attribute("The client id for a log line, or None.")
    peer = Attribute("The peer's address for a log line.")

    def admitted():
        """Its turn has come to be read from."""

    def connect_due():
        """Its CONNECT deadline came."""

    def keepalive_due(now, stalls):
        """Its keepalive deadline came: the next one, or None when it is gone."""

    def flush():
        """Write this turn's output."""

    def flush_failed():
        """Writing raised: the connection cannot go on."""


# What the connection asks of its parts


class IReading(Interface):
    """
    What the connection asks of what reads it: bytes in, packets to the
    handlers of the present state, reading paused and resumed, and the
    deadlines of hearing from the peer.
    """

    framer = Attribute("The framer the bytes go through (a dialect configures it).")
    handlers = Attribute(
        "The present state's handlers by packet type, (receiver, function), the receiver one of"
        " reading.CONNECTION, READING, HANDSHAKE and PUBLISHING; None where nothing is read."
    )
    paused = Attribute("Whether the transport is not read from.")
    output_full = Attribute("Whether the peer does not read what it is sent (reading waits too).")
    unread = Attribute("Whether nothing has been read yet.")

    def received(data):
        """Bytes from the peer."""

    def wait_for_admission():
        """Many new connections are not yet read from: this one waits its turn."""

    def admitted():
        """Its turn has come to be read from."""

    def pause():
        """Stop reading the transport."""

    def resume():
        """Read the transport again, unless something else still holds it."""

    def resume_put_off():
        """An answer came: the packets put off while it was awaited are handled next."""

    def in_steps(work):
        """See :meth:`IConnection.in_steps`."""

    def closing():
        """The connection closes gracefully: what the peer still sends is read and ignored."""

    def connect_due():
        """The CONNECT deadline came: a client that has not connected is closed."""

    def keepalive_due(now, stalls):
        """The keepalive deadline came: the next one, or None when the client is gone or expired."""

    def count_protocol_error(reason):
        """Log and count a protocol error of the peer (the connection closes it)."""

    def not_connected(packet):
        """A packet other than CONNECT before CONNECT."""

    def second_connect(packet):
        """A CONNECT from a connected client."""

    def unexpected(packet):
        """A packet only a server sends."""


class ILogin(Interface):
    """
    What the connection asks of its login (CONNECT to CONNACK, and the
    token's expiry), and its handshake of it (the answer).
    """

    def handle_CONNECT(packet):
        """The client's CONNECT; True while the answer is awaited."""

    def answered(ok):
        """The throttle's delay before the answer (0 if no login was begun there)."""

    def welcome_after(delay, packet, will, auth_properties=None):
        """The credentials were accepted: the client is welcomed ``delay`` seconds from now."""

    def refused(reason_code, reason):
        """The credentials were refused: counted, answered after the throttle's delay."""

    def refuse(reason_code, reason):
        """CONNACK with a refusal (``reason_code`` in 5.0's terms), and the connection closes."""

    def ended():
        """The connection is closed: its throttle place and timers are released."""


class IHandshake(Interface):
    """What the connection and its login ask of its 5.0 enhanced authentication (section 4.12)."""

    method = Attribute("The method CONNECT authenticated with, once it has; else None.")

    def begin(exchange):
        """CONNECT named a method offered: ``exchange`` (a handshake.Exchange) starts."""

    def handle_AUTH(packet):
        """An AUTH from a connected client: re-authentication."""

    def challenge_answered(packet):
        """An AUTH while the client is challenged."""

    def challenge_dropped(packet):
        """A DISCONNECT while the client is challenged."""

    def challenge_broken(packet):
        """Any other packet while the client is challenged."""

    def ended():
        """The connection is closed: its deadline is cancelled."""


class IPublishing(Interface):
    """What the connection asks of its publishing: a connected client's PUBLISH and acks."""

    router = Attribute("The router (a 5.0 PUBLISH's checks read its maximum QoS).")
    limits = Attribute("The connection's limits (a 5.0 PUBLISH's checks read retain available).")
    session = Attribute("The client's session.")
    ordered_acks = Attribute("Acks waiting, in order, for a store commit (OrderedAcks), or None.")

    def handle_PUBLISH(packet):
        """A 3.x PUBLISH (and a 5.0 one past the dialect's checks)."""

    def handle_PUBLISH5(packet):
        """A 5.0 PUBLISH: the dialect's checks, then as any other."""

    def handle_PUBACK(packet):
        """A PUBACK for a delivery to the client."""

    def handle_PUBREC(packet):
        """A PUBREC for a QoS 2 delivery to the client."""

    def handle_PUBREL(packet):
        """A 3.x PUBREL: the client's QoS 2 publish is released."""

    def handle_PUBREL5(packet):
        """A 5.0 PUBREL: one of an id not awaiting it is answered with a reason code."""

    def handle_PUBCOMP(packet):
        """A PUBCOMP: a QoS 2 delivery to the client is complete."""


class ISubscribing(Interface):
    """What the connection asks of its subscribing: SUBSCRIBE and UNSUBSCRIBE."""

    def handle_SUBSCRIBE(packet):
        """A SUBSCRIBE, in steps of bounded size; True while steps are left."""

    def handle_UNSUBSCRIBE(packet):
        """An UNSUBSCRIBE, in steps of bounded size; True while steps are left."""

"""
The seams inside one MQTT connection: what its parts (reading, login,
handshake, publishing, subscribing) may ask of the connection they work
for, and what the connection asks of each part, as Twisted declares
``ITransport`` and ``IProtocol``.  Every implementation declares these
with ``@implementer``, and the tests verify it (``zope.interface.verify``).
"""

from zope.interface import Attribute, Interface


class IConnection(Interface):
    """
    What a part may ask of the connection it works for, and read of it:
    the facts the handshake established, nothing of the bytes below.
    """

    state = Attribute("The handshake's state (see handshake.TRANSITIONS); CLOSED once closing.")
    log_id = Attribute("The client id made safe for a log line, once CONNECT named one, else None.")
    peer = Attribute("The peer's address for a log line.")
    client_id = Attribute("The client identifier, from CONNECT or assigned; None before.")
    username = Attribute("The user name the client logged in as, or None.")
    identity = Attribute("Who the client is once logged in (a security.identity.Identity).")

    def write(data):
        """Queue ``data``, bytes of whole packets; a turn's output leaves in one transport write."""

    def close(publish_will, graceful=False):
        """
        Close the connection: ``graceful``, what is queued goes out first
        and the peer may close its side; else at once.  The session's
        will is published if ``publish_will``.
        """

    def protocol_error(reason, reason_code=None):
        """The peer broke the protocol: log, count, tell a 5.0 client ``reason_code``, close."""

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
    its client connects: the transitions of the handshake, the choices
    CONNECT makes, and the answer.
    """

    transport = Attribute("The connection's transport (a TLS one has the client's certificate).")
    host = Attribute("The peer's host, which the throttles count by.")
    factory = Attribute("The listener's MQTTServerFactory: its portal, throttle and methods.")
    max_delivery_rate = Attribute("Messages a second the client is sent at most (0: no bound).")

    def enter(event):
        """The handshake makes the transition ``event`` from its present state."""

    def speak(dialect):
        """CONNECT chose ``dialect``: the connection reads and answers in it from now on."""

    def authenticating(handshake):
        """CONNECT began an enhanced authentication: ``handshake`` answers its AUTH packets."""

    def accepted(session, may_write):
        """
        The client is accepted with ``session``: its packets are handled as
        a connected client's from now on; ``may_write``, the ACL's cached
        check of what it may publish, or None.
        """

    def keep_alive(seconds):
        """The keep alive the server takes (0: none): its deadline is watched from now on."""

    def resume():
        """An answer came: what the client sent meanwhile is handled next."""


class IReading(Interface):
    """What the connection asks of what reads it: bytes in, packets handled, pausing."""

    paused = Attribute("Whether the transport is not being read from.")
    unread = Attribute("Whether nothing has been read from this connection yet.")
    last_received = Attribute("When a whole packet last arrived (the clock's seconds).")
    awaiting_admission = Attribute("Whether it waits for its turn to be read from (see Flusher.admit).")

    def received(data):
        """Bytes from the peer."""

    def admitted():
        """Its turn has come to be read from."""

    def speaking(handlers):
        """Once connected, packets go to ``handlers``: by type, (receiver index, function)."""

    def connected(receivers):
        """The client is connected: ``receivers`` (by index) take its packets."""

    def output_paused():
        """The peer does not read what it is sent: reading pauses too."""

    def output_resumed():
        """The peer reads again."""

    def in_steps(work):
        """See :meth:`IConnection.in_steps`."""

    def protocol_error(reason):
        """Log and count a protocol error of the peer (the connection closes)."""


class ILogin(Interface):
    """What the connection asks of its login: CONNECT to CONNACK, and the token's expiry."""

    def handle_CONNECT(packet):
        """The client's CONNECT; True while the login's answer is awaited."""

    def ended():
        """The connection is closed: its throttle place and timers are released."""


class IHandshake(Interface):
    """What the connection asks of its 5.0 enhanced authentication (section 4.12)."""

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

"""
The broker's seams, declared: what a session asks of whatever carries it
to its receiver, how that carrier's dialect frames a PUBLISH, what routing
asks of a subscriber, and what connections and bridges ask of a session
and of the router.  Implementations declare them with ``@implementer``;
tests/system/test_layers.py verifies each with ``zope.interface.verify``.
"""

from zope.interface import Attribute, Interface


class ISessionCarrier(Interface):
    """
    What carries a session to its receiver: a client's MQTT connection
    (over TCP, TLS or WebSocket), or a bridge's link upstream.  The session
    writes whole frames to it, in order, and asks nothing else; the broker
    never asks which kind of carrier it is.
    """

    def write(frame):
        """
        Send ``frame`` (bytes: one or more whole MQTT packets, as the
        session's frames made them) to the receiver, after everything
        written before.
        """


class IClientConnection(ISessionCarrier):
    """
    A client's connection: a carrier that the router's session table and
    the gateway may end, and that the admin API lists.  (A bridge's link is
    a carrier but not this: no client can claim a bridge's client id, which
    begins with INTERNAL_PREFIX, and the gateway lists, kicks and shuts
    down clients' connections only.)
    """

    peer = Attribute("The client's address (an IAddress).")
    username = Attribute("The user name it logged in with, or None.")
    keepalive = Attribute("The keep alive (s) the connection runs with.")
    dialect = Attribute("Its protocol version's dialect (``dialect.level``: the protocol level).")
    listener_kind = Attribute(
        "The kind of listener it came through (``tcp``, ``tls``, ``ws``, ``wss``, ``mqttsn``):"
        " a label the session keeps for the archive, never a branch of the broker's."
    )

    def taken_over(publish_will=True):
        """
        Another connection claims this client id: close now, the will
        published if ``publish_will``.  Called by the router's session
        table before it hands the session to the newcomer.
        """

    def kick():
        """The admin API disconnects the client; its will is published."""

    def shutting_down():
        """The gateway stops: the client is told so where its version can be, then it is closed."""


class IFrames(Interface):
    """
    How the attached carrier's dialect frames a PUBLISH for a session
    (broker.deliveryframes: 3.1/3.1.1's message frames, 5.0's encoder).
    """

    retries = Attribute(
        "Whether unacknowledged deliveries go again on a timer while connected (3.1.1),"
        " rather than only when a session resumes (5.0, [MQTT-4.4.0-1])."
    )
    expires = Attribute("Whether a QoS 1 delivery that expired in flight is not sent again.")

    def publish(message, qos, mid, retain, dup, group):
        """
        The bytes of ``message`` delivered at ``qos`` under message id
        ``mid`` (None at QoS 0), with those RETAIN and DUP flags, having
        come by the shared subscription ``group`` (or None).  Raises
        broker.deliveryframes.TooLarge when the receiver takes nothing that large.
        """


class ISubscriber(Interface):
    """
    What routing asks of each subscriber the trie matches: a session, or a
    shared subscription's group standing for its members.
    """

    policy = Attribute("Its DeliveryPolicy: where a bridge delivers otherwise than a client.")
    may_read = Attribute("Whether its reader may read a topic (topic -> bool), or None: every topic.")
    budget = Attribute("A DeliveryBudget asked after may_read (a dashboard page's), or None.")
    options = Attribute("Its 5.0 subscription options by filter, or None: 3.1.1's delivery for every filter.")
    store = Attribute("The store when what is routed to it may be written there, else None.")
    outbox = Attribute("The IOutbox its routed copies go to.")


class IOutbox(Interface):
    """
    Where the copies routed to a subscriber go: a session's Outbox, or a
    shared subscription's group, which hands each to one member's.
    """

    def deliver(message, qos, retain=False, held=None):
        """
        Send ``message`` at ``qos`` (and RETAIN as given) now, or keep it
        within its bounds.  ``held``: its publisher's acknowledgement
        (broker.acks.Held) when that may wait for the store.  True when the
        delivery was written to the store: the acknowledgement waits for
        its commit.
        """


class ISession(ISubscriber):
    """What a connection or a bridge asks of the session it holds."""

    client_id = Attribute("The client id (a bridge's begins with INTERNAL_PREFIX).")
    connection = Attribute("The ISessionCarrier attached, or None.")
    listener_kind = Attribute(
        "Its last carrier's ``listener_kind`` (kept while it is away), ``bridge`` for a"
        " bridge's session, or \"\": not known (no client connection since it was made or restored)."
    )
    window = Attribute(
        "Its in-flight window (broker.window.Window): the receiver's acknowledgements go to its"
        " puback, pubrec and pubcomp, as they go to the session's own, one call fewer."
    )
    subscriptions = Attribute("Topic filter -> granted QoS.")
    awaiting_pubrel = Attribute("Inbound QoS 2 message ids whose PUBREL has not arrived yet.")
    will = Attribute("The will its connection's end publishes, or None.")
    limits = Attribute("Its SessionLimits.")
    inflight = Attribute("Deliveries in flight to its receiver, by message id.")
    queued = Attribute("Messages waiting for its receiver.")
    queued_bytes = Attribute("Their payload bytes.")
    dropped = Attribute("Messages dropped, not delivered: its queue was full, or they were too large.")
    dropped_too_large = Attribute("Of those, the ones too large for the receiver.")
    dropped_expired = Attribute("Messages that expired while they waited.")

    def attach(connection, frames, receive_maximum=None):
        """
        ``connection`` (an ISessionCarrier) carries the session from now,
        writing what ``frames`` (an IFrames) make; ``receive_maximum``: the
        receiver's, if it gave one.  What was in flight goes again, then
        what waited.
        """

    def puback(mid):
        """The receiver's PUBACK."""

    def pubrec(mid, failed=False):
        """The receiver's PUBREC; ``failed``: its 5.0 reason code refuses the message."""

    def pubcomp(mid):
        """The receiver's PUBCOMP."""

    def pause():
        """The carrier takes no more for now: deliveries wait in the session."""

    def resume():
        """The carrier takes more again."""

    def qos2_received(mid):
        """An inbound QoS 2 PUBLISH: True the first time, when it is to be routed."""

    def qos2_released(mid):
        """Its PUBREL: True when that was written to the store (the PUBCOMP waits for the commit)."""

    def forget_inbound_qos2():
        """The sender's session is new: its unreleased QoS 2 ids are free."""

    def deliver_as(policy, limits=None):
        """A bridge's DeliveryPolicy, and its limits if given, in place of a client's."""

    def oldest_waiting():
        """When the oldest message waiting for the receiver was queued (clock time), or None."""


class IRouter(Interface):
    """What connections and bridges ask of the broker."""

    stats = Attribute("The broker's counters (broker.stats.Stats).")
    store = Attribute("The durable store, or None: everything in memory.")
    access = Attribute("Who may write and read what (broker.access.Access).")
    max_qos = Attribute("The highest QoS granted.")
    limits = Attribute("The SessionLimits a new session is given.")
    max_persistent_sessions = Attribute("Persistent sessions at most (0: no bound).")
    sessions = Attribute("Sessions by client id (a read-only mapping).")
    subscriptions = Attribute("The subscription trie.")
    shared = Attribute("Shared subscriptions' groups by (share name, filter).")
    retained = Attribute("The retained messages' tree.")
    recorder = Attribute("The archive (anything with published()), or None.")

    def owner_refusal(client_id, owner):
        """Why the identity ``owner`` may not connect as ``client_id``, or None."""

    def resumes_session(client_id, clean_start, owner):
        """Whether a CONNECT would resume a persistent session ``owner`` owns."""

    def may_start_session(client_id, ends_with_connection=False):
        """Whether a CONNECT may go on within max_persistent_sessions."""

    def connect(client_id, clean_start, will=None, expiry_interval=0, will_delay=0, owner=None):
        """
        The session for ``client_id``, taken over from any connection that
        held it, and whether it was present: ``(session, present)``.
        ``clean_start``: a session held is ended, not resumed;
        ``expiry_interval``: how long (s) it outlives its connection, 0 not
        at all, NEVER_EXPIRES for ever.
        """

    def set_session_expiry(session, expiry_interval):
        """A 5.0 DISCONNECT changed the session's expiry interval."""

    def disconnect(session, publish_will):
        """The carrier of ``session`` is gone; its will is published if ``publish_will``."""

    def publish(message, sender=None, held=None):
        """Route ``message`` to its subscribers; True when a copy was written to the store."""

    def publish_held(message, sender=None):
        """Route ``message``; the acks.Held its publisher's acknowledgement waits on, or None."""

    def may_be_durable(message):
        """Whether routing ``message`` may write it to the store."""

    def subscribe(session, requests):
        """Add ``[(filter, QoS[, options])]`` to ``session``; the QoS granted for each."""

    def unsubscribe(session, topic_filters):
        """Take ``topic_filters`` from ``session``."""

    def send_retained(session, topic_filters):
        """After SUBACK: the retained messages matching the new filters."""

    def shared_refusal(topic_filter, new_groups=0):
        """Why a shared subscription to ``topic_filter`` would pass a bound, or None."""

    def limited(name, logger=None):
        """The rate-limited warning ``name`` (broker.logsummary.RateLimited)."""

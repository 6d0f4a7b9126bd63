"""
The router's table of sessions by client id: who may connect as which
client id, taking a session over from the connection that held it, its
end (with its connection, expired, deleted, replaced by another
identity's), and its will when its connection ends.  The Router holds one.
"""

from collections.abc import Mapping

from twisted.logger import Logger

from mqttgw.broker.session import NEVER_EXPIRES, Session
from mqttgw.schema import default
from mqttgw.wire.printable import printable

log = Logger()


def owner_name(owner):
    """A session owner as the log names it."""
    return "anonymous" if owner == "" else repr(printable(owner))


class SessionTable(Mapping):
    """
    Sessions by client id, read as a mapping (``router.sessions[client_id]``).
    It makes, resumes and ends them; the router it serves routes to them,
    and is given here only what the table asks of it: ``unroute(session,
    topic_filter)`` takes an ended session's filters out of its trie,
    ``publish(message, sender)`` publishes a will, ``limited(name)`` is a
    rate-limited warning.
    """

    # Bounds of the whole broker (0: none); see [limits].
    max_persistent_sessions = default("limits.max_persistent_sessions")
    # Seconds a persistent session may go unused, or None: for ever.
    persistent_client_expiration = None
    # What a CONNECT gets whose client id's session belongs to another
    # identity (see owner_refusal): "refuse", or "new_session" (the old
    # session is discarded, never resumed).
    session_owner_mismatch = default("auth.session_owner_mismatch")

    def __init__(self, clock, limits, stats, store, unroute, publish, limited):
        self.clock = clock
        # The limits a new session is given.
        self.limits = limits
        self.stats = stats
        # The durable store, or None to keep everything in memory.
        self.store = store
        self._unroute = unroute
        self._publish = publish
        self._limited = limited
        self._sessions = {}

    # The mapping

    def __getitem__(self, client_id):
        return self._sessions[client_id]

    def __iter__(self):
        return iter(self._sessions)

    def __len__(self):
        return len(self._sessions)

    def get(self, client_id, default=None):
        return self._sessions.get(client_id, default)

    def values(self):
        return self._sessions.values()

    def items(self):
        return self._sessions.items()

    def restore(self, stored_sessions, from_stored):
        """Persistent sessions as the store had them (``from_stored`` reads
        a stored subscription); yields each, for the router to route."""
        now = self.clock.seconds()
        for stored in stored_sessions:
            session = self._new_session(stored.client_id, NEVER_EXPIRES)
            session.restore(stored, now, from_stored)
            if session.expiry_interval != NEVER_EXPIRES:
                left = session.last_seen + session.expiry_interval - now
                session.expire_in(max(0.0, left), self._expired)
            yield session

    # Who connects

    def owner_refusal(self, client_id, owner):
        """
        Why the identity ``owner`` may not connect as ``client_id``, or
        None.  An identity owns its session: another one never resumes it
        nor takes it over from its connected owner; it may only replace a
        session left unconnected, and only with ``session_owner_mismatch``
        set to "new_session".  Refusals are counted; the caller logs them.
        """
        session = self._sessions.get(client_id)
        if session is None or session.owner is None or session.owner == owner:
            return None
        if session.connection is None and self.session_owner_mismatch == "new_session":
            return None
        self.stats.session_owner_refused += 1
        # The same words whether its owner is connected or not: the
        # refused client learns nothing of the owner's presence.
        return "its session belongs to another identity"

    def connect(
        self, client_id, clean_start, will=None, expiry_interval=0, will_delay=0, owner=None
    ):
        """
        Claim the session for ``client_id``, taking it over from any
        connection that holds it (that connection is closed, and its will
        published, before this returns).  Returns ``(session,
        session_present)``; the caller sends CONNACK, then attaches.

        ``clean_start``: a session held for the client id is not resumed
        but ended; ``expiry_interval``: how long (s) the session outlives
        the connection, 0 not at all, NEVER_EXPIRES for ever.  (3.1.1's
        Clean Session is both: Clean Start, and an interval of 0.)

        ``owner``: the identity connecting (a user name, "" for anonymous;
        None for the gateway's own sessions), which :meth:`owner_refusal`
        has let through.  A session another identity owns ends here, as
        with a clean start; one without an owner (stored before owners
        were) becomes this one's.
        """
        session = self._sessions.get(client_id)
        if session is not None and owner is not None and session.owner != owner:
            session = self._other_owner(session, owner, clean_start)
        if session is not None and session.connection is not None:
            session = self._take_over(session, clean_start)
        present = False
        if session is not None:
            # A new connection for the client id within its will's delay:
            # the will is not sent, whether or not this connection resumes
            # the session ([MQTT-3.1.2-8]); nor does the session expire.
            session.cancel_timers()
            if clean_start or not session.expiry_interval:
                self._discard(session)
                session = None
            else:
                present = True
                if not expiry_interval:
                    # Resumed by a 5.0 client that keeps it no longer.
                    self._forget(session)
                elif session.expiry_interval != expiry_interval:
                    session.set_expiry(expiry_interval)
        if session is None:
            session = self._new_session(client_id, expiry_interval)
            session.start(owner, expiry_interval)
        session.renew(expiry_interval, will, will_delay)
        return session, present

    def _other_owner(self, session, owner, clean_start):
        """
        ``owner`` connects with the client id of a session it does not own:
        it claims one stored without an owner, or replaces one left
        unconnected (None: it is gone).
        """
        if session.owner is None:
            if not clean_start:
                self._claim(session, owner)
            return session
        if session.connection is not None:
            return session
        # Two identities taking turns could repeat it at any rate.
        self._limited("session owner replaced").warn(
            "discarding the session of client {client_id} (owned by {old}):"
            " {new} connected with its client id (auth.session_owner_mismatch)",
            client_id=printable(session.client_id),
            old=owner_name(session.owner),
            new=owner_name(owner),
        )
        self.stats.session_owner_replaced += 1
        self._end_session(session)
        return None

    def _take_over(self, session, clean_start):
        """The connection holding ``session`` is closed for a new one; the
        session as it is then (None: it ended with that connection)."""
        client_id = session.client_id
        log.info(
            "client {client_id} taken over by a new connection",
            client_id=printable(client_id),
        )
        # A persistent session resumed by its own client is a
        # reconnection, not a failure: its will is published only when
        # the session ends here (a clean start, or one that ends with its
        # connection), and never when it has a delay, which this new
        # connection comes within.
        session.connection.taken_over(
            publish_will=not session.will_delay and (clean_start or not session.expiry_interval)
        )
        return self._sessions.get(client_id)

    def _claim(self, session, owner):
        """A session restored from a store without owners: its first login owns it."""
        session.claim(owner)
        log.warn(
            "session of client {client_id} was stored without an owner: now owned by {owner},"
            " its first login",
            client_id=printable(session.client_id),
            owner=owner_name(owner),
        )

    def set_session_expiry(self, session, expiry_interval):
        """A 5.0 DISCONNECT changed the session's expiry interval."""
        if expiry_interval == 0 and session.expiry_interval:
            self._forget(session)
        session.set_expiry(expiry_interval)

    def _forget(self, session):
        """A persistent session becomes one that ends with its connection."""
        session.forget()
        stats = self.stats
        stats.persistent_sessions -= 1
        if not session.internal and session.connection is None:
            stats.clients_disconnected -= 1

    def resumes_session(self, client_id, clean_start, owner):
        """
        Whether a CONNECT would resume the persistent session it has (one
        its identity ``owner`` owns) rather than start one: a store that
        cannot be written still serves such a session, as it does one
        connected when the store failed, but cannot record a new one.
        """
        session = self._sessions.get(client_id)
        return (
            session is not None
            and not clean_start
            and not session.ends_with_connection
            and session.owner in (None, owner)
        )

    def may_start_session(self, client_id, ends_with_connection=False):
        """
        Whether a CONNECT may go on: False when it would create one more
        persistent session than ``max_persistent_sessions`` allows.
        """
        limit = self.max_persistent_sessions
        if ends_with_connection or not limit:
            return True
        existing = self._sessions.get(client_id)
        if existing is not None and existing.expiry_interval:
            return True
        if self.stats.persistent_sessions < limit:
            return True
        self.stats.sessions_refused += 1
        return False

    def expire_sessions(self):
        """
        Remove persistent sessions whose client has been away longer than
        ``persistent_client_expiration``, their queues with them (bridges'
        own sessions never expire).  Returns how many went.
        """
        expiration = self.persistent_client_expiration
        if expiration is None:
            return 0
        cutoff = self.clock.seconds() - expiration
        expired = [
            s
            for s in self._sessions.values()
            if s.connection is None
            and s.expiry_interval == NEVER_EXPIRES
            and not s.internal
            and s.last_seen is not None
            and s.last_seen < cutoff
        ]
        for session in expired:
            log.info(
                "expiring persistent session of client {client_id}: away {away:.0f}s",
                client_id=printable(session.client_id),
                away=self.clock.seconds() - session.last_seen,
            )
            self._end_session(session)
        self.stats.clients_expired += len(expired)
        return len(expired)

    def _expired(self, session):
        """A 5.0 session's expiry interval ran out."""
        if self._sessions.get(session.client_id) is not session or session.connection is not None:
            return
        log.info(
            "session of client {client_id} expired ({interval}s)",
            client_id=printable(session.client_id),
            interval=session.expiry_interval,
        )
        self.stats.clients_expired += 1
        self._end_session(session)

    def _end_session(self, session):
        """The session ends: a will still waiting for its delay goes now."""
        will = session.pending_will
        session.cancel_timers()
        self._discard(session)
        if will is not None:
            self._publish_will(session, will)

    def delete_session(self, client_id):
        """The admin API's delete: a session not in use, and its store rows."""
        session = self._sessions.get(client_id)
        if session is None or session.connection is not None:
            return False
        self._discard(session)
        return True

    def disconnect(self, session, publish_will):
        """The connection holding ``session`` ended."""
        will = session.left(self.clock.seconds())
        expiry = session.expiry_interval
        if not expiry:
            self._discard(session)
        elif expiry != NEVER_EXPIRES:
            session.expire_in(expiry, self._expired)
        if publish_will and will is not None:
            if session.will_delay and expiry:
                # Sent when the delay ends, or the session does if sooner.
                session.delay_will(will, session.will_delay, self._publish_will)
            else:
                self._publish_will(session, will)

    def _publish_will(self, session, will):
        log.info(
            "publishing will of {client_id} on {topic}",
            client_id=printable(session.client_id),
            topic=printable(will.topic),
        )
        if will.properties and "message_expiry_interval" in will.properties:
            will.expiry = self.clock.seconds() + will.properties["message_expiry_interval"]
        self._publish(will, session)

    def _new_session(self, client_id, expiry_interval):
        session = Session(
            client_id, expiry_interval, self.clock, self.limits, self.stats, self.store
        )
        self._sessions[client_id] = session
        if expiry_interval:
            stats = self.stats
            stats.persistent_sessions += 1
            if not session.internal:
                stats.clients_disconnected += 1
        return session

    def _discard(self, session):
        for topic_filter in session.subscriptions:
            self._unroute(session, topic_filter)
        session.end()
        if self._sessions.get(session.client_id) is session:
            del self._sessions[session.client_id]
            # What it held goes with it (the queue of one that ends with
            # its connection, say).
            session.release()
            stats = self.stats
            if session.expiry_interval:
                stats.persistent_sessions -= 1
                if not session.internal and session.connection is None:
                    stats.clients_disconnected -= 1


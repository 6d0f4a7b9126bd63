"""
SUBSCRIBE and UNSUBSCRIBE in steps of bounded size: each filter checked
(its syntax, the dialect's options, the ACL, the session's quotas), the
router asked for what is granted, then SUBACK or UNSUBACK and the retained
messages.  What is left of a large packet runs over the next reactor
turns, before any further packet of the connection.  A part of
:class:`~mqttgw.transports.protocol.MQTTServerProtocol`.
"""

from twisted.logger import Logger
from zope.interface import implementer

from mqttgw.broker.subscriptions import is_shared, shared_filter
from mqttgw.broker.topics import InvalidTopic, filter_size, validate_topic_filter
from mqttgw.transports.interfaces import ISubscribing
from mqttgw.wire import reasons as R
from mqttgw.wire.framing import FiltersToDecode
from mqttgw.wire.printable import printable

log = Logger()


def _take_step(topics, start, count):
    """
    ``count`` filters of a SUBSCRIBE or UNSUBSCRIBE from ``start``, dropped
    from a list as they are taken: a hundred thousand freed all at once,
    when the packet goes, would hold the reactor for milliseconds.
    """
    step = topics[start : start + count]
    topics[start : start + count] = [None] * len(step)
    return step


class _Granting:
    """What one SUBSCRIBE has granted and refused so far."""

    __slots__ = ("suback", "accepted", "refused", "first_reason", "identifier")

    def __init__(self, identifier):
        self.suback = []
        # Filters whose retained messages are sent.
        self.accepted = []
        self.refused = 0
        self.first_reason = None
        self.identifier = identifier


@implementer(ISubscribing)
class Subscribing:
    """
    A connected client's SUBSCRIBE and UNSUBSCRIBE, for its connection
    (an :class:`~mqttgw.transports.interfaces.IConnection`) and session.
    """

    __slots__ = ("connection", "router", "session", "dialect", "limits")
    # Topic filters of one SUBSCRIBE or UNSUBSCRIBE handled per turn.
    FILTERS_PER_STEP = 64

    def __init__(self, connection, router, session, dialect, limits):
        self.connection = connection
        self.router = router
        self.session = session
        self.dialect = dialect
        self.limits = limits

    def handle_SUBSCRIBE(self, packet):
        return self.connection.in_steps(self._subscribe(packet))

    def handle_UNSUBSCRIBE(self, packet):
        return self.connection.in_steps(self._unsubscribe(packet))

    def _decoded(self, packet):
        """
        Decode a large packet's filters a step at a time (yielding between
        steps); every one is decoded, and so checked, before any is used.
        """
        topics = packet.topics
        if type(topics) is FiltersToDecode:
            while not topics.step(self.FILTERS_PER_STEP):
                yield
            packet.topics = topics.decoded

    def _subscribe(self, packet):
        yield from self._decoded(packet)
        session = self.session
        granting = _Granting(self.dialect.subscription_identifier(packet, self.limits))
        topics = packet.topics
        for start in range(0, len(topics), self.FILTERS_PER_STEP):
            if start:
                yield
            chunk, codes = self._subscribe_step(_take_step(topics, start, self.FILTERS_PER_STEP), granting)
            granted = iter(self.router.subscribe(session, chunk))
            granting.suback.extend(next(granted) if ok is True else ok for ok in codes)
        if granting.refused:
            # One line per packet, however many filters it refuses.
            log.info(
                "client {client_id} SUBSCRIBE refused {refused} of {n} filters: {reason}",
                client_id=self.connection.log_id,
                refused=granting.refused,
                n=len(topics),
                reason=printable(granting.first_reason),
            )
        reason = granting.first_reason if granting.refused else None
        self.connection.write(self.dialect.suback(packet.message_id, granting.suback, reason))
        self.router.send_retained(session, granting.accepted)

    def _subscribe_step(self, step, granting):
        """
        The router's entries for a step's filters, and a code per filter:
        True where the router grants it, else the refusal's.
        """
        session = self.session
        dialect = self.dialect
        chunk = []
        codes = []
        # What this step adds to the session's filters, for its bounds.
        adding = set()
        quota = [0, set()]
        for topic_filter, requested in step:
            failure, why = self._check_filter(topic_filter, requested)
            if failure is None and topic_filter not in session.subscriptions and topic_filter not in adding:
                why = self._quota_refusal(topic_filter, adding, quota)
                if why is not None:
                    failure = R.QUOTA_EXCEEDED
                    self.router.stats.subscriptions_refused += 1
            if failure is not None:
                codes.append(dialect.refused_filter(failure, why))
                granting.refused += 1
                if granting.first_reason is None:
                    granting.first_reason = why
                continue
            entry, retained = dialect.subscription(topic_filter, requested, session, granting.identifier)
            chunk.append(entry)
            if retained:
                granting.accepted.append(topic_filter)
            codes.append(True)
        return chunk, codes

    def _quota_refusal(self, topic_filter, adding, quota):
        """
        Why a new filter would exceed the session's bounds, else None (and
        it is counted in ``adding`` and ``quota``: the bytes and shared
        groups this step adds).
        """
        session = self.session
        limits = session.limits
        size = filter_size(topic_filter)
        why = None
        if len(session.subscriptions) + len(adding) >= limits.max_subscriptions:
            why = f"max_subscriptions ({limits.max_subscriptions}) reached"
        elif session.filter_bytes + quota[0] + size > limits.max_subscription_bytes:
            why = f"max_subscription_bytes ({limits.max_subscription_bytes}) reached"
        elif is_shared(topic_filter):
            new_groups = quota[1]
            key = shared_filter(topic_filter)
            if key not in new_groups:
                why = self.router.shared_refusal(topic_filter, len(new_groups))
                if why is None and key not in self.router.shared:
                    new_groups.add(key)
        if why is None:
            adding.add(topic_filter)
            quota[0] += size
        return why

    def _check_filter(self, topic_filter, requested):
        """
        ``(None, None)`` for a filter the client may subscribe to, else
        ``(reason code, why)``.
        """
        dialect = self.dialect
        try:
            if is_shared(topic_filter):
                inner = shared_filter(topic_filter)[1]
                refusal = dialect.shared_refusal(requested, self.limits)
                if refusal is not None:
                    return refusal
            else:
                validate_topic_filter(topic_filter)
                inner = topic_filter
        except InvalidTopic as e:
            return R.TOPIC_FILTER_INVALID, str(e)
        refusal = dialect.wildcard_refusal(inner, self.limits)
        if refusal is not None:
            return refusal
        # 3.1 has no failure code: a filter that can match nothing
        # readable is granted, and nothing is delivered on it.
        connection = self.connection
        if dialect.may_refuse_filters and not self.router.access.may_subscribe(
            connection.username, connection.client_id, inner, connection.identity.subscribe
        ):
            return R.NOT_AUTHORIZED, f"not authorized for {topic_filter!r}"
        return None, None

    def _unsubscribe(self, packet):
        yield from self._decoded(packet)
        topics = packet.topics
        codes = []
        for start in range(0, len(topics), self.FILTERS_PER_STEP):
            if start:
                yield
            step = _take_step(topics, start, self.FILTERS_PER_STEP)
            self.dialect.unsubscribed(self.session.subscriptions, step, codes)
            self.router.unsubscribe(self.session, step)
        self.connection.write(self.dialect.unsuback(packet.message_id, codes))

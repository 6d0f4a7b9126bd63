"""
An MQTT-SN client's SUBSCRIBE and UNSUBSCRIBE: the topic filter, short
name or pre-defined id read, checked (its syntax, the ACL, the session's
bounds), the router asked, then SUBACK (topic id 0 for a wildcard filter
or a short name; deliveries on a wildcard's topics are registered with
the client first) and the retained messages.  A part of
:class:`~mqttgw.transports.mqttsn.client.SnClient`.
"""

from zope.interface import Interface, implementer

from mqttgw.broker.subscriptions import is_shared
from mqttgw.broker.topics import InvalidTopic, is_wildcard, validate_topic_filter
from mqttgw.wire.mqttsn import Suback, Unsuback
from mqttgw.wire.mqttsn import constants as C


class ISnSubscribing(Interface):
    """What a connected MQTT-SN client's SUBSCRIBE and UNSUBSCRIBE go to."""

    def handle_SUBSCRIBE(message):
        """Subscribe: SUBACK, then the retained messages."""

    def handle_UNSUBSCRIBE(message):
        """Unsubscribe: UNSUBACK."""


class SubscriptionRefused(Exception):
    """A filter the client may not have: the SUBACK return code in ``args[0]``."""


@implementer(ISnSubscribing)
class SnSubscribing:
    """The subscribing of one client (an ISnClient) and its session."""

    __slots__ = ("client", "router", "session")

    def __init__(self, client, router, session):
        self.client = client
        self.router = router
        self.session = session

    def _filter(self, message):
        """(topic filter, topic id for SUBACK) of a SUBSCRIBE or UNSUBSCRIBE, or SubscriptionRefused."""
        topics = self.client.topics
        kind = message.topic_id_type
        if kind == C.PREDEFINED_TOPIC_ID:
            name = topics.predefined_name(message.topic_id)
            if name is None:
                raise SubscriptionRefused(C.REJECTED_INVALID_TOPIC_ID)
            return name, message.topic_id
        name = message.topic_name
        if kind == C.SHORT_TOPIC_NAME and ("+" in name or "#" in name):
            # A short topic name is a name, never a filter.
            raise SubscriptionRefused(C.REJECTED_INVALID_TOPIC_ID)
        try:
            validate_topic_filter(name)
        except InvalidTopic:
            raise SubscriptionRefused(C.REJECTED_INVALID_TOPIC_ID) from None
        if is_shared(name):
            raise SubscriptionRefused(C.REJECTED_NOT_SUPPORTED)
        return name, 0

    def handle_SUBSCRIBE(self, message):
        client = self.client
        mid = message.message_id
        try:
            topic_filter, topic_id = self._filter(message)
            self._check(topic_filter)
            if topic_id == 0 and message.topic_id_type == C.NORMAL_TOPIC_ID and not is_wildcard(topic_filter):
                # A topic name: its id, for the deliveries on it.
                topic_id = client.register_own(topic_filter)
                if topic_id is None:
                    raise SubscriptionRefused(C.REJECTED_CONGESTION)
        except SubscriptionRefused as refused:
            client.send(Suback(0, mid, refused.args[0], 0).encode())
            return
        router = self.router
        requested = message.qos if message.qos > 0 else 0
        granted = router.subscribe(self.session, [(topic_filter, min(requested, router.max_qos))])[0]
        client.send(Suback(topic_id, mid, C.ACCEPTED, granted).encode())
        router.send_retained(self.session, [topic_filter])

    def _check(self, topic_filter):
        """SubscriptionRefused when the ACL or the session's bounds refuse ``topic_filter``."""
        client = self.client
        router = self.router
        if not router.access.may_subscribe(client.username, client.client_id, topic_filter):
            raise SubscriptionRefused(C.REJECTED_NOT_SUPPORTED)
        session = self.session
        limits = session.limits
        if topic_filter not in session.subscriptions and (
            len(session.subscriptions) >= limits.max_subscriptions
            or session.filter_bytes + len(topic_filter.encode("utf-8")) > limits.max_subscription_bytes
        ):
            router.stats.subscriptions_refused += 1
            raise SubscriptionRefused(C.REJECTED_CONGESTION)

    def handle_UNSUBSCRIBE(self, message):
        try:
            topic_filter, _ = self._filter(message)
        except SubscriptionRefused:
            topic_filter = None
        if topic_filter is not None:
            self.router.unsubscribe(self.session, [topic_filter])
        # Answered whatever it named, as MQTT's UNSUBACK is.
        self.client.send(Unsuback(message.message_id).encode())

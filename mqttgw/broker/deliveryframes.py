"""
The outbound PUBLISH of one attached connection, as the session asks for
it without knowing which protocol version the connection speaks.  The
connection gives its frames at attach, made from its dialect's ``frame``:
3.1/3.1.1's is the message's own cached frame (:data:`PLAIN`), a 5.0
connection's (or a bridge's 5.0 upstream's) is wrapped by
:class:`EncodedFrames`.

A frames object has ``publish(message, qos, mid, retain, dup, group)``,
returning the bytes, or raising TooLarge when the receiver takes nothing
that large (an exception: a check of every frame would cost the hot
path more than a try block); ``retries``: unacknowledged deliveries go again on a timer while
connected (3.1.1), rather than only when a session resumes (5.0,
[MQTT-4.4.0-1]); ``expires``: a QoS 1 delivery that expired in flight is
not sent again.
"""

from zope.interface import implementer

from mqttgw.broker.interfaces import IFrames
from mqttgw.broker.subscriptions import subscription_ids
from mqttgw.wire.packets import Publish


class TooLarge(Exception):
    """A frame larger than the receiver accepts ([MQTT-3.1.2-25])."""


@implementer(IFrames)
class PlainFrames:
    """MQTT 3.1 and 3.1.1: one frame per message and QoS, ids spliced in."""

    __slots__ = ()
    retries = True
    expires = False
    # The message's own framing, with no call between: every copy
    # delivered goes through it.
    publish = staticmethod(Publish.frame)


@implementer(IFrames)
class EncodedFrames:
    """
    A connection's ``encoder.frame(message, qos, mid, retain, dup,
    subscription_ids)`` (5.0: properties, topic aliases, the client's
    maximum packet size), given the identifiers of ``session``'s
    subscriptions.
    """

    __slots__ = ("encoder", "session")
    retries = False
    expires = True

    def __init__(self, encoder, session):
        self.encoder = encoder
        self.session = session

    def publish(self, message, qos, mid, retain, dup, group):
        session = self.session
        ids = subscription_ids(session, message.topic, group) if session.options else None
        frame = self.encoder.frame(message, qos, mid, retain, dup, ids)
        if frame is None:
            raise TooLarge()
        return frame


# 3.1/3.1.1's, and a session's before any connection attaches.
PLAIN = PlainFrames()

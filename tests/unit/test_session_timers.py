"""
A session's own timers, as the router uses them: its expiry, and its will
waiting for its delay ([MQTT-3.1.2-8]), scheduled and cancelled through
the session, the waiting will readable as ``pending_will``.
"""

from twisted.internet.task import Clock

from mqttgw.broker.session import NEVER_EXPIRES, Session
from mqttgw.wire import packets as P


def session_and_calls():
    clock = Clock()
    calls = []
    return Session("c", NEVER_EXPIRES, clock), clock, calls


def test_expiry_calls_back_with_the_session_when_its_interval_ends():
    session, clock, calls = session_and_calls()
    session.expire_in(10, calls.append)
    clock.advance(9.9)
    assert calls == []
    clock.advance(0.1)
    assert calls == [session]
    assert clock.getDelayedCalls() == []


def test_a_delayed_will_is_pending_until_its_delay_ends_then_published():
    session, clock, calls = session_and_calls()
    will = P.Publish("w", b"gone", 1, False)
    session.delay_will(will, 5, lambda s, w: calls.append((s, w, s.pending_will)))
    assert session.pending_will is will
    clock.advance(5)
    # Published once, no longer pending when it goes.
    assert calls == [(session, will, None)]
    assert session.pending_will is None


def test_cancel_timers_stops_both_and_forgets_the_pending_will():
    session, clock, calls = session_and_calls()
    session.expire_in(3, calls.append)
    session.delay_will(P.Publish("w", b"gone", 0, False), 5, lambda s, w: calls.append(w))
    session.cancel_timers()
    assert session.pending_will is None
    assert clock.getDelayedCalls() == []
    clock.advance(10)
    assert calls == []

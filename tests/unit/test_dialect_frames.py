"""
Outbound PUBLISH framing goes through the connection's dialect for every
version: the session is given its dialect's frames at attach and never
asks which version the connection speaks.
"""

import pytest
from twisted.internet.task import Clock

from mqttgw.broker.deliveryframes import TooLarge
from mqttgw.broker.session import Session
from mqttgw.testing import FakeBroker
from mqttgw.transports.dialects import V31, V311, V5
from mqttgw.wire import packets as P


@pytest.mark.parametrize("dialect", [V31(), V311()], ids=["3.1", "3.1.1"])
def test_a_3x_dialect_frames_a_publish_as_the_message_frames_itself(dialect):
    session = Session("c", 0, Clock())
    frames = dialect.frames(session)
    message = P.Publish("t/a", b"x", 1, False)
    # The dialect's frame itself, no call between, for every copy.
    assert frames.publish is type(dialect).frame
    assert frames.publish(message, 1, 7, False, True, None) == P.Publish("t/a", b"x", 1, False, True, 7).encode()
    assert frames.retries and not frames.expires


def test_a_5_0_dialect_frames_with_its_own_limits():
    clock = Clock()
    dialect = V5(clock, {"maximum_packet_size": 32}, 0, 65535)
    frames = dialect.frames(Session("c", 0, clock))
    small = P.Publish("t", b"x", 0, False, properties={})
    assert frames.publish(small, 0, None, False, False, None) == small.frame5(0)
    assert not frames.retries and frames.expires
    with pytest.raises(TooLarge):
        frames.publish(P.Publish("t", bytes(64), 0, False), 0, None, False, False, None)


@pytest.mark.parametrize("level", [P.MQTT_31, P.MQTT_311, P.MQTT_5])
def test_the_session_is_given_the_frames_of_its_connections_dialect(level):
    broker = FakeBroker()
    client = broker.client(P.Connect("c", protocol_level=level, protocol_name=P.PROTOCOL_NAMES[level],
                                     properties={} if level == P.MQTT_5 else None))
    protocol = client.protocol
    frames = protocol.session.frames
    assert type(frames) is type(protocol.dialect.frames(protocol.session))
    if level != P.MQTT_5:
        assert frames.publish is type(protocol.dialect).frame
    else:
        assert frames.encoder is protocol.dialect.connection5

"""
An MQTT-SN listener in process, on a FakeBroker's router and clock and a
fake datagram transport: its datagrams sent in and read out.
"""

from mqttgw.testing import FakeBroker
from mqttgw.transports.mqttsn.listener import MqttSnProtocol
from mqttgw.transports.mqttsn.options import MqttSnOptions
from mqttgw.wire import mqttsn as S
from mqttgw.wire import packets as P


class FakeDatagramTransport:
    """What a listener writes: (datagram, address) pairs."""

    def __init__(self):
        self.written = []

    def write(self, data, addr):
        self.written.append((data, addr))


class Listener:
    """A listener on a FakeBroker's router, its datagrams in and out."""

    def __init__(self, acl=None, **options):
        self.broker = FakeBroker(acl=acl)
        self.protocol = MqttSnProtocol(self.broker.router, self.broker.clock, MqttSnOptions(**options))
        self.transport = FakeDatagramTransport()
        self.protocol.transport = self.transport

    def send(self, message, addr=("127.0.0.1", 5000)):
        data = message if isinstance(message, bytes) else message.encode()
        self.protocol.datagramReceived(data, addr)

    def out(self, addr=None):
        got = [(S.decode(d), a) for d, a in self.transport.written if addr is None or a == addr]
        self.transport.written = [(d, a) for d, a in self.transport.written if not (addr is None or a == addr)]
        return [m for m, _ in got]

    def connect(self, client_id, addr=("127.0.0.1", 5000), duration=10, will=None, clean=True):
        self.send(S.Connect(client_id, duration, clean_session=clean, will=will is not None), addr)
        if will is not None:
            assert self.out(addr) == [S.WillTopicReq()]
            self.send(S.WillTopic(will[0]), addr)
            assert self.out(addr) == [S.WillMsgReq()]
            self.send(S.WillMsg(will[1]), addr)
        assert self.out(addr) == [S.Connack(0)]
        return self.protocol.clients[(addr[0], addr[1], None)]

    def mqtt_subscriber(self, topic_filter):
        client = self.broker.client(client_id="watcher", keepalive=0)
        client.send(P.Subscribe(1, [(topic_filter, 1)]))
        client.received()
        return client

"""
A raw MQTT-SN client over a real UDP socket on 127.0.0.1, for tests that
need what no client library sends (a sleeper's PINGREQ, a forwarder's
encapsulation, bad datagrams), counting the bytes both ways.
"""

import socket
import time

from mqttgw.wire import mqttsn as S

TIMEOUT = 5.0


class RawSn:
    def __init__(self, port, host="127.0.0.1", bind_port=0):
        self.address = (host, port)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", bind_port))
        self.sent = self.received = 0

    @property
    def port(self):
        return self.socket.getsockname()[1]

    def send(self, message):
        data = message if isinstance(message, bytes) else message.encode()
        self.sent += len(data)
        self.socket.sendto(data, self.address)

    def recv_raw(self, timeout=TIMEOUT):
        """The next datagram's bytes, or None within ``timeout``."""
        self.socket.settimeout(timeout)
        try:
            data, _ = self.socket.recvfrom(70000)
        except socket.timeout:
            return None
        self.received += len(data)
        return data

    def recv(self, timeout=TIMEOUT):
        data = self.recv_raw(timeout)
        return None if data is None else S.decode(data)

    def expect(self, cls, timeout=TIMEOUT):
        """The next message of ``cls``; others before it are returned too, as a list."""
        deadline = time.monotonic() + timeout
        before = []
        while time.monotonic() < deadline:
            message = self.recv(max(0.01, deadline - time.monotonic()))
            if message is None:
                break
            if isinstance(message, cls):
                return message, before
            before.append(message)
        raise AssertionError(f"no {cls.__name__} within {timeout}s; got {before}")

    def nothing(self, timeout=0.5):
        """Whatever arrives within ``timeout`` (a test that expects none asserts it is empty)."""
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.recv_raw(max(0.01, deadline - time.monotonic()))
            if data is None:
                break
            got.append(data)
        return got

    def connect(self, client_id, duration=60, clean=True, will=None):
        """CONNECT (with a will: (topic, message, qos, retain)); the CONNACK's return code."""
        self.send(S.Connect(client_id, duration, clean_session=clean, will=will is not None))
        if will is not None:
            self.expect(S.WillTopicReq)
            topic, message, qos, retain = will
            self.send(S.WillTopic(topic, qos, retain))
            self.expect(S.WillMsgReq)
            self.send(S.WillMsg(message))
        return self.expect(S.Connack)[0].return_code

    def close(self):
        self.socket.close()

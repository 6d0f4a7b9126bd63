"""A blocking wrapper around paho-mqtt for interoperability tests."""

import queue
import threading

import paho.mqtt.client as mqtt

VERSIONS = {"MQTTv31": mqtt.MQTTv31, "MQTTv311": mqtt.MQTTv311, "MQTTv5": mqtt.MQTTv5}
TIMEOUT = 10
# Clients whose network thread runs: stopped after each test (conftest),
# so none left behind reconnects into a later test's gateway.
RUNNING = []


class PahoClient:
    def __init__(self, port, client_id, version, clean_session=True, will=None, **kwargs):
        # 5.0 has Clean Start in CONNECT instead; clean_session gives it.
        self.v5 = version == "MQTTv5"
        self.clean_start = clean_session
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=None if self.v5 else clean_session,
            protocol=VERSIONS[version],
            **kwargs,
        )
        self.messages = queue.Queue()
        self.connack = queue.Queue()
        self.subacks = queue.Queue()
        self.disconnected = threading.Event()
        c = self.client
        c.on_connect = self._on_connect
        self.connack_properties = None
        c.on_message = lambda c_, u, m: self.messages.put(m)
        c.on_subscribe = lambda c_, u, mid, codes, p: self.subacks.put((mid, codes))
        # 5.0: the reason code and properties of the DISCONNECT that ended it.
        self.disconnect_reason = queue.Queue()
        c.on_disconnect = self._on_disconnect
        if will is not None:
            c.will_set(*will)
        self.port = port

    def _on_connect(self, client, userdata, flags, rc, properties):
        # Kept before the (flags, rc) pair is handed over, so it is there
        # for whoever takes that.
        self.connack_properties = properties
        self.connack.put((flags, rc))

    def _on_disconnect(self, client, userdata, flags, rc, properties):
        self.disconnect_reason.put((rc, properties))
        self.disconnected.set()

    def connect(self, keepalive=60, transport_host="127.0.0.1", reconnect_delay=(60, 120),
                properties=None):
        """
        The CONNACK flags; for 5.0, ``properties`` go in CONNECT and the
        CONNACK's properties are kept as ``connack_properties``.
        """
        # Tests that drop the broker choose a short delay; others none.
        self.client.reconnect_delay_set(*reconnect_delay)
        if self.v5:
            self.client.connect(
                transport_host, self.port, keepalive,
                clean_start=self.clean_start, properties=properties,
            )
        else:
            self.client.connect(transport_host, self.port, keepalive)
        self.client.loop_start()
        RUNNING.append(self)
        try:
            flags, rc = self.connack.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError(
                f"{self.client._client_id.decode()!r}: no CONNACK from {transport_host}:{self.port}"
                f" within {TIMEOUT} s"
            ) from None
        assert rc == 0, rc
        return flags

    def subscribe(self, topic, qos=0, options=None, properties=None):
        """The SUBACK's codes; 5.0 ``options`` (SubscribeOptions) replace qos."""
        if options is None and properties is None:
            result, mid = self.client.subscribe(topic, qos)
        else:
            result, mid = self.client.subscribe(topic, qos, options, properties)
        assert result == mqtt.MQTT_ERR_SUCCESS
        got_mid, codes = self.subacks.get(timeout=TIMEOUT)
        assert got_mid == mid
        return [c.value for c in codes]

    def publish(self, topic, payload, qos=0, retain=False, properties=None):
        info = self.client.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def receive(self, n=1, timeout=TIMEOUT):
        return [self.messages.get(timeout=timeout) for _ in range(n)]

    def nothing_more(self, wait=0.5):
        try:
            m = self.messages.get(timeout=wait)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected message on {m.topic}: {m.payload!r}")

    def disconnect(self):
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self):
        """Lose the connection without DISCONNECT, as a crashed device would."""
        self.client.loop_stop()
        self.client.socket().close()


def connack_code(port, version, client_id, username=None, password=None):
    """The CONNACK return (or reason) code a login gets."""
    c = PahoClient(port, client_id, version)
    if username is not None:
        c.client.username_pw_set(username, password)
    c.client.connect("127.0.0.1", port, 60)
    c.client.loop_start()
    try:
        _, rc = c.connack.get(timeout=TIMEOUT)
    finally:
        c.client.disconnect()
        c.client.loop_stop()
    return rc.value if hasattr(rc, "value") else rc

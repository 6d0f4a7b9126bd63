"""mqttgw: an MQTT 3.1, 3.1.1 and 5.0 broker and gateway on Twisted."""

__version__ = "0.1.0"

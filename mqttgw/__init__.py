"""mqttgw: an MQTT 3.1 and 3.1.1 broker and gateway on Twisted."""

__version__ = "0.1.0"

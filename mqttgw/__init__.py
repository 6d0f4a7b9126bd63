"""mqttgw: an MQTT 3.1, 3.1.1 and 5.0 broker and gateway on Twisted."""

from mqttgw import compiled as _compiled

__version__ = "0.1.0"

if _compiled.pure_requested():
    # Plain Python even where the hot path was compiled (mqttgw/compiled.py).
    _compiled.prefer_source()

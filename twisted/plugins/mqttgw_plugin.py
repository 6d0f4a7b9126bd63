from twisted.application.service import ServiceMaker

from mqttgw.bridges.interfaces import LazyBridgeKind

mqttgw = ServiceMaker(
    "mqttgw",
    "mqttgw.service.tap",
    "MQTT 3.1/3.1.1 broker and gateway",
    "mqttgw",
)

# The built-in bridge kind: [[bridge]] tables with kind = "mqtt".
mqtt_bridge = LazyBridgeKind("mqtt", "mqttgw.bridges.bridge:MQTTBridgeKind")

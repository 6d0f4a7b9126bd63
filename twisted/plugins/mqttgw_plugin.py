from twisted.application.service import ServiceMaker

mqttgw = ServiceMaker(
    "mqttgw",
    "mqttgw.tap",
    "MQTT 3.1/3.1.1 broker and gateway",
    "mqttgw",
)

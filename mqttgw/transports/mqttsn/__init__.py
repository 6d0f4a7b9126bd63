"""
MQTT-SN 1.2 over UDP, on the shared router: the listener
(:mod:`~mqttgw.transports.mqttsn.listener`), each client's connection
(:mod:`~mqttgw.transports.mqttsn.client`) with its parts, topic ids
(:mod:`~mqttgw.transports.mqttsn.topics`), the outbound PUBLISH
(:mod:`~mqttgw.transports.mqttsn.frames`) and discovery
(:mod:`~mqttgw.transports.mqttsn.discovery`).
"""

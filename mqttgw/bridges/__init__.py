"""Upstream brokers: the bridge plugin interface, the MQTT client and the MQTT bridge."""

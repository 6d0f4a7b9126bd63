"""Bytes to and from the broker: the MQTT connection, WebSocket and TLS, and listeners as services."""

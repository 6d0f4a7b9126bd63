"""The wire: MQTT packets as objects and bytes, and text from the wire made safe for logs.  Pure: no I/O, no clock."""

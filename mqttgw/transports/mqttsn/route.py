"""
Where an MQTT-SN client is reached: a UDP address, and behind a
forwarder the wireless node id its messages are encapsulated with (the
replies go back encapsulated through the same forwarder, for that node).
"""

from mqttgw.wire.mqttsn import constants as C


class Route:
    """A client's address (``host``, ``port``) and forwarder node id (bytes, or None)."""

    __slots__ = ("host", "port", "node", "_header")

    def __init__(self, host, port, node=None):
        self.host = host
        self.port = port
        self.node = node
        self._header = None if node is None else bytes((3 + len(node), C.ENCAPSULATED_MESSAGE, 0)) + node

    @property
    def key(self):
        """What the listener's tables are keyed by."""
        return (self.host, self.port, self.node)

    @property
    def address(self):
        return (self.host, self.port)

    def wrap(self, frame):
        """``frame`` as it goes to this address: encapsulated behind a forwarder."""
        header = self._header
        return frame if header is None else header + frame

    def __str__(self):
        where = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        return where if self.node is None else f"{where} node {self.node.hex()}"

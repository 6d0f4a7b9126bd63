"""
What a 5.0 connection keeps beyond a 3.1.1 one: the client's limits
(maximum packet size, topic alias maximum, problem information), topic
aliases in both directions, and the framing of PUBLISH to the client that
the session calls as its encoder.
"""

from mqttgw.wire import reasons as R
from mqttgw.wire.framing import ProtocolViolation
from mqttgw.wire.packets import Connack
from mqttgw.wire.printable import printable
from mqttgw.wire.properties import message_properties, problem_properties


def check_response_topic(properties):
    """A Response Topic is a topic name: no wildcards ([MQTT-3.3.2-14])."""
    topic = properties.get("response_topic")
    if topic is not None and ("+" in topic or "#" in topic or not topic):
        raise ProtocolViolation(
            f"response topic {printable(topic)!r} is not a topic name", R.PROTOCOL_ERROR
        )


# What a CONNACK leaves out, a group at a time in this order, when it would
# be larger than the client's Maximum Packet Size ([MQTT-3.1.2-24]): the
# Reason String and User Properties ([MQTT-3.2.2-19], [MQTT-3.2.2-20]),
# Response Information (a server may always send none), then Topic Alias
# Maximum (absent, the client sends no aliases, and the server takes none).
# The rest state limits the server holds the client to, or what the client
# must learn (an assigned client id, the authentication method): they stay.
CONNACK_OPTIONAL = (
    ("reason_string", "user_property"),
    ("response_information",),
    ("topic_alias_maximum",),
)


class Connection5:
    __slots__ = (
        "clock", "problem_information", "max_packet_size", "alias_maximum_in",
        "aliases_in", "alias_maximum_out", "aliases_out", "assign_aliases_at",
        "receive_maximum",
    )

    def __init__(self, clock, connect_properties, alias_maximum_in, receive_maximum):
        self.clock = clock
        props = connect_properties or {}
        # Reason strings and user properties only on PUBLISH, CONNACK and
        # DISCONNECT unless asked for ([MQTT-3.1.2-29]).
        self.problem_information = props.get("request_problem_information", 1) == 1
        self.max_packet_size = props.get("maximum_packet_size")
        self.alias_maximum_in = alias_maximum_in
        self.aliases_in = None
        # Aliases toward the client: as many as it takes, but no more than
        # the server's own maximum, which bounds what a connection holds.
        self.alias_maximum_out = min(props.get("topic_alias_maximum", 0), alias_maximum_in)
        self.aliases_out = None
        # Outbound aliases are made only on frames written at once (QoS 0,
        # or any QoS without the store), so a frame using an alias never
        # overtakes the one that set it up.  3: for every QoS.
        self.assign_aliases_at = 3
        # The server's receive maximum: QoS 1/2 publishes of the client
        # not yet completed may number at most this.
        self.receive_maximum = receive_maximum

    # Inbound

    def inbound_topic(self, packet):
        """
        The topic of an inbound PUBLISH after its alias; the alias and
        whatever is not a message property leave ``packet.properties``,
        and an expiry interval becomes ``packet.expiry``.
        """
        props = packet.properties
        topic = packet.topic
        if not props:
            # No properties, the usual PUBLISH.
            if not topic:
                raise ProtocolViolation("PUBLISH with neither topic nor topic alias", R.PROTOCOL_ERROR)
            packet.properties = None
            return topic
        alias = props.pop("topic_alias", None)
        if alias is not None:
            if alias > self.alias_maximum_in:
                raise ProtocolViolation(
                    f"topic alias {alias} exceeds the maximum {self.alias_maximum_in}",
                    R.TOPIC_ALIAS_INVALID,
                )
            if topic:
                if self.aliases_in is None:
                    self.aliases_in = {}
                self.aliases_in[alias] = topic
            else:
                topic = (self.aliases_in or {}).get(alias)
                if topic is None:
                    raise ProtocolViolation(f"topic alias {alias} is not set", R.PROTOCOL_ERROR)
                packet.topic = topic
        elif not topic:
            raise ProtocolViolation("PUBLISH with neither topic nor topic alias", R.PROTOCOL_ERROR)
        if props:
            interval = props.get("message_expiry_interval")
            if interval is not None:
                packet.expiry = self.clock.seconds() + interval
            check_response_topic(props)
        packet.properties = message_properties(props)
        return topic

    # Outbound

    def frame(self, message, qos, mid, retain, dup, subscription_ids):
        """A PUBLISH for the client, or None when larger than it accepts."""
        alias = None
        new_alias = False
        if self.alias_maximum_out:
            aliases = self.aliases_out
            if aliases is None:
                aliases = self.aliases_out = {}
            number = aliases.get(message.topic)
            if number is not None:
                alias = (number, False)
            elif qos < self.assign_aliases_at and len(aliases) < self.alias_maximum_out:
                number = aliases[message.topic] = len(aliases) + 1
                alias = (number, True)
                new_alias = True
        # The clock only for what expires.
        now = self.clock.seconds() if message.expiry is not None else None
        frame = message.frame5(qos, mid, retain, dup, now, subscription_ids, alias)
        limit = self.max_packet_size
        if limit is not None and len(frame) > limit:
            if new_alias:
                del self.aliases_out[message.topic]
            return None
        return frame

    def fit_connack(self, reason_code, properties):
        """
        The CONNACK properties that fit the client's Maximum Packet Size,
        or None when not even the CONNACK without its optional ones does:
        then none is sent ([MQTT-3.1.2-24]).  Without Topic Alias Maximum
        the client may use no aliases.
        """
        limit = self.max_packet_size
        if limit is None:
            return properties
        for optional in (None,) + CONNACK_OPTIONAL:
            if optional is not None:
                properties = {k: v for k, v in properties.items() if k not in optional}
            if len(Connack(reason_code, False, properties).encode()) <= limit:
                if "topic_alias_maximum" not in properties:
                    self.alias_maximum_in = 0
                return properties
        return None

    def fit(self, packet_class, *args, properties=None, exempt=False):
        """
        A packet of ``packet_class`` with ``properties`` the client may be
        sent: reason string and user properties left out when it did not
        ask for them (``exempt``: CONNACK and DISCONNECT may have them
        anyway) or when they would make the packet too large
        ([MQTT-3.2.2-19], [MQTT-3.4.2-2], ...).
        """
        if properties and not exempt and not self.problem_information:
            properties = problem_properties(properties)
        wire = packet_class(*args, properties=properties or {}).encode()
        if self.max_packet_size is not None and len(wire) > self.max_packet_size:
            wire = packet_class(*args, properties=problem_properties(properties) or {}).encode()
        return wire

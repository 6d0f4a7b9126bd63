"""
The broker's counters: the one set of numbers ``$SYS``, ``/metrics``, the
admin API and the health endpoint read.  The router and its sessions keep
them up to date as things happen, with integer increments only.
"""


class Stats:
    """Counters an operator (and the health endpoint) can read."""

    __slots__ = (
        "connections",
        # Connections to WebSocket ports that have not upgraded yet.
        "handshakes",
        "messages_received",
        "messages_delivered",
        "messages_dropped",
        "protocol_errors",
        "connections_refused",
        # CONNECTs refused for their credentials (CONNACK 3, 4 or 5).
        "logins_refused",
        # PUBLISHes not routed: the client may not write the topic.
        "messages_denied",
        # For $SYS and /metrics, with mosquitto's meanings: all packets and
        # bytes in and out, PUBLISH payload bytes, the most clients
        # connected at once, persistent sessions expired.
        "packets_received",
        "packets_sent",
        "bytes_received",
        "bytes_sent",
        "publish_bytes_received",
        "publish_bytes_sent",
        "clients_maximum",
        "clients_expired",
        "connections_accepted",
        # New retained topics, or persistent sessions, refused at a limit.
        "retained_refused",
        "sessions_refused",
        # QoS 1/2 publishes refused because the store could not commit.
        "store_refused",
        # Topic filters refused at a client's subscription bounds.
        "subscriptions_refused",
        # 5.0: messages whose expiry interval ran out before delivery, and
        # messages larger than their subscriber's maximum packet size.
        "messages_expired",
        "messages_too_large",
        # Messages that waited (queued or in flight) and were dropped: their
        # reader may no longer read the topic.
        "messages_unreadable",
        # CONNECTs refused because the client id's session belongs to
        # another identity, and sessions discarded for another identity
        # (auth.session_owner_mismatch = "new_session").
        "session_owner_refused",
        "session_owner_replaced",
        # Clients connected by protocol version: 3.1, 3.1.1 and 5.0.
        "clients_v31",
        "clients_v311",
        "clients_v5",
        # MQTT-SN clients connected (asleep ones too), and datagrams their
        # listeners dropped (malformed, unknown, or out of turn).
        "clients_mqttsn",
        "mqttsn_dropped",
        # Gauges of the sessions, kept where they change so that no reader
        # scans them: clients (not the gateway's own sessions) with a
        # connection, and persistent ones without; persistent sessions of
        # any kind (for max_persistent_sessions); messages queued or in
        # flight for sessions, and the payload bytes of those queued.
        "clients_connected",
        "clients_disconnected",
        "persistent_sessions",
        "stored_messages",
        "queued_bytes",
        # Messages dropped because the gateway's queues together reached
        # max_queued_bytes_total, and that bound (0: none).
        "dropped_at_total_bound",
        "max_queued_bytes_total",
    )

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

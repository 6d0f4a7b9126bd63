"""
The keys of the broker core: ``[persistence]``, ``[sparkplug]``, ``[limits]``
and ``[mqtt]`` (schema rows; those whose defaults the core takes are in
mqttgw.schema).
"""

from mqttgw.schema import BROKER_KEYS, CONNECTION_KEYS, Key

PERSISTENCE_KEYS = [
    Key(
        "persistence",
        "enabled",
        bool,
        True,
        "keep retained messages and persistent sessions on disk",
        flag_name="no-persistence",
        flag_help="keep everything in memory only: no store on disk",
        doc=(
            "In a SQLite store: retained messages, and persistent sessions "
            "(clean session 0) with their subscriptions, queued and in-flight"
            " QoS 1/2 messages and inbound QoS 2 ids, so they survive a "
            "restart or a crash.  A QoS 1/2 publish that must outlive a crash"
            " (retained, or queued for a persistent session) is acknowledged "
            "only once it is committed; traffic between clean sessions never "
            "waits for the disk."
        ),
    ),
    Key(
        "persistence", "data_dir", str, "./mqttgw-data", "directory of the store",
        doc=(
            "It holds ``mqttgw.db`` and ``mqttgw.db.state``, the store's "
            "record of which database it is and how far it was committed.  "
            "The systemd unit uses ``/var/lib/mqttgw``.  A store that cannot "
            "be opened or read, or that is missing, empty, another database "
            "or older than its record (a lost ``-wal``), stops start-up with "
            "a message naming the file; it is never replaced."
        ),
    ),
    Key(
        "persistence",
        "recover",
        bool,
        False,
        "start on a store refused as damaged (missing, empty, another, or older"
        " than its record) by setting its files aside, renamed, and starting empty",
        flag_name="store-recover",
        flag_help="set a store refused as damaged aside (renamed, never deleted) and start"
        " with a new, empty one, logging what it held",
        doc=(
            "Its files are renamed with a time suffix "
            "(``mqttgw.db.20261126T130807Z``, ``...-wal``, ``....state``), "
            "never deleted; the gateway starts with a new, empty store and "
            "logs what the record and the database held.  For one start: "
            "leave it off after."
        ),
    ),
    Key(
        "persistence",
        "durability",
        str,
        "fsync",
        "what an acknowledged message survives: fsync (power loss) or os (a crash)",
        choices=("fsync", "os"),
        doc=(
            "``fsync``: every commit is flushed to the disk (SQLite "
            "synchronous=FULL); ``os``: a crash of the gateway, not of the "
            "machine (synchronous=NORMAL).  Commits are grouped, so the cost "
            "is per batch, not per message; the manual's durability page gives "
            "the measured figures."
        ),
    ),
    Key(
        "persistence",
        "persistent_client_expiration",
        str,
        "",
        "remove persistent sessions whose client has been away longer than"
        " this (as mosquitto's: 12h, 2d, 1w, 3m, 1y; m is months; empty: never)",
        doc=(
            "A number of seconds, or with a unit h (hours), d (days), w "
            "(weeks), m (months, not minutes) or y (years), e.g. ``2d``.  The"
            " store records when each session was last seen, so the clock "
            "runs across restarts.  Bridges' own sessions never expire."
        ),
    ),
]

SPARKPLUG_KEYS = [
    Key(
        "sparkplug",
        "aware",
        bool,
        True,
        "Sparkplug Aware MQTT Server: keep births on $sparkplug/certificates/, track edge state",
        flag_name="no-sparkplug",
        flag_help="carry Sparkplug B messages as any others: no certificates, no edge state",
        doc=(
            "Sparkplug B 3.0: every NBIRTH and DBIRTH is kept, byte for byte,"
            " as the retained message of ``$sparkplug/certificates/<its "
            "topic>``, readable by whoever may read the birth's topic; edge "
            "nodes and devices are tracked from their births and deaths "
            "(``$SYS/broker/sparkplug/...``, ``/metrics``, "
            "``/api/sparkplug``)."
        ),
    ),
    Key(
        "sparkplug",
        "ndeath_timestamp",
        bool,
        False,
        "replace an NDEATH's timestamp with the time the gateway delivers it",
        flag_name="sparkplug-ndeath-timestamp",
        doc="The specification allows it.",
    ),
    Key(
        "sparkplug", "max_nodes", int, 10_000, "Sparkplug edge nodes whose state is tracked", 1,
        flag_name="sparkplug-max-nodes",
        doc=(
            "Past it, or past max_devices, births are still carried and kept,"
            " their state is not (offline nodes are forgotten first)."
        ),
    ),
    Key(
        "sparkplug", "max_devices", int, 100_000, "Sparkplug devices whose state is tracked, in all", 1,
        flag_name="sparkplug-max-devices",
        doc="The same rule as max_nodes.",
    ),
]

LIMITS_KEYS = [
    CONNECTION_KEYS["limits.max_packet_size"],
    CONNECTION_KEYS["limits.max_connect_size"],
    CONNECTION_KEYS["limits.connect_timeout"],
    Key(
        "limits",
        "max_connections",
        int,
        0,
        "connections held at once (0: the open-file limit less a reserve)",
        0,
        doc=(
            "WebSocket connections still upgrading included; further "
            "connections are closed on accept.  The open-file limit is raised"
            " to its hard limit at start-up; the reserve is 100, for the "
            "store, archive and bridges; the figure is logged at start-up."
        ),
    ),
    Key(
        "limits",
        "listen_backlog",
        int,
        0,
        "connections the kernel queues for each listener before they are accepted"
        " (0: limits.max_connections); the kernel caps it at net.core.somaxconn",
        0,
        doc=(
            "Queueing as many as max_connections means every client coming "
            "back at once after a restart is queued rather than made to retry"
            " its SYN a second later.  A listener given as an endpoint string"
            " with its own ``backlog=`` keeps it.  The kernel's cap is said "
            "once at start-up when it applies; TCP listeners take a storm's "
            "connections out of the kernel's queue as they come, up to "
            "max_connections, whatever the cap."
        ),
    ),
    Key(
        "limits",
        "max_connection_rate",
        float,
        0.0,
        "new connections a second from one address (an IPv6 /64), a burst of as"
        " many; more are closed before a byte is read (0: no limit)",
        0.0,
        doc=(
            "Refusals are logged once per address per log.refusal_interval "
            "with a count.  mosquitto has no such limit."
        ),
    ),
    Key(
        "limits",
        "connection_rate_loopback",
        bool,
        False,
        "apply max_connection_rate to loopback clients too",
        flag_help="apply --max-connection-rate to loopback clients too",
        doc="Local processes are exempt otherwise.",
    ),
    Key(
        "limits",
        "login_delay",
        float,
        0.1,
        "seconds the answer to a failed login waits, doubled for each earlier"
        " failure of its address or user name",
        0.0,
        doc=(
            "The login throttle.  The wait is at most max_login_delay, and "
            "the answer comes after the answers already due for the same "
            "address or user name: parallel guesses are answered one after "
            "another, not at once.  A success waits for the answers due for "
            "its user name (at most max_login_delay) and clears nothing: "
            "failures are forgotten 10 minutes after the last."
        ),
    ),
    Key(
        "limits",
        "max_login_delay",
        float,
        10.0,
        "longest wait of a failed login's answer (after those already due)",
        0.0,
    ),
    Key(
        "limits",
        "max_waiting_logins",
        int,
        256,
        "logins one address (an IPv6 /64) may have checked or waiting for their"
        " answer at once; more get CONNACK 3 (5.0: 0x89) unchecked",
        1,
        doc=(
            "Enough for a site's devices behind one NAT address reconnecting "
            "together.  The refusals waiting are answered one after another: "
            "for an address's own failures a place comes free at least every "
            "max_login_delay."
        ),
    ),
    Key(
        "limits",
        "max_waiting_logins_per_user",
        int,
        16,
        "logins one user name may have checked or waiting for their answer at"
        " once, from any address; more get CONNACK 3 (5.0: 0x89) unchecked",
        1,
        doc=(
            "So only this many guesses at one user's password are checked "
            "before the first is answered.  Devices sharing one user name "
            "past it are told CONNACK 3 and retry."
        ),
    ),
    Key(
        "limits",
        "login_throttle_size",
        int,
        10_000,
        "addresses and user names the login throttle (and addresses the connection"
        " rate) remembers, about 400 bytes each",
        1,
        doc="The least recently seen is forgotten first.",
    ),
    BROKER_KEYS["limits.max_inflight_messages"],
    BROKER_KEYS["limits.max_persistent_sessions"],
    BROKER_KEYS["limits.max_retained_messages"],
    Key(
        "limits",
        "max_queued_bytes_total",
        int,
        0,
        "payload bytes queued across every session and bridge at once; beyond it"
        " a message that would be queued is dropped, counted and logged (0: no limit)",
        0,
        doc=(
            "mosquitto bounds memory as a whole with memory_limit.  Drops are"
            " counted in ``mqttgw_messages_dropped_at_total_bound`` and "
            "logged, rate-limited; a bridge's queue drops its oldest first."
        ),
    ),
    BROKER_KEYS["limits.max_shared_groups"],
    BROKER_KEYS["limits.max_shared_group_members"],
    BROKER_KEYS["limits.max_queued_messages"],
    BROKER_KEYS["limits.max_queued_bytes"],
    BROKER_KEYS["limits.max_subscriptions"],
    BROKER_KEYS["limits.max_subscription_bytes"],
]

MQTT_KEYS = [
    BROKER_KEYS["mqtt.queue_qos0_messages"],
    BROKER_KEYS["mqtt.max_qos"],
    CONNECTION_KEYS["mqtt.max_topic_alias"],
    CONNECTION_KEYS["mqtt.max_keepalive"],
    CONNECTION_KEYS["mqtt.retain_available"],
    CONNECTION_KEYS["mqtt.wildcard_subscription_available"],
    CONNECTION_KEYS["mqtt.subscription_identifier_available"],
    CONNECTION_KEYS["mqtt.shared_subscription_available"],
    CONNECTION_KEYS["mqtt.response_information"],
    CONNECTION_KEYS["mqtt.reject_control_characters"],
    Key(
        "mqtt",
        "sys_interval",
        float,
        10.0,
        "seconds between updates of the $SYS topics (0: none)",
        0.0,
        doc=(
            "mosquitto's topics (clients, messages, bytes, load averages, "
            "retained and stored counts) and mqttgw's own under "
            "``$SYS/broker/bridge/NAME/`` and ``$SYS/broker/store/``.  Values"
            " are retained and published when they change."
        ),
    ),
    CONNECTION_KEYS["mqtt.allow_long_client_ids"],
    BROKER_KEYS["mqtt.retry_interval"],
    BROKER_KEYS["mqtt.retry_max_interval"],
]

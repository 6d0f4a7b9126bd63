"""
Settings: the TOML configuration file and the command-line flags, checked
against one schema.  Every flag has a key; flags win over the file; an
unknown or ill-typed key is an error that names it.
"""

import tomllib

import attr

from mqttgw.pipeline import settings as pipeline_settings
from mqttgw.schema import (
    BROKER_KEYS,
    CONNECTION_KEYS,
    REQUIRED,
    ConfigError,
    Key,
    check_table,
    check_value,
    section_class,
)
from mqttgw.transports.tlsprofile import INTERMEDIATE_CIPHERS

# The schema; deploy/mqttgw.toml is written from it (mqttgw.service.example).
KEYS = [
    Key("listeners", "tcp", list, [], "TCP listener: a port, HOST:PORT or endpoint string"),
    Key(
        "listeners", "tls", list, [], "TLS listener: a port, HOST:PORT or endpoint string",
        doc='MQTT over TLS; needs tls.cert and tls.key.  E.g. ``["8883"]``.',
    ),
    Key(
        "listeners", "ws", list, [], "WebSocket listener: a port, HOST:PORT or endpoint string",
        doc=(
            "MQTT over WebSocket, on any request path (browsers use "
            "``/mqtt``); the same port answers ``GET /healthz`` with a JSON "
            'status.  E.g. ``["8080"]``.'
        ),
    ),
    Key(
        "listeners", "wss", list, [], "WebSocket over TLS listener: a port, HOST:PORT or endpoint string",
        doc=(
            "MQTT over WebSocket over TLS; needs tls.cert and tls.key.  E.g. "
            '``["8443"]``.'
        ),
    ),
    Key(
        "listeners", "mqttsn", list, [], "MQTT-SN 1.2 listener (UDP): a port, HOST:PORT or udp:PORT:interface=HOST",
        doc=(
            "MQTT-SN over UDP, on the same router and sessions as MQTT; off "
            "unless given (the Paho MQTT-SN Gateway uses 10000, mqtt-sn-12's "
            'tools 2442).  See ``[mqttsn]``.  E.g. ``["10000"]``.'
        ),
    ),
    Key(
        "auth",
        "password_file",
        str,
        "",
        "password file in mosquitto's format (mosquitto_passwd, python -m mqttgw.passwd)",
        doc=(
            "Files written by mosquitto_passwd are read as they are (``$7$`` "
            "PBKDF2-SHA512 and ``$6$`` SHA-512 entries).  Empty: no passwords"
            " are checked."
        ),
    ),
    Key(
        "auth", "acl_file", str, "", "access control list in mosquitto's acl_file format",
        doc=(
            "What each client may publish and subscribe to: ``topic "
            "[read|write|readwrite|deny] FILTER`` lines (before any ``user`` "
            "line: for anonymous clients), ``user NAME`` lines, and "
            "``pattern`` lines for every client with ``%u`` (user name) and "
            "``%c`` (client id).  A deny rule wins over any grant.  Empty: "
            "everything allowed."
        ),
    ),
    Key(
        "auth",
        "allow_anonymous",
        bool,
        None,
        "accept clients without a user name (default: only when no password file is set)",
        doc=(
            "Left to that default with no password file set, start-up logs a "
            "warning for each listener; setting jwt_secret_file or "
            "jwt_public_key turns anonymous access off by default too.  "
            "``--no-anonymous`` sets it to false."
        ),
    ),
    Key(
        "auth",
        "jwt_secret_file",
        str,
        "",
        "file holding the HS256 secret that signed tokens (JWT) sent as passwords are checked with",
        doc=(
            "Signed tokens are for browsers and services, sent as the MQTT "
            "password with any user name.  The secret is at least 32 bytes; "
            "jwt_public_key checks RS256 and ES256 tokens instead.  The "
            "``exp`` claim is required and enforced: the connection is closed"
            " when the token expires. jwt_username_claim names the user (for "
            "the ACL); optional claims ``mqtt_publish`` and "
            "``mqtt_subscribe`` (lists of topic filters) narrow what its "
            "holder may publish and read, so a dashboard page can hold a "
            "short-lived, read-only token.  Setting this key or "
            "jwt_public_key turns anonymous access off by default."
        ),
    ),
    Key(
        "auth",
        "jwt_public_key",
        str,
        "",
        "PEM public key (RSA or EC) that RS256/ES256 tokens sent as passwords are checked with",
        doc=(
            "The tokens' claims are read as with jwt_secret_file.  Setting it"
            " turns anonymous access off by default."
        ),
    ),
    Key(
        "auth",
        "methods",
        list,
        [],
        "MQTT 5.0 enhanced authentication methods offered (installed plugins' names)",
        flag_name="auth-method",
        doc=(
            "Over AUTH packets.  A plugin offers a method by providing "
            "``mqttgw.security.enhanced.IAuthenticationMethod``; none is "
            "offered by default, and a CONNECT naming one not offered gets "
            "CONNACK 0x8C."
        ),
    ),
    Key("auth", "jwt_username_claim", str, "sub", "the token claim that names the user"),
    Key("auth", "jwt_audience", str, "", "the audience (aud) tokens must name (empty: not checked)"),
    Key(
        "auth",
        "analytics_writers",
        list,
        ["mqttgw-pipeline"],
        "user names that may write $analytics/... (the pipeline's)",
        flag_name="analytics-writer",
        doc=(
            "The pipeline publishes its rollups there as ``mqttgw-pipeline``."
            "  No client may write ``$SYS/...`` or a bridge's state topic."
        ),
    ),
    BROKER_KEYS["auth.session_owner_mismatch"],
    Key(
        "tls", "cert", str, "", "server certificate (PEM), its chain after it",
        doc=(
            "Read and checked at start-up, as is the key.  TLS 1.2 is the "
            "oldest version accepted."
        ),
    ),
    Key("tls", "key", str, "", "server private key (PEM)"),
    Key(
        "tls", "ca", str, "", "authorities client certificates are checked against (PEM)",
        doc=(
            "With a ca but without require_client_cert, a certificate is "
            "checked when a client offers one."
        ),
    ),
    Key(
        "tls",
        "require_client_cert",
        bool,
        False,
        "refuse TLS clients without a certificate signed by tls.ca",
    ),
    Key(
        "tls",
        "ciphers",
        str,
        INTERMEDIATE_CIPHERS,
        "TLS 1.2 cipher suites, an OpenSSL cipher string (default: forward-secret AEAD only)",
        doc=(
            "As mosquitto's ciphers.  The default is Mozilla's intermediate "
            "profile: forward-secret key exchange with AES-GCM or "
            "ChaCha20-Poly1305 only, so no plain RSA key exchange and no CBC "
            "suites.  Widen it for old clients by adding suites, e.g. "
            "``:AES128-SHA`` at its end.  TLS 1.3 suites are OpenSSL's own, "
            "whatever this says.  A string naming no suite stops start-up."
        ),
    ),
    Key(
        "tls",
        "use_identity_as_username",
        bool,
        False,
        "take the MQTT user name from the client certificate's common name",
        doc=(
            "As mosquitto's use_identity_as_username; a client without one is"
            " refused (CONNACK 5)."
        ),
    ),
    Key(
        "websocket",
        "trusted_proxies",
        list,
        [],
        "proxy addresses whose X-Forwarded-For names the real client",
        doc=(
            "Addresses or networks (``10.0.0.0/8``); the right-most address "
            "of the header is used.  From any other peer the header is "
            "ignored."
        ),
    ),
    Key(
        "websocket",
        "max_message_size",
        int,
        1024 * 1024 + 1024,
        "largest WebSocket message accepted, in bytes",
        1,
        doc="Each frame is held to it too.",
    ),
    Key(
        "websocket", "compression", bool, False, "accept permessage-deflate",
        doc=(
            "Off by default: MQTT payloads are often small or already "
            "compressed, and it costs CPU on every message."
        ),
    ),
    Key(
        "websocket",
        "dashboard",
        bool,
        False,
        "serve the dashboard and the admin API (always with credentials) on WebSocket listeners",
        doc=(
            "The dashboard at ``/``, the admin API under ``/api/``; MQTT "
            "stays on every WebSocket upgrade."
        ),
    ),
    Key(
        "websocket",
        "allowed_origins",
        list,
        [],
        "origins of web pages that may connect besides the gateway's own ('*': any)",
        flag_name="allowed-origin",
        doc=(
            "By origin, e.g. ``https://dashboard.example.net``.  Requests "
            "without an Origin header (clients that are not browsers) are "
            "accepted.  Without this check any page a user opens could talk "
            "to the gateway from their browser."
        ),
    ),
    Key(
        "simple_bridge",
        "addresses",
        list,
        [],
        "upstream HOST:PORT of a bridge named default, tried in turn",
        flag_name="bridge",
    ),
    Key(
        "simple_bridge",
        "rules",
        list,
        [],
        "that bridge's rules: 'PATTERN in|out|both QOS [LOCAL_PREFIX REMOTE_PREFIX]'",
        flag_name="bridge-topic",
    ),
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
        "archive",
        "directory",
        str,
        "",
        "record messages as Parquet segments in this directory (empty: off)",
        flag_name="archive",
        doc=(
            "Segments are partitioned ``date=YYYY-MM-DD/hour=HH/`` (UTC), for"
            " the PySpark pipeline (``python -m mqttgw.pipeline``).  Needs "
            "the ``archive`` extra (pyarrow)."
        ),
    ),
    Key("archive", "include", list, ["#"], "topic filters to record", flag_name="archive-include"),
    Key("archive", "exclude", list, [], "topic filters not to record", flag_name="archive-exclude"),
    Key(
        "archive",
        "directions",
        list,
        ["in", "bridge_in", "bridge_out"],
        "what to record: in, out, bridge_in, bridge_out",
        flag_name="archive-direction",
        doc=(
            "``in``: published by clients; ``out``: each delivery to a "
            "client, one row per subscriber; ``bridge_in``: brought in by "
            "bridges; ``bridge_out``: forwarded upstream."
        ),
    ),
    Key(
        "archive", "roll_seconds", float, 60.0, "seconds before a segment is closed", 0.001,
        doc=(
            "A segment is closed (and renamed in from ``_tmp/``) after "
            "roll_seconds or roll_rows, whichever comes first, at each hour "
            "boundary, and on shutdown."
        ),
    ),
    Key(
        "archive", "roll_rows", int, 100_000, "rows before a segment is closed", 1,
        doc="Whichever of roll_seconds and roll_rows comes first closes it.",
    ),
    Key(
        "archive", "gateway_id", str, "", "this gateway's id in the archive (default: host name)",
        doc=(
            "The archive's ``gateway_id`` column, by which the pipeline tells"
            " gateways' archives apart."
        ),
    ),
    Key(
        "otel",
        "endpoint",
        str,
        "",
        "OTLP/HTTP traces URL spans are exported to (empty: tracing off)",
        flag_name="otel-endpoint",
        doc=(
            "E.g. ``http://127.0.0.1:4318/v1/traces`` (an OpenTelemetry "
            "Collector's or Jaeger's OTLP/HTTP receiver).  Needs the ``otel``"
            " extra (``pip install 'mqttgw[otel]'``); empty, nothing of "
            "OpenTelemetry is loaded.  Spans are exported in batches from a "
            "thread of their own; a collector that cannot be reached costs "
            "at most otel.max_queue_size spans, the rest dropped and counted "
            "(``mqttgw_trace_spans_total``).  See the tracing guide."
        ),
    ),
    Key(
        "otel",
        "sample_ratio",
        float,
        0.0,
        "share of messages without a sampled trace context that are traced",
        0.0,
        1.0,
        flag_name="otel-sample-ratio",
        doc=(
            "Parent-based: a 5.0 PUBLISH whose ``traceparent`` user property "
            "says sampled is traced whatever the ratio, one that says not "
            "sampled is not; others are traced at this ratio (0.0: only "
            "those that carry a sampled ``traceparent``)."
        ),
    ),
    Key(
        "otel", "service_name", str, "mqttgw", "the name the spans' resource gives the gateway (service.name)",
        flag_name="otel-service-name",
    ),
    Key(
        "otel",
        "max_queue_size",
        int,
        2048,
        "spans waiting for export, at most; more are dropped and counted",
        1,
        flag_name="otel-max-queue-size",
    ),
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
    CONNECTION_KEYS["log.connection_messages"],
    Key(
        "log",
        "refusal_interval",
        float,
        10.0,
        "seconds over which the refused connections of one address are logged"
        " as one line with a count",
        0.1,
        doc=(
            "Refused CONNECTs, connections over limits.max_connection_rate "
            "and connections closed for sending no CONNECT in time: the "
            "first from an address in full, then one line with how many more"
            " and the last reason; never a line per connection.  Refusals at"
            " limits.max_connections are a warning of the whole gateway "
            "instead: at most 10 lines a minute, then one with how many were"
            " not logged."
        ),
    ),
    Key(
        "log",
        "level",
        str,
        "info",
        "lowest level logged",
        choices=("debug", "info", "warn", "error", "critical"),
        flag_name="log-level",
        doc="SIGHUP applies a change.",
    ),
    Key(
        "log",
        "format",
        str,
        "text",
        "text lines, or JSON lines with stable field names",
        choices=("text", "json"),
        flag_name="log-format",
        doc=(
            "``json``: one object per line with the fields time (UTC, ISO "
            "8601), level, namespace, message, traceback (failures) and the "
            "event's own fields (client_id, peer, topic...).  Warnings that "
            "can repeat many times a second (protocol errors from a flood of "
            "bad clients, refused connections) are logged 10 times a minute "
            "at most, then counted in one line."
        ),
    ),
    Key(
        "http",
        "address",
        str,
        "",
        "admin HTTP listener (metrics, health, admin API): PORT (loopback),"
        " HOST:PORT or an endpoint string; empty: off",
        flag_name="http",
        doc=(
            "It answers ``GET /healthz`` (alive), ``/readyz`` (listeners "
            "bound, store committing, archive writing: else 503 and the "
            "reasons), ``/metrics`` (Prometheus) and the JSON API under "
            "``/api/`` that ``python -m mqttgw.ctl`` speaks.  A bare port "
            'listens on loopback only (``"9883"``); elsewhere ``/metrics`` '
            "and ``/api/`` ask for HTTP Basic credentials (the password file)"
            " or a Bearer token of a user in admin_users.  On loopback reads "
            "need none, but changes (PUT, DELETE, POST) always do, or come "
            "through the Unix socket (http.socket).  It also serves the "
            "dashboard at ``/`` (open it in a browser) and the dashboard's "
            "MQTT over WebSocket at ``/mqtt``."
        ),
    ),
    Key(
        "http",
        "admin_users",
        list,
        [],
        "user names that may use the admin API when it asks for credentials",
        flag_name="admin-user",
        doc=(
            "They may read ``/metrics`` too, and are admins in the dashboard "
            "(see clients, kick them, clear retained topics, publish)."
        ),
    ),
    Key(
        "http",
        "read_users",
        list,
        [],
        "user names that may read the admin API's overview, bridges and Sparkplug edge"
        " and use the dashboard read-only",
        flag_name="read-user",
        doc=(
            "In the dashboard they see the data the ACL lets them read, the "
            "overview, the bridges and the Sparkplug edge, and may not "
            "publish."
        ),
    ),
    Key(
        "http",
        "token_lifetime",
        float,
        300.0,
        "seconds a dashboard sign-in token lasts (the page renews it while open)",
        10.0,
        doc=(
            "The tokens are signed with a key made at start-up, so a restart "
            "signs every page out."
        ),
    ),
    Key(
        "http",
        "dashboard_message_rate",
        int,
        12_000,
        "messages a second sent at most to each dashboard page; beyond, dropped for the page",
        1,
        doc=(
            "A dashboard page is an MQTT connection naming itself by the "
            "WebSocket subprotocol ``mqttgw-dashboard``, here or on a "
            "WebSocket listener serving the dashboard.  The page shows each "
            "topic's latest value, so it loses little, and a gateway carrying"
            " 100,000 messages a second does not deliver each a second time "
            "to every open page."
        ),
    ),
    Key(
        "http",
        "allowed_hosts",
        list,
        [],
        "host names the HTTP listeners answer to besides their own addresses, the"
        " loopback names (on loopback) and the machine's name ('*': any)",
        flag_name="allowed-host",
        doc=(
            "The names a browser or a proxy uses for them.  Any other Host is"
            " answered 421, and a WebSocket page of another origin is "
            "refused, so a web page whose name an attacker re-points at this "
            "machine (DNS rebinding) can use nothing.  Start-up says when any"
            " name is accepted."
        ),
    ),
    Key(
        "http",
        "allowed_origins",
        list,
        [],
        "origins of web pages that may change things through the admin listener"
        " or use its /mqtt besides its own",
        flag_name="http-allowed-origin",
        doc=(
            "Origins as ``scheme://host:port``, such as the address of a TLS "
            "proxy in front of it."
        ),
    ),
    Key(
        "http",
        "max_connections",
        int,
        32,
        "connections the admin listener and its Unix socket each hold at once (together at"
        " most a quarter of the open-file limit less the reserve); more are closed at accept",
        1,
        flag_name="http-max-connections",
        doc=(
            "Each its own, so busy HTTP clients never lock ``python -m "
            "mqttgw.ctl`` out.  The reserve is the descriptors kept for the "
            "store, the archive and the bridges; these connections are "
            "subtracted from limits.max_connections, so no HTTP client can "
            "take those."
        ),
    ),
    Key(
        "http",
        "idle_timeout",
        float,
        30.0,
        "seconds the admin listener keeps a connection that sends no request",
        0.1,
        flag_name="http-idle-timeout",
    ),
    Key(
        "http",
        "socket",
        str,
        "admin.sock",
        "Unix socket (mode 0600) of the admin API that python -m mqttgw.ctl uses, with"
        " the admin listener; a relative path is in persistence.data_dir (empty: none)",
        flag_name="http-socket",
        doc="Whoever may open it may change everything without credentials.",
    ),
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
    CONNECTION_KEYS["mqtt.allow_long_client_ids"],
    BROKER_KEYS["mqtt.retry_interval"],
    BROKER_KEYS["mqtt.retry_max_interval"],
    Key(
        "mqttsn", "gateway_id", int, 1, "the gateway id MQTT-SN's ADVERTISE and GWINFO carry", 1, 255,
        flag_name="mqttsn-gateway-id",
    ),
    Key(
        "mqttsn", "multicast", str, "", "multicast GROUP:PORT for ADVERTISE and SEARCHGW (empty: no discovery)",
        flag_name="mqttsn-multicast",
        doc=(
            'E.g. ``"225.1.1.1:1883"``.  The group is joined, and ADVERTISE '
            "sent, on the listener's address when it is an IPv4 address; "
            "SEARCHGW on the group is answered with GWINFO to the group and "
            "to the asker.  A SEARCHGW sent to the listener's port is always "
            "answered, to its sender."
        ),
    ),
    Key(
        "mqttsn", "advertise_interval", int, 900, "seconds between ADVERTISE messages on the multicast group",
        1, 65535, flag_name="mqttsn-advertise-interval",
        doc="900 (15 minutes) is the Paho MQTT-SN Gateway's default; ADVERTISE carries it as its Duration.",
    ),
    Key(
        "mqttsn", "predefined_topics", str, "",
        "pre-defined topic ids, in the Paho MQTT-SN Gateway's predefinedTopic.conf format",
        flag_name="mqttsn-predefined-topics",
        doc=(
            "One ``ClientId, TopicName, TopicId`` a line, ``*`` for every "
            "client; a client's own line wins over a ``*`` line."
        ),
    ),
    Key(
        "mqttsn", "clients", str, "",
        "who may connect over MQTT-SN, from where: the Paho gateway's clients.conf format (empty: anyone)",
        flag_name="mqttsn-clients",
        doc=(
            "One ``ClientId, ADDRESS:PORT[, flag...]`` a line.  With a file, "
            "only listed client ids from their listed addresses connect, the "
            "client id is the identity the ACL and session ownership read, "
            "a ``forwarder`` line's encapsulated messages are taken, and a "
            "``QoS-1`` line's address may publish at QoS -1 as that client."
            "  Without one, any client id connects as an anonymous client."
        ),
    ),
    Key(
        "mqttsn", "max_clients_per_address", int, 1000,
        "MQTT-SN clients connected from one IP address at most, a forwarder's nodes included (0: no bound)",
        0, flag_name="mqttsn-max-clients-per-address",
        doc=(
            "A CONNECT past it is refused with CONNACK \"Rejected: congestion\".  "
            "Datagrams cost nothing to send from a spoofed address: this "
            "keeps one source from taking every place under "
            "``limits.max_connections``."
        ),
    ),
    Key(
        "mqttsn", "qos_minus_one", bool, False,
        "route QoS -1 PUBLISH (no CONNECT) on pre-defined ids and short names",
        flag_name="mqttsn-qos-minus-one",
        doc=(
            "Off by default: a QoS -1 sender is not even asked who it is.  "
            "The ACL is read for the anonymous identity, or for the client "
            "id the clients file gives the sender's address."
        ),
    ),
]

KEYS_BY_PATH = {k.path: k for k in KEYS}
SECTIONS = sorted({k.section for k in KEYS})


def load_file(path):
    """``{key path: value}`` from a TOML file, every key checked."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    values = {}
    for section, table in document.items():
        if section == "listener":
            values["listener_tables"] = [check_listener(t, path) for t in _tables(table, path, "listener")]
            continue
        if section == "bridge":
            # [[bridge]] tables are checked by their bridge kind.
            if not isinstance(table, list) or not all(isinstance(t, dict) for t in table):
                raise ConfigError(f"{path}: bridge must be [[bridge]] tables")
            values["bridges"] = table
            continue
        if section == "pipeline":
            # The pipeline's options (python -m mqttgw.pipeline --config),
            # checked here too so a typo fails at the gateway's start.
            try:
                values["pipeline"] = pipeline_settings.check(table, path)
            except pipeline_settings.SettingsError as e:
                raise ConfigError(str(e)) from None
            continue
        if section not in SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section}]")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {section} must be a table")
        for name, value in table.items():
            key = KEYS_BY_PATH.get(f"{section}.{name}")
            if key is None:
                raise ConfigError(f"{path}: unknown key {section}.{name}")
            values[key.path] = check_value(key, value, path)
    return values


def _tables(value, path, name):
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(f"{path}: {name} must be [[{name}]] tables")
    return value


# [[listener]] tables: one listener each, with settings of its own.
LISTENER_KEYS = [
    Key(
        "listener", "kind", str, REQUIRED, "the listener's kind: tcp, tls, ws or wss", choices=("tcp", "tls", "ws", "wss"),
        doc=(
            "``tls`` and ``wss`` need a certificate and key, here or in "
            "``[tls]``."
        ),
    ),
    Key("listener", "address", (str, int), REQUIRED, "a port, HOST:PORT or an endpoint string"),
    Key(
        "listener", "allow_anonymous", bool, None, "accept clients without a user name here",
        doc="Left out: auth.allow_anonymous.",
    ),
    Key(
        "listener", "cert", str, "", "this listener's certificate (PEM)",
        doc="Left out or empty: tls.cert.",
    ),
    Key(
        "listener", "key", str, "", "this listener's private key (PEM)",
        doc="Left out or empty: tls.key.",
    ),
    Key(
        "listener", "ca", str, "", "authorities its client certificates are checked against",
        doc="Left out or empty: tls.ca.",
    ),
    Key(
        "listener", "require_client_cert", bool, False, "refuse clients without a certificate",
        doc="Left out: tls.require_client_cert.",
    ),
    Key("listener", "ciphers", str, "", "its TLS 1.2 cipher suites (OpenSSL cipher string; default tls.ciphers)"),
    Key(
        "listener", "use_identity_as_username", bool, False, "user name from the certificate (tls, wss)",
        doc=(
            "Its common name, as tls.use_identity_as_username; left out: that"
            " key.  A tcp or ws listener has no certificate to read: there it"
            " is refused, and the main key does not apply."
        ),
    ),
    Key(
        "listener", "allowed_origins", list, [], "web page origins that may connect (ws, wss)",
        doc="Left out: websocket.allowed_origins.",
    ),
    Key(
        "listener", "auth", list, ["password", "token"], "what logins it accepts: password, token",
        doc=(
            "``password``: a user name and password from the password file; "
            "``token``: a signed token (JWT) as the password."
        ),
    ),
]


# The main sections a [[listener]] key of the same name falls back to.
INHERITED_FROM = ("auth", "tls", "websocket")


def inherited_key(name):
    """The main section's key a [[listener]] key ``name`` falls back to, or None."""
    for section in INHERITED_FROM:
        key = KEYS_BY_PATH.get(f"{section}.{name}")
        if key is not None:
            return key
    return None


def with_inherited(table, settings):
    """
    A [[listener]] table with each key it leaves out, or sets to "", taken
    from the main section's key of the same name; one worked out at
    start-up (auth.allow_anonymous unset) stays out.
    """
    table = dict(table)
    for key in LISTENER_KEYS:
        source = inherited_key(key.name)
        if source is not None and table.get(key.name, "") == "" and settings[source.path] is not None:
            table[key.name] = settings[source.path]
    return table


def check_listener(table, where):
    """A [[listener]] table with its keys checked; the message names the key."""
    values = check_table(LISTENER_KEYS, table, where)
    unknown = set(values["auth"]) - {"password", "token"}
    if unknown:
        raise ConfigError(f"{where}: listener.auth takes password and token, not {sorted(unknown)[0]!r}")
    if values["kind"] in ("tcp", "tls") and "allowed_origins" in table:
        raise ConfigError(f"{where}: listener.allowed_origins is for ws and wss listeners")
    if values["kind"] in ("tcp", "ws") and "use_identity_as_username" in table:
        raise ConfigError(f"{where}: listener.use_identity_as_username is for tls and wss listeners")
    # Only what the table sets: what it leaves out comes from the main sections.
    return dict(table, address=str(values["address"]))


@attr.s(frozen=True, slots=True)
class Listener:
    """
    One listener as declared: its [[listener]] table, and the
    ``[listeners]`` list it came from (None for a [[listener]] table).
    One from a list has only kind and address: it takes everything else
    from the main sections, and shares their connection factory, portal
    and TLS certificate with the others of its list.
    """

    table = attr.ib()
    declared_in = attr.ib(default=None)

    @property
    def where(self):
        """How an error names it: the list's key, or the table's kind and address."""
        return self.declared_in or f"listener {self.table['kind']} {self.table['address']}"


def declared_listeners(values):
    """
    Every listener, in the order they start: the ``[listeners]`` lists'
    tcp, tls, ws and wss entries, the [[listener]] tables, then MQTT-SN's.
    """
    listed = [
        Listener({"kind": kind, "address": str(address)}, f"listeners.{kind}")
        for kind in ("tcp", "tls", "ws", "wss")
        for address in values[f"listeners.{kind}"]
    ]
    tables = [Listener(table) for table in values["listener_tables"]]
    udp = [Listener({"kind": "mqttsn", "address": str(a)}, "listeners.mqttsn") for a in values["listeners.mqttsn"]]
    return tuple(listed + tables + udp)


# Each main section's class: its values as attributes (settings.tls.cert).
SECTION_CLASSES = {
    name: section_class(name, [k for k in KEYS if k.section == name]) for name in SECTIONS
}
# What the file holds beside the main sections: [[bridge]] and [[listener]] tables.
TABLES = ("bridges", "listener_tables")


@attr.s(frozen=True)
class Settings:
    """
    Every key's value after file and flags are merged: each main section
    an immutable object with its keys as attributes (``settings.tls.cert``),
    and ``settings["tls.cert"]`` for what goes through keys by their path
    (the flags, a reload's comparison).
    """

    values = attr.ib()
    # Every listener, as [[listener]] tables (declared_listeners).
    all_listeners = attr.ib(default=())
    sections = attr.ib(init=False)

    @sections.default
    def _sections(self):
        return {
            name: cls(**{k: self.values[f"{name}.{k}"] for k in attr.fields_dict(cls)})
            for name, cls in SECTION_CLASSES.items()
        }

    def __getattr__(self, name):
        # Only for a name that is not an attribute of the class.
        if name == "sections":
            raise AttributeError(name)
        if name in self.sections:
            return self.sections[name]
        if name in TABLES:
            return self.values[name]
        raise AttributeError(f"settings have no section {name!r}")

    def __getitem__(self, path):
        return self.values[path]


LISTENERS = [k.path for k in KEYS if k.section == "listeners"]
DEFAULT_LISTENER = ("listeners.tcp", ["1883"])


def build(file_values, flag_values):
    """Defaults, then the file, then the flags; with no listener, TCP 1883."""
    values = {k.path: k.default for k in KEYS}
    values["bridges"] = []
    values["listener_tables"] = []
    values.update(file_values)
    values.update(flag_values)
    if values["simple_bridge.addresses"]:
        values["bridges"] = values["bridges"] + [
            {
                "name": "default",
                "addresses": values["simple_bridge.addresses"],
                "rules": values["simple_bridge.rules"],
            }
        ]
    elif values["simple_bridge.rules"]:
        raise ConfigError("simple_bridge.rules (--bridge-topic) needs an address (--bridge)")
    unknown = set(values["archive.directions"]) - {"in", "out", "bridge_in", "bridge_out"}
    if unknown:
        raise ConfigError(f"archive.directions: unknown direction {sorted(unknown)[0]!r}")
    if not any(values[path] for path in LISTENERS) and not values["listener_tables"]:
        values[DEFAULT_LISTENER[0]] = DEFAULT_LISTENER[1]
    tls_listeners = values["listeners.tls"] or values["listeners.wss"]
    if tls_listeners and not (values["tls.cert"] and values["tls.key"]):
        raise ConfigError("TLS listeners need tls.cert and tls.key (--cert, --key)")
    tls_tables = any(t["kind"] in ("tls", "wss") for t in values["listener_tables"])
    for name in ("cert", "key", "ca"):
        if values[f"tls.{name}"] and not (tls_listeners or tls_tables):
            raise ConfigError(
                f"tls.{name} (--{name}) is set but there is no TLS listener (--tls, --wss)"
            )
    values["persistence.persistent_client_expiration"] = parse_duration(
        values["persistence.persistent_client_expiration"],
        "persistence.persistent_client_expiration",
    )
    values["websocket.trusted_proxies"] = parse_networks(
        values["websocket.trusted_proxies"], "websocket.trusted_proxies"
    )
    return Settings(values, declared_listeners(values))


# persistent_client_expiration units, as mosquitto's.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_duration(text, where):
    """
    Seconds from ``90``, ``12h``, ``2d``, ``1w``, ``1m`` or ``1y`` as
    mosquitto reads persistent_client_expiration (there ``m`` is a month);
    None for empty.
    """
    if isinstance(text, (int, float)) or text is None:
        return text
    text = text.strip()
    if not text:
        return None
    number, unit = text[:-1], text[-1]
    if unit.isdigit():
        number, unit = text, "s"
    # mosquitto's m is a month (30 days), not a minute.
    seconds = {"m": 30 * 86400}.get(unit, _UNITS.get(unit))
    if not number.isdigit() or seconds is None or int(number) <= 0:
        raise ConfigError(
            f"{where}: {text!r} is not a duration such as 3600, 12h, 2d, 1w, 1m or 1y"
        )
    return int(number) * seconds


def parse_networks(entries, where):
    """Addresses or networks (``10.0.0.0/8``) as ip_network objects."""
    import ipaddress

    networks = []
    for entry in entries:
        if not isinstance(entry, str):
            networks.append(entry)
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{where}: {entry!r} is not an address or network") from None
    return networks

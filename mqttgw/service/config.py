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
)
from mqttgw.transports.tlsprofile import INTERMEDIATE_CIPHERS

# The schema; deploy/mqttgw.toml documents each key.
KEYS = [
    Key("listeners", "tcp", list, [], "TCP listener: a port or endpoint string"),
    Key("listeners", "tls", list, [], "TLS listener: a port or endpoint string"),
    Key("listeners", "ws", list, [], "WebSocket listener: a port or endpoint string"),
    Key(
        "listeners", "wss", list, [], "WebSocket over TLS listener: a port or endpoint string"
    ),
    Key(
        "auth",
        "password_file",
        str,
        "",
        "password file in mosquitto's format (mosquitto_passwd, python -m mqttgw.passwd)",
    ),
    Key("auth", "acl_file", str, "", "access control list in mosquitto's acl_file format"),
    Key(
        "auth",
        "allow_anonymous",
        bool,
        None,
        "accept clients without a user name (default: only when no password file is set)",
    ),
    Key(
        "auth",
        "jwt_secret_file",
        str,
        "",
        "file holding the HS256 secret that signed tokens (JWT) sent as passwords are checked with",
    ),
    Key(
        "auth",
        "jwt_public_key",
        str,
        "",
        "PEM public key (RSA or EC) that RS256/ES256 tokens sent as passwords are checked with",
    ),
    Key(
        "auth",
        "methods",
        list,
        [],
        "MQTT 5.0 enhanced authentication methods offered (installed plugins' names)",
        flag_name="auth-method",
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
    ),
    BROKER_KEYS["auth.session_owner_mismatch"],
    Key("tls", "cert", str, "", "server certificate (PEM), its chain after it"),
    Key("tls", "key", str, "", "server private key (PEM)"),
    Key("tls", "ca", str, "", "authorities client certificates are checked against (PEM)"),
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
    ),
    Key(
        "tls",
        "use_identity_as_username",
        bool,
        False,
        "take the MQTT user name from the client certificate's common name",
    ),
    Key(
        "websocket",
        "trusted_proxies",
        list,
        [],
        "proxy addresses whose X-Forwarded-For names the real client",
    ),
    Key(
        "websocket",
        "max_message_size",
        int,
        1024 * 1024 + 1024,
        "largest WebSocket message accepted, in bytes",
        1,
    ),
    Key("websocket", "compression", bool, False, "accept permessage-deflate"),
    Key(
        "websocket",
        "dashboard",
        bool,
        False,
        "serve the dashboard and the admin API (always with credentials) on WebSocket listeners",
    ),
    Key(
        "websocket",
        "allowed_origins",
        list,
        [],
        "origins of web pages that may connect besides the gateway's own ('*': any)",
        flag_name="allowed-origin",
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
    ),
    Key("persistence", "data_dir", str, "./mqttgw-data", "directory of the store"),
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
    ),
    Key(
        "archive",
        "directory",
        str,
        "",
        "record messages as Parquet segments in this directory (empty: off)",
        flag_name="archive",
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
    ),
    Key("archive", "roll_seconds", float, 60.0, "seconds before a segment is closed", 0.001),
    Key("archive", "roll_rows", int, 100_000, "rows before a segment is closed", 1),
    Key("archive", "gateway_id", str, "", "this gateway's id in the archive (default: host name)"),
    Key(
        "sparkplug",
        "aware",
        bool,
        True,
        "Sparkplug Aware MQTT Server: keep births on $sparkplug/certificates/, track edge state",
        flag_name="no-sparkplug",
        flag_help="carry Sparkplug B messages as any others: no certificates, no edge state",
    ),
    Key(
        "sparkplug",
        "ndeath_timestamp",
        bool,
        False,
        "replace an NDEATH's timestamp with the time the gateway delivers it",
        flag_name="sparkplug-ndeath-timestamp",
    ),
    Key(
        "sparkplug", "max_nodes", int, 10_000, "Sparkplug edge nodes whose state is tracked", 1,
        flag_name="sparkplug-max-nodes",
    ),
    Key(
        "sparkplug", "max_devices", int, 100_000, "Sparkplug devices whose state is tracked, in all", 1,
        flag_name="sparkplug-max-devices",
    ),
    Key(
        "persistence",
        "durability",
        str,
        "fsync",
        "what an acknowledged message survives: fsync (power loss) or os (a crash)",
        choices=("fsync", "os"),
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
    ),
    Key(
        "limits",
        "listen_backlog",
        int,
        0,
        "connections the kernel queues for each listener before they are accepted"
        " (0: limits.max_connections); the kernel caps it at net.core.somaxconn",
        0,
    ),
    Key(
        "limits",
        "max_connection_rate",
        float,
        0.0,
        "new connections a second from one address (an IPv6 /64), a burst of as"
        " many; more are closed before a byte is read (0: no limit)",
        0.0,
    ),
    Key(
        "limits",
        "connection_rate_loopback",
        bool,
        False,
        "apply max_connection_rate to loopback clients too",
        flag_help="apply --max-connection-rate to loopback clients too",
    ),
    Key(
        "limits",
        "login_delay",
        float,
        0.1,
        "seconds the answer to a failed login waits, doubled for each earlier"
        " failure of its address or user name",
        0.0,
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
    ),
    Key(
        "limits",
        "max_waiting_logins_per_user",
        int,
        16,
        "logins one user name may have checked or waiting for their answer at"
        " once, from any address; more get CONNACK 3 (5.0: 0x89) unchecked",
        1,
    ),
    Key(
        "limits",
        "login_throttle_size",
        int,
        10_000,
        "addresses and user names the login throttle (and addresses the connection"
        " rate) remembers, about 400 bytes each",
        1,
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
    ),
    Key(
        "log",
        "level",
        str,
        "info",
        "lowest level logged",
        choices=("debug", "info", "warn", "error", "critical"),
        flag_name="log-level",
    ),
    Key(
        "log",
        "format",
        str,
        "text",
        "text lines, or JSON lines with stable field names",
        choices=("text", "json"),
        flag_name="log-format",
    ),
    Key(
        "http",
        "address",
        str,
        "",
        "admin HTTP listener (metrics, health, admin API): PORT (loopback),"
        " HOST:PORT or an endpoint string; empty: off",
        flag_name="http",
    ),
    Key(
        "http",
        "admin_users",
        list,
        [],
        "user names that may use the admin API when it asks for credentials",
        flag_name="admin-user",
    ),
    Key(
        "http",
        "read_users",
        list,
        [],
        "user names that may read the admin API's overview, bridges and Sparkplug edge"
        " and use the dashboard read-only",
        flag_name="read-user",
    ),
    Key(
        "http",
        "token_lifetime",
        float,
        300.0,
        "seconds a dashboard sign-in token lasts (the page renews it while open)",
        10.0,
    ),
    Key(
        "http",
        "dashboard_message_rate",
        int,
        12_000,
        "messages a second sent at most to each dashboard page; beyond, dropped for the page",
        1,
    ),
    Key(
        "http",
        "allowed_hosts",
        list,
        [],
        "host names the HTTP listeners answer to besides their own addresses, the"
        " loopback names (on loopback) and the machine's name ('*': any)",
        flag_name="allowed-host",
    ),
    Key(
        "http",
        "allowed_origins",
        list,
        [],
        "origins of web pages that may change things through the admin listener"
        " or use its /mqtt besides its own",
        flag_name="http-allowed-origin",
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
    ),
    Key(
        "mqtt",
        "sys_interval",
        float,
        10.0,
        "seconds between updates of the $SYS topics (0: none)",
        0.0,
    ),
    Key(
        "persistence",
        "persistent_client_expiration",
        str,
        "",
        "remove persistent sessions whose client has been away longer than"
        " this (as mosquitto's: 90m, 12h, 2d, 1w, 3m, 1y; empty: never)",
    ),
    CONNECTION_KEYS["mqtt.allow_long_client_ids"],
    BROKER_KEYS["mqtt.retry_interval"],
    BROKER_KEYS["mqtt.retry_max_interval"],
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


# [[listener]] tables: a listener with its own security settings.
# [[listener]] tables: one listener each, with settings of its own.
LISTENER_KEYS = [
    Key("listener", "kind", str, REQUIRED, "tcp, tls, ws or wss", choices=("tcp", "tls", "ws", "wss")),
    Key("listener", "address", (str, int), REQUIRED, "a port or an endpoint string"),
    Key("listener", "allow_anonymous", bool, None, "accept clients without a user name here"),
    Key("listener", "cert", str, "", "this listener's certificate (PEM)"),
    Key("listener", "key", str, "", "this listener's private key (PEM)"),
    Key("listener", "ca", str, "", "authorities its client certificates are checked against"),
    Key("listener", "require_client_cert", bool, False, "refuse clients without a certificate"),
    Key("listener", "ciphers", str, "", "its TLS 1.2 cipher suites (OpenSSL cipher string; default tls.ciphers)"),
    Key("listener", "use_identity_as_username", bool, False, "user name from the certificate"),
    Key("listener", "allowed_origins", list, [], "web page origins that may connect (ws, wss)"),
    Key("listener", "auth", list, ["password", "token"], "what logins it accepts: password, token"),
]


def check_listener(table, where):
    """A [[listener]] table with its keys checked; the message names the key."""
    values = check_table(LISTENER_KEYS, table, where)
    unknown = set(values["auth"]) - {"password", "token"}
    if unknown:
        raise ConfigError(f"{where}: listener.auth takes password and token, not {sorted(unknown)[0]!r}")
    if values["kind"] in ("tcp", "tls") and "allowed_origins" in table:
        raise ConfigError(f"{where}: listener.allowed_origins is for ws and wss listeners")
    # Only what the table sets: what it leaves out comes from the main sections.
    return dict(table, address=str(values["address"]))


@attr.s(frozen=True)
class Settings:
    """Every key's value, by section, after file and flags are merged."""

    values = attr.ib()

    def __getitem__(self, path):
        return self.values[path]

    def section(self, name):
        return {
            k.name: self.values[k.path] for k in KEYS if k.section == name
        }


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
    return Settings(values)


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

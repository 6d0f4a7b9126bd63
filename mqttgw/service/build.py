"""
Objects built from checked settings: listener endpoints, limits, the
router's configuration, the store, the archive, TLS options and the
credentials files.  ``tap`` composes them into the running service, and
``reload`` builds them again on SIGHUP.
"""


import importlib.util
import os
import resource
import socket
import sys

from twisted.logger import Logger

from mqttgw.bridges.interfaces import bridge_kinds
from mqttgw.broker.router import Router
from mqttgw.broker.session import SessionLimits
from mqttgw.broker.sparkplug import Sparkplug
from mqttgw.broker.topics import InvalidTopic, validate_topic_filter
from mqttgw.security.acl import ACL
from mqttgw.security.enhanced import authentication_methods
from mqttgw.security.passwords import PasswordTable
from mqttgw.security.throttle import ConnectionRate, Throttle
from mqttgw.security.tokens import TokenKeys
from mqttgw.service import config
from mqttgw.transports.protocol import ConnectionLimits, refusal_log

log = Logger()


def endpoint_description(listener, backlog=None):
    """
    A bare port number means TCP on every interface, ``HOST:PORT`` (or
    ``[::1]:PORT``) that host's address, anything else is an endpoint
    string.  Listening endpoints get ``backlog`` unless they name one:
    Twisted's default of 50 leaves a site's devices reconnecting after a
    power cut waiting for minutes.
    """
    description = f"tcp:{listener}" if listener.isdigit() else host_port_description(listener)
    kind = description.split(":", 1)[0]
    if (
        backlog is not None
        and kind in ("tcp", "tcp6", "ssl", "unix")
        and "backlog=" not in description
    ):
        description += f":backlog={backlog}"
    return description


# Descriptors kept back from every listener's connections for the store,
# the archive, bridges, log files and listening sockets.
RESERVED_DESCRIPTORS = 100


def open_file_limit():
    """RLIMIT_NOFILE's soft limit, raised to its hard limit first if it can be."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1024 * 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft


def http_listeners(settings):
    """How many HTTP listeners the admin surface has: its TCP one and its Unix socket."""
    if not settings.http.address:
        return 0
    return 2 if settings.http.socket else 1


def http_connection_limit(settings, soft=None):
    """
    What each of the admin surface's listeners holds at once:
    ``http.max_connections``, together at most a quarter of the
    descriptors left beside the reserve.  Each has its own, so connections
    to the TCP port never lock ``python -m mqttgw.ctl`` out of the socket.
    """
    listeners = http_listeners(settings)
    if not listeners:
        return 0
    soft = open_file_limit() if soft is None else soft
    return max(1, min(settings.http.max_connections, (soft - RESERVED_DESCRIPTORS) // 4 // listeners))


def connection_limit(configured, log, http=0, soft=None):
    """
    ``limits.max_connections``, or with 0 the open-file limit (raised to its
    hard limit first) less a reserve and the ``http`` connections; a
    configured number above that is lowered to it.  Said at start-up
    either way, so the listeners together never take the descriptors the
    store, the archive and the bridges need.
    """
    soft = open_file_limit() if soft is None else soft
    available = max(1, soft - RESERVED_DESCRIPTORS - http)
    if configured == 0:
        log.info(
            "max_connections {n}: the open-file limit {soft} less {reserve}"
            " kept for the store, archive and bridges{http_part}",
            n=available,
            soft=soft,
            reserve=RESERVED_DESCRIPTORS,
            http_part=f" and {http} for the admin listener and its socket (http.max_connections)" if http else "",
        )
        return available
    if configured > available:
        log.warn(
            "limits.max_connections {n} is above what the open-file limit {soft}"
            " allows beside {reserve} kept for the store, archive and bridges"
            " and {http} for the admin listener: {available} it is",
            n=configured,
            soft=soft,
            reserve=RESERVED_DESCRIPTORS,
            http=http,
            available=available,
        )
        return available
    return configured


SOMAXCONN = "/proc/sys/net/core/somaxconn"


def kernel_somaxconn(path=SOMAXCONN):
    """The kernel's cap on a listen backlog, or None where it cannot be read."""
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def listen_backlog(configured, max_connections, log, somaxconn=kernel_somaxconn):
    """
    The backlog every listener asks listen() for: ``limits.listen_backlog``,
    or with 0 the connection limit, so that every client the gateway may
    hold can be queued at once.  The kernel caps it at net.core.somaxconn:
    said once at start-up when it does.
    """
    backlog = configured or max_connections
    cap = somaxconn()
    if cap is not None and backlog > cap:
        log.info(
            "listen backlog {backlog} (limits.listen_backlog{derived}) is capped by the kernel"
            " at net.core.somaxconn {cap}: TCP listeners take a storm's connections out of"
            " the kernel's queue as they come; TLS and WebSocket ones queue {cap} at most"
            " (raise net.core.somaxconn to queue more)",
            backlog=backlog,
            derived=" 0: limits.max_connections" if not configured else "",
            cap=cap,
        )
    return backlog


def check_endpoint(listener, where):
    """A listening endpoint for ``listener``, or ConfigError naming it."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import serverFromString

    try:
        endpoint = serverFromString(reactor, endpoint_description(listener))
    except (ValueError, TypeError, KeyError) as e:
        raise config.ConfigError(f"{where}: {listener!r} is not a port or endpoint: {e}") from None
    port = getattr(endpoint, "_port", None)
    if isinstance(port, int) and not 0 <= port <= 65535:
        raise config.ConfigError(f"{where}: {listener!r}: port {port} is not in 0-65535")
    interface = getattr(endpoint, "_interface", "")
    if interface:
        # Start-up, before the reactor runs: a name that is no address
        # here is one line now rather than a bind error later.
        try:
            socket.getaddrinfo(interface, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise config.ConfigError(
                f"{where}: {listener!r}: {interface} is not an address of this machine: {e}"
            ) from None
    return endpoint


def check_listeners(settings):
    """
    The addresses of the listeners of the ``[listeners]`` lists (a reload
    checks them again); a [[listener]] table's are checked with the rest
    of it (check_listener_tables).
    """
    for listener in settings.all_listeners:
        if listener.declared_in is None:
            continue
        if listener.table["kind"] == "mqttsn":
            check_udp_address(listener.table["address"], listener.where)
        else:
            check_endpoint(listener.table["address"], listener.where)


def check_udp_address(listener, where):
    """(interface, port) of an MQTT-SN listener, or ConfigError naming it."""
    from mqttgw.transports.mqttsn.service import udp_address

    try:
        return udp_address(listener)
    except ValueError as e:
        raise config.ConfigError(f"{where}: {e}") from None


def check_mqttsn(settings, limits=None):
    """
    The [mqttsn] section as the listeners run with it, its files read;
    ConfigError naming a key.  None without an MQTT-SN listener: the
    section is not read, and MQTT-SN's modules are not loaded.
    """
    if not settings.listeners.mqttsn:
        return None
    from mqttgw.security.mqttsn_clients import ClientList
    from mqttgw.security.predefined_topics import PredefinedTopics
    from mqttgw.transports.mqttsn.options import MqttSnOptions, parse_multicast

    section = settings.mqttsn
    try:
        multicast = parse_multicast(section.multicast)
    except ValueError as e:
        raise config.ConfigError(f"mqttsn.multicast: {e}") from None
    # The files' errors name the file and line (FILE:LINE: what).
    clients = ClientList.from_file(section.clients) if section.clients else None
    predefined = PredefinedTopics.from_file(section.predefined_topics) if section.predefined_topics else None
    return MqttSnOptions(
        gateway_id=section.gateway_id,
        multicast=multicast,
        advertise_interval=section.advertise_interval,
        qos_minus_one=section.qos_minus_one,
        max_clients_per_address=section.max_clients_per_address,
        clients=clients,
        predefined=predefined,
        max_datagram_size=min(settings.limits.max_packet_size, 0xFFFF),
        half_open_timeout=settings.limits.connect_timeout,
    )


def check_http(settings):
    """The admin listener beyond loopback needs a way to check credentials."""
    address = settings.http.address
    if not address:
        return
    description = http_description(address)
    check_endpoint(description, "http.address")
    from mqttgw.web.admin import is_loopback

    if not is_loopback(http_host(description)):
        auth = settings.auth
        if not (auth.password_file or auth.jwt_secret_file or auth.jwt_public_key):
            raise config.ConfigError(
                f"http.address {address} is reachable beyond this machine: it needs"
                " auth.password_file or a token key, and http.admin_users"
            )


def check_auth_methods(settings):
    """
    The enhanced authentication methods ``auth.methods`` offers, prepared
    (see mqttgw.security.enhanced), by name.
    """
    names = settings.auth.methods
    if not names:
        return {}
    installed = authentication_methods()
    methods = {}
    for name in names:
        plugin = installed.get(name)
        if plugin is None:
            raise config.ConfigError(
                f"auth.methods: no authentication method {name!r} is installed"
                f" (installed: {', '.join(sorted(installed)) or 'none'})"
            )
        methods[name] = plugin.prepare(settings)
    return methods


def check_bridges(settings, tables=None):
    """
    [(bridge kind, its checked settings)] for every bridge configured, or
    for ``tables`` (the configuration's with the runtime ones merged).
    """
    kinds = bridge_kinds()
    bridges = []
    names = set()
    for table in settings.bridges if tables is None else tables:
        kind = kinds.get(table.get("kind", "mqtt"))
        if kind is None:
            raise config.ConfigError(
                f"bridge.kind {table.get('kind', 'mqtt')!r} is not installed"
                f" (known: {', '.join(sorted(kinds))})"
            )
        checked = kind.check(table)
        if checked.name in names:
            raise config.ConfigError(f"bridge.name {checked.name!r} is used twice")
        names.add(checked.name)
        bridges.append((kind, checked))
    return bridges


def check_listener_tables(settings):
    """
    Every listener's table, in the order they start, with what it leaves
    out taken from the main sections; a [[listener]] table's address and
    TLS files checked.  One from a ``[listeners]`` list is marked ``main``:
    it uses the main sections' TLS, checked with them.
    """
    checked = []
    for listener in settings.all_listeners:
        table = config.with_inherited(listener.table, settings)
        if listener.declared_in is not None:
            checked.append(dict(table, main=True))
            continue
        where = listener.where
        check_endpoint(table["address"], where)
        own_ciphers = listener.table.get("ciphers")
        if table["kind"] in ("tls", "wss"):
            if not (table["cert"] and table["key"]):
                raise config.ConfigError(f"{where}: a TLS listener needs cert and key (or tls.cert, tls.key)")
            table["tls_files"] = (
                table["cert"],
                table["key"],
                table["ca"] or None,
                table["require_client_cert"],
                table["ciphers"],
                f"{where}: listener.ciphers" if own_ciphers else "tls.ciphers",
            )
            from mqttgw.transports.tls import server_options

            table["tls_options"] = server_options(*table["tls_files"])
        checked.append(table)
    return checked


def load_auth_files(settings):
    """
    (password table, ACL, token keys), each None when not configured;
    errors name the file and line.
    """
    auth = settings.auth
    table = PasswordTable.from_file(auth.password_file) if auth.password_file else None
    acl = ACL.from_file(auth.acl_file) if auth.acl_file else None
    tokens = TokenKeys.from_settings(
        auth.jwt_secret_file,
        auth.jwt_public_key,
        auth.jwt_username_claim,
        auth.jwt_audience,
    )
    return table, acl, tokens


def server_tls_options(settings):
    if not (settings.listeners.tls or settings.listeners.wss):
        return None
    from mqttgw.transports.tls import server_options

    tls = settings.tls
    return server_options(
        tls.cert, tls.key, tls.ca or None, tls.require_client_cert, tls.ciphers
    )


def session_limits(settings):
    limits = settings.limits
    mqtt = settings.mqtt
    return SessionLimits(
        max_inflight_messages=limits.max_inflight_messages,
        max_queued_messages=limits.max_queued_messages,
        max_queued_bytes=limits.max_queued_bytes,
        queue_qos0_messages=mqtt.queue_qos0_messages,
        retry_interval=mqtt.retry_interval,
        retry_max_interval=mqtt.retry_max_interval,
        max_subscriptions=limits.max_subscriptions,
        max_subscription_bytes=limits.max_subscription_bytes,
    )


def configure_router(router, settings):
    """What of the router's behaviour the configuration sets (and SIGHUP renews)."""
    router.limits = session_limits(settings)
    router.max_qos = settings.mqtt.max_qos
    router.max_persistent_sessions = settings.limits.max_persistent_sessions
    router.max_retained_messages = settings.limits.max_retained_messages
    router.stats.max_queued_bytes_total = settings.limits.max_queued_bytes_total
    router.max_shared_groups = settings.limits.max_shared_groups
    router.max_shared_group_members = settings.limits.max_shared_group_members
    router.persistent_client_expiration = settings.persistence.persistent_client_expiration
    router.session_owner_mismatch = settings.auth.session_owner_mismatch
    sparkplug = router.sparkplug
    if sparkplug is not None:
        sparkplug.ndeath_timestamp = settings.sparkplug.ndeath_timestamp
        sparkplug.max_nodes = settings.sparkplug.max_nodes
        sparkplug.max_devices = settings.sparkplug.max_devices


def _installed(name):
    """Whether module ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def build_router(settings, clock, store=None):
    router = Router(clock, store=store)
    if settings.sparkplug.aware:
        # Checked now, imported with the first Sparkplug message.
        if not _installed("google.protobuf"):
            sys.exit("mqttgw: sparkplug.aware needs protobuf (pip install protobuf), or set it false")
        router.sparkplug = Sparkplug(router, clock)
    configure_router(router, settings)
    return router


def login_gates(settings, reactor):
    """
    The login throttle, the per-address connection rate and the log of
    refusals, shared by every listener.
    """
    limits = settings.limits
    throttle = Throttle(
        first=limits.login_delay,
        longest=limits.max_login_delay,
        size=limits.login_throttle_size,
        max_waiting=limits.max_waiting_logins,
        max_waiting_per_user=limits.max_waiting_logins_per_user,
        seconds=reactor.seconds,
    )
    rate = ConnectionRate(
        limits.max_connection_rate,
        limits.connection_rate_loopback,
        limits.login_throttle_size,
        reactor.seconds,
    )
    if rate.rate:
        log.info(
            "limits.max_connection_rate: at most {rate} new connections a second per address{loopback}",
            rate=rate.rate,
            loopback="" if rate.loopback else " (loopback exempt)",
        )
    return throttle, rate, refusal_log(reactor, settings.log.refusal_interval)


def connection_limits(settings):
    limits = settings.limits
    soft = open_file_limit()
    return ConnectionLimits(
        max_packet_size=limits.max_packet_size,
        max_connect_size=limits.max_connect_size,
        connect_timeout=limits.connect_timeout,
        max_connections=connection_limit(
            limits.max_connections,
            log,
            http_connection_limit(settings, soft) * http_listeners(settings),
            soft,
        ),
        reject_control_characters=settings.mqtt.reject_control_characters,
        allow_long_client_ids=settings.mqtt.allow_long_client_ids,
        connection_messages=settings.log.connection_messages,
        **{name: getattr(settings.mqtt, name) for name in SERVER_PROPERTIES},
    )


# [mqtt] keys of what CONNACK tells a 5.0 client, named as ConnectionLimits'
# fields.
SERVER_PROPERTIES = (
    "max_topic_alias",
    "max_keepalive",
    "retain_available",
    "wildcard_subscription_available",
    "subscription_identifier_available",
    "shared_subscription_available",
    "response_information",
)


def check_archive_filters(settings):
    a = settings.archive
    for topic_filter in a.include + a.exclude:
        try:
            validate_topic_filter(topic_filter)
        except InvalidTopic as e:
            raise config.ConfigError(f"archive.include/exclude: {e}") from None


def open_archive(settings, reactor):
    """The archive, or None when archive.directory is empty."""
    a = settings.archive
    if not a.directory:
        return None
    try:
        from mqttgw.archive.segments import Archive
    except ImportError:
        sys.exit("mqttgw: archive.directory needs pyarrow: pip install 'mqttgw[archive]'")
    import socket

    try:
        check_archive_filters(settings)
    except config.ConfigError as e:
        sys.exit(f"mqttgw: {e}")
    return Archive(
        a.directory,
        reactor,
        a.gateway_id or socket.gethostname(),
        include=a.include,
        exclude=a.exclude,
        directions=a.directions,
        roll_seconds=a.roll_seconds,
        roll_rows=a.roll_rows,
    )


def open_store(settings, reactor):
    """The loaded store, or None without persistence; errors end start-up."""
    persistence = settings.persistence
    if not persistence.enabled:
        return None, ([], [])
    from mqttgw.broker.store import Store, StoreError

    try:
        store = Store(
            persistence.data_dir, reactor, persistence.durability, recover=persistence.recover
        )
        return store, store.load()
    except StoreError as e:
        sys.exit(f"mqttgw: {e}")


def http_description(address):
    """
    ``--http``: a bare port listens on loopback only; ``HOST:PORT`` on that
    host; anything else is an endpoint string.
    """
    if address.isdigit():
        return f"tcp:{address}:interface=127.0.0.1"
    return host_port_description(address)


def host_port_description(address):
    """
    ``HOST:PORT`` or ``[IPv6]:PORT`` as a TCP endpoint string on that
    address; anything else (an endpoint string) as it is.
    """
    host, sep, port = address.rpartition(":")
    if not (sep and port.isdigit() and host):
        return address
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        # tcp6:1883, ssl:8883:..., unix:...: an endpoint string.
        return address
    elif host in ("tcp", "tcp6", "ssl", "unix", "systemd", "haproxy"):
        return address
    escaped = host.replace(":", "\\:")
    return f"tcp{'6' if ':' in host else ''}:{port}:interface={escaped}"


def admin_socket(settings):
    """The path of the admin API's Unix socket, or None (see http.socket)."""
    path = settings.http.socket
    if not (settings.http.address and path):
        return None
    return os.path.join(settings.persistence.data_dir, path)


def unix_description(path):
    """A listening endpoint for the Unix socket at ``path``, mode 0600, stale files replaced."""
    escaped = path.replace("\\", "\\\\").replace(":", "\\:")
    return f"unix:{escaped}:mode=600:lockfile=1"


def http_host(description):
    for part in description.split(":"):
        if part.startswith("interface="):
            return part[len("interface="):].replace("\\", "")
    return "0.0.0.0"

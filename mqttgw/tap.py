"""
The twistd plugin's options and service: ``twistd -n mqttgw --tcp 1883``.
"""

import sys

import attr

from twisted.application.service import MultiService, Service
from twisted.internet.threads import deferToThread
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python import usage

from twisted.protocols.tls import TLSMemoryBIOFactory

from twisted.python.threadpool import ThreadPool

from mqttgw import __version__, config, logs
from mqttgw.acl import ACL, Access
from mqttgw.auth import (
    AuthConfigError,
    PasswordChecker,
    PasswordTable,
    TokenKeys,
    TokenOrPasswordChecker,
    credentials_checker,
    make_portal,
)
from mqttgw.interfaces import bridge_kinds
from mqttgw.protocol import ConnectionLimits, Flusher, MQTTServerFactory
from mqttgw.router import Router
from mqttgw.session import SessionLimits
from mqttgw.store import Store, StoreError
from mqttgw.tls import ReloadableServerTLS, server_options
from mqttgw.topics import InvalidTopic, validate_topic_filter
from mqttgw.websocket import websocket_resource, websocket_site

log = Logger()


def endpoint_description(listener, backlog=None):
    """
    A bare port number means TCP on every interface.  Listening endpoints
    get ``backlog`` unless they name one: Twisted's default of 50 leaves a
    site's devices reconnecting after a power cut waiting for minutes.
    """
    description = f"tcp:{listener}" if listener.isdigit() else listener
    kind = description.split(":", 1)[0]
    if (
        backlog is not None
        and kind in ("tcp", "tcp6", "ssl", "unix")
        and "backlog=" not in description
    ):
        description += f":backlog={backlog}"
    return description


# Descriptors kept back from max_connections for the store, the archive,
# bridges, log files and listening sockets.
RESERVED_DESCRIPTORS = 100


def connection_limit(configured, log):
    """
    ``limits.max_connections``, or with 0 the open-file limit (raised to its
    hard limit first) less a reserve, said at start-up either way.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1024 * 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    available = max(1, soft - RESERVED_DESCRIPTORS)
    if configured == 0:
        log.info(
            "max_connections {n}: the open-file limit {soft} less {reserve}"
            " kept for the store, archive and bridges",
            n=available,
            soft=soft,
            reserve=RESERVED_DESCRIPTORS,
        )
        return available
    if configured > available:
        log.warn(
            "limits.max_connections {n} is above what the open-file limit {soft}"
            " allows ({available}): connections beyond it will fail",
            n=configured,
            soft=soft,
            available=available,
        )
    return configured


def _flag_keys():
    return [k for k in config.KEYS if k.type is not list]


def _help(key):
    """A flag's help: what it does, its key, and a default worth showing."""
    if key.type is bool:
        return f"{key.flag_help or key.help} [{key.path}]"
    if key.default in ("", None, []):
        return f"{key.help} [{key.path}]"
    return f"{key.help} [{key.path}, default {key.default}]"


class Options(usage.Options):
    synopsis = "[--tcp PORT]... [--ws PORT]... [--tls PORT --cert F --key F]... [options]"
    longdesc = (
        "Run the mqttgw MQTT broker.  Listener options (--tcp, --tls, --ws,"
        " --wss) take a port or a Twisted endpoint string and may repeat;"
        " with none, it listens on TCP port 1883.  Every option has a key in"
        " the --config TOML file; options given here win over the file."
    )
    optParameters = [["config", "c", None, "TOML configuration file"]] + [
        [k.flag, None, None, _help(k)] for k in _flag_keys() if k.type is not bool
    ]
    optFlags = [[k.flag, None, _help(k)] for k in _flag_keys() if k.type is bool] + [
        ["no-anonymous", None, "refuse clients without a user name [auth.allow_anonymous]"]
    ]

    def opt_version(self):
        """Print mqttgw's version and exit."""
        import platform

        import twisted

        print(f"mqttgw {__version__} (Twisted {twisted.__version__}, Python {platform.python_version()})")
        sys.exit(0)

    def __init__(self):
        super().__init__()
        self.lists = {}

    def _flag_values(self):
        values = {}
        for key in _flag_keys():
            raw = self[key.flag]
            if key.type is bool:
                if raw:
                    values[key.path] = not key.default
                continue
            if raw is None:
                continue
            try:
                value = key.type(raw)
            except ValueError:
                raise config.ConfigError(
                    f"--{key.flag} must be {config._type_name(key.type)}, not {raw!r}"
                ) from None
            values[key.path] = config.check_value(key, value, f"--{key.flag}")
        if self["no-anonymous"]:
            if self["allow-anonymous"]:
                raise config.ConfigError("--allow-anonymous and --no-anonymous contradict each other")
            values["auth.allow_anonymous"] = False
        values.update(self.lists)
        return values

    def postOptions(self):
        try:
            flags = self.flag_values = self._flag_values()
            from_file = config.load_file(self["config"]) if self["config"] else {}
            settings = config.build(from_file, flags)
            _check_listeners(settings)
            self.tls_options = _tls_options(settings)
            self.bridges = _check_bridges(settings)
            self.auth_files = load_auth_files(settings)
            self.listener_tables = _check_listener_tables(settings)
            _check_http(settings)
        except config.ConfigError as e:
            # One line naming the problem, not a page of usage.
            sys.exit(f"mqttgw: {e}")
        self.settings = settings
        parent = getattr(self, "parent", None)
        if parent is not None:
            logs.use_under_twistd(parent, settings["log.format"])


def _repeatable(key):
    def opt(self, value):
        self.lists.setdefault(key.path, []).append(value)

    opt.__doc__ = f"{key.help} (repeatable) [{key.path}]"
    return opt


# --tcp, --tls, --ws, --wss, --bridge, ...: one opt_ method each.
for _key in config.KEYS:
    if _key.type is list:
        setattr(Options, "opt_" + _key.flag.replace("-", "_"), _repeatable(_key))


def check_endpoint(listener, where):
    """A listening endpoint for ``listener``, or ConfigError naming it."""
    from twisted.internet import reactor

    try:
        endpoint = serverFromString(reactor, endpoint_description(listener))
    except (ValueError, TypeError, KeyError) as e:
        raise config.ConfigError(f"{where}: {listener!r} is not a port or endpoint: {e}") from None
    port = getattr(endpoint, "_port", None)
    if isinstance(port, int) and not 0 <= port <= 65535:
        raise config.ConfigError(f"{where}: {listener!r}: port {port} is not in 0-65535")
    return endpoint


def _check_listeners(settings):
    for path in config.LISTENERS:
        for listener in settings[path]:
            check_endpoint(listener, path)


def _check_http(settings):
    """The admin listener beyond loopback needs a way to check credentials."""
    from mqttgw.admin import is_loopback

    address = settings["http.address"]
    if not address:
        return
    description = http_description(address)
    check_endpoint(description, "http.address")
    if not is_loopback(_http_host(description)):
        auth = settings.section("auth")
        if not (auth["password_file"] or auth["jwt_secret_file"] or auth["jwt_public_key"]):
            raise config.ConfigError(
                f"http.address {address} is reachable beyond this machine: it needs"
                " auth.password_file or a token key, and http.admin_users"
            )


def _check_bridges(settings):
    """[(bridge kind, its checked settings)] for every bridge configured."""
    kinds = bridge_kinds()
    bridges = []
    names = set()
    for table in settings["bridges"]:
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


def _check_listener_tables(settings):
    """[[listener]] tables with their addresses and TLS files checked."""
    checked = []
    tls = settings.section("tls")
    for table in settings["listener_tables"]:
        where = f"listener {table['kind']} {table['address']}"
        check_endpoint(table["address"], where)
        table = dict(table)
        if table["kind"] in ("tls", "wss"):
            cert, key = table.get("cert") or tls["cert"], table.get("key") or tls["key"]
            if not (cert and key):
                raise config.ConfigError(f"{where}: a TLS listener needs cert and key (or tls.cert, tls.key)")
            table["tls_files"] = (
                cert,
                key,
                table.get("ca", tls["ca"]) or None,
                table.get("require_client_cert", tls["require_client_cert"]),
            )
            table["tls_options"] = server_options(*table["tls_files"])
        checked.append(table)
    return checked


def load_auth_files(settings):
    """
    (password table, ACL, token keys), each None when not configured;
    errors name the file and line.
    """
    auth = settings.section("auth")
    try:
        table = PasswordTable.from_file(auth["password_file"]) if auth["password_file"] else None
        acl = ACL.from_file(auth["acl_file"]) if auth["acl_file"] else None
        tokens = TokenKeys.from_settings(
            auth["jwt_secret_file"],
            auth["jwt_public_key"],
            auth["jwt_username_claim"],
            auth["jwt_audience"],
        )
    except AuthConfigError as e:
        raise config.ConfigError(str(e)) from None
    return table, acl, tokens


def _tls_options(settings):
    if not (settings["listeners.tls"] or settings["listeners.wss"]):
        return None
    tls = settings.section("tls")
    return server_options(
        tls["cert"], tls["key"], tls["ca"] or None, tls["require_client_cert"]
    )


def session_limits(settings):
    limits = settings.section("limits")
    mqtt = settings.section("mqtt")
    return SessionLimits(
        max_inflight_messages=limits["max_inflight_messages"],
        max_queued_messages=limits["max_queued_messages"],
        max_queued_bytes=limits["max_queued_bytes"],
        queue_qos0_messages=mqtt["queue_qos0_messages"],
        retry_interval=mqtt["retry_interval"],
        retry_max_interval=mqtt["retry_max_interval"],
        max_subscriptions=limits["max_subscriptions"],
        max_subscription_bytes=limits["max_subscription_bytes"],
    )


def configure_router(router, settings):
    """What of the router's behaviour the configuration sets (and SIGHUP renews)."""
    router.limits = session_limits(settings)
    router.max_qos = settings["mqtt.max_qos"]
    router.max_persistent_sessions = settings["limits.max_persistent_sessions"]
    router.max_retained_messages = settings["limits.max_retained_messages"]
    router.persistent_client_expiration = settings["persistence.persistent_client_expiration"]


def build_router(settings, clock, store=None):
    router = Router(clock, store=store)
    configure_router(router, settings)
    return router


def connection_limits(settings):
    limits = settings.section("limits")
    return ConnectionLimits(
        max_packet_size=limits["max_packet_size"],
        max_connect_size=limits["max_connect_size"],
        connect_timeout=limits["connect_timeout"],
        max_connections=connection_limit(limits["max_connections"], log),
        reject_control_characters=settings["mqtt.reject_control_characters"],
        allow_long_client_ids=settings["mqtt.allow_long_client_ids"],
        connection_messages=settings["log.connection_messages"],
    )


class WorkerService(Service):
    """
    Runs a worker thread (the store's writer, the archive's) from start-up;
    on shutdown it finishes its work, stopped off the reactor thread.
    """

    def __init__(self, worker):
        self.worker = worker

    def startService(self):
        super().startService()
        self.worker.start()

    def stopService(self):
        super().stopService()
        return deferToThread(self.worker.stop)


def check_archive_filters(settings):
    a = settings.section("archive")
    for topic_filter in a["include"] + a["exclude"]:
        try:
            validate_topic_filter(topic_filter)
        except InvalidTopic as e:
            raise config.ConfigError(f"archive.include/exclude: {e}") from None


def open_archive(settings, reactor):
    """The archive, or None when archive.directory is empty."""
    a = settings.section("archive")
    if not a["directory"]:
        return None
    try:
        from mqttgw.archive import Archive
    except ImportError:
        sys.exit("mqttgw: archive.directory needs pyarrow: pip install 'mqttgw[archive]'")
    import socket

    try:
        check_archive_filters(settings)
    except config.ConfigError as e:
        sys.exit(f"mqttgw: {e}")
    return Archive(
        a["directory"],
        reactor,
        a["gateway_id"] or socket.gethostname(),
        include=a["include"],
        exclude=a["exclude"],
        directions=a["directions"],
        roll_seconds=a["roll_seconds"],
        roll_rows=a["roll_rows"],
    )


def open_store(settings, reactor):
    """The loaded store, or None without persistence; errors end start-up."""
    persistence = settings.section("persistence")
    if not persistence["enabled"]:
        return None, ([], [])
    try:
        store = Store(persistence["data_dir"], reactor, persistence["durability"])
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
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and not host.startswith(("tcp", "ssl", "unix")):
        host = host.strip("[]")
        return f"tcp{'6' if ':' in host else ''}:{port}:interface={host.replace(':', chr(92) + ':')}"
    return address


def _http_host(description):
    for part in description.split(":"):
        if part.startswith("interface="):
            return part[len("interface="):].replace("\\", "")
    return "0.0.0.0"


class Parts:
    """What the running gateway is made of, for reload and the admin API."""

    top = router = pool = checker = gateway = sys_topics = archive = None
    had_passwords = had_tokens = None

    def __init__(self):
        self.factories = []
        self.bridges = []


class GatewayService(Service):
    """
    Starts the periodic work (store probe, expiry sweep, $SYS) once the
    listeners are bound, and says what is running in one summary.
    """

    def __init__(self, parts, settings, restored):
        self.parts = parts
        self.settings = settings
        self.restored = restored

    def startService(self):
        super().startService()
        parts = self.parts
        parts.gateway.start()
        cleared = parts.gateway.clear_bridge_states()
        if cleared:
            log.info("cleared the retained state of bridges not configured: {topics}", topics=", ".join(cleared))
        if parts.sys_topics is not None:
            parts.sys_topics.start()
        self.summary()

    def stopService(self):
        super().stopService()
        self.parts.gateway.stop()
        if self.parts.sys_topics is not None:
            self.parts.sys_topics.stop()

    def summary(self):
        settings = self.settings
        parts = self.parts
        listeners = ", ".join(
            f"{l.kind} {l.address}"
            + (" TLS" if l.secure else "")
            + (" anonymous" if l.anonymous else "")
            for l in parts.gateway.listeners
        )
        persistence = settings.section("persistence")
        if parts.router.store is not None:
            store = f"data dir {persistence['data_dir']} (durability {persistence['durability']})"
        else:
            store = "no persistence (memory only)"
        retained, sessions = self.restored
        queued = sum(len(s.deliveries) for s in sessions)
        log.info(
            "mqttgw {version} running: listeners {listeners}; {store}; restored {sessions}"
            " persistent session(s) with {queued} queued message(s) and {retained} retained"
            " message(s); bridges {bridges}; archive {archive}; $SYS every {sys}s; log level {log_level_name}",
            version=__version__,
            listeners=listeners,
            store=store,
            sessions=len(sessions),
            queued=queued,
            retained=len(retained),
            bridges=", ".join(b.settings.name for b in parts.bridges) or "none",
            archive=settings["archive.directory"] or "off",
            sys=settings["mqtt.sys_interval"],
            log_level_name=settings["log.level"],
        )


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor
    from mqttgw.admin import Roles, admin_site, api_resource, is_loopback
    from mqttgw.auth import TokenIssuer
    from mqttgw.dashboard import Dashboard
    from mqttgw.gateway import Gateway
    from mqttgw.listening import ListenerService
    from mqttgw.metrics import Metrics
    from mqttgw.reload import ReloadService
    from mqttgw.systopics import SysTopics

    settings = options.settings
    logs.set_level(settings["log.level"])
    store, restored = open_store(settings, reactor)
    router = build_router(settings, reactor, store)
    router.restore(*restored)
    limits = settings.section("limits")
    parts = Parts()
    parts.router = router
    top = parts.top = MultiService()
    # Who may connect, and what they may touch.
    auth = settings.section("auth")
    table, acl, tokens = options.auth_files
    parts.had_passwords, parts.had_tokens = table, tokens
    router.access = Access(acl, auth["analytics_writers"])
    allow_anonymous = auth["allow_anonymous"]
    if allow_anonymous is None:
        allow_anonymous = table is None and tokens is None
    pool = parts.pool = ThreadPool(0, 2, "mqttgw-auth")
    passwords = PasswordChecker(table, reactor, pool) if table is not None else None
    http = settings["http.address"]
    ws = settings.section("websocket")
    # The dashboard's sign-in tokens, when a dashboard is served and
    # there are credentials to sign in with.
    issuer = None
    if (http or ws["dashboard"]) and (table is not None or tokens is not None):
        issuer = TokenIssuer(settings["http.token_lifetime"])
    checker = parts.checker = credentials_checker(passwords, tokens, reactor, pool, issuer)
    reloader = ReloadService(reactor, options, parts)

    def portal_for(anonymous, methods=None):
        """A portal for a listener accepting ``methods`` (None: all configured)."""
        listener_checker = checker
        if methods is not None:
            listener_checker = credentials_checker(
                passwords if "password" in methods else None,
                tokens if "token" in methods else None,
                reactor,
                pool,
                issuer if "token" in methods else None,
            )
            if isinstance(listener_checker, TokenOrPasswordChecker):
                # Shares the reload of the main checker.
                reloader.token_checkers.append(listener_checker)
        if listener_checker is None and anonymous:
            return None
        return make_portal(listener_checker, anonymous)

    portal = portal_for(allow_anonymous)
    # One flusher for the reactor: output of all listeners leaves together.
    flusher = Flusher(reactor)
    limits_now = connection_limits(settings)

    def mqtt_factory(kind, portal, identity_as_username=False):
        factory = MQTTServerFactory(
            router, limits_now, reactor, flusher,
            identity_as_username=identity_as_username, portal=portal,
        )
        factory.kind = kind
        parts.factories.append(factory)
        return factory

    factory = mqtt_factory("tcp", portal)
    tls_factory = mqtt_factory("tls", portal, settings["tls.use_identity_as_username"])
    roles = Roles(settings["http.admin_users"], settings["http.read_users"])
    page_rate = settings["http.dashboard_message_rate"]
    gateway = parts.gateway = Gateway(router, reactor, store)
    dashboard = None
    if ws["dashboard"]:
        # Beside MQTT, anyone can reach the API: it always asks who.
        dashboard = Dashboard()
        dashboard.putChild(
            b"api", api_resource(gateway, make_portal(checker, False), roles, issuer)
        )
        log.warn(
            "websocket.dashboard: the dashboard and the admin API (/api/, with the"
            " credentials of http.admin_users or http.read_users) are served on every"
            " WebSocket listener",
        )

    def site(mqtt_factory, secure=False, allowed_origins=None):
        return websocket_site(
            mqtt_factory,
            router,
            reactor,
            ws["max_message_size"],
            ws["trusted_proxies"],
            ws["compression"],
            ws["allowed_origins"] if allowed_origins is None else allowed_origins,
            secure,
            page_rate if dashboard is not None else 0,
            dashboard=dashboard,
        )

    # TLS options SIGHUP can renew: the listeners' certificates and keys.
    renewable = {}

    def tls(wrapped, tls_options=None, files=None):
        key = files or "global"
        if key not in renewable:
            if files is None:
                load = lambda: _tls_options(settings)  # noqa: E731
            else:
                load = lambda: server_options(*files)  # noqa: E731
            renewable[key] = ReloadableServerTLS(tls_options or options.tls_options, load)
        wrapper = TLSMemoryBIOFactory(renewable[key], False, wrapped)
        wrapper.noisy = False
        return wrapper

    reloader.setServiceParent(top)
    if store is not None:
        # First in, so last to stop: connections close before it commits.
        WorkerService(store).setServiceParent(top)
    archive = parts.archive = gateway.archive = open_archive(settings, reactor)
    if archive is not None:
        router.recorder = archive
        WorkerService(archive).setServiceParent(top)
    gateway.bridges = parts.bridges

    def listen(kind, address, made, anonymous):
        listener = ListenerService(
            reactor,
            kind,
            endpoint_description(address, limits["listen_backlog"]),
            made,
            secure=kind in ("tls", "wss"),
            anonymous=anonymous,
            name=address,
        )
        gateway.listeners.append(listener)
        listener.setServiceParent(top)
        if anonymous:
            log.warn(
                "listener {listener} ({kind}) accepts anonymous clients: anyone who can"
                " reach it may publish and subscribe (set auth.password_file, or"
                " auth.allow_anonymous = false)",
                listener=address,
                kind=kind,
            )

    listeners = [
        ("tcp", lambda: factory),
        ("tls", lambda: tls(tls_factory)),
        ("ws", lambda: site(factory)),
        ("wss", lambda: tls(site(tls_factory, secure=True))),
    ]
    for kind, make_factory in listeners:
        for address in settings[f"listeners.{kind}"]:
            identity = kind in ("tls", "wss") and settings["tls.use_identity_as_username"]
            listen(kind, address, make_factory(), allow_anonymous and not identity)
    # [[listener]] tables: each with its own factory, portal and TLS.
    for table_ in options.listener_tables:
        kind = table_["kind"]
        anonymous = table_.get("allow_anonymous", allow_anonymous)
        listener_factory = mqtt_factory(
            kind,
            portal_for(anonymous, table_.get("auth")),
            table_.get("use_identity_as_username", settings["tls.use_identity_as_username"]),
        )
        made = listener_factory
        if kind in ("ws", "wss"):
            made = site(listener_factory, kind == "wss", table_.get("allowed_origins"))
        if kind in ("tls", "wss"):
            made = tls(made, table_["tls_options"], table_["tls_files"])
        listen(kind, table_["address"], made, anonymous)
    reloader.renewable_tls = list(renewable.values())
    for kind, bridge in options.bridges:
        service = kind.make_service(router, bridge, reactor)
        parts.bridges.append(service)
        service.setServiceParent(top)
    # $SYS, metrics and the admin listener.
    if settings["mqtt.sys_interval"] > 0:
        parts.sys_topics = SysTopics(
            router, reactor, settings["mqtt.sys_interval"], parts.bridges, store
        )
    if http:
        metrics = Metrics(router, gateway.listeners, parts.bridges, store, archive)
        description = http_description(http)
        admin_portal = None
        open_ = is_loopback(_http_host(description))
        if not open_:
            admin_portal = make_portal(checker, False)
            log.warn(
                "admin listener {address} is reachable beyond this machine: /metrics"
                " and /api/ ask for the credentials of http.admin_users ({users})",
                address=http,
                users=", ".join(settings["http.admin_users"]) or "none yet",
            )
        else:
            log.info(
                "admin listener {address}: the dashboard at /, /metrics and /api/,"
                " open to this machine only",
                address=http,
            )
        # The dashboard's own MQTT, on the listener's origin.
        mqtt = websocket_resource(
            mqtt_factory("http", portal), ws["max_message_size"], ws["trusted_proxies"],
            ws["compression"], [], False, page_rate,
        )
        ListenerService(
            reactor, "http", description,
            admin_site(
                gateway, metrics, admin_portal,
                attr.evolve(roles, open=open_),
                issuer, make_portal(checker, False) if checker is not None else None,
                mqtt,
            ),
            name=http,
        ).setServiceParent(top)
        gateway.http = description
    GatewayService(parts, settings, restored).setServiceParent(top)
    top.router = router
    top.parts = parts
    return top

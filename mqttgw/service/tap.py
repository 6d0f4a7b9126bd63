"""
The twistd plugin's options and service: ``twistd -n mqttgw --tcp 1883``.
"""

import sys

import attr
from twisted.application.service import MultiService, Service
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage
from twisted.python.threadpool import ThreadPool

from mqttgw import __version__
from mqttgw.broker.access import Access
from mqttgw.schema import ConfigError, check_value, type_name
from mqttgw.security.passwords import PasswordChecker
from mqttgw.security.portal import (
    TokenOrPasswordChecker,
    credentials_checker,
    make_portal,
)
from mqttgw.security.tokens import TokenIssuer
from mqttgw.service import config, logs
from mqttgw.service.build import (
    build_router,
    check_bridges,
    check_http,
    check_listener_tables,
    check_listeners,
    connection_limits,
    endpoint_description,
    http_description,
    http_host,
    load_auth_files,
    open_archive,
    open_store,
    server_tls_options,
)
from mqttgw.service.gateway import Gateway
from mqttgw.service.reload import ReloadService
from mqttgw.transports.listening import ListenerService
from mqttgw.transports.protocol import MQTTServerFactory
from mqttgw.transports.schedulers import Flusher
from mqttgw.transports.tls import ReloadableServerTLS, server_options
from mqttgw.transports.websocket import websocket_resource, websocket_site
from mqttgw.web.admin import Roles, admin_site, api_resource, is_loopback
from mqttgw.web.dashboard import Dashboard
from mqttgw.web.metrics import Metrics
from mqttgw.web.systopics import SysTopics

log = Logger()


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
                raise ConfigError(
                    f"--{key.flag} must be {type_name(key.type)}, not {raw!r}"
                ) from None
            values[key.path] = check_value(key, value, f"--{key.flag}")
        if self["no-anonymous"]:
            if self["allow-anonymous"]:
                raise ConfigError("--allow-anonymous and --no-anonymous contradict each other")
            values["auth.allow_anonymous"] = False
        values.update(self.lists)
        return values

    def postOptions(self):
        try:
            flags = self.flag_values = self._flag_values()
            from_file = config.load_file(self["config"]) if self["config"] else {}
            settings = config.build(from_file, flags)
            check_listeners(settings)
            self.tls_options = server_tls_options(settings)
            self.bridges = check_bridges(settings)
            self.auth_files = load_auth_files(settings)
            self.listener_tables = check_listener_tables(settings)
            check_http(settings)
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
                load = lambda: server_tls_options(settings)  # noqa: E731
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
        open_ = is_loopback(http_host(description))
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

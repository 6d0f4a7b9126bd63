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


class Assembly:
    """
    The running gateway put together from checked settings, one part at a
    time; what several parts share (the router, the credentials checker,
    the flusher, the dashboard) is built once here.
    """

    def __init__(self, options, reactor):
        self.options = options
        self.settings = settings = options.settings
        self.reactor = reactor
        self.ws = settings.section("websocket")
        self.parts = parts = Parts()
        parts.top = MultiService()
        store, self.restored = open_store(settings, reactor)
        router = parts.router = build_router(settings, reactor, store)
        router.restore(*self.restored)
        self.flusher = Flusher(reactor)
        self.limits = connection_limits(settings)
        self.reloader = ReloadService(reactor, options, parts)
        self.renewable = {}
        parts.gateway = Gateway(router, reactor, store)
        parts.gateway.bridges = parts.bridges

    def credentials(self):
        """Who may connect, and what they may touch."""
        settings, parts, reactor = self.settings, self.parts, self.reactor
        auth = settings.section("auth")
        table, acl, tokens = self.options.auth_files
        parts.had_passwords, parts.had_tokens = table, tokens
        parts.router.access = Access(acl, auth["analytics_writers"])
        allow_anonymous = auth["allow_anonymous"]
        if allow_anonymous is None:
            allow_anonymous = table is None and tokens is None
        self.allow_anonymous = allow_anonymous
        pool = parts.pool = ThreadPool(0, 2, "mqttgw-auth")
        self.passwords = PasswordChecker(table, reactor, pool) if table is not None else None
        self.tokens = tokens
        # The dashboard's sign-in tokens, when a dashboard is served and
        # there are credentials to sign in with.
        self.issuer = None
        if (settings["http.address"] or self.ws["dashboard"]) and (table is not None or tokens is not None):
            self.issuer = TokenIssuer(settings["http.token_lifetime"])
        parts.checker = credentials_checker(self.passwords, tokens, reactor, pool, self.issuer)
        self.portal = self.portal_for(allow_anonymous)

    def portal_for(self, anonymous, methods=None):
        """A portal for a listener accepting ``methods`` (None: all configured)."""
        checker = self.parts.checker
        if methods is not None:
            checker = credentials_checker(
                self.passwords if "password" in methods else None,
                self.tokens if "token" in methods else None,
                self.reactor,
                self.parts.pool,
                self.issuer if "token" in methods else None,
            )
            if isinstance(checker, TokenOrPasswordChecker):
                # Shares the reload of the main checker.
                self.reloader.token_checkers.append(checker)
        if checker is None and anonymous:
            return None
        return make_portal(checker, anonymous)

    def dashboard(self):
        """The dashboard on WebSocket listeners, if served there."""
        self.page = None
        if not self.ws["dashboard"]:
            return
        # Beside MQTT, anyone can reach the API: it always asks who.
        self.page = Dashboard()
        self.page.putChild(
            b"api",
            api_resource(self.parts.gateway, make_portal(self.parts.checker, False), self.roles(), self.issuer),
        )
        log.warn(
            "websocket.dashboard: the dashboard and the admin API (/api/, with the"
            " credentials of http.admin_users or http.read_users) are served on every"
            " WebSocket listener",
        )

    def roles(self):
        return Roles(self.settings["http.admin_users"], self.settings["http.read_users"])

    def mqtt_factory(self, kind, portal, identity_as_username=False):
        factory = MQTTServerFactory(
            self.parts.router, self.limits, self.reactor, self.flusher,
            identity_as_username=identity_as_username, portal=portal,
        )
        factory.kind = kind
        self.parts.factories.append(factory)
        return factory

    def site(self, mqtt_factory, secure=False, allowed_origins=None):
        ws = self.ws
        return websocket_site(
            mqtt_factory,
            self.parts.router,
            self.reactor,
            ws["max_message_size"],
            ws["trusted_proxies"],
            ws["compression"],
            ws["allowed_origins"] if allowed_origins is None else allowed_origins,
            secure,
            self.settings["http.dashboard_message_rate"] if self.page is not None else 0,
            dashboard=self.page,
        )

    def tls(self, wrapped, tls_options=None, files=None):
        """``wrapped`` behind TLS whose certificate SIGHUP can renew."""
        key = files or "global"
        if key not in self.renewable:
            if files is None:
                settings = self.settings
                load = lambda: server_tls_options(settings)  # noqa: E731
            else:
                load = lambda: server_options(*files)  # noqa: E731
            self.renewable[key] = ReloadableServerTLS(tls_options or self.options.tls_options, load)
        wrapper = TLSMemoryBIOFactory(self.renewable[key], False, wrapped)
        wrapper.noisy = False
        return wrapper

    def workers(self):
        """The store's and the archive's writer threads: first in, last to stop."""
        parts, top = self.parts, self.parts.top
        self.reloader.setServiceParent(top)
        store = parts.router.store
        if store is not None:
            # Connections close before it commits.
            WorkerService(store).setServiceParent(top)
        archive = parts.archive = parts.gateway.archive = open_archive(self.settings, self.reactor)
        if archive is not None:
            parts.router.recorder = archive
            WorkerService(archive).setServiceParent(top)

    def listen(self, kind, address, made, anonymous):
        listener = ListenerService(
            self.reactor,
            kind,
            endpoint_description(address, self.settings["limits.listen_backlog"]),
            made,
            secure=kind in ("tls", "wss"),
            anonymous=anonymous,
            name=address,
        )
        self.parts.gateway.listeners.append(listener)
        listener.setServiceParent(self.parts.top)
        if anonymous:
            log.warn(
                "listener {listener} ({kind}) accepts anonymous clients: anyone who can"
                " reach it may publish and subscribe (set auth.password_file, or"
                " auth.allow_anonymous = false)",
                listener=address,
                kind=kind,
            )

    def listeners(self):
        """--tcp, --tls, --ws and --wss, then the [[listener]] tables."""
        settings = self.settings
        identity = settings["tls.use_identity_as_username"]
        factory = self.mqtt_factory("tcp", self.portal)
        tls_factory = self.mqtt_factory("tls", self.portal, identity)
        made = {
            "tcp": lambda: factory,
            "tls": lambda: self.tls(tls_factory),
            "ws": lambda: self.site(factory),
            "wss": lambda: self.tls(self.site(tls_factory, secure=True)),
        }
        for kind, make in made.items():
            for address in settings[f"listeners.{kind}"]:
                anonymous = self.allow_anonymous and not (kind in ("tls", "wss") and identity)
                self.listen(kind, address, make(), anonymous)
        # Each table with its own factory, portal and TLS.
        for table in self.options.listener_tables:
            kind = table["kind"]
            anonymous = table.get("allow_anonymous", self.allow_anonymous)
            listener_factory = self.mqtt_factory(
                kind,
                self.portal_for(anonymous, table.get("auth")),
                table.get("use_identity_as_username", identity),
            )
            made_ = listener_factory
            if kind in ("ws", "wss"):
                made_ = self.site(listener_factory, kind == "wss", table.get("allowed_origins"))
            if kind in ("tls", "wss"):
                made_ = self.tls(made_, table["tls_options"], table["tls_files"])
            self.listen(kind, table["address"], made_, anonymous)
        self.reloader.renewable_tls = list(self.renewable.values())

    def bridges(self):
        parts = self.parts
        for kind, bridge in self.options.bridges:
            service = kind.make_service(parts.router, bridge, self.reactor)
            parts.bridges.append(service)
            service.setServiceParent(parts.top)

    def operations(self):
        """$SYS, and the admin listener with metrics, the API and the dashboard."""
        settings, parts = self.settings, self.parts
        router, gateway = parts.router, parts.gateway
        if settings["mqtt.sys_interval"] > 0:
            parts.sys_topics = SysTopics(
                router, self.reactor, settings["mqtt.sys_interval"], parts.bridges, router.store
            )
        http = settings["http.address"]
        if not http:
            return
        metrics = Metrics(router, gateway.listeners, parts.bridges, router.store, parts.archive)
        description = http_description(http)
        admin_portal = None
        open_ = is_loopback(http_host(description))
        checker = parts.checker
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
        ws = self.ws
        # The dashboard's own MQTT, on the listener's origin.
        mqtt = websocket_resource(
            self.mqtt_factory("http", self.portal), ws["max_message_size"], ws["trusted_proxies"],
            ws["compression"], [], False, settings["http.dashboard_message_rate"],
        )
        ListenerService(
            self.reactor, "http", description,
            admin_site(
                gateway, metrics, admin_portal,
                attr.evolve(self.roles(), open=open_),
                self.issuer, make_portal(checker, False) if checker is not None else None,
                mqtt,
            ),
            name=http,
        ).setServiceParent(parts.top)
        gateway.http = description


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor

    logs.set_level(options.settings["log.level"])
    gateway = Assembly(options, reactor)
    gateway.credentials()
    gateway.dashboard()
    gateway.workers()
    gateway.listeners()
    gateway.bridges()
    gateway.operations()
    parts = gateway.parts
    GatewayService(parts, options.settings, gateway.restored).setServiceParent(parts.top)
    parts.top.router = parts.router
    parts.top.parts = parts
    return parts.top

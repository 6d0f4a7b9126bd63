"""
The twistd plugin's options and service: ``twistd -n mqttgw --tcp 1883``.
"""

import sys

from twisted.application import strports
from twisted.application.service import MultiService, Service
from twisted.internet.threads import deferToThread
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python import usage

from twisted.protocols.tls import TLSMemoryBIOFactory

from twisted.python.threadpool import ThreadPool

from mqttgw import config
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
from mqttgw.websocket import websocket_site

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


class Options(usage.Options):
    synopsis = "[--tcp PORT]... [--ws PORT]... [--tls PORT --cert F --key F]... [options]"
    longdesc = (
        "Run the mqttgw MQTT broker.  Listener options (--tcp, --tls, --ws,"
        " --wss) take a port or a Twisted endpoint string and may repeat;"
        " with none, it listens on TCP port 1883.  Every option has a key in"
        " the --config TOML file; options given here win over the file."
    )
    optParameters = [["config", "c", None, "TOML configuration file"]] + [
        [k.flag, None, None, f"{k.help} [{k.path}, default {k.default}]"]
        for k in _flag_keys()
        if k.type is not bool
    ]
    optFlags = [
        [k.flag, None, f"{k.help} [{k.path}]"] for k in _flag_keys() if k.type is bool
    ] + [["no-anonymous", None, "refuse clients without a user name [auth.allow_anonymous]"]]

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
                raise usage.UsageError(
                    f"--{key.flag} must be {config._type_name(key.type)}, not {raw!r}"
                ) from None
            try:
                values[key.path] = config.check_value(key, value, f"--{key.flag}")
            except config.ConfigError as e:
                raise usage.UsageError(str(e)) from None
        if self["no-anonymous"]:
            if self["allow-anonymous"]:
                raise usage.UsageError("--allow-anonymous and --no-anonymous contradict each other")
            values["auth.allow_anonymous"] = False
        values.update(self.lists)
        return values

    def postOptions(self):
        flags = self._flag_values()
        try:
            from_file = config.load_file(self["config"]) if self["config"] else {}
            settings = config.build(from_file, flags)
            _check_listeners(settings)
            self.tls_options = _tls_options(settings)
            self.bridges = _check_bridges(settings)
            self.auth_files = load_auth_files(settings)
            self.listener_tables = _check_listener_tables(settings)
        except config.ConfigError as e:
            # One line naming the problem, not a page of usage.
            sys.exit(f"mqttgw: {e}")
        self.settings = settings


def _repeatable(key):
    def opt(self, value):
        self.lists.setdefault(key.path, []).append(value)

    opt.__doc__ = f"{key.help} (repeatable) [{key.path}]"
    return opt


# --tcp, --tls, --ws, --wss, --bridge, ...: one opt_ method each.
for _key in config.KEYS:
    if _key.type is list:
        setattr(Options, "opt_" + _key.flag.replace("-", "_"), _repeatable(_key))


def _check_listeners(settings):
    from twisted.internet import reactor

    for path in config.LISTENERS:
        for listener in settings[path]:
            try:
                serverFromString(reactor, endpoint_description(listener))
            except (ValueError, TypeError, KeyError) as e:
                raise config.ConfigError(
                    f"{path}: {listener!r} is not a port or endpoint: {e}"
                ) from None


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
    from twisted.internet import reactor

    checked = []
    tls = settings.section("tls")
    for table in settings["listener_tables"]:
        where = f"listener {table['kind']} {table['address']}"
        try:
            serverFromString(reactor, endpoint_description(table["address"]))
        except (ValueError, TypeError, KeyError) as e:
            raise config.ConfigError(f"{where}: not a port or endpoint: {e}") from None
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


class AuthService(Service):
    """
    The hashing threads, and reload on SIGHUP: the password file and the
    ACL are read again (off the reactor thread) and swapped in at once; a
    file that fails to parse leaves the old rules in force.  SIGUSR1 and
    SIGUSR2 are ignored rather than left to kill the process.
    """

    token_checkers = ()

    def __init__(self, reactor, settings, checker, access, pool):
        self.reactor = reactor
        self.settings = settings
        self.checker = checker
        self.access = access
        self.pool = pool

    def reload_tls(self):
        """New handshakes use the renewed certificates; current ones go on."""

        def load_all():
            return [(listener, listener.load()) for listener in self.renewable_tls]

        def swap(loaded):
            for listener, renewed in loaded:
                listener.options = renewed
            if loaded:
                log.info("reloaded: {n} TLS certificate(s)", n=len(loaded))

        def failed(reason):
            log.error("certificate reload failed, the old ones stay in use: {error}",
                      error=reason.getErrorMessage())

        return deferToThread(load_all).addCallbacks(swap, failed)

    def startService(self):
        super().startService()
        import signal

        self.pool.start()
        self.reactor.addSystemEventTrigger("during", "shutdown", self.pool.stop)
        signal.signal(signal.SIGHUP, lambda *_: self.reactor.callFromThread(self.reload))
        for name in ("SIGUSR1", "SIGUSR2"):
            signal.signal(getattr(signal, name), lambda signum, _: self.reactor.callFromThread(
                log.info, "ignoring signal {signum}", signum=signum))

    renewable_tls = ()

    def reload(self):
        log.info("SIGHUP: reading the password file, ACL, token keys and certificates again")
        self.reload_tls()
        d = deferToThread(load_auth_files, self.settings)

        def swap(files):
            table, acl, tokens = files
            checker = self.checker
            for listener_checker in self.token_checkers:
                if listener_checker.tokens is not None:
                    listener_checker.tokens = tokens
            if isinstance(checker, TokenOrPasswordChecker):
                checker.tokens = tokens
                checker = checker.passwords
            if isinstance(checker, PasswordChecker) and table is not None:
                checker.replace(table)
            if acl is not None:
                self.access.replace(acl)
            log.info("reloaded: {users} users, ACL {acl}, token keys {tokens}",
                     users=len(table.entries) if table else 0,
                     acl="in force" if acl is not None else "none",
                     tokens="in force" if tokens is not None else "none")

        def failed(reason):
            log.error("reload failed, the old rules stay in force: {error}",
                      error=reason.getErrorMessage())

        d.addCallbacks(swap, failed)
        return d


def _tls_options(settings):
    if not (settings["listeners.tls"] or settings["listeners.wss"]):
        return None
    tls = settings.section("tls")
    return server_options(
        tls["cert"], tls["key"], tls["ca"] or None, tls["require_client_cert"]
    )


def build_router(settings, clock, store=None):
    limits = settings.section("limits")
    mqtt = settings.section("mqtt")
    return Router(
        clock,
        SessionLimits(
            max_inflight_messages=limits["max_inflight_messages"],
            max_queued_messages=limits["max_queued_messages"],
            max_queued_bytes=limits["max_queued_bytes"],
            queue_qos0_messages=mqtt["queue_qos0_messages"],
            retry_interval=mqtt["retry_interval"],
            retry_max_interval=mqtt["retry_max_interval"],
        ),
        max_qos=mqtt["max_qos"],
        store=store,
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

    for topic_filter in a["include"] + a["exclude"]:
        try:
            validate_topic_filter(topic_filter)
        except InvalidTopic as e:
            sys.exit(f"mqttgw: archive.include/exclude: {e}")
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


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor
    settings = options.settings
    store, (retained, sessions) = open_store(settings, reactor)
    router = build_router(settings, reactor, store)
    router.restore(retained, sessions)
    limits = settings.section("limits")
    connection_limits = ConnectionLimits(
        max_packet_size=limits["max_packet_size"],
        max_connect_size=limits["max_connect_size"],
        connect_timeout=limits["connect_timeout"],
        max_connections=connection_limit(limits["max_connections"], log),
        reject_control_characters=settings["mqtt.reject_control_characters"],
        allow_long_client_ids=settings["mqtt.allow_long_client_ids"],
        connection_messages=settings["log.connection_messages"],
    )
    # Who may connect, and what they may touch.
    auth = settings.section("auth")
    table, acl, tokens = options.auth_files
    router.access = Access(acl, auth["analytics_writers"])
    allow_anonymous = auth["allow_anonymous"]
    if allow_anonymous is None:
        allow_anonymous = table is None and tokens is None
    pool = ThreadPool(0, 2, "mqttgw-auth")
    passwords = PasswordChecker(table, reactor, pool) if table is not None else None
    checker = credentials_checker(passwords, tokens, reactor, pool)

    def portal_for(anonymous, methods=None):
        """A portal for a listener accepting ``methods`` (None: all configured)."""
        listener_checker = checker
        if methods is not None:
            listener_checker = credentials_checker(
                passwords if "password" in methods else None,
                tokens if "token" in methods else None,
                reactor,
                pool,
            )
            if isinstance(listener_checker, TokenOrPasswordChecker):
                # Shares the reload of the main checker.
                reloads.append(listener_checker)
        if listener_checker is None and anonymous:
            return None
        return make_portal(listener_checker, anonymous)

    reloads = []

    portal = portal_for(allow_anonymous)
    # One flusher for the reactor: output of all listeners leaves together.
    flusher = Flusher(reactor)
    factory = MQTTServerFactory(router, connection_limits, reactor, flusher, portal=portal)
    tls_factory = MQTTServerFactory(
        router,
        connection_limits,
        reactor,
        flusher,
        identity_as_username=settings["tls.use_identity_as_username"],
        portal=portal,
    )
    ws = settings.section("websocket")

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
        return TLSMemoryBIOFactory(renewable[key], False, wrapped)

    top = MultiService()
    auth_service = AuthService(reactor, settings, checker, router.access, pool)
    auth_service.setServiceParent(top)
    if store is not None:
        # First in, so last to stop: connections close before it commits.
        WorkerService(store).setServiceParent(top)
    archive = open_archive(settings, reactor)
    if archive is not None:
        router.recorder = archive
        WorkerService(archive).setServiceParent(top)
    listeners = [
        ("listeners.tcp", lambda: factory),
        ("listeners.tls", lambda: tls(tls_factory)),
        ("listeners.ws", lambda: site(factory)),
        ("listeners.wss", lambda: tls(site(tls_factory, secure=True))),
    ]
    for path, make_factory in listeners:
        for listener in settings[path]:
            if allow_anonymous and not (path.endswith("tls") and settings["tls.use_identity_as_username"]):
                log.warn(
                    "listener {listener} ({kind}) accepts anonymous clients: anyone who can"
                    " reach it may publish and subscribe (set auth.password_file, or"
                    " auth.allow_anonymous = false)",
                    listener=listener,
                    kind=path.split(".")[1],
                )
            strports.service(
                endpoint_description(listener, limits["listen_backlog"]),
                make_factory(),
                reactor=reactor,
            ).setServiceParent(top)
    # [[listener]] tables: each with its own factory, portal and TLS.
    for table in options.listener_tables:
        kind = table["kind"]
        anonymous = table.get("allow_anonymous", allow_anonymous)
        listener_factory = MQTTServerFactory(
            router,
            connection_limits,
            reactor,
            flusher,
            identity_as_username=table.get(
                "use_identity_as_username", settings["tls.use_identity_as_username"]
            ),
            portal=portal_for(anonymous, table.get("auth")),
        )
        made = listener_factory
        if kind in ("ws", "wss"):
            made = site(listener_factory, kind == "wss", table.get("allowed_origins"))
        if kind in ("tls", "wss"):
            made = tls(made, table["tls_options"], table["tls_files"])
        if anonymous:
            log.warn(
                "listener {listener} ({kind}) accepts anonymous clients: anyone who can"
                " reach it may publish and subscribe",
                listener=table["address"],
                kind=kind,
            )
        strports.service(
            endpoint_description(table["address"], limits["listen_backlog"]), made, reactor=reactor
        ).setServiceParent(top)
    auth_service.token_checkers = reloads
    auth_service.renewable_tls = list(renewable.values())
    for kind, bridge in options.bridges:
        kind.make_service(router, bridge, reactor).setServiceParent(top)
    top.router = router
    return top

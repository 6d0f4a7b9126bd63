"""
The running gateway put together from checked settings (the twistd
plugin's Options): router, credentials, listeners, bridges, $SYS and the
admin listener.  Imported by makeService, not with the plugin, so what only
an option asks for (TLS, WebSocket, the admin site) loads only then.
"""

import os
import sys

import attr
from twisted.application.service import Service
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from mqttgw.broker.access import Access
from mqttgw.security.passwords import PasswordChecker
from mqttgw.security.portal import (
    TokenOrPasswordChecker,
    credentials_checker,
    make_portal,
)
from mqttgw.security.tokens import TokenIssuer
from mqttgw.service.build import (
    admin_socket,
    build_router,
    connection_limits,
    endpoint_description,
    http_connection_limit,
    http_description,
    http_host,
    listen_backlog,
    login_gates,
    open_archive,
    open_store,
    server_tls_options,
    unix_description,
)
from mqttgw.service.gateway import Gateway
from mqttgw.service.reload import ReloadService
from mqttgw.transports.listening import ListenerService
from mqttgw.transports.protocol import MQTTServerFactory
from mqttgw.transports.schedulers import Flusher
from mqttgw.web.systopics import SysTopics

log = Logger()


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
        self.ws = settings.websocket
        store, restored = open_store(settings, reactor)
        router = build_router(settings, reactor, store)
        router.restore(*restored)
        self.gateway = gateway = Gateway(router, reactor, store)
        gateway.settings, gateway.restored = settings, restored
        self.flusher = Flusher(reactor)
        self.limits = connection_limits(settings)
        self.backlog = listen_backlog(settings.limits.listen_backlog, self.limits.max_connections, log)
        self.throttle, self.connection_rate, self.refusals = login_gates(settings, reactor)
        gateway.throttle = self.throttle
        self.reloader = ReloadService(reactor, options, gateway)
        # What the admin API changes bridges through.
        gateway.reloader = self.reloader
        gateway.runtime_bridges = options.runtime_bridges
        self.renewable = {}
        self._hosts = None
        self._kept_topics = None

    @property
    def hosts(self):
        """The names every HTTP listener answers to besides its own addresses."""
        if self._hosts is None:
            from mqttgw.transports.httpguard import HostNames

            self._hosts = HostNames(self.settings.http.allowed_hosts)
            if "*" in self._hosts.allowed:
                log.warn(
                    "http.allowed_hosts has '*': the HTTP listeners answer to any host name,"
                    " so a web page whose name is re-pointed at this machine may use them"
                )
        return self._hosts

    def credentials(self):
        """Who may connect, and what they may touch."""
        settings, gateway, reactor = self.settings, self.gateway, self.reactor
        auth = settings.auth
        table, acl, tokens = self.options.auth_files
        gateway.had_passwords, gateway.had_tokens = table, tokens
        gateway.router.access = Access(acl, auth.analytics_writers)
        allow_anonymous = auth.allow_anonymous
        if allow_anonymous is None:
            allow_anonymous = table is None and tokens is None
        self.allow_anonymous = allow_anonymous
        pool = gateway.pool = ThreadPool(0, 2, "mqttgw-auth")
        self.passwords = PasswordChecker(table, reactor, pool) if table is not None else None
        self.tokens = tokens
        # The dashboard's sign-in tokens, when a dashboard is served and
        # there are credentials to sign in with.
        self.issuer = None
        if (settings.http.address or self.ws.dashboard) and (table is not None or tokens is not None):
            self.issuer = TokenIssuer(settings.http.token_lifetime)
        gateway.checker = credentials_checker(self.passwords, tokens, reactor, pool, self.issuer)
        self.portal = self.portal_for(allow_anonymous)
        if auth.session_owner_mismatch == "new_session":
            log.warn(
                "auth.session_owner_mismatch = new_session: a client connecting with the"
                " client id of another identity's unconnected session discards that session"
            )
        if self.options.auth_methods:
            log.info(
                "auth.methods: MQTT 5.0 enhanced authentication offered: {methods}",
                methods=", ".join(self.options.auth_methods),
            )

    def portal_for(self, anonymous, methods=None):
        """A portal for a listener accepting ``methods`` (None: all configured)."""
        checker = self.gateway.checker
        if methods is not None:
            checker = credentials_checker(
                self.passwords if "password" in methods else None,
                self.tokens if "token" in methods else None,
                self.reactor,
                self.gateway.pool,
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
        if not self.ws.dashboard:
            return
        from mqttgw.web.admin import api_resource
        from mqttgw.web.dashboard import Dashboard

        # Beside MQTT, anyone can reach the API: it always asks who.
        self.page = Dashboard()
        self.page.putChild(
            b"api",
            api_resource(
                self.gateway, make_portal(self.gateway.checker, False), self.roles(), self.issuer,
                throttle=self.login_throttle(),
            ),
        )
        log.warn(
            "websocket.dashboard: the dashboard and the admin API (/api/, with the"
            " credentials of http.admin_users or http.read_users) are served on every"
            " WebSocket listener",
        )

    def roles(self):
        from mqttgw.web.admin import Roles

        return Roles(self.settings.http.admin_users, self.settings.http.read_users)

    def login_throttle(self):
        """The one login throttle of every listener, MQTT's and the admin surface's."""
        return self.throttle

    def mqtt_factory(self, kind, portal, identity_as_username=False):
        factory = MQTTServerFactory(
            self.gateway.router, self.limits, self.reactor, self.flusher,
            identity_as_username=identity_as_username, portal=portal,
            throttle=self.throttle, connection_rate=self.connection_rate, refusals=self.refusals,
        )
        factory.kind = kind
        factory.auth_methods = self.options.auth_methods
        self.gateway.factories.append(factory)
        return factory

    def site(self, mqtt_factory, secure=False, allowed_origins=None):
        from mqttgw.transports.websocket import websocket_site

        ws = self.ws
        return websocket_site(
            mqtt_factory,
            self.gateway.router,
            self.reactor,
            ws.max_message_size,
            ws.trusted_proxies,
            ws.compression,
            ws.allowed_origins if allowed_origins is None else allowed_origins,
            secure,
            self.settings.http.dashboard_message_rate if self.page is not None else 0,
            dashboard=self.page,
            hosts=self.hosts,
        )

    def tls(self, wrapped, tls_options=None, files=None):
        """``wrapped`` behind TLS whose certificate SIGHUP can renew."""
        from twisted.protocols.tls import TLSMemoryBIOFactory

        from mqttgw.transports.tls import ReloadableServerTLS, server_options

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
        gateway = self.gateway
        self.reloader.setServiceParent(gateway)
        if gateway.store is not None:
            # Connections close before it commits.
            WorkerService(gateway.store).setServiceParent(gateway)
        archive = gateway.archive = open_archive(self.settings, self.reactor)
        if archive is not None:
            gateway.router.recorder = archive
            WorkerService(archive).setServiceParent(gateway)
        self.tracing()

    def tracing(self):
        """Distributed traces, when otel.endpoint is set: the router's tracer."""
        if not self.settings.otel.endpoint:
            return
        try:
            from mqttgw.service.tracing import start_tracing
        except ImportError:
            sys.exit("mqttgw: otel.endpoint needs OpenTelemetry: pip install 'mqttgw[otel]'")
        start_tracing(self.gateway.router, self.settings, self.reactor).setServiceParent(self.gateway)

    def listen(self, kind, address, made, anonymous):
        listener = ListenerService(
            self.reactor,
            kind,
            endpoint_description(address, self.backlog),
            made,
            secure=kind in ("tls", "wss"),
            anonymous=anonymous,
            name=address,
        )
        self.gateway.listeners.append(listener)
        listener.setServiceParent(self.gateway)
        if anonymous:
            log.warn(
                "listener {listener} ({kind}) accepts anonymous clients: anyone who can"
                " reach it may publish and subscribe (set auth.password_file, or"
                " auth.allow_anonymous = false)",
                listener=address,
                kind=kind,
            )

    def listeners(self):
        """
        Every listener, from one list of [[listener]] tables in the order
        given: those of the ``[listeners]`` lists (--tcp, --tls, --ws, --wss),
        the [[listener]] tables, then MQTT-SN's (--mqttsn).
        """
        identity = self.settings.tls.use_identity_as_username
        # The [listeners] lists' listeners share one factory for plain
        # connections and one for TLS, with the main portal and certificate.
        main = {False: self.mqtt_factory("tcp", self.portal), True: self.mqtt_factory("tls", self.portal, identity)}
        for table in self.options.listener_tables:
            kind = table["kind"]
            if kind == "mqttsn":
                self.mqttsn_listener(table["address"])
                continue
            secure = kind in ("tls", "wss")
            # What a table leaves out is the main sections' (config.with_inherited);
            # left to be worked out at start-up, allow_anonymous is this one's.
            # With the certificate as the user name nobody logs in without one.
            identity_ = secure and table["use_identity_as_username"]
            anonymous = table.get("allow_anonymous", self.allow_anonymous) and not identity_
            if table.get("main"):
                made = factory = main[secure]
            else:
                made = factory = self.mqtt_factory(kind, self.portal_for(anonymous, table.get("auth")), identity_)
            if kind in ("ws", "wss"):
                made = self.site(factory, kind == "wss", table["allowed_origins"])
            if secure:
                made = self.tls(made, table.get("tls_options"), table.get("tls_files"))
            self.listen(kind, table["address"], made, anonymous)
        self.reloader.renewable_tls = list(self.renewable.values())

    def mqttsn_listener(self, address):
        """One of --mqttsn: MQTT-SN over UDP, on the same router."""
        # MQTT-SN's modules are loaded only for a listener of its own.
        from mqttgw.transports.mqttsn.kept import KeptTopics
        from mqttgw.transports.mqttsn.listener import MqttSnProtocol
        from mqttgw.transports.mqttsn.service import MqttSnListenerService, make_discovery

        options, router = self.options.mqttsn, self.gateway.router
        if self._kept_topics is None:
            # One for every MQTT-SN listener: a client may come back on any of them.
            self._kept_topics = KeptTopics.restored(router.store, options, self.gateway.restored[1])
        protocol = MqttSnProtocol(
            router, self.reactor, options, self.limits, self.connection_rate, self.refusals, self._kept_topics
        )
        service = MqttSnListenerService(self.reactor, address, protocol, anonymous=options.clients is None)
        service.discovery = make_discovery(self.reactor, options, service.interface)
        if service.name in self.gateway.namedServices:
            raise SystemExit(f"mqttgw: mqttsn listener {address}: given twice")
        self.gateway.listeners.append(service)
        service.setServiceParent(self.gateway)
        if options.clients is None:
            log.warn(
                "listener {listener} (mqttsn) accepts any client id: MQTT-SN carries no"
                " password, so anyone who can reach it may publish and subscribe (set"
                " mqttsn.clients to list who may connect, from where)",
                listener=address,
            )

    def bridges(self):
        gateway = self.gateway
        for kind, bridge in self.options.bridges:
            service = kind.make_service(gateway.router, bridge, self.reactor)
            gateway.bridges.append(service)
            service.setServiceParent(gateway)

    def operations(self):
        """$SYS, and the admin listener with metrics, the API and the dashboard."""
        settings, gateway = self.settings, self.gateway
        router = gateway.router
        if settings.mqtt.sys_interval > 0:
            gateway.sys_topics = SysTopics(
                router, self.reactor, settings.mqtt.sys_interval, gateway.bridges, router.store
            )
        http = settings.http.address
        if not http:
            return
        from mqttgw.transports.httpguard import BoundedFactory, ConnectionSlots
        from mqttgw.web.admin import admin_site
        from mqttgw.web.metrics import Metrics

        metrics = Metrics(router, gateway.listeners, gateway.bridges, router.store, gateway.archive)
        description = http_description(http)
        open_, admin_portal = self.admin_portal(http, description)
        hosts, secure = self.hosts, description.startswith("ssl:")
        origins = settings.http.allowed_origins
        mqtt = self.dashboard_mqtt(origins, secure)
        checker = gateway.checker
        signin = make_portal(checker, False) if checker is not None else None
        # Reads without credentials on loopback see what anonymous MQTT clients may.
        anonymous_reads = self.allow_anonymous
        limit = http_connection_limit(settings)
        timeout = settings.http.idle_timeout
        site = admin_site(
            gateway, metrics, admin_portal, attr.evolve(self.roles(), open=open_), self.issuer,
            signin, mqtt, hosts, self.login_throttle(), anonymous_reads,
            allowed_origins=origins, timeout=timeout,
        )
        site.secure = secure
        ListenerService(
            self.reactor, "http", description, BoundedFactory(site, ConnectionSlots(limit), "admin"),
            name=http,
        ).setServiceParent(gateway)
        log.info(
            "admin listener {address}: at most {n} connections, and as many on its socket"
            " (http.max_connections), idle ones closed after {timeout}s; host names"
            " besides its addresses: {names}",
            address=http,
            n=limit,
            timeout=timeout,
            names=", ".join(sorted(hosts.allowed)) or "none",
        )
        gateway.http = description
        self.admin_socket_listener(metrics, limit, timeout)

    def admin_portal(self, http, description):
        """
        Whether the admin listener at ``http`` is this machine's alone, and
        the portal that checks its callers' credentials (None if it is).
        """
        from mqttgw.web.admin import is_loopback

        if is_loopback(http_host(description)):
            log.info(
                "admin listener {address}: the dashboard at /, /metrics and /api/ for"
                " this machine only; changes need credentials (or the admin socket)",
                address=http,
            )
            return True, None
        admin_portal = make_portal(self.gateway.checker, False)
        log.warn(
            "admin listener {address} is reachable beyond this machine: /metrics"
            " and /api/ ask for the credentials of http.admin_users ({users})",
            address=http,
            users=", ".join(self.settings.http.admin_users) or "none yet",
        )
        return False, admin_portal

    def dashboard_mqtt(self, origins, secure):
        """The dashboard's own MQTT over WebSocket, on the admin listener's origin."""
        from mqttgw.transports.websocket import websocket_resource

        if "*" in origins:
            log.warn(
                "http.allowed_origins has '*': a page of any origin may use the admin"
                " listener's /mqtt and send it changes (with credentials)"
            )
        ws = self.ws
        return websocket_resource(
            self.mqtt_factory("http", self.portal), ws.max_message_size, ws.trusted_proxies,
            ws.compression, origins, secure, self.settings.http.dashboard_message_rate, self.hosts,
        )

    def admin_socket_listener(self, metrics, limit, timeout):
        """The admin API on a Unix socket, for python -m mqttgw.ctl, if one is configured."""
        path = admin_socket(self.settings)
        if path is None:
            return
        from mqttgw.transports.httpguard import BoundedFactory, ConnectionSlots
        from mqttgw.web.admin import admin_site

        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        local = admin_site(
            self.gateway, metrics, throttle=self.login_throttle(), local=True, timeout=timeout
        )
        # Not required: a data directory that cannot take it (read-only,
        # full) leaves the admin API on http.address alone.
        ListenerService(
            self.reactor, "http", unix_description(path),
            BoundedFactory(local, ConnectionSlots(limit), "admin socket"), name=path,
            required=False,
        ).setServiceParent(self.gateway)
        log.info(
            "admin socket {path} (mode 0600): the admin API for python -m mqttgw.ctl,"
            " every change allowed to whoever may open it",
            path=path,
        )

"""
SIGHUP: the configuration file (and the files it names) read again, off
the reactor thread, and what can change live applied without dropping a
client: log level, limits for new connections and sessions, $SYS interval,
session expiry, archive filters, passwords, ACL, token keys, TLS
certificates (new handshakes use them) and bridges (only those added,
removed or changed are started or stopped).  What cannot change live is
named in one line as needing a restart.  A file that fails its checks
changes nothing and is reported in one line.  SIGUSR1 rotates the log file
when there is one; SIGUSR1 and SIGUSR2 never end the process.
"""

import signal

from twisted.application.service import Service
from twisted.internet.defer import DeferredList, maybeDeferred
from twisted.internet.threads import deferToThread
from twisted.logger import Logger

from mqttgw.security.passwords import PasswordChecker
from mqttgw.security.portal import TokenOrPasswordChecker
from mqttgw.service import build, config, logs
from mqttgw.web.systopics import SysTopics

log = Logger()

# Keys (or key prefixes) that take effect only at start-up.
NEEDS_RESTART = (
    "listeners.",
    "listener_tables",
    "persistence.",
    "archive.directory",
    "archive.gateway_id",
    "http.",
    "log.format",
    "websocket.",
    "auth.allow_anonymous",
    "auth.analytics_writers",
    "tls.use_identity_as_username",
    "tls.require_client_cert",
    "tls.ca",
    "sparkplug.aware",
    "mqttsn.",
    "otel.",
)


class ReloadService(Service):
    """
    Holds what a reload touches.  ``read(settings)`` (run in a thread)
    returns the new configuration checked; ``apply`` swaps it in.
    """

    def __init__(self, reactor, options, gateway):
        self.reactor = reactor
        self.options = options
        self.settings = options.settings
        self.gateway = gateway
        # Token checkers of [[listener]] tables, reloaded with the main one.
        self.token_checkers = []
        self.renewable_tls = []

    def startService(self):
        super().startService()
        self.gateway.pool.start()
        self.reactor.addSystemEventTrigger("during", "shutdown", self.gateway.pool.stop)
        signal.signal(signal.SIGHUP, lambda *_: self.reactor.callFromThread(self.reload))
        signal.signal(signal.SIGUSR1, lambda *_: self.reactor.callFromThread(self.rotate))
        signal.signal(
            signal.SIGUSR2,
            lambda signum, _: self.reactor.callFromThread(log.info, "ignoring signal SIGUSR2"),
        )

    def rotate(self):
        if logs.log_file is not None:
            logs.log_file.rotate()
            log.info("SIGUSR1: log file rotated")
        else:
            log.info("ignoring signal SIGUSR1: no log file to rotate")

    # Reading, in a thread

    def read(self):
        options = self.options
        from_file = config.load_file(options["config"]) if options["config"] else {}
        settings = config.build(from_file, options.flag_values)
        build.check_listeners(settings)
        build.check_archive_filters(settings)
        return {
            "settings": settings,
            "bridges": build.check_bridges(
                settings, self.gateway.runtime_bridges.merged(settings.bridges)
            ),
            "auth_files": build.load_auth_files(settings),
            "tls": [(listener, listener.load()) for listener in self.renewable_tls],
        }

    def reload(self):
        where = self.options["config"] or "the command line"
        log.info("SIGHUP: reading {where} again", where=where)
        d = deferToThread(self.read)
        d.addCallbacks(self.apply, self._failed)
        return d

    def _failed(self, reason):
        log.error(
            "reload failed, nothing changed: {error}",
            error=reason.getErrorMessage(),
        )

    # Applying, in the reactor

    def apply(self, new):
        old, settings = self.settings, new["settings"]
        self.settings = settings
        self.options.settings = settings
        gateway = self.gateway
        restart = sorted(
            path
            for path in set(old.values) | set(settings.values)
            if path.startswith(NEEDS_RESTART) and old.values.get(path) != settings.values.get(path)
        )
        if restart:
            log.warn("reload: changed but needs a restart: {keys}", keys=", ".join(restart))
        logs.set_level(settings.log.level)
        limits = build.connection_limits(settings)
        for factory in gateway.factories:
            factory.limits = limits
        router = gateway.router
        build.configure_router(router, settings)
        gateway.schedule_sweep()
        if gateway.sys_topics is None and settings.mqtt.sys_interval > 0:
            gateway.sys_topics = SysTopics(router, self.reactor, 0, gateway.bridges, router.store)
        if gateway.sys_topics is not None:
            gateway.sys_topics.interval = settings.mqtt.sys_interval
            gateway.sys_topics.start()
        archive = gateway.archive
        if archive is not None:
            a = settings.archive
            archive.set_filters(a.include, a.exclude)
            archive.directions = frozenset(a.directions)
            archive.roll_seconds = a.roll_seconds
            archive.roll_rows = a.roll_rows
        table, acl, tokens = new["auth_files"]
        self._swap_auth(new["auth_files"])
        for listener, renewed in new["tls"]:
            listener.options = renewed
        changes = self._reload_bridges(new["bridges"])
        log.info(
            "reloaded: {users} users, ACL {acl}, token keys {tokens}, {tls} TLS certificate(s),"
            " limits, log level {log_level_name}, bridges {changes}",
            users=len(table.entries) if table else 0,
            acl="in force" if acl is not None else "none",
            tokens="in force" if tokens is not None else "none",
            tls=len(new["tls"]),
            log_level_name=settings.log.level,
            changes=changes or "unchanged",
        )

    def change_bridge(self, name, table):
        """
        The admin API's change: bridge ``name`` set to ``table`` (None:
        removed).  The whole set is checked (in a thread), then kept on
        disk, then applied as a reload applies bridges.  A Deferred firing
        with the changes made, or failing with the ConfigError.
        """
        runtime = self.gateway.runtime_bridges
        entries = runtime.changed(name, table)
        settings = self.settings

        def check():
            return build.check_bridges(settings, runtime.merged(settings.bridges, entries))

        d = deferToThread(check)
        d.addCallback(lambda wanted: runtime.save(entries).addCallback(lambda _: wanted))
        d.addCallback(self._reload_bridges)
        return d

    def _swap_auth(self, files):
        table, acl, tokens = files
        checker = self.gateway.checker
        for listener_checker in self.token_checkers:
            if listener_checker.tokens is not None:
                listener_checker.tokens = tokens
        if isinstance(checker, TokenOrPasswordChecker):
            checker.tokens = tokens
            checker = checker.passwords
        if isinstance(checker, PasswordChecker) and table is not None:
            checker.replace(table)
        access = self.gateway.router.access
        if acl is None and access.acl is not None:
            log.warn("reload: acl_file is no longer set: every client may read and write every topic")
        access.replace(acl)
        if (table is None) != (self.gateway.had_passwords is None) or (
            tokens is None
        ) != (self.gateway.had_tokens is None):
            log.warn("reload: turning password files or token keys on or off needs a restart")

    def _reload_bridges(self, wanted):
        """Stop bridges removed or changed, start those added or changed."""
        gateway = self.gateway
        running = {b.settings.name: b for b in gateway.bridges}
        wanted_by_name = {checked.name: (kind, checked) for kind, checked in wanted}
        said = []
        stopping = []
        for name, bridge in running.items():
            new = wanted_by_name.get(name)
            if new is None or new[1] != bridge.settings:
                said.append(f"{'-' if new is None else '~'}{name}")
                gateway.bridges.remove(bridge)
                stopping.append(maybeDeferred(bridge.disownServiceParent))
        starting = [
            (kind, checked)
            for name, (kind, checked) in wanted_by_name.items()
            if name not in running or running[name].settings != checked
        ]
        said += [f"+{checked.name}" for _, checked in starting if checked.name not in running]

        removed = [
            bridge.settings.state_topic
            for name, bridge in running.items()
            if name not in wanted_by_name and hasattr(bridge, "settings")
        ]

        def start(_):
            gateway.clear_bridge_states(removed)
            for kind, checked in starting:
                bridge = kind.make_service(gateway.router, checked, self.reactor)
                gateway.bridges.append(bridge)
                bridge.setServiceParent(gateway)

        DeferredList(stopping).addCallback(start)
        return " ".join(said)

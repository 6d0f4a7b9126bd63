"""
The twistd plugin's options and service: ``twistd -n mqttgw --tcp 1883``.
"""

import sys

from twisted.logger import Logger
from twisted.python import usage

from mqttgw import __version__
from mqttgw.schema import ConfigError, check_value, type_name
from mqttgw.service import collector, config, footprint, logs
from mqttgw.service.build import (
    check_auth_methods,
    check_bridges,
    check_http,
    check_listener_tables,
    check_listeners,
    check_mqttsn,
    load_auth_files,
    server_tls_options,
)
from mqttgw.service.runtime_bridges import RuntimeBridges

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
        " --wss, --mqttsn) take a port, HOST:PORT ([::1]:PORT) or a Twisted endpoint string and may repeat;"
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

        print(
            f"mqttgw {__version__} (Twisted {twisted.__version__}, Python {platform.python_version()})"
        )
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
            footprint.load_reactor(footprint.uses_tls(settings))
            check_listeners(settings)
            self.tls_options = server_tls_options(settings)
            self.runtime_bridges = RuntimeBridges.in_data_dir(settings).load()
            self.bridges = check_bridges(settings, self.runtime_bridges.merged(settings.bridges))
            self.auth_methods = check_auth_methods(settings)
            self.auth_files = load_auth_files(settings)
            self.listener_tables = check_listener_tables(settings)
            check_http(settings)
            self.mqttsn = check_mqttsn(settings)
        except config.ConfigError as e:
            # One line naming the problem, not a page of usage.
            sys.exit(f"mqttgw: {e}")
        self.settings = settings
        parent = getattr(self, "parent", None)
        if parent is not None:
            logs.use_under_twistd(parent, settings.log.format)


def _repeatable(key):
    def opt(self, value):
        self.lists.setdefault(key.path, []).append(value)

    opt.__doc__ = f"{key.help} (repeatable) [{key.path}]"
    return opt


# --tcp, --tls, --ws, --wss, --bridge, ...: one opt_ method each.
for _key in config.KEYS:
    if _key.type is list:
        setattr(Options, "opt_" + _key.flag.replace("-", "_"), _repeatable(_key))


def makeService(options, reactor=None):
    from mqttgw.service.assembly import Assembly

    if reactor is None:
        from twisted.internet import reactor

        # The process is the gateway's (tests pass a reactor of their own).
        reactor.callWhenRunning(collector.tune)
    logs.set_level(options.settings.log.level)
    assembly = Assembly(options, reactor)
    assembly.credentials()
    assembly.dashboard()
    assembly.workers()
    assembly.listeners()
    assembly.bridges()
    assembly.operations()
    return assembly.gateway

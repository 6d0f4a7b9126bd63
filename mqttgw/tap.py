"""
The twistd plugin's options and service: ``twistd -n mqttgw --tcp 1883``.
"""

import sys

from twisted.application import strports
from twisted.application.service import MultiService
from twisted.internet.endpoints import serverFromString
from twisted.python import usage

from mqttgw import config
from mqttgw.protocol import ConnectionLimits, MQTTServerFactory
from mqttgw.router import Router
from mqttgw.session import SessionLimits

def endpoint_description(listener):
    """A bare port number means TCP on every interface."""
    return f"tcp:{listener}" if listener.isdigit() else listener


def _flag_keys():
    return [k for k in config.KEYS if k.type is not list]


class Options(usage.Options):
    synopsis = "[--tcp PORT]... [--config FILE] [options]"
    longdesc = (
        "Run the mqttgw MQTT broker.  Listener options take a port or a"
        " Twisted endpoint string and may repeat; with none, it listens on"
        " TCP port 1883.  Every option has a key in the --config TOML file;"
        " options given here win over the file."
    )
    optParameters = [["config", "c", None, "TOML configuration file"]] + [
        [k.flag, None, None, f"{k.help} [{k.path}, default {k.default}]"]
        for k in _flag_keys()
        if k.type is not bool
    ]
    optFlags = [[k.flag, None, f"{k.help} [{k.path}]"] for k in _flag_keys() if k.type is bool]

    def __init__(self):
        super().__init__()
        self.listeners = {"listeners.tcp": []}

    def opt_tcp(self, listener):
        """TCP listener: a port or endpoint string (repeatable)"""
        self.listeners["listeners.tcp"].append(listener)

    def _flag_values(self):
        values = {}
        for key in _flag_keys():
            raw = self[key.flag]
            if key.type is bool:
                if raw:
                    values[key.path] = True
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
        for path, given in self.listeners.items():
            if given:
                values[path] = given
        return values

    def postOptions(self):
        flags = self._flag_values()
        try:
            from_file = config.load_file(self["config"]) if self["config"] else {}
            settings = config.build(from_file, flags)
            _check_listeners(settings)
        except config.ConfigError as e:
            # One line naming the problem, not a page of usage.
            sys.exit(f"mqttgw: {e}")
        self.settings = settings


def _check_listeners(settings):
    from twisted.internet import reactor

    for listener in settings["listeners.tcp"]:
        try:
            serverFromString(reactor, endpoint_description(listener))
        except (ValueError, TypeError, KeyError) as e:
            raise config.ConfigError(
                f"listeners.tcp: {listener!r} is not a port or endpoint: {e}"
            ) from None


def build_router(settings, clock):
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
    )


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor
    settings = options.settings
    router = build_router(settings, reactor)
    limits = settings.section("limits")
    factory = MQTTServerFactory(
        router,
        ConnectionLimits(
            max_packet_size=limits["max_packet_size"],
            connect_timeout=limits["connect_timeout"],
            max_connections=limits["max_connections"],
        ),
        reactor,
    )
    top = MultiService()
    for listener in settings["listeners.tcp"]:
        strports.service(
            endpoint_description(listener), factory, reactor=reactor
        ).setServiceParent(top)
    top.router = router
    return top

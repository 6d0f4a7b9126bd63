"""
Interfaces between mqttgw and its extensions.  A bridge kind is found with
Twisted's plugin system: any module in a ``twisted/plugins/`` directory may
provide one, and ``[[bridge]]`` tables name it with their ``kind`` key.
"""

from importlib import import_module

from twisted.plugin import IPlugin
from zope.interface import Attribute, Interface, implementer


class IBridgeKind(Interface):
    name = Attribute("The value of a [[bridge]] table's kind key.")

    def make_service(router, bridge, reactor):
        """
        An IService that runs one bridge: ``bridge`` is its [[bridge]]
        table, checked; ``router`` the broker it is a client of.
        """

    def check(bridge):
        """The [[bridge]] table, checked; raises ConfigError naming a key."""


@implementer(IPlugin, IBridgeKind)
class LazyBridgeKind:
    """A bridge kind whose code is imported only when a bridge uses it."""

    def __init__(self, name, target):
        self.name = name
        self._target = target

    def _kind(self):
        module, attribute = self._target.split(":")
        return getattr(import_module(module), attribute)

    def make_service(self, router, bridge, reactor):
        return self._kind().make_service(router, bridge, reactor)

    def check(self, bridge):
        return self._kind().check(bridge)


def bridge_kinds():
    """Every bridge kind installed, by name."""
    from twisted.plugin import getPlugins

    import twisted.plugins

    return {kind.name: kind for kind in getPlugins(IBridgeKind, twisted.plugins)}

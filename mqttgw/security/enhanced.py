"""
MQTT 5.0 enhanced authentication (section 4.12 of the standard): the
interface an authentication method provides, found with Twisted's plugin
system as bridge kinds are, and offered only when ``auth.methods`` names
it.

A CONNECT naming a method offered starts an exchange (``exchange`` of
what the plugin's ``prepare`` made of the configuration); each step is given
the client's Authentication Data and answers :class:`Continue` (its data
goes to the client in AUTH 0x18, whose answer is the next step),
:class:`Authenticated` (CONNACK 0x00, or AUTH 0x00 when re-authenticating)
or fails with :class:`Refused`.  A step may return a Deferred: hashing
belongs in a thread, never on the reactor.  The method's answer replaces
the password check; the ACL applies to the user name it gives.
"""

import attr
from twisted.plugin import IPlugin
from zope.interface import Attribute, Interface

from mqttgw.wire import reasons as R


class IAuthenticationMethod(Interface):
    """What a plugin provides (a module in a ``twisted/plugins/`` directory)."""

    name = Attribute("The Authentication Method as CONNECT names it (SCRAM-SHA-512, say).")

    def prepare(settings):
        """
        The method as the configuration sets it up, an IAuthenticator, at
        start-up; raises mqttgw.schema.ConfigError naming the key at fault.
        """


class IAuthenticator(Interface):
    def exchange(client_id, username):
        """
        An IAuthenticationExchange for one authentication (at CONNECT, or a
        re-authentication) of ``client_id``; ``username`` as CONNECT gave
        it, or None.
        """


class IAuthenticationExchange(Interface):
    def step(data):
        """
        The client's Authentication Data (bytes, or None when it sent none):
        returns, or a Deferred fires with, a :class:`Continue` or an
        :class:`Authenticated`; raises, or fails with, :class:`Refused`.
        """


@attr.s(frozen=True, slots=True)
class Continue:
    """More is needed: ``data`` is the server's Authentication Data."""

    data = attr.ib(default=None)


@attr.s(frozen=True, slots=True)
class Authenticated:
    """The client is ``username``; ``data``, if any, goes to it as well."""

    username = attr.ib()
    data = attr.ib(default=None)


class Refused(Exception):
    """The exchange failed; ``reason_code`` is what the client is told."""

    def __init__(self, reason, reason_code=R.NOT_AUTHORIZED):
        super().__init__(reason)
        self.reason_code = reason_code


def authentication_methods():
    """Every authentication method installed, by name."""
    from twisted.plugin import getPlugins

    import twisted.plugins

    return {m.name: m for m in getPlugins(IAuthenticationMethod, twisted.plugins)}


__all__ = [
    "IAuthenticationMethod", "IAuthenticator", "IAuthenticationExchange", "IPlugin",
    "Continue", "Authenticated", "Refused", "authentication_methods",
]

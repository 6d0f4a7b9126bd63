"""
Start-up without TLS where the configuration has none.  Twisted's TCP
transport, its reactor base and its endpoints look for pyOpenSSL when
first imported, and finding it loads cryptography and service_identity as
well, a large share of the idle memory and the start-up time.  A gateway
whose listeners are all plain imports them with pyOpenSSL hidden, as
Twisted would be without it installed; afterwards nothing is hidden, and
whatever later asks for TLS (a bridge, a token key) loads it then, on its
own: TLS listeners and bridges wrap their connections themselves
(twisted.protocols.tls), so only an ``ssl:`` endpoint needs the reactor's.
"""

import sys

# What Twisted's modules probe for: pyOpenSSL, and the certificate name
# checks they load beside it.
TLS_PACKAGES = ("OpenSSL", "service_identity")


def uses_tls(settings):
    """Whether any listener of ``settings`` speaks TLS."""
    tables = [listener.table for listener in settings.all_listeners if listener.table["kind"] != "mqttsn"]
    if any(t["kind"] in ("tls", "wss") for t in tables):
        return True
    addresses = [settings.http.address or ""] + [t["address"] for t in tables]
    return any(str(a).startswith("ssl:") for a in addresses)


def load_reactor(tls):
    """
    The reactor installed and Twisted's endpoints imported, pyOpenSSL
    hidden from them unless ``tls``.  Where they are loaded already (a
    test's process) this changes nothing.
    """
    hidden = []
    if not tls and "twisted.internet.tcp" not in sys.modules:
        hidden = [name for name in TLS_PACKAGES if name not in sys.modules]
    for name in hidden:
        # None in sys.modules: the import fails as if not installed.
        sys.modules[name] = None
    try:
        import twisted.internet.endpoints
        import twisted.internet.reactor  # noqa: F401
    finally:
        for name in hidden:
            if sys.modules.get(name, ()) is None:
                del sys.modules[name]

"""
The HTTP admin listener (``--http``): ``/healthz``, ``/readyz``,
``/metrics`` and a small JSON API under ``/api/``::

    GET    /api/overview                 listeners, counters, store, bridges
    GET    /api/clients                  connected clients
    DELETE /api/clients/CLIENT_ID        disconnect a client (kick)
    GET    /api/sessions                 persistent sessions
    DELETE /api/sessions/CLIENT_ID       remove a session not in use
    GET    /api/retained?filter=F        retained messages matching F
    DELETE /api/retained?filter=F        clear them
    GET    /api/bridges                  bridges, their state and queues

Client ids are URL-encoded path segments.  On loopback no credentials are
asked for; bound anywhere else, ``/metrics`` and ``/api/`` take HTTP Basic
(a user of the password file) or ``Bearer`` (a token), through the same
portal as MQTT, and only ``http.admin_users``.  ``/healthz`` and
``/readyz`` stay open for health checks.
"""

import base64
import binascii
import ipaddress
import json

from twisted.cred.credentials import UsernamePassword
from twisted.logger import Logger
from twisted.web.resource import ErrorPage, Resource
from twisted.web.server import Site
from twisted.web.util import DeferredResource

from mqttgw.auth import IIdentity
from mqttgw.packets import Publish
from mqttgw.printable import printable
from mqttgw.topics import InvalidTopic, validate_topic_filter

log = Logger()

# Retained messages listed at most per request.
MAX_LISTED = 10_000


def is_loopback(host):
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _JSON(Resource):
    isLeaf = True

    def reply(self, request, value, code=200):
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(value, indent=1).encode() + b"\n"


class Healthz(_JSON):
    """The process is alive and its reactor turns."""

    def render_GET(self, request):
        return self.reply(request, {"status": "alive"})


class Readyz(_JSON):
    """
    200 while every listener is bound, the store commits and the archive
    (if any) writes; otherwise 503 with the reasons.
    """

    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request):
        reasons = self.gateway.not_ready()
        if reasons:
            return self.reply(request, {"status": "not ready", "reasons": reasons}, 503)
        return self.reply(request, {"status": "ready"})


class MetricsPage(Resource):
    isLeaf = True

    def __init__(self, metrics):
        super().__init__()
        self.metrics = metrics

    def render_GET(self, request):
        from prometheus_client import CONTENT_TYPE_LATEST

        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return self.metrics.text()


class Clients(_JSON):
    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request):
        if request.postpath and request.postpath[0]:
            return self.reply(request, {"error": "GET /api/clients lists them all"}, 404)
        return self.reply(request, self.gateway.clients())

    def render_DELETE(self, request):
        client_id = _one_segment(request)
        if client_id is None:
            return self.reply(request, {"error": "DELETE /api/clients/CLIENT_ID"}, 404)
        if not self.gateway.kick(client_id):
            return self.reply(request, {"error": f"client {client_id!r} is not connected"}, 404)
        log.info("admin API: client {client_id} disconnected", client_id=printable(client_id))
        return self.reply(request, {"kicked": client_id})


class Sessions(_JSON):
    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request):
        return self.reply(request, self.gateway.sessions())

    def render_DELETE(self, request):
        client_id = _one_segment(request)
        if client_id is None:
            return self.reply(request, {"error": "DELETE /api/sessions/CLIENT_ID"}, 404)
        if not self.gateway.router.delete_session(client_id):
            return self.reply(
                request, {"error": f"no persistent session {client_id!r} out of use"}, 404
            )
        log.info("admin API: session of {client_id} deleted", client_id=printable(client_id))
        return self.reply(request, {"deleted": client_id})


class Retained(_JSON):
    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def _filter(self, request):
        raw = request.args.get(b"filter", [b"#"])[0]
        try:
            topic_filter = raw.decode()
            validate_topic_filter(topic_filter)
        except (UnicodeDecodeError, InvalidTopic) as e:
            return None, str(e)
        return topic_filter, None

    def render_GET(self, request):
        topic_filter, error = self._filter(request)
        if error:
            return self.reply(request, {"error": error}, 400)
        listed = []
        for message in self.gateway.retained(topic_filter):
            listed.append({"topic": message.topic, "qos": message.qos, "payload": _payload(message.payload), "bytes": len(message.payload)})
            if len(listed) >= MAX_LISTED:
                break
        return self.reply(request, listed)

    def render_DELETE(self, request):
        topic_filter, error = self._filter(request)
        if error:
            return self.reply(request, {"error": error}, 400)
        topics = [m.topic for m in self.gateway.retained(topic_filter) if not m.topic.startswith("$SYS/")]
        for topic in topics:
            # As a client clears a retained topic: an empty retained publish.
            self.gateway.router.publish(Publish(topic, b"", 0, True))
        log.info(
            "admin API: {n} retained message(s) matching {filter} deleted",
            n=len(topics),
            filter=printable(topic_filter),
        )
        return self.reply(request, {"deleted": topics})


class Bridges(_JSON):
    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request):
        return self.reply(request, [b.status() for b in self.gateway.bridges])


class Overview(_JSON):
    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request):
        return self.reply(request, self.gateway.overview())


def _one_segment(request):
    """The one path segment after the resource (a client id), decoded."""
    if len(request.postpath) != 1 or not request.postpath[0]:
        return None
    try:
        return request.postpath[0].decode()
    except UnicodeDecodeError:
        return None


def _payload(payload):
    """UTF-8 text when it is, else base64, marked as such."""
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(payload).decode()}


class _Authorized(Resource):
    """
    Asks for credentials before ``wrapped``: HTTP Basic or a Bearer token,
    checked by ``portal``, and a user among ``admin_users``.
    """

    def __init__(self, wrapped, portal, admin_users):
        super().__init__()
        self.wrapped = wrapped
        self.portal = portal
        self.admin_users = admin_users

    isLeaf = True

    def render(self, request):
        creds = _credentials(request.getHeader(b"authorization"))
        if creds is None:
            return _challenge().render(request)

        def logged_in(result):
            _, identity, _ = result
            if identity.username not in self.admin_users:
                log.info(
                    "admin API: user {user} is not in http.admin_users",
                    user=printable(identity.username),
                )
                return ErrorPage(403, "Forbidden", "not an admin user")
            # DeferredResource walks the rest of the path from here.
            return self.wrapped

        d = self.portal.login(creds, None, IIdentity)
        d.addCallbacks(logged_in, lambda _: _challenge())
        return DeferredResource(d).render(request)


def _challenge():
    page = ErrorPage(401, "Unauthorized", "credentials needed")
    render = page.render

    def with_header(request):
        request.setHeader(b"www-authenticate", b'Basic realm="mqttgw"')
        return render(request)

    page.render = with_header
    return page


def _credentials(header):
    if not header:
        return None
    scheme, _, value = header.partition(b" ")
    scheme = scheme.lower()
    if scheme == b"basic":
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return None
        return UsernamePassword(user, password) if sep else None
    if scheme == b"bearer":
        # Tokens go through the portal as the MQTT password does.
        return UsernamePassword(b"", value.strip())
    return None


def admin_site(gateway, metrics, portal=None, admin_users=()):
    """
    The admin listener's site; with ``portal``, /metrics and /api/ need
    credentials of an ``admin_users`` user.
    """
    api = Resource()
    api.putChild(b"overview", Overview(gateway))
    api.putChild(b"clients", Clients(gateway))
    api.putChild(b"sessions", Sessions(gateway))
    api.putChild(b"retained", Retained(gateway))
    api.putChild(b"bridges", Bridges(gateway))
    root = Resource()
    root.putChild(b"healthz", Healthz())
    root.putChild(b"readyz", Readyz(gateway))
    guarded = {b"metrics": MetricsPage(metrics), b"api": api}
    for name, resource in guarded.items():
        if portal is not None:
            resource = _Authorized(resource, portal, frozenset(admin_users))
        root.putChild(name, resource)
    site = Site(root)
    site.noisy = False
    # No access log line per scrape or health check.
    site.log = lambda request: None
    return site

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
    PUT    /api/bridges/NAME             add or replace a bridge (a [[bridge]] table, JSON)
    DELETE /api/bridges/NAME             remove a bridge
    GET    /api/sparkplug?group=G        Sparkplug edge nodes and devices, their state
    GET    /api/whoami                   who the credentials sent are, and their role
    POST   /api/token                    a short-lived token for the dashboard

Client ids are URL-encoded path segments.  Credentials are HTTP Basic
(a user of the password file) or ``Bearer`` (a token) in the
Authorization header, never in the URL, checked through the same portal
and the same login throttle as MQTT: only ``http.admin_users`` may
change anything (PUT, DELETE, POST), on every listener, loopback
included; ``http.read_users`` may read the overview, the bridges and
the Sparkplug edge.
On loopback reads need none, and whoever signs in may read,
and retained payloads and Sparkplug nodes are listed only as far as the
ACL lets the reader read them; the local Unix socket
(``admin_site(..., local=True)``) is open to whoever may open it.  ``/healthz`` and ``/readyz`` stay open for
health checks.  Everything else is the dashboard (``/``) and its MQTT
over WebSocket (``/mqtt``).
"""

import base64
import binascii
import ipaddress
import json

import attr
from twisted.cred.credentials import UsernamePassword
from twisted.internet import task
from twisted.logger import Logger
from twisted.web.pages import errorPage, forbidden
from twisted.web.resource import Resource, getChildForRequest
from twisted.web.server import NOT_DONE_YET

from mqttgw.broker.access import READ
from mqttgw.broker.logsummary import RateLimited
from mqttgw.broker.topics import InvalidTopic, validate_topic_filter
from mqttgw.schema import ConfigError
from mqttgw.security.identity import IIdentity
from mqttgw.security.passwords import Busy
from mqttgw.security.throttle import Throttle, address_key
from mqttgw.transports.httpguard import SAFE_METHODS, HostSite
from mqttgw.web.dashboard import Dashboard
from mqttgw.wire.packets import Publish
from mqttgw.wire.printable import printable

log = Logger()

# Retained messages listed, or Sparkplug nodes and devices looked at, at
# most per request.
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
        request.setHeader(b"x-content-type-options", b"nosniff")
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
    """The Prometheus series (web/metrics), in Prometheus' text format."""

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


def _reader(request, gateway, anonymous_reads, local):
    """
    What the caller may read, as an MQTT client would: a check of each
    topic, None for every topic, or False: credentials needed.
    """
    if local:
        return None
    access = gateway.router.access
    identity = getattr(request, "identity", None)
    if identity is not None:
        return access.checker(identity.username, "", READ, identity.subscribe)
    if not anonymous_reads:
        return False
    return access.checker(None, "", READ)


class Retained(_JSON):
    """
    Retained messages, listed as far as the reader may read them: what the
    ACL (and a token's filters) give the identity that signed in; without
    credentials (a loopback read), what an anonymous MQTT client may read,
    or nothing when anonymous clients are refused.  ``local`` (the Unix
    socket): everything.
    """

    def __init__(self, gateway, anonymous_reads=True, local=False):
        super().__init__()
        self.gateway = gateway
        self.anonymous_reads = anonymous_reads
        self.local = local

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
        may_read = _reader(request, self.gateway, self.anonymous_reads, self.local)
        if may_read is False:
            return _challenge(None, "reading retained payloads here needs credentials").render(request)
        listed = []
        for message in self.gateway.retained(topic_filter):
            if may_read is not None and not may_read(message.topic):
                continue
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
    """
    GET lists the bridges; PUT /api/bridges/NAME with a [[bridge]] table
    (JSON) adds or replaces one, DELETE /api/bridges/NAME removes one: kept
    across restarts and SIGHUP (see mqttgw.service.runtime_bridges).
    """

    # The largest table accepted.
    MAX_BODY = 64 * 1024

    def __init__(self, gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request):
        if request.postpath and request.postpath[0]:
            return self.reply(request, {"error": "GET /api/bridges lists them all"}, 404)
        return self.reply(request, [b.status() for b in self.gateway.bridges])

    def render_PUT(self, request):
        name = _one_segment(request)
        if name is None:
            return self.reply(request, {"error": "PUT /api/bridges/NAME with a [[bridge]] table"}, 404)
        body = request.content.read(self.MAX_BODY + 1)
        if len(body) > self.MAX_BODY:
            return self.reply(request, {"error": f"a bridge table is at most {self.MAX_BODY} bytes"}, 413)
        try:
            table = json.loads(body)
        except ValueError as e:
            return self.reply(request, {"error": f"not JSON: {e}"}, 400)
        if not isinstance(table, dict):
            return self.reply(request, {"error": "a [[bridge]] table is a JSON object"}, 400)
        if table.setdefault("name", name) != name:
            return self.reply(request, {"error": f"the table names {table['name']!r}, the path {name!r}"}, 400)
        return self._change(request, name, table)

    def render_DELETE(self, request):
        name = _one_segment(request)
        if name is None:
            return self.reply(request, {"error": "DELETE /api/bridges/NAME"}, 404)
        if not any(b.settings.name == name for b in self.gateway.bridges):
            return self.reply(request, {"error": f"no bridge {name!r}"}, 404)
        return self._change(request, name, None)

    def _change(self, request, name, table):
        reloader = self.gateway.reloader
        if reloader is None:
            return self.reply(request, {"error": "bridges cannot be changed here"}, 503)

        def done(changes):
            log.info(
                "admin API: bridge {name} {what} ({changes})",
                name=printable(name),
                what="removed" if table is None else "set",
                changes=changes or "unchanged",
            )
            _finish(request, self.reply(request, {"bridge": name, "changes": changes}))

        def refused(reason):
            if reason.check(ConfigError):
                _finish(request, self.reply(request, {"error": str(reason.value)}, 400))
            else:
                log.failure("admin API: changing bridge {name}", reason, name=printable(name))
                _finish(request, self.reply(request, {"error": "the change failed"}, 500))

        reloader.change_bridge(name, table).addCallbacks(done, refused)
        return NOT_DONE_YET


def _finish(request, body):
    if not request.finished and not getattr(request, "_disconnected", False):
        request.write(body)
        request.finish()


class SparkplugNodes(_JSON):
    """
    The edge nodes and devices the gateway has seen (``?group=G``: of one
    group), and its counters.  A node or device is listed as far as the
    reader may read its topics, as Retained lists payloads, and the
    counters as far as it may read them under $SYS; at most MAX_LISTED
    nodes and devices are looked at per request.
    """

    def __init__(self, gateway, anonymous_reads=True, local=False):
        super().__init__()
        self.gateway = gateway
        self.anonymous_reads = anonymous_reads
        self.local = local

    # The counters are those $SYS publishes: for those who may read them there.
    COUNTERS = "$SYS/broker/sparkplug/"

    def render_GET(self, request):
        may_read = _reader(request, self.gateway, self.anonymous_reads, self.local)
        if may_read is False:
            return _challenge(None, "reading the Sparkplug edge here needs credentials").render(request)
        group = request.args.get(b"group", [None])[0]
        if group is not None:
            group = group.decode("utf-8", "replace")
        answer = self.gateway.sparkplug(may_read, group, MAX_LISTED)
        if may_read is not None and "stats" in answer and not may_read(self.COUNTERS + "nodes_online"):
            del answer["stats"]
        return self.reply(request, answer)


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


@attr.s(frozen=True)
class Roles:
    """
    Who may do what in the admin API and the dashboard.  Only
    ``admin_users`` may change anything, on every listener; ``open`` (a
    loopback listener) asks no credentials for reads, and lets whoever
    signs in read.
    """

    admin_users = attr.ib(converter=frozenset, default=())
    read_users = attr.ib(converter=frozenset, default=())
    open = attr.ib(default=False)

    def of(self, username):
        """"admin", "read", or None for a user with neither role."""
        if username in self.admin_users:
            return "admin"
        if self.open or username in self.read_users:
            return "read"
        return None


class Logins:
    """
    How the admin surface checks credentials: ``portal`` (None: there are
    none to check), through the login ``throttle`` MQTT uses, as MQTT
    logins do: per address and per user name, the logins waiting bounded,
    refusals and successes answered after the delay due.
    """

    def __init__(self, portal, throttle, clock):
        self.portal = portal
        self.throttle = throttle if throttle is not None else Throttle()
        self.clock = clock
        self.refused = 0
        self._limited = RateLimited(log)
        self._busy = RateLimited(log)

    def begin(self, request, creds):
        """A :class:`Login` of the throttle, or None: too many already waiting."""
        username = creds.username.decode("utf-8", "replace") if creds.username else None
        login = self.throttle.begin(_host(request), username)
        if login is None:
            self._busy.info(
                "admin API: too many logins waiting from {peer} or for its user name: refused unchecked",
                peer=_address(request),
            )
        return login

    def busy(self, login):
        """No password was checked (the checker was busy): nothing counted."""
        self.throttle.release(login)

    def failed(self, request, login):
        """The delay before this refusal is answered; counted and logged (bounded)."""
        delay = self.throttle.answer(login, False)
        self.refused += 1
        self._limited.info(
            "admin API: credentials refused from {peer} for {path}, answered after {delay:.2f}s",
            peer=_address(request),
            path=printable(request.path.decode("utf-8", "replace")),
            delay=delay,
        )
        return delay

    def succeeded(self, login):
        """The delay before this success is answered: what is due for its user name first."""
        return self.throttle.answer(login, True)


def _host(request):
    return getattr(request.getClientAddress(), "host", None) or "local"


def _address(request):
    peer = request.getClientAddress()
    return address_key(getattr(peer, "host", None)) or "local"


class _Authorized(Resource):
    """
    Asks for credentials before ``wrapped``: HTTP Basic or a Bearer token,
    checked through ``logins``; admins may do everything, read-only users
    use the ``read_methods``.  ``open_methods`` (reads on a loopback
    listener) pass without credentials; sent anyway, they are checked.
    The identity is left on the request for ``wrapped``.
    """

    def __init__(self, wrapped, logins, roles, read_methods=(), open_methods=()):
        super().__init__()
        self.wrapped = wrapped
        self.logins = logins
        self.roles = roles
        self.read_methods = frozenset(read_methods)
        self.open_methods = frozenset(open_methods)

    isLeaf = True

    def render(self, request):
        header = request.getHeader(b"authorization")
        logins = self.logins
        if request.method in self.open_methods and (header is None or logins.portal is None):
            return getChildForRequest(self.wrapped, request).render(request)
        if logins.portal is None:
            return _json_error(
                request, 403,
                "changes here need credentials and the gateway has none to check:"
                " use python -m mqttgw.ctl over the Unix socket",
            )
        creds = _credentials(header)
        if creds is None:
            return _challenge(header).render(request)
        login = logins.begin(request, creds)
        if login is None:
            # Answered at once, the password unchecked: it tells nothing.
            request.setHeader(b"retry-after", b"%d" % max(1, round(logins.throttle.longest)))
            return _json_error(request, 429, "too many logins waiting from this address or for this user")

        def logged_in(result):
            _, identity, _ = result
            # After the answers due for this user name, as over MQTT.
            delay = logins.succeeded(login)
            if delay > 0:
                return task.deferLater(logins.clock, delay, self._authorized, request, identity)
            return self._authorized(request, identity)

        def refused(reason):
            if reason.check(Busy):
                logins.busy(login)
                return errorPage(503, "Service Unavailable", "too many logins being checked")
            # Answered after the throttle's delay, as MQTT refusals are.
            return task.deferLater(logins.clock, logins.failed(request, login), _challenge, header)

        # A caller may leave while its credentials are checked.
        gone = []
        request.notifyFinish().addErrback(gone.append)
        d = logins.portal.login(creds, None, IIdentity)
        d.addCallbacks(logged_in, refused)

        def render(resource):
            if not gone:
                request.render(getChildForRequest(resource, request))

        d.addCallback(render)
        d.addErrback(lambda reason: log.failure("admin API: {path}", reason, path=request.path))
        return NOT_DONE_YET

    def _authorized(self, request, identity):
        """What ``request`` of a logged-in ``identity`` gets: ``wrapped`` if its role allows the method."""
        role = self.roles.of(identity.username)
        # Reads open without credentials stay open with them.
        allowed = role == "admin" or request.method in self.open_methods or (
            role == "read" and request.method in self.read_methods
        )
        if not allowed:
            log.info(
                "admin API: user {user} may not {method} {path}",
                user=printable(identity.username),
                method=request.method.decode("ascii", "replace"),
                path=printable(request.path.decode("utf-8", "replace")),
            )
            return forbidden("Forbidden", "not allowed for this user")
        request.identity = identity
        # DeferredResource walks the rest of the path from here.
        return self.wrapped


def _json_error(request, code, error):
    return _JSON().reply(request, {"error": error}, code)


class _Challenge(Resource):
    """401, asking for credentials in the way the caller can give them."""

    isLeaf = True

    def __init__(self, header, detail):
        super().__init__()
        self.page = errorPage(401, "Unauthorized", detail)
        self.header = header

    def render(self, request):
        # The dashboard's own calls (and any with a token) are not answered
        # with a Basic challenge, which makes a browser ask for a password
        # itself.
        header = self.header
        script = request.getHeader(b"x-requested-with") is not None
        bearer = header is not None and header[:7].lower() == b"bearer "
        scheme = b"Bearer" if script or bearer else b'Basic realm="mqttgw"'
        request.setHeader(b"www-authenticate", scheme)
        return self.page.render(request)


def _challenge(header=None, detail="credentials needed"):
    return _Challenge(header, detail)


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


class WhoAmI(_JSON):
    """
    What the dashboard needs before it signs in: whether it must (the
    gateway checks credentials) and whether the API is open to it.
    """

    def __init__(self, roles, signin):
        super().__init__()
        self.roles = roles
        self.signin = signin

    def render_GET(self, request):
        return self.reply(request, {"signin": self.signin, "open": self.roles.open})


class Token(_JSON):
    """
    ``POST /api/token``, behind the credentials check: a user name and
    password (Basic), or a token of the gateway's (Bearer) to renew it.
    The answer is a new short-lived token for the dashboard's MQTT
    connection and API calls.  The user must have a role; a read-only
    user's token may not publish.
    """

    def __init__(self, issuer, roles, clock):
        super().__init__()
        self.issuer = issuer
        self.roles = roles
        self.clock = clock

    def render_POST(self, request):
        identity = getattr(request, "identity", None)
        if self.issuer is None or identity is None:
            return self.reply(request, {"error": "the gateway checks no credentials: no token needed"}, 404)
        role = self.roles.of(identity.username)
        if identity.username is None or role is None:
            return self.reply(request, {"error": "this user may not use the dashboard"}, 403)
        token = self.issuer.issue(identity.username, self.clock.seconds(), read_only=role != "admin")
        return self.reply(
            request,
            {"token": token, "user": identity.username, "role": role, "lifetime": self.issuer.lifetime},
        )


def api_resource(
    gateway, portal, roles, issuer=None, signin_portal=None, throttle=None, anonymous_reads=True, local=False
):
    """
    /api/: with ``portal``, every call but whoami needs credentials;
    without (a loopback listener), reads need none but changes need those
    of ``signin_portal``.  ``local`` (the Unix socket): none are asked.
    ``anonymous_reads``: whether a read without credentials may list
    what an anonymous MQTT client may read.
    """
    children = {
        b"overview": (Overview(gateway), (b"GET", b"HEAD")),
        b"bridges": (Bridges(gateway), (b"GET", b"HEAD")),  # PUT, DELETE: admins
        b"clients": (Clients(gateway), ()),
        b"sessions": (Sessions(gateway), ()),
        b"retained": (Retained(gateway, anonymous_reads, local), ()),
        b"sparkplug": (SparkplugNodes(gateway, anonymous_reads, local), (b"GET", b"HEAD")),
    }
    api = Resource()
    api.putChild(b"whoami", WhoAmI(roles, issuer is not None))
    logins = Logins(portal or signin_portal, throttle, gateway.clock)
    for name, (resource, read_methods) in children.items():
        if portal is not None:
            resource = _Authorized(resource, logins, roles, read_methods)
        elif not local:
            resource = _Authorized(resource, logins, roles, read_methods, SAFE_METHODS)
        api.putChild(name, resource)
    # Signing in asks for credentials even where the rest of the API does not.
    token = Token(issuer, roles, gateway.clock)
    if logins.portal is not None and not local:
        token = _Authorized(token, logins, roles, (b"POST",))
    api.putChild(b"token", token)
    return api


def admin_site(
    gateway,
    metrics,
    portal=None,
    roles=None,
    issuer=None,
    signin_portal=None,
    mqtt=None,
    hosts=None,
    throttle=None,
    anonymous_reads=True,
    local=False,
    allowed_origins=(),
    timeout=60.0,
):
    """
    The admin listener's site.  With ``portal``, /metrics and /api/ need
    credentials, and ``roles`` says what each user may do there; without,
    only changes do, those of ``signin_portal`` (the MQTT listeners'
    portal), whose users also get dashboard tokens from ``issuer``.
    ``mqtt``, a WebSocket resource, serves the dashboard's MQTT at /mqtt.
    ``hosts`` are the names it answers to (see transports.httpguard);
    ``local``: the site of the Unix socket, where whoever can connect is
    an admin.  ``timeout``: seconds an idle connection is kept.
    """
    roles = roles or Roles(open=portal is None)
    throttle = throttle if throttle is not None else Throttle()
    if not local and (portal or signin_portal) is not None and not roles.admin_users:
        log.warn(
            "admin listener: credentials are checked but http.admin_users is empty:"
            " no user may change anything over HTTP, changes only over the admin socket"
            " (python -m mqttgw.ctl)"
        )
    api = api_resource(gateway, portal, roles, issuer, signin_portal, throttle, anonymous_reads, local)
    metrics_page = MetricsPage(metrics)
    if portal is not None:
        metrics_page = _Authorized(metrics_page, Logins(portal, throttle, gateway.clock), roles)
    root = Dashboard()
    root.putChild(b"healthz", Healthz())
    root.putChild(b"readyz", Readyz(gateway))
    root.putChild(b"metrics", metrics_page)
    root.putChild(b"api", api)
    if mqtt is not None:
        root.putChild(b"mqtt", mqtt)
    if local:
        hosts = None
    return HostSite(root, hosts, allowed_origins=allowed_origins, timeout=timeout)

"""
What the WebSocket port answers over HTTP: ``/healthz``, the dashboard
where one is served, and the MQTT WebSocket on every other path.
"""

import json
import time

from twisted.web.resource import Resource


class Health(Resource):
    """``GET /healthz``: 200 and a small JSON status while the router runs."""

    isLeaf = True

    def __init__(self, router, clock):
        super().__init__()
        self.router = router
        self.clock = clock
        self.started = time.time()

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"x-content-type-options", b"nosniff")
        router = self.router
        status = {
            "status": "ok",
            "uptime_s": round(time.time() - self.started, 1),
            "sessions": len(router.sessions),
            "subscriptions": router.subscriptions.count,
            "retained": len(router.retained),
            **router.stats.as_dict(),
        }
        return json.dumps(status).encode()


class Root(Resource):
    """
    ``/healthz`` for HTTP; with a dashboard, requests that do not ask for
    a WebSocket are the dashboard's; every other path is the MQTT
    WebSocket.
    """

    def __init__(self, websocket, health, dashboard=None):
        super().__init__()
        self._websocket = websocket
        self._health = health
        self._dashboard = dashboard

    def _is_page(self, request):
        upgrade = request.getHeader(b"upgrade")
        if self._dashboard is None or (upgrade is not None and upgrade.lower() == b"websocket"):
            return False
        # One request per connection: the guard's deadline and byte budget
        # are for one handshake, not a page's keep-alive.
        request.channel.persistent = False
        request.setHeader(b"connection", b"close")
        return True

    def getChild(self, path, request):
        if request.path == b"/healthz":
            return self._health
        if self._is_page(request):
            return self._dashboard.getChildWithDefault(path, request)
        return self._websocket

    def render(self, request):
        if self._is_page(request):
            return self._dashboard.render(request)
        return self._websocket.render(request)

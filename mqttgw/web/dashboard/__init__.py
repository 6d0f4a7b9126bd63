"""
The dashboard: plain ES modules, CSS and one HTML page shipped in the
package and served as they are (no build step).  The files are read once,
at start-up, so serving them never touches the disk on the reactor
thread; the page may load nothing from elsewhere (the Content Security
Policy says so to the browser, too).
"""

from pathlib import Path

from twisted.web.pages import notFound
from twisted.web.resource import Resource

STATIC = Path(__file__).with_name("static")

TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
}

# Same origin only: scripts, styles, the API and the MQTT WebSocket
# ('self' covers ws: and wss: to the same host).
POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    b" connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def _load():
    files = {}
    for path in sorted(STATIC.rglob("*")):
        kind = TYPES.get(path.suffix)
        if kind is not None and path.is_file():
            files[path.relative_to(STATIC).as_posix()] = (path.read_bytes(), kind)
    return files


class StaticFiles(Resource):
    """The dashboard's files, from memory; ``/`` is index.html."""

    isLeaf = True

    def __init__(self, files):
        super().__init__()
        self.files = files

    def render_GET(self, request):
        name = b"/".join(request.prepath[-1:] + request.postpath).decode("utf-8", "replace")
        found = self.files.get(name or "index.html")
        if found is None:
            # Escaped by the page: the name is the caller's.
            return notFound("No Such Resource", f"no such file: {name}").render(request)
        body, kind = found
        request.setHeader(b"content-type", kind)
        request.setHeader(b"content-security-policy", POLICY)
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"referrer-policy", b"no-referrer")
        # Files change only with the package: revalidate, never stale.
        request.setHeader(b"cache-control", b"no-cache")
        return body

    render_HEAD = render_GET


class Dashboard(Resource):
    """A root whose named children (the API, health) come first; the rest is the dashboard."""

    def __init__(self):
        super().__init__()
        self.static = StaticFiles(_load())

    def getChild(self, path, request):
        return self.static

    def render_GET(self, request):
        return self.static.render_GET(request)

    render_HEAD = render_GET

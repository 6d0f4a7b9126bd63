"""
The admin API called as its clients call it: in process over the fake
broker through treq's StubTreq (``API``), or over HTTP to the admin
listener of a gateway under twistd (``request``).
"""

import base64
import json
import urllib.error
import urllib.request

from treq.testing import StubTreq
from twisted.trial.unittest import SynchronousTestCase

from mqttgw.service.gateway import Gateway
from mqttgw.web.admin import admin_site
from mqttgw.web.metrics import Metrics

# successResultOf, as SynchronousTestCase has it.
successResultOf = SynchronousTestCase().successResultOf

URL = "http://127.0.0.1:9883"
USERS = {"root": "rootpw", "viewer": "viewpw", "device": "devpw"}


class API:
    """The admin listener's resources, called as an HTTP client would."""

    def __init__(self, broker, portal=None, roles=None, **options):
        self.gateway = Gateway(broker.router, broker.clock)
        site = admin_site(self.gateway, Metrics(broker.router), portal, roles, **options)
        self.http = StubTreq(site.resource)

    def call(self, method, path, user=None, password=None, headers=None):
        """(status, headers, body) of a request; the answer must be there at once."""
        headers = dict(headers or {})
        if user is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        response = successResultOf(self.http.request(method, URL + path, headers=headers))
        return response.code, response.headers, successResultOf(response.content())

    def json(self, method, path, **kwargs):
        """(status, the JSON body) of a request."""
        status, headers, body = self.call(method, path, **kwargs)
        assert headers.getRawHeaders("content-type") == ["application/json"]
        return status, json.loads(body)


def request(port, path, method="GET", user=None, password=None, token=None):
    """(status, headers, body) of one HTTP request."""
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if user is not None:
        r.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    if token is not None:
        r.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(r, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()

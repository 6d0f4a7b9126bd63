"""
The manual (docs/): the site and the manual pages build with warnings as
errors, every internal link resolves, and the generated reference lists
exactly what exists: every configuration key, command-line option,
/metrics series, $SYS topic and admin route, and nothing else.  What
exists is found here from the running code, not from the generator.
"""

import html.parser
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _require_sphinx():
    try:
        import furo  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as e:
        message = f"the manual's tools are not installed ({e.name}; pip install -e '.[docs]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (required under CI)")
        pytest.skip(message)


def _build(builder, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, str(DOCS), str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The site and the manual pages, built once for this module's tests."""
    _require_sphinx()
    out = tmp_path_factory.mktemp("docs")
    return types.SimpleNamespace(html=_build("html", out / "html"), man=_build("man", out / "man"))


class _Terms(html.parser.HTMLParser):
    """The text of every <dt> of a page: the reference's entries."""

    def __init__(self):
        super().__init__()
        self.terms, self.ids, self.links = [], set(), []
        self._in = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name):
                self.links.append(attrs[name])
        if tag == "dt":
            self._in += 1
            self.terms.append("")

    def handle_endtag(self, tag):
        if tag == "dt":
            self._in -= 1

    def handle_data(self, data):
        if self._in:
            self.terms[-1] += data


def _page(built, name):
    parser = _Terms()
    parser.feed((built.html / name).read_text())
    return parser


def _terms(built, name):
    return [" ".join(t.split()) for t in _page(built, name).terms]


def test_the_site_and_the_manual_pages_build_without_warnings(built):
    pages = {"mqttgw.8": "mqttgw", "mqttgw.toml.5": "mqttgw.toml", "mqttgw-ctl.8": "mqttgw-ctl",
             "mqttgw-passwd.1": "mqttgw-passwd"}
    for filename, name in pages.items():
        text = (built.man / filename).read_text()
        assert re.search(rf'^\.TH "{re.escape(name.upper())}" "{filename[-1]}"', text, re.M), filename
    assert "max_packet_size" in (built.man / "mqttgw.toml.5").read_text()
    for page in ("guide/getting-started", "guide/securing", "guide/operations", "guide/performance",
                 "reference/metrics", "changelog"):
        assert (built.html / f"{page}.html").exists(), page


def test_every_internal_link_and_anchor_resolves(built):
    pages = {p.resolve(): _page(built, p.relative_to(built.html)) for p in built.html.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("//"):
                continue
            path, _, anchor = link.partition("#")
            path = path.partition("?")[0]
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append((page.name, link))
            elif anchor and target.suffix == ".html" and anchor not in pages[target].ids:
                broken.append((page.name, link))
    assert broken == []


def test_the_configuration_reference_lists_every_key_and_no_other(built):
    from mqttgw.bridges.settings import BRIDGE_KEYS
    from mqttgw.pipeline import settings as pipeline
    from mqttgw.service.config import KEYS, LISTENER_KEYS

    existing = {k.path for k in KEYS + LISTENER_KEYS + BRIDGE_KEYS} | {f"pipeline.{n}" for n in pipeline.KEYS}
    listed = set(_terms(built, "man/mqttgw.toml.html"))
    assert listed == existing
    text = (built.html / "man/mqttgw.toml.html").read_text()
    # Whether a reload applies each key, as the reload service decides.
    from mqttgw.service.reload import NEEDS_RESTART

    assert text.count("SIGHUP: needs a restart") == sum(k.path.startswith(NEEDS_RESTART) for k in KEYS)
    assert text.count("SIGHUP: applied") == sum(not k.path.startswith(NEEDS_RESTART) for k in KEYS)


def _options_listed(terms):
    """The option strings of the reference's entries (``-c CONFIG, --config CONFIG``)."""
    return {word for term in terms for word in re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", term)}


def test_twistd_mqttgw_options_are_listed_and_no_other(built):
    from mqttgw.service.tap import Options

    options = Options()
    existing = {"--" + o.rstrip("=") for o in options.longOpt} | {
        "-" + s.rstrip(":") for s in options.shortOpt if s.rstrip(":")
    }
    assert _options_listed(_terms(built, "man/mqttgw.html")) == existing


def _argparse_options(parser):
    import argparse

    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _argparse_options(sub)
        found |= set(action.option_strings)
    return found - {"-h", "--help"}


@pytest.mark.parametrize(
    "page, parsers",
    [
        ("man/mqttgw-ctl.html", ["mqttgw.ctl:build_parser"]),
        ("man/mqttgw-passwd.html", ["mqttgw.passwd:build_parser"]),
        ("reference/pipeline.html", [
            "mqttgw.pipeline.cli:_parser", "mqttgw.pipeline.command:submit_parser", "mqttgw.pipeline.connect_server:parser",
        ]),
    ],
)
def test_each_commands_options_are_listed_and_no_other(built, page, parsers):
    import importlib

    existing = set()
    for spec in parsers:
        module, _, function = spec.partition(":")
        existing |= _argparse_options(getattr(importlib.import_module(module), function)())
    assert _options_listed(_terms(built, page)) == existing


def _gateway_parts(router, reactor):
    """A real bridge on ``router``, a store and an archive as the views read them."""
    from mqttgw.bridges.bridge import MQTTBridgeKind
    from mqttgw.broker.sparkplug import Sparkplug

    router.sparkplug = Sparkplug(router, reactor)
    # Its upstream is never answered: what it reports is there all the same.
    settings = MQTTBridgeKind.check({"name": "up", "addresses": ["127.0.0.1:1001"], "rules": ["t/# out 1"]})
    bridge = MQTTBridgeKind.make_service(router, settings, reactor)
    bridge.startService()
    # Counters whose topics appear once they are not zero.
    bridge.refused = 1
    router.stats.clients_v5 = router.stats.messages_expired = 1
    store = types.SimpleNamespace(state="ok", last_commit_seconds=0.001, failed=None, on_commit=None)
    archive = types.SimpleNamespace(written=0, dropped=0)
    return bridge, store, archive


def test_every_sys_topic_is_listed_with_its_meaning_and_no_other(built, router, reactor):
    from mqttgw.web.systopics import SysTopics

    bridge, store, _archive = _gateway_parts(router, reactor)
    topics = SysTopics(router, reactor, 10, [bridge], store)
    topics.values()
    reactor.advance(10)
    name = bridge.status()["name"]
    existing = {
        re.sub(r"/(1min|5min|15min)$", "/PERIOD", t.replace(f"/bridge/{name}/", "/bridge/BRIDGE/"))
        for t in topics.values()
    }
    listed = {t for t in _terms(built, "reference/metrics.html") if t.startswith("$SYS/")}
    assert listed == existing


def test_every_metrics_series_is_listed_and_no_other(built, router, reactor):
    from mqttgw.web.metrics import Metrics

    bridge, store, archive = _gateway_parts(router, reactor)
    listener = types.SimpleNamespace(kind="tcp", description="tcp:1883", port=None)
    metrics = Metrics(router, [listener], [bridge], store, archive)
    # What /metrics serves, a histogram's _created series aside.
    served = set(re.findall(r"^# TYPE (\S+) ", metrics.text().decode(), re.M))
    existing = {name for name in served if not name.endswith("_created")}
    listed = {
        t.split("{")[0].split()[0] for t in _terms(built, "reference/metrics.html") if t.startswith("mqttgw_")
    }
    assert listed == existing


def test_the_guides_name_only_series_that_exist(built):
    listed = {
        t.split("{")[0].split()[0] for t in _terms(built, "reference/metrics.html") if t.startswith("mqttgw_")
    }
    # Counters are named with or without the _total the exposition adds.
    known = listed | {name.removesuffix("_total") for name in listed}
    named = {
        name for page in (DOCS / "guide").glob("*.rst")
        for name in re.findall(r"\bmqttgw_[a-z0-9_]*[a-z0-9]\b", page.read_text())
    }
    assert named and named - known == set()


def test_every_admin_route_is_listed_and_no_other(built):
    from twisted.internet.task import Clock

    from mqttgw.web import admin

    site = admin.admin_site(types.SimpleNamespace(clock=Clock()), types.SimpleNamespace(), local=True)
    root = site.resource
    existing = set()
    for prefix, parent in (("/", root), ("/api/", root.children[b"api"])):
        for segment, resource in parent.children.items():
            if segment == b"api":
                continue
            for method in ("GET", "PUT", "POST", "DELETE"):
                if hasattr(resource, "render_" + method):
                    existing.add((method, prefix + segment.decode()))
    listed = set()
    for term in _terms(built, "reference/admin-api.html"):
        method, path = term.split()
        listed.add((method, "/".join(path.split("?")[0].split("/")[:3])))
    assert listed == existing


def test_the_bench_results_file_is_a_table_the_manual_includes(tmp_path):
    _require_sphinx()
    import docutils.core

    from bench import run

    report = {
        "machine": {"cpus": 2, "python": "3.11.7", "platform": "Linux"},
        "results": {
            "mqttgw": {"fan-in qos0": {"per_second": 300.0, "lost": 0}},
            "mosquitto": {"fan-in qos0": {"per_second": 200.0, "lost": 4}},
        },
    }
    text = run.rst(report, ["--duration", "8"])
    assert text.startswith("The last run, on a 2-core machine (Python 3.11.7, ``--duration 8``):")
    document = docutils.core.publish_doctree(text, settings_overrides={"halt_level": 2, "report_level": 2})
    rows = [[entry.astext() for entry in row.children] for row in document.findall(lambda n: n.tagname == "row")]
    assert rows[0] == ["scenario", "mqttgw", "mosquitto", "mqttgw/mosquitto"]
    assert rows[1][:3] == ["fan-in qos0 (msg/s)", "300", "200 (lost 4)"]
    # The committed results file is in the same form, and the page includes it.
    committed = (ROOT / "bench/results/latest.rst").read_text()
    docutils.core.publish_doctree(committed, settings_overrides={"halt_level": 2, "report_level": 2})
    assert ".. include:: ../../bench/results/latest.rst" in (DOCS / "guide/performance.rst").read_text()

"""
The generated reference: directives that write a page's reference part
from the code itself at build time, so no reference page is edited by
hand.  Configuration keys come from the schema rows, options from the
parsers, ``/metrics`` series and ``$SYS`` topics from what the gateway
publishes (collected once from a fully equipped stand-in), admin routes
from the admin module's route table.
"""

import argparse
import importlib
import re
import types

from docutils.parsers.rst import Directive, directives
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles

# A bridge named so in the stand-in; pages show the name as BRIDGE.
BRIDGE = "BRIDGE"


class _Generated(Directive):
    """A directive whose content is reStructuredText made by ``lines()``."""

    has_content = False

    def run(self):
        _note_generated(self.state.document.settings.env)
        node = nodes.section() if self.titles else nodes.container()
        node.document = self.state.document
        text = StringList(list(self.lines()), source=f"<{self.name}>")
        nested_parse_with_titles(self.state, text, node)
        return node.children

    titles = False


def _literal(value):
    if value in ("", None):
        return "none"
    if isinstance(value, list):
        return "``[" + ", ".join(f'"{v}"' for v in value) + "]``" if value else "``[]``"
    if isinstance(value, bool):
        return "``true``" if value else "``false``"
    if isinstance(value, str):
        return f'``"{value}"``'
    return f"``{value}``"


def _one_line(text):
    return " ".join(str(text).split())


def key_lines(key, flags=True, restart=()):
    """A schema row as a definition list item."""
    from mqttgw.schema import REQUIRED, type_name

    default = "required" if key.default is REQUIRED else _literal(key.default)
    yield f"``{key.path}``"
    yield f"   {_sentence(key.help)}"
    doc = getattr(key, "doc", None)
    if doc:
        yield ""
        yield f"   {_one_line(doc)}"
    yield ""
    facts = [f"Type: {type_name(key.type)}", f"default: {default}"]
    if key.minimum is not None:
        facts.append(f"at least ``{key.minimum}``")
    if key.maximum is not None:
        facts.append(f"at most ``{key.maximum}``")
    if key.choices is not None:
        facts.append("one of " + ", ".join(_literal(c) if c == "" else f"``{c}``" for c in key.choices))
    if flags:
        facts.append(f"flag: ``--{key.flag}``" + (" (repeatable)" if key.type is list else ""))
    if restart is not None:
        facts.append("SIGHUP: " + ("needs a restart" if key.path.startswith(restart) else "applied"))
    yield "   " + "; ".join(facts) + "."
    yield ""


class ConfigReference(_Generated):
    """Every key of the TOML file, section by section."""

    titles = True

    def lines(self):
        from mqttgw.bridges.settings import BRIDGE_KEYS
        from mqttgw.pipeline import settings as pipeline
        from mqttgw.service.config import KEYS, LISTENER_KEYS
        from mqttgw.service.example import sections
        from mqttgw.service.reload import NEEDS_RESTART

        for section in sections():
            yield from _heading(f"[{section}]")
            yield from _introduction(section)
            for key in KEYS:
                if key.section == section:
                    yield from key_lines(key, restart=NEEDS_RESTART)
        yield from _heading("[[listener]]")
        yield from _introduction("listener")
        for key in LISTENER_KEYS:
            yield from key_lines(key, flags=False, restart=None)
        yield from _heading("[[bridge]]")
        yield from _introduction("bridge")
        for key in BRIDGE_KEYS:
            yield from key_lines(key, flags=False, restart=None)
        yield from _heading("[pipeline]")
        yield from _introduction("pipeline")
        for name, (kind, default, text) in pipeline.KEYS.items():
            yield f"``pipeline.{name}``"
            yield f"   {_sentence(text)}"
            if name in pipeline.DOCS:
                yield ""
                yield f"   {_one_line(pipeline.DOCS[name])}"
            yield ""
            kind_name = {list: "a list of strings", dict: "a table", bool: "true or false", str: "a string"}[kind]
            yield f"   Type: {kind_name}; default: {_literal(default) if kind is not dict else '``{}``'}."
            yield ""


def _introduction(section):
    """A section's introduction, shared with the example file."""
    from mqttgw.service.example import INTRODUCTIONS

    if section in INTRODUCTIONS:
        yield _one_line(INTRODUCTIONS[section])
        yield ""


def _heading(title, underline="-"):
    yield ""
    yield title
    yield underline * len(title)
    yield ""


class TwistdOptions(_Generated):
    """``twistd mqttgw``'s options, from its usage.Options class."""

    def lines(self):
        from mqttgw.service.tap import Options

        for name, short, _default, text in Options.optParameters:
            metavar = name.upper().replace("-", "_")
            yield _option_term(name, short, metavar)
            yield f"   {_sentence(text)}"
            yield ""
        for name, short, text in Options.optFlags:
            yield _option_term(name, short, None)
            yield f"   {_sentence(text)}"
            yield ""
        for attribute in sorted(dir(Options)):
            if not attribute.startswith("opt_") or attribute == "opt_help":
                continue
            name = attribute[4:].replace("_", "-")
            method = getattr(Options, attribute)
            repeatable = method.__code__.co_argcount > 1
            yield _option_term(name, None, name.upper().replace("-", "_") if repeatable else None)
            yield f"   {_sentence(method.__doc__)}"
            yield ""
        yield "``--help``"
        yield "   Print the options and exit."
        yield ""


def _option_term(name, short, metavar):
    spelled = f"--{name}" + (f" {metavar}" if metavar else "")
    if short:
        spelled = f"-{short}" + (f" {metavar}" if metavar else "") + f"``, ``{spelled}"
    return f"``{spelled}``"


def _sentence(text):
    """Help text as a sentence: its first letter up, a full stop."""
    text = _rst_escape(_one_line(text))
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _rst_escape(text):
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|")


class ArgparseOptions(_Generated):
    """A command's options and sub-commands, from its argparse parser."""

    required_arguments = 1

    def lines(self):
        module, _, function = self.arguments[0].partition(":")
        parser = getattr(importlib.import_module(module), function)()
        yield from _parser_lines(parser, parser.prog)


def _parser_lines(parser, prog, depth=0):
    usage = " ".join(parser.format_usage().split())
    yield f"``{usage.removeprefix('usage: ')}``"
    yield ""
    if parser.description and depth == 0:
        # Descriptions are the modules' own reStructuredText.
        yield _one_line(parser.description)
        yield ""
    subcommands = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            subcommands = [(name, sub, helps.get(name)) for name, sub in action.choices.items()]
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            term = ", ".join(f"``{o}{metavar}``" for o in action.option_strings)
        else:
            term = f"``{action.metavar or action.dest}``"
        yield term
        yield "   " + (_sentence(action.help % {"default": action.default, "prog": prog})
                       if action.help else "An argument.")
        if action.choices and not action.option_strings:
            yield "   One of " + ", ".join(f"``{c}``" for c in action.choices) + "."
        yield ""
    for name, sub, text in subcommands:
        yield f"**{name}**"
        yield f"   {_sentence(text) if text else 'The ``' + name + '`` command.'}"
        yield ""
        for line in _parser_lines(sub, f"{prog} {name}", depth + 1):
            yield "   " + line if line else ""


# The stand-in the $SYS and /metrics pages are collected from: a router
# with Sparkplug awareness, a store, an archive, a listener and a bridge
# whose status has every field a bridge reports.

def _bridge_status():
    return {
        "name": BRIDGE, "kind": "mqtt", "protocol": "3.1.1", "addresses": [], "connected": True,
        "connected_since": 0, "queued": 0, "inflight": 0, "window": 0, "dropped": 0,
        "queued_bytes": 0, "oldest_queued_s": 0, "drain_rate": 0.0,
        "drops": {"queue_full": 0, "too_large": 0, "expired": 0, "refused": 0},
        "link_changes": 0, "sent": 0, "received": 0, "refused": 1,
        "reason_codes": {"PUBACK quota_exceeded": 1}, "upstream_limits": {},
        "address": "central:1883", "disconnected_since": None, "disconnected_s": None,
        "last_failure": None, "failures": {}, "fallbacks": {}, "clean_fallback": False,
    }


def equipped():
    """``(router, clock, bridges, store, archive, listeners)`` of a stand-in gateway."""
    from twisted.internet.task import Clock

    from mqttgw.service import build, config

    clock = Clock()
    router = build.build_router(config.build({}, {}), clock)
    stats = router.stats
    # Counters that show their topics once they are not zero.
    stats.clients_v5 = stats.messages_expired = 1
    bridge = types.SimpleNamespace(status=_bridge_status)
    store = types.SimpleNamespace(state="ok", last_commit_seconds=0.001, failed=None, on_commit=None)
    archive = types.SimpleNamespace(written=0, dropped=0)
    listener = types.SimpleNamespace(kind="tcp", description="tcp:1883", port=None)
    return router, clock, [bridge], store, archive, [listener]


def sys_topics():
    """``{topic: meaning}`` of every ``$SYS`` topic, load averages by PERIOD."""
    from mqttgw.web import systopics

    router, clock, bridges, store, _archive, _listeners = equipped()
    publisher = systopics.SysTopics(router, clock, 10, bridges, store)
    publisher.values()
    clock.advance(10)
    topics = {}
    for topic in publisher.values():
        pattern = re.sub(r"/(1min|5min|15min)$", "/PERIOD", topic)
        topics[pattern] = systopics.meaning(pattern) if systopics.known(pattern) else None
    return topics


def metric_families():
    """``[(name, kind, labels, help)]`` of every ``/metrics`` series."""
    from mqttgw.web.metrics import Metrics

    router, _clock, bridges, store, archive, listeners = equipped()
    metrics = Metrics(router, listeners, bridges, store, archive)
    families = []
    for family in metrics.registry.collect():
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        # As /metrics serves it: a counter's name ends in _total.
        name = family.name + ("_total" if family.type == "counter" else "")
        families.append((name, family.type, labels, family.documentation))
    return families


class SysTopicsReference(_Generated):
    def lines(self):
        topics = sys_topics()
        unknown = [topic for topic, text in topics.items() if text is None]
        if unknown:
            raise self.error(f"$SYS topics without a meaning in mqttgw.web.systopics.MEANINGS: {', '.join(unknown)}")
        for topic, text in topics.items():
            yield f"``{topic}``"
            yield f"   {_sentence(text)}"
            yield ""


class MetricsReference(_Generated):
    def lines(self):
        for name, kind, labels, text in metric_families():
            shown = name + ("{" + ", ".join(labels) + "}" if labels else "")
            yield f"``{shown}`` ({kind})"
            yield f"   {_sentence(text)}"
            yield ""


ROUTE = re.compile(r"^\s+(GET|PUT|POST|DELETE|HEAD)\s+(/\S+)\s+(.+)$")


def admin_routes():
    """``[(method, path, meaning)]`` from mqttgw.web.admin's route table."""
    from mqttgw.web import admin

    routes = []
    for line in admin.__doc__.splitlines():
        match = ROUTE.match(line)
        if match:
            routes.append(match.groups())
    return routes


class AdminRoutesReference(_Generated):
    def lines(self):
        from mqttgw.web import admin

        for path, resource in (("/healthz", admin.Healthz), ("/readyz", admin.Readyz), ("/metrics", admin.MetricsPage)):
            yield f"``GET {path}``"
            yield f"   {_sentence(resource.__doc__.strip().split(chr(10) * 2)[0])}"
            yield ""
        for method, path, text in admin_routes():
            yield f"``{method} {path}``"
            yield f"   {_sentence(text)}"
            yield ""


class Newsfragments(_Generated):
    """The changelog's fragments not yet released, grouped by type."""

    def lines(self):
        import tomllib
        from pathlib import Path

        root = Path(self.state.document.settings.env.srcdir).parent
        config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["towncrier"]
        fragments = sorted((root / config["directory"]).glob("*.rst"))
        for kind in config["type"]:
            found = [f for f in fragments if f.name.split(".")[-2] == kind["directory"]]
            if not found:
                continue
            yield f"**{kind['name']}**"
            yield ""
            for fragment in found:
                text = fragment.read_text().strip().splitlines()
                yield "- " + text[0]
                yield from ("  " + line if line else "" for line in text[1:])
            yield ""


class MarkdownTables(Directive):
    """
    A Markdown file of headings, paragraphs and pipe tables (the
    conformance maps in tests/) shown as it is, without a Markdown parser.
    """

    required_arguments = 1

    def run(self):
        from pathlib import Path

        env = self.state.document.settings.env
        _note_generated(env)
        # Relative to the page, as an include's path is.
        path = (Path(env.doc2path(env.docname)).parent / self.arguments[0]).resolve()
        env.note_dependency(str(path))
        out, paragraph, rows = [], [], []

        def flush():
            if paragraph:
                out.append(nodes.paragraph("", "", *_inline(" ".join(paragraph))))
                paragraph.clear()
            if rows:
                out.append(_table(rows))
                rows.clear()

        for line in path.read_text().splitlines():
            if line.startswith("|"):
                if paragraph:
                    flush()
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if not all(set(c) <= set("-: ") for c in cells):
                    rows.append(cells)
            elif line.startswith("#"):
                flush()
                if not line.startswith("# "):
                    out.append(nodes.rubric("", "", *_inline(line.lstrip("#").strip())))
            elif line.strip():
                if rows:
                    flush()
                paragraph.append(line.strip())
            else:
                flush()
        flush()
        return out


def _inline(text):
    """Text with Markdown's `code` spans as literals."""
    parts = text.split("`")
    return [nodes.literal(part, part) if i % 2 else nodes.Text(part) for i, part in enumerate(parts) if part]


def _table(rows):
    width = max(len(r) for r in rows)
    table = nodes.table()
    group = nodes.tgroup(cols=width)
    table += group
    for _ in range(width):
        group += nodes.colspec(colwidth=1)
    head, body = nodes.thead(), nodes.tbody()
    for i, cells in enumerate(rows):
        row = nodes.row()
        for cell in cells + [""] * (width - len(cells)):
            row += nodes.entry("", nodes.paragraph("", "", *_inline(cell)))
        (head if i == 0 else body).append(row)
    group += head
    group += body
    return table


# Pages written from the code are read again at every build: Sphinx sees
# only their sources, which do not change when the code does.

def _note_generated(env):
    if not hasattr(env, "mqttgw_generated"):
        env.mqttgw_generated = set()
    env.mqttgw_generated.add(env.docname)


def _outdated(app, env, added, changed, removed):
    return sorted(getattr(env, "mqttgw_generated", set()) - set(removed))


def _purge(app, env, docname):
    getattr(env, "mqttgw_generated", set()).discard(docname)


def _merge(app, env, docnames, other):
    env.mqttgw_generated = getattr(env, "mqttgw_generated", set()) | getattr(other, "mqttgw_generated", set())


def setup(app):
    app.connect("env-get-outdated", _outdated)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    directives.register_directive("mqttgw-markdown", MarkdownTables)
    directives.register_directive("mqttgw-newsfragments", Newsfragments)
    directives.register_directive("mqttgw-config", ConfigReference)
    directives.register_directive("mqttgw-twistd-options", TwistdOptions)
    directives.register_directive("mqttgw-argparse", ArgparseOptions)
    directives.register_directive("mqttgw-sys-topics", SysTopicsReference)
    directives.register_directive("mqttgw-metrics", MetricsReference)
    directives.register_directive("mqttgw-admin-routes", AdminRoutesReference)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

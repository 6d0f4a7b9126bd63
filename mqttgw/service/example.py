"""
The example configuration file, ``deploy/mqttgw.toml``, written from the
schema rows that check the file and make the manual's reference, so the
example cannot drift from what the gateway accepts: a key added, or its
default or text changed, shows here without a second copy to edit.

    python -m mqttgw.service.example [--output deploy/mqttgw.toml]

The texts are the rows' ``help`` and ``doc``, written in
reStructuredText for the manual; comments show them without the double
backquotes of their literals.
"""

import argparse
import json
import re
import sys
import textwrap

from mqttgw.bridges.settings import BRIDGE_KEYS
from mqttgw.pipeline import settings as pipeline
from mqttgw.schema import REQUIRED
from mqttgw.service.config import KEYS, LISTENER_KEYS, inherited_key

WIDTH = 76

HEADER = """\
mqttgw configuration: every key, with its default value.

Options given on the command line win over this file: each key's flag is
named under its explanation (limits.max_packet_size is --max-packet-size).
A key the gateway does not know, or a value of the wrong type or out of
its bounds, stops start-up with one line naming the key.

This file is written from the settings' schema by
python -m mqttgw.service.example."""

# What a section is about, before its keys; also printed by the manual's
# reference (docs/_ext/mqttgw_reference.py), hence reStructuredText.
INTRODUCTIONS = {
    "listeners": (
        "Each listener is a port number (every interface) or a Twisted endpoint"
        ' string, e.g. ``"tcp:1883:interface=127.0.0.1"`` or'
        ' ``"tcp6:1883:interface=\\\\:\\\\:"``.  With no listener at all, here'
        " or in ``[[listener]]`` tables, mqttgw listens on TCP port 1883."
    ),
    "auth": (
        "Who may connect, and what they may do.  SIGHUP reads the password file"
        " and the ACL again without dropping connections; a file that fails to"
        " parse leaves the old rules in force."
    ),
    "simple_bridge": (
        "One bridge, named ``default``, for the simple case: the same as the"
        " flags ``--bridge HOST:PORT`` and ``--bridge-topic RULE``.  Use"
        " ``[[bridge]]`` tables for anything more."
    ),
    "mqtt": (
        "Settings for MQTT 5.0 clients are what CONNACK tells them, named as"
        " mosquitto names them where it has them."
    ),
    "mqttsn": (
        "The MQTT-SN 1.2 listeners (``listeners.mqttsn``): discovery, QoS -1,"
        " and the Paho MQTT-SN Gateway's clients and pre-defined topics"
        " files, read as they are.  A reload leaves them as they are: a"
        " change needs a restart."
    ),
    "listener": (
        "Listeners with their own security settings, beside (or instead of)"
        " those of ``[listeners]``: one table per listener.  What a table leaves"
        " out comes from ``[auth]``, ``[tls]`` and ``[websocket]``: for example a"
        " ``tcp`` listener on loopback with ``allow_anonymous = true`` beside a"
        " ``tls`` listener on 8883 that asks for passwords.  A reload leaves"
        " listeners as they are: a change needs a restart."
    ),
    "bridge": (
        "Bridges forward chosen topics to and from upstream brokers, one"
        " ``[[bridge]]`` table each.  A bridge is a client of this broker with a"
        " persistent session of its own, so what cannot be forwarded while the"
        " upstream is away waits in the store (in order, surviving restarts) and"
        " is removed only once the upstream acknowledged it.  A reload starts,"
        " stops or restarts only the bridges added, removed or changed."
    ),
    "pipeline": (
        "Options of ``mqttgw-pipeline --config /etc/mqttgw/mqttgw.toml``"
        " (``python -m mqttgw.pipeline``), whose flags win over them.  The"
        " gateway only checks this section at start-up."
    ),
}

# Values shown for keys that have no default to show: those required in
# a table, and those worked out at start-up.
EXAMPLES = {
    "auth.allow_anonymous": False,
    "listener.kind": "tcp",
    "listener.address": "tcp:1883:interface=127.0.0.1",
    "listener.allow_anonymous": True,
    "bridge.name": "central",
    "bridge.addresses": ["central.example.net:8883", "central-2.example.net:8883"],
    # 8883 is MQTT over TLS: a copy that uncomments the table keeps it so.
    "bridge.tls": True,
    "bridge.rules": ["sensors/# out 1 site-7/ field/site-7/", "commands/# in 2 site-7/ field/site-7/"],
}



def plain(text):
    """reStructuredText as a comment shows it: literals without their marks."""
    return re.sub(r"\s*\n\s*", " ", str(text).replace("``", "")).strip()


def sentence(text):
    text = plain(text)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def comment(text, prefix="# "):
    return [
        prefix + line
        for line in textwrap.wrap(
            text, WIDTH - len(prefix), break_long_words=False, break_on_hyphens=False
        )
    ]


def toml_key(name):
    """A TOML key: bare when it may be, quoted otherwise (``spark.sql.x`` is one key, not three)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else toml(name)


def toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON's string escapes are TOML's basic string escapes.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {value!r}")


def assignment(name, value):
    """``name = value``; a long list a few items a line."""
    line = f"{name} = {toml(value)}"
    if len(line) <= WIDTH or not isinstance(value, list) or len(value) < 2:
        return [line]
    lines = [f"{name} = ["]
    row = ""
    for item in (toml(v) + "," for v in value):
        if row and len(row) + 1 + len(item) > WIDTH - 4:
            lines.append("    " + row)
            row = ""
        row = f"{row} {item}" if row else item
    return lines + ["    " + row, "]"]


def facts(key, flags):
    """A row's bounds, choices and flag, as the reference lists them."""
    parts = []
    if key.minimum is not None:
        parts.append(f"at least {key.minimum}")
    if key.maximum is not None:
        parts.append(f"at most {key.maximum}")
    if key.choices is not None:
        parts.append("one of " + ", ".join(toml(c) if c == "" else str(c) for c in key.choices))
    if flags:
        parts.append(f"flag --{key.flag}" + (" (repeatable)" if key.type is list else ""))
    return sentence("; ".join(parts)) if parts else ""


def explanation(key, flags=True):
    texts = [sentence(key.help), plain(key.doc or ""), facts(key, flags)]
    return "  ".join(t for t in texts if t)


def key_lines(key, flags=True, prefix=""):
    """A key's explanation and its ``name = value``; commented out when its
    value is worked out at start-up."""
    source = inherited_key(key.name) if key.section == "listener" else None
    if key.path in EXAMPLES:
        value = EXAMPLES[key.path]
    elif source is not None:
        value = source.default
    elif key.default is None or key.default is REQUIRED:
        raise ValueError(f"{key.path}: no default to show: give it one in EXAMPLES")
    else:
        value = key.default
    shown = "# " if key.default is None or source is not None else ""
    lines = comment(explanation(key, flags), prefix + "# ")
    return lines + [prefix + shown + line for line in assignment(key.name, value)]


def sections():
    """The main sections, in the order of their first key in KEYS."""
    order = []
    for key in KEYS:
        if key.section not in order:
            order.append(key.section)
    return order


def introduction(section, prefix="# "):
    text = INTRODUCTIONS.get(section)
    return comment(plain(text), prefix) if text else []


def commented_table(section, keys):
    intro = plain(INTRODUCTIONS[section]) + "  Uncomment the table below to use it."
    lines = comment(intro) + ["#", f"# [[{section}]]"]
    for key in keys:
        lines += key_lines(key, flags=False, prefix="# ")
    return lines


def pipeline_lines():
    lines = ["[pipeline]"] + introduction("pipeline")
    for name, (_kind, default, text) in pipeline.KEYS.items():
        doc = pipeline.DOCS.get(name)
        lines += [""] + comment(sentence(text) + ("  " + plain(doc) if doc else ""))
        lines += assignment(name, default)
    return lines


def render():
    """The example file's text."""
    lines = [("# " + line).rstrip() for line in HEADER.splitlines()]
    for section in sections():
        intro = introduction(section)
        lines += ["", f"[{section}]"] + intro
        for i, key in enumerate(k for k in KEYS if k.section == section):
            lines += ([""] if i or intro else []) + key_lines(key)
    lines += [""] + commented_table("listener", LISTENER_KEYS)
    lines += [""] + commented_table("bridge", BRIDGE_KEYS)
    lines += [""] + pipeline_lines()
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mqttgw.service.example",
        description="Print the example configuration file, every key with its default.",
    )
    parser.add_argument("--output", metavar="PATH", help="write it to PATH instead")
    args = parser.parse_args(argv)
    text = render()
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()

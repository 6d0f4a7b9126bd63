"""
``python -m mqttgw.ctl``: the admin API from a shell.

    python -m mqttgw.ctl [--url URL] [--user NAME] [--json] COMMAND

    clients                      connected clients
    kick CLIENT_ID               disconnect a client
    sessions                     persistent sessions
    sessions delete CLIENT_ID    remove a session not in use
    retained [FILTER]            retained messages (default: #)
    retained delete FILTER       clear retained messages
    bridges                      bridges with their state and queue
    bridge-set NAME FILE         add or replace a bridge at runtime
    bridge-delete NAME           remove a bridge at runtime

The password for ``--user`` comes from ``$MQTTGW_PASSWORD``; a token from
``$MQTTGW_TOKEN``.  Exits 0 on success, 1 with one line on failure.
"""

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_URL = "http://127.0.0.1:9883"


class CtlError(Exception):
    pass


def request(url, method="GET", user=None, password=None, token=None, timeout=10.0, body=None):
    req = urllib.request.Request(url, method=method, data=body)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    elif user is not None:
        basic = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        req.add_header("Authorization", f"Basic {basic}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read()).get("error", e.reason)
        except (ValueError, AttributeError):
            detail = e.reason
        raise CtlError(f"{method} {url}: {e.code} {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CtlError(f"cannot reach {url}: {reason}") from None


def _when(seconds):
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def table(rows, columns):
    """``rows`` (dicts) as aligned text columns ``[(heading, key, format)]``."""
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        cells.append([str(fmt(row.get(key)) if fmt else row.get(key, "")) for _, key, fmt in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells
    )


def _dash(value):
    return "-" if value is None else value


COLUMNS = {
    "clients": [
        ("CLIENT ID", "client_id", None),
        ("ADDRESS", "address", None),
        ("LISTENER", "listener", _dash),
        ("MQTT", "protocol", None),
        ("USER", "username", _dash),
        ("KEEPALIVE", "keepalive", None),
        ("SUBS", "subscriptions", None),
        ("QUEUED", "queued", None),
        ("INFLIGHT", "inflight", None),
        ("CONNECTED SINCE", "connected_since", _when),
    ],
    "sessions": [
        ("CLIENT ID", "client_id", None),
        ("CONNECTED", "connected", lambda v: "yes" if v else "no"),
        ("SUBSCRIPTIONS", "subscriptions", lambda v: " ".join(v) or "-"),
        ("QUEUED", "queued", None),
        ("INFLIGHT", "inflight", None),
        ("LAST SEEN", "last_seen", _when),
    ],
    "retained": [
        ("TOPIC", "topic", None),
        ("QOS", "qos", None),
        ("BYTES", "bytes", None),
        ("PAYLOAD", "payload", lambda v: (v if isinstance(v, str) else "<binary>")[:60]),
    ],
    "bridges": [
        ("NAME", "name", None),
        ("STATE", "connected", lambda v: "connected" if v else "down"),
        ("QUEUED", "queued", None),
        ("INFLIGHT", "inflight", None),
        ("DROPPED", "dropped", None),
        ("SENT", "sent", None),
        ("RECEIVED", "received", None),
        ("REFUSED", "refused", None),
        ("PROTOCOL", "protocol", None),
        ("ADDRESSES", "addresses", lambda v: ",".join(v)),
    ],
}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m mqttgw.ctl", description="Talk to a running mqttgw's admin API."
    )
    parser.add_argument("--url", default=os.environ.get("MQTTGW_URL", DEFAULT_URL),
                        help=f"the admin listener (default {DEFAULT_URL}, or $MQTTGW_URL)")
    parser.add_argument("--user", help="user name (password from $MQTTGW_PASSWORD)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("clients", help="connected clients")
    kick = commands.add_parser("kick", help="disconnect a client")
    kick.add_argument("client_id")
    sessions = commands.add_parser("sessions", help="persistent sessions; 'delete CLIENT_ID' removes one")
    sessions.add_argument("action", nargs="?", choices=["delete"])
    sessions.add_argument("client_id", nargs="?")
    retained = commands.add_parser("retained", help="retained messages; 'delete FILTER' clears them")
    retained.add_argument("words", nargs="*", metavar="[delete] FILTER")
    commands.add_parser("bridges", help="bridges, their state and queues")
    bridge_set = commands.add_parser(
        "bridge-set", help="add or replace a bridge at runtime from a [[bridge]] table (TOML or JSON file)"
    )
    bridge_set.add_argument("name")
    bridge_set.add_argument("file", help="the table: a .json object, or TOML with the keys at top level")
    bridge_delete = commands.add_parser("bridge-delete", help="remove a bridge at runtime")
    bridge_delete.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "sessions" and args.action == "delete" and not args.client_id:
        parser.error("sessions delete needs a CLIENT_ID")
    if args.command == "retained":
        words = args.words
        args.delete = bool(words) and words[0] == "delete"
        if args.delete:
            words = words[1:]
            if len(words) != 1:
                parser.error("retained delete needs one FILTER")
        elif len(words) > 1:
            parser.error("retained takes at most one FILTER")
        args.filter = words[0] if words else "#"
    return args


def run(args):
    base = args.url.rstrip("/") + "/api/"
    auth = {
        "user": args.user,
        "password": os.environ.get("MQTTGW_PASSWORD"),
        "token": os.environ.get("MQTTGW_TOKEN"),
    }
    quote = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
    command = args.command
    if command == "clients":
        return request(base + "clients", **auth), "clients"
    if command == "kick":
        return request(base + "clients/" + quote(args.client_id), "DELETE", **auth), None
    if command == "sessions":
        if args.action == "delete":
            return request(base + "sessions/" + quote(args.client_id), "DELETE", **auth), None
        return request(base + "sessions", **auth), "sessions"
    if command == "retained":
        query = "retained?" + urllib.parse.urlencode({"filter": args.filter})
        if args.delete:
            return request(base + query, "DELETE", **auth), None
        return request(base + query, **auth), "retained"
    if command == "bridges":
        return request(base + "bridges", **auth), "bridges"
    if command == "bridge-set":
        table = _read_table(args.file)
        body = json.dumps(table).encode()
        return request(base + "bridges/" + quote(args.name), "PUT", body=body, **auth), None
    if command == "bridge-delete":
        return request(base + "bridges/" + quote(args.name), "DELETE", **auth), None
    raise CtlError(f"unknown command {command}")


def _read_table(path):
    import tomllib

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CtlError(f"cannot read {path}: {e.strerror}") from None
    try:
        if path.endswith(".json"):
            table = json.loads(data)
        else:
            table = tomllib.loads(data.decode())
            # A file written as [[bridge]] holds one table.
            if list(table) == ["bridge"] and isinstance(table["bridge"], list) and len(table["bridge"]) == 1:
                table = table["bridge"][0]
    except (ValueError, UnicodeDecodeError) as e:
        raise CtlError(f"{path}: {e}") from None
    if not isinstance(table, dict):
        raise CtlError(f"{path}: not a table")
    return table


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result, kind = run(args)
    except CtlError as e:
        print(f"mqttgw.ctl: {e}", file=sys.stderr)
        return 1
    if args.json or kind is None:
        if kind is None and not args.json:
            if "kicked" in result:
                print(f"kicked {result['kicked']}")
            elif "bridge" in result:
                print(f"bridge {result['bridge']}: {result['changes'] or 'unchanged'}")
            elif "deleted" in result and isinstance(result["deleted"], list):
                print(f"deleted {len(result['deleted'])} retained message(s)")
            else:
                print(f"deleted session {result['deleted']}")
        else:
            print(json.dumps(result, indent=1))
        return 0
    print(table(result, COLUMNS[kind]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""
``python -m mqttgw.ctl``: the admin API from a shell.

    python -m mqttgw.ctl [--socket PATH | --url URL [--user NAME]] [--json] COMMAND

    clients                      connected clients
    kick CLIENT_ID               disconnect a client
    sessions                     persistent sessions
    sessions delete CLIENT_ID    remove a session not in use
    retained [FILTER]            retained messages (default: #)
    retained delete FILTER       clear retained messages
    bridges                      bridges with their state and queue
    bridge-set NAME FILE         add or replace a bridge at runtime
    bridge-delete NAME           remove a bridge at runtime

By default it speaks over the gateway's Unix socket (``http.socket``,
mode 0600: whoever may open it may change everything, so no password is
asked): ``--socket PATH``, ``$MQTTGW_SOCKET``, the one ``--config FILE``
names, or ``./mqttgw-data/admin.sock``.  With ``--url`` (or
``$MQTTGW_URL``) it speaks to the admin listener over TCP, where changes
need credentials: the password for ``--user`` comes from
``$MQTTGW_PASSWORD``, a token from ``$MQTTGW_TOKEN``, both sent in the
Authorization header.  Exits 0 on success, 1 with one line on failure.
"""

import argparse
import base64
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse

from mqttgw.service import config

DEFAULT_SOCKET = os.path.join("mqttgw-data", "admin.sock")


class CtlError(Exception):
    pass


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the gateway's Unix socket."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(
    url, method="GET", user=None, password=None, token=None, timeout=10.0, body=None, socket_path=None
):
    """
    The JSON answer to ``method`` on ``url`` (a full URL, or with
    ``socket_path`` a path on the gateway's Unix socket).
    """
    headers = {"Host": "localhost"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif user is not None:
        basic = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {basic}"
    if socket_path is not None:
        where, path = socket_path, url
        connection = _UnixConnection(socket_path, timeout)
    else:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"{url}: not an http:// or https:// URL")
        where, path = url, parts.path + (f"?{parts.query}" if parts.query else "")
        headers["Host"] = parts.netloc
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
    except OSError as e:
        hint = ""
        if socket_path is not None and isinstance(e, FileNotFoundError):
            hint = " (is the gateway running with --http, and is this its socket? see --socket, --config)"
        raise CtlError(f"cannot reach {where}: {e.strerror or e}{hint}") from None
    finally:
        connection.close()
    if response.status >= 400:
        try:
            detail = json.loads(data).get("error", response.reason)
        except (ValueError, AttributeError):
            detail = response.reason
        raise CtlError(f"{method} {path}: {response.status} {detail}")
    try:
        return json.loads(data)
    except ValueError:
        raise CtlError(f"{method} {path}: the answer is not JSON") from None


def default_socket(config_path=None):
    """Where the gateway's Unix socket is: $MQTTGW_SOCKET, the configuration's, or the default."""
    if os.environ.get("MQTTGW_SOCKET"):
        return os.environ["MQTTGW_SOCKET"]
    if config_path is None:
        return DEFAULT_SOCKET
    try:
        settings = config.build(config.load_file(config_path), {})
    except config.ConfigError as e:
        raise CtlError(str(e)) from None
    if not settings.http.socket:
        raise CtlError(f"{config_path}: http.socket is empty: use --url")
    return os.path.join(settings.persistence.data_dir, settings.http.socket)


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
        ("UPSTREAM", "address", _dash),
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


def build_parser():
    """The command line, as parse_args() reads it and the manual page shows it."""
    parser = argparse.ArgumentParser(
        prog="python -m mqttgw.ctl", description="Talk to a running mqttgw's admin API."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--socket", help=f"the gateway's Unix socket (default $MQTTGW_SOCKET, or {DEFAULT_SOCKET})")
    where.add_argument("--config", "-c", help="the gateway's configuration file, to find its socket")
    where.add_argument("--url", default=os.environ.get("MQTTGW_URL"),
                       help="the admin listener over TCP instead, http://HOST:PORT (or $MQTTGW_URL)")
    parser.add_argument("--user", help="user name, with --url (password from $MQTTGW_PASSWORD)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("clients", help="connected clients")
    kick = commands.add_parser("kick", help="disconnect a client")
    kick.add_argument("client_id", help="the client to disconnect")
    sessions = commands.add_parser("sessions", help="persistent sessions; 'delete CLIENT_ID' removes one")
    sessions.add_argument("action", nargs="?", choices=["delete"], help="remove the session instead of listing")
    sessions.add_argument("client_id", nargs="?", help="the session's client id, with delete")
    retained = commands.add_parser("retained", help="retained messages; 'delete FILTER' clears them")
    retained.add_argument(
        "words", nargs="*", metavar="[delete] FILTER", help="the topic filter (default #); delete clears what it matches"
    )
    commands.add_parser("bridges", help="bridges, their state and queues")
    bridge_set = commands.add_parser(
        "bridge-set", help="add or replace a bridge at runtime from a [[bridge]] table (TOML or JSON file)"
    )
    bridge_set.add_argument("name", help="the bridge's name")
    bridge_set.add_argument("file", help="the table: a .json object, or TOML with the keys at top level")
    bridge_delete = commands.add_parser("bridge-delete", help="remove a bridge at runtime")
    bridge_delete.add_argument("name", help="the bridge's name")
    return parser


def parse_args(argv):
    parser = build_parser()
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
    if args.url and not args.socket and not args.config:
        base = args.url.rstrip("/") + "/api/"
        auth = {
            "user": args.user,
            "password": os.environ.get("MQTTGW_PASSWORD"),
            "token": os.environ.get("MQTTGW_TOKEN"),
        }
    else:
        # Over the socket no credentials are needed, nor sent.
        base = "/api/"
        auth = {"socket_path": args.socket or default_socket(args.config)}
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

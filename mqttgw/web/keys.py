"""The ``[http]`` section's keys: the admin listener, its API, metrics and dashboard (schema rows)."""

from mqttgw.schema import Key

HTTP_KEYS = [
    Key(
        "http",
        "address",
        str,
        "",
        "admin HTTP listener (metrics, health, admin API): PORT (loopback),"
        " HOST:PORT or an endpoint string; empty: off",
        flag_name="http",
        doc=(
            "It answers ``GET /healthz`` (alive), ``/readyz`` (listeners "
            "bound, store committing, archive writing: else 503 and the "
            "reasons), ``/metrics`` (Prometheus) and the JSON API under "
            "``/api/`` that ``python -m mqttgw.ctl`` speaks.  A bare port "
            'listens on loopback only (``"9883"``); elsewhere ``/metrics`` '
            "and ``/api/`` ask for HTTP Basic credentials (the password file)"
            " or a Bearer token of a user in admin_users.  On loopback reads "
            "need none, but changes (PUT, DELETE, POST) always do, or come "
            "through the Unix socket (http.socket).  It also serves the "
            "dashboard at ``/`` (open it in a browser) and the dashboard's "
            "MQTT over WebSocket at ``/mqtt``."
        ),
    ),
    Key(
        "http",
        "admin_users",
        list,
        [],
        "user names that may use the admin API when it asks for credentials",
        flag_name="admin-user",
        doc=(
            "They may read ``/metrics`` too, and are admins in the dashboard "
            "(see clients, kick them, clear retained topics, publish)."
        ),
    ),
    Key(
        "http",
        "read_users",
        list,
        [],
        "user names that may read the admin API's overview, bridges and Sparkplug edge"
        " and use the dashboard read-only",
        flag_name="read-user",
        doc=(
            "In the dashboard they see the data the ACL lets them read, the "
            "overview, the bridges and the Sparkplug edge, and may not "
            "publish."
        ),
    ),
    Key(
        "http",
        "token_lifetime",
        float,
        300.0,
        "seconds a dashboard sign-in token lasts (the page renews it while open)",
        10.0,
        doc=(
            "The tokens are signed with a key made at start-up, so a restart "
            "signs every page out."
        ),
    ),
    Key(
        "http",
        "dashboard_message_rate",
        int,
        12_000,
        "messages a second sent at most to each dashboard page; beyond, dropped for the page",
        1,
        doc=(
            "A dashboard page is an MQTT connection naming itself by the "
            "WebSocket subprotocol ``mqttgw-dashboard``, here or on a "
            "WebSocket listener serving the dashboard.  The page shows each "
            "topic's latest value, so it loses little, and a gateway carrying"
            " 100,000 messages a second does not deliver each a second time "
            "to every open page."
        ),
    ),
    Key(
        "http",
        "allowed_hosts",
        list,
        [],
        "host names the HTTP listeners answer to besides their own addresses, the"
        " loopback names (on loopback) and the machine's name ('*': any)",
        flag_name="allowed-host",
        doc=(
            "The names a browser or a proxy uses for them.  Any other Host is"
            " answered 421, and a WebSocket page of another origin is "
            "refused, so a web page whose name an attacker re-points at this "
            "machine (DNS rebinding) can use nothing.  Start-up says when any"
            " name is accepted."
        ),
    ),
    Key(
        "http",
        "allowed_origins",
        list,
        [],
        "origins of web pages that may change things through the admin listener"
        " or use its /mqtt besides its own",
        flag_name="http-allowed-origin",
        doc=(
            "Origins as ``scheme://host:port``, such as the address of a TLS "
            "proxy in front of it."
        ),
    ),
    Key(
        "http",
        "max_connections",
        int,
        32,
        "connections the admin listener and its Unix socket each hold at once (together at"
        " most a quarter of the open-file limit less the reserve); more are closed at accept",
        1,
        flag_name="http-max-connections",
        doc=(
            "Each its own, so busy HTTP clients never lock ``python -m "
            "mqttgw.ctl`` out.  The reserve is the descriptors kept for the "
            "store, the archive and the bridges; these connections are "
            "subtracted from limits.max_connections, so no HTTP client can "
            "take those."
        ),
    ),
    Key(
        "http",
        "idle_timeout",
        float,
        30.0,
        "seconds the admin listener keeps a connection that sends no request",
        0.1,
        flag_name="http-idle-timeout",
    ),
    Key(
        "http",
        "socket",
        str,
        "admin.sock",
        "Unix socket (mode 0600) of the admin API that python -m mqttgw.ctl uses, with"
        " the admin listener; a relative path is in persistence.data_dir (empty: none)",
        flag_name="http-socket",
        doc="Whoever may open it may change everything without credentials.",
    ),
]

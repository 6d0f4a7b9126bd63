"""
The keys of the listeners and what they speak: the ``[listeners]`` lists,
``[tls]``, ``[websocket]`` and the ``[[listener]]`` tables (schema rows;
mqttgw.service.config collects them).
"""

from mqttgw.schema import REQUIRED, Key
from mqttgw.transports.tlsprofile import INTERMEDIATE_CIPHERS

LISTENERS_KEYS = [
    Key("listeners", "tcp", list, [], "TCP listener: a port, HOST:PORT or endpoint string"),
    Key(
        "listeners", "tls", list, [], "TLS listener: a port, HOST:PORT or endpoint string",
        doc='MQTT over TLS; needs tls.cert and tls.key.  E.g. ``["8883"]``.',
    ),
    Key(
        "listeners", "ws", list, [], "WebSocket listener: a port, HOST:PORT or endpoint string",
        doc=(
            "MQTT over WebSocket, on any request path (browsers use "
            "``/mqtt``); the same port answers ``GET /healthz`` with a JSON "
            'status.  E.g. ``["8080"]``.'
        ),
    ),
    Key(
        "listeners", "wss", list, [], "WebSocket over TLS listener: a port, HOST:PORT or endpoint string",
        doc=(
            "MQTT over WebSocket over TLS; needs tls.cert and tls.key.  E.g. "
            '``["8443"]``.'
        ),
    ),
    Key(
        "listeners", "mqttsn", list, [], "MQTT-SN 1.2 listener (UDP): a port, HOST:PORT or udp:PORT:interface=HOST",
        doc=(
            "MQTT-SN over UDP, on the same router and sessions as MQTT; off "
            "unless given (the Paho MQTT-SN Gateway uses 10000, mqtt-sn-12's "
            'tools 2442).  See ``[mqttsn]``.  E.g. ``["10000"]``.'
        ),
    ),
]

TLS_KEYS = [
    Key(
        "tls", "cert", str, "", "server certificate (PEM), its chain after it",
        doc=(
            "Read and checked at start-up, as is the key.  TLS 1.2 is the "
            "oldest version accepted."
        ),
    ),
    Key("tls", "key", str, "", "server private key (PEM)"),
    Key(
        "tls", "ca", str, "", "authorities client certificates are checked against (PEM)",
        doc=(
            "With a ca but without require_client_cert, a certificate is "
            "checked when a client offers one."
        ),
    ),
    Key(
        "tls",
        "require_client_cert",
        bool,
        False,
        "refuse TLS clients without a certificate signed by tls.ca",
    ),
    Key(
        "tls",
        "ciphers",
        str,
        INTERMEDIATE_CIPHERS,
        "TLS 1.2 cipher suites, an OpenSSL cipher string (default: forward-secret AEAD only)",
        doc=(
            "As mosquitto's ciphers.  The default is Mozilla's intermediate "
            "profile: forward-secret key exchange with AES-GCM or "
            "ChaCha20-Poly1305 only, so no plain RSA key exchange and no CBC "
            "suites.  Widen it for old clients by adding suites, e.g. "
            "``:AES128-SHA`` at its end.  TLS 1.3 suites are OpenSSL's own, "
            "whatever this says.  A string naming no suite stops start-up."
        ),
    ),
    Key(
        "tls",
        "use_identity_as_username",
        bool,
        False,
        "take the MQTT user name from the client certificate's common name",
        doc=(
            "As mosquitto's use_identity_as_username; a client without one is"
            " refused (CONNACK 5)."
        ),
    ),
]

WEBSOCKET_KEYS = [
    Key(
        "websocket",
        "trusted_proxies",
        list,
        [],
        "proxy addresses whose X-Forwarded-For names the real client",
        doc=(
            "Addresses or networks (``10.0.0.0/8``); the right-most address "
            "of the header is used.  From any other peer the header is "
            "ignored."
        ),
    ),
    Key(
        "websocket",
        "max_message_size",
        int,
        1024 * 1024 + 1024,
        "largest WebSocket message accepted, in bytes",
        1,
        doc="Each frame is held to it too.",
    ),
    Key(
        "websocket", "compression", bool, False, "accept permessage-deflate",
        doc=(
            "Off by default: MQTT payloads are often small or already "
            "compressed, and it costs CPU on every message."
        ),
    ),
    Key(
        "websocket",
        "dashboard",
        bool,
        False,
        "serve the dashboard and the admin API (always with credentials) on WebSocket listeners",
        doc=(
            "The dashboard at ``/``, the admin API under ``/api/``; MQTT "
            "stays on every WebSocket upgrade."
        ),
    ),
    Key(
        "websocket",
        "allowed_origins",
        list,
        [],
        "origins of web pages that may connect besides the gateway's own ('*': any)",
        flag_name="allowed-origin",
        doc=(
            "By origin, e.g. ``https://dashboard.example.net``.  Requests "
            "without an Origin header (clients that are not browsers) are "
            "accepted.  Without this check any page a user opens could talk "
            "to the gateway from their browser."
        ),
    ),
]


# [[listener]] tables: one listener each, with settings of its own.
LISTENER_KEYS = [
    Key(
        "listener", "kind", str, REQUIRED, "the listener's kind: tcp, tls, ws or wss", choices=("tcp", "tls", "ws", "wss"),
        doc=(
            "``tls`` and ``wss`` need a certificate and key, here or in "
            "``[tls]``."
        ),
    ),
    Key("listener", "address", (str, int), REQUIRED, "a port, HOST:PORT or an endpoint string"),
    Key(
        "listener", "allow_anonymous", bool, None, "accept clients without a user name here",
        doc="Left out: auth.allow_anonymous.",
    ),
    Key(
        "listener", "cert", str, "", "this listener's certificate (PEM)",
        doc="Left out or empty: tls.cert.",
    ),
    Key(
        "listener", "key", str, "", "this listener's private key (PEM)",
        doc="Left out or empty: tls.key.",
    ),
    Key(
        "listener", "ca", str, "", "authorities its client certificates are checked against",
        doc="Left out or empty: tls.ca.",
    ),
    Key(
        "listener", "require_client_cert", bool, False, "refuse clients without a certificate",
        doc="Left out: tls.require_client_cert.",
    ),
    Key("listener", "ciphers", str, "", "its TLS 1.2 cipher suites (OpenSSL cipher string; default tls.ciphers)"),
    Key(
        "listener", "use_identity_as_username", bool, False, "user name from the certificate (tls, wss)",
        doc=(
            "Its common name, as tls.use_identity_as_username; left out: that"
            " key.  A tcp or ws listener has no certificate to read: there it"
            " is refused, and the main key does not apply."
        ),
    ),
    Key(
        "listener", "allowed_origins", list, [], "web page origins that may connect (ws, wss)",
        doc="Left out: websocket.allowed_origins.",
    ),
    Key(
        "listener", "auth", list, ["password", "token"], "what logins it accepts: password, token",
        doc=(
            "``password``: a user name and password from the password file; "
            "``token``: a signed token (JWT) as the password."
        ),
    ),
]

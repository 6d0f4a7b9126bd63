"""The ``[auth]`` section's keys: who may connect and what they may do (schema rows)."""

from mqttgw.schema import BROKER_KEYS, Key

AUTH_KEYS = [
    Key(
        "auth",
        "password_file",
        str,
        "",
        "password file in mosquitto's format (mosquitto_passwd, python -m mqttgw.passwd)",
        doc=(
            "Files written by mosquitto_passwd are read as they are (``$7$`` "
            "PBKDF2-SHA512 and ``$6$`` SHA-512 entries).  Empty: no passwords"
            " are checked."
        ),
    ),
    Key(
        "auth", "acl_file", str, "", "access control list in mosquitto's acl_file format",
        doc=(
            "What each client may publish and subscribe to: ``topic "
            "[read|write|readwrite|deny] FILTER`` lines (before any ``user`` "
            "line: for anonymous clients), ``user NAME`` lines, and "
            "``pattern`` lines for every client with ``%u`` (user name) and "
            "``%c`` (client id).  A deny rule wins over any grant.  Empty: "
            "everything allowed."
        ),
    ),
    Key(
        "auth",
        "allow_anonymous",
        bool,
        None,
        "accept clients without a user name (default: only when no password file is set)",
        doc=(
            "Left to that default with no password file set, start-up logs a "
            "warning for each listener; setting jwt_secret_file or "
            "jwt_public_key turns anonymous access off by default too.  "
            "``--no-anonymous`` sets it to false."
        ),
    ),
    Key(
        "auth",
        "jwt_secret_file",
        str,
        "",
        "file holding the HS256 secret that signed tokens (JWT) sent as passwords are checked with",
        doc=(
            "Signed tokens are for browsers and services, sent as the MQTT "
            "password with any user name.  The secret is at least 32 bytes; "
            "jwt_public_key checks RS256 and ES256 tokens instead.  The "
            "``exp`` claim is required and enforced: the connection is closed"
            " when the token expires. jwt_username_claim names the user (for "
            "the ACL); optional claims ``mqtt_publish`` and "
            "``mqtt_subscribe`` (lists of topic filters) narrow what its "
            "holder may publish and read, so a dashboard page can hold a "
            "short-lived, read-only token.  Setting this key or "
            "jwt_public_key turns anonymous access off by default."
        ),
    ),
    Key(
        "auth",
        "jwt_public_key",
        str,
        "",
        "PEM public key (RSA or EC) that RS256/ES256 tokens sent as passwords are checked with",
        doc=(
            "The tokens' claims are read as with jwt_secret_file.  Setting it"
            " turns anonymous access off by default."
        ),
    ),
    Key(
        "auth",
        "methods",
        list,
        [],
        "MQTT 5.0 enhanced authentication methods offered (installed plugins' names)",
        flag_name="auth-method",
        doc=(
            "Over AUTH packets.  A plugin offers a method by providing "
            "``mqttgw.security.enhanced.IAuthenticationMethod``; none is "
            "offered by default, and a CONNECT naming one not offered gets "
            "CONNACK 0x8C."
        ),
    ),
    Key("auth", "jwt_username_claim", str, "sub", "the token claim that names the user"),
    Key("auth", "jwt_audience", str, "", "the audience (aud) tokens must name (empty: not checked)"),
    Key(
        "auth",
        "analytics_writers",
        list,
        ["mqttgw-pipeline"],
        "user names that may write $analytics/... (the pipeline's)",
        flag_name="analytics-writer",
        doc=(
            "The pipeline publishes its rollups there as ``mqttgw-pipeline``."
            "  No client may write ``$SYS/...`` or a bridge's state topic."
        ),
    ),
    BROKER_KEYS["auth.session_owner_mismatch"],
]

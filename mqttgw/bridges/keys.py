"""
The ``[simple_bridge]`` section's keys (schema rows); a ``[[bridge]]``
table's are in mqttgw.bridges.settings, which loads TLS.
"""

from mqttgw.schema import Key

SIMPLE_BRIDGE_KEYS = [
    Key(
        "simple_bridge",
        "addresses",
        list,
        [],
        "upstream HOST:PORT of a bridge named default, tried in turn",
        flag_name="bridge",
    ),
    Key(
        "simple_bridge",
        "rules",
        list,
        [],
        "that bridge's rules: 'PATTERN in|out|both QOS [LOCAL_PREFIX REMOTE_PREFIX]'",
        flag_name="bridge-topic",
    ),
]

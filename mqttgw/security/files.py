"""
The files credentials and rights are read from (passwords, ACL, token
keys, MQTT-SN clients and pre-defined topics): their lines, and the error
that names a file, and line, that cannot be used.
"""

from mqttgw.schema import ConfigError


class AuthConfigError(ConfigError):
    """A password, ACL or MQTT-SN file that cannot be used; the message says where."""


def read_lines(path):
    """The lines of a text file, or AuthConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AuthConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None

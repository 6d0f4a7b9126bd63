"""
The files credentials are read from (passwords, ACL, token keys): their
lines, and the error that names a file, and line, that cannot be used.
"""

from mqttgw.schema import ConfigError


class AuthConfigError(ConfigError):
    """A password or ACL file that cannot be used; the message says where."""


def read_lines(path):
    """The lines of a text file, or AuthConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AuthConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None

"""
The one error every layer raises for settings it cannot use: the service
that read them reports it as one line naming the key, and stops (or, on a
reload, keeps what it had).
"""


class ConfigError(Exception):
    """Configuration that cannot be used; the message names the key."""

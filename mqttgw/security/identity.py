"""
What a client is once logged in: the avatar the portal gives a listener,
whether from a password, a token or no credentials at all.
"""

import attr
from zope.interface import Interface, implementer


class IIdentity(Interface):
    """What a client is once logged in: see :class:`Identity`."""


@implementer(IIdentity)
@attr.s(frozen=True, slots=True)
class Identity:
    # None for an anonymous client.
    username = attr.ib()
    # From a token: the topic filters its holder may publish to and
    # subscribe to (None: as the ACL says), and when it expires (epoch s).
    publish = attr.ib(default=None)
    subscribe = attr.ib(default=None)
    expires = attr.ib(default=None)

    @property
    def owner(self):
        """
        Who the sessions it makes belong to: its user name (from a
        password, a token's subject or a client certificate), or "" when
        anonymous.  Another owner never resumes them.
        """
        return self.username or ""

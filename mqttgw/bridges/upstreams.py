"""
A bridge's upstream addresses as it knows them: what each made it fall
back from (try_private, MQTT 5.0) and how its attempts failed, which one
it is on or trying and in what order it tries them, whether it is on a
fallback clean session, and since when it has had no working link.
"""

from collections import Counter

import attr

from mqttgw.wire import packets as P

# The fallbacks an address may be on, as status() names them.
FALLBACK_NAMES = {
    "try_private": "try_private off", "mqttv311": "mqttv311", "remote_state": "remote_state_topic off",
}


@attr.s(slots=True)
class Address:
    """One upstream address and what the bridge learnt there."""

    text = attr.ib()
    # The protocol level spoken there, and whether the CONNECT announces a bridge.
    level = attr.ib()
    try_private = attr.ib()
    # Whether the CONNECT's will (and the link's state message) goes to remote_state_topic.
    remote_state = attr.ib(default=True)
    # The fallbacks in effect, in the order they were taken.
    fallbacks = attr.ib(factory=list)
    # Failed attempts, by kind (bridges.failures).
    failures = attr.ib(factory=Counter)

    def fall_back(self):
        """
        The step down after the upstream refused the protocol the CONNECT
        announced, taken and named: 5.0 to 3.1.1, then try_private off;
        None when there is none left.
        """
        if self.level == P.MQTT_5:
            self.level = P.MQTT_311
            step = "mqttv311"
        elif self.try_private:
            self.try_private = False
            step = "try_private"
        else:
            return None
        self.fallbacks.append(step)
        return step

    def take_back(self, step):
        """
        A step taken after a close before CONNACK, undone: the next CONNECT
        was closed the same way, so the close was not about the protocol
        (a proxy whose broker is down closes every connection).
        """
        self.fallbacks.remove(step)
        if step == "mqttv311":
            self.level = P.MQTT_5
        elif step == "try_private":
            self.try_private = True

    def leave_state_out(self):
        """After the upstream refused the will's topic: no will, no state message there."""
        if not self.remote_state:
            return None
        self.remote_state = False
        self.fallbacks.append("remote_state")
        return "remote_state"


class Upstreams:
    """
    The addresses in the order they are tried.  A round tries each once,
    starting where the last left off: after a failed attempt or a lost
    link the next address comes first (mosquitto's bridges move on the
    same way), so a node that dropped the bridge is tried last.  A planned
    move (bridges.returns) names where the next round starts, at once.
    """

    def __init__(self, settings, clock):
        self.clock = clock
        self.addresses = [Address(a, settings.protocol_level, settings.try_private) for a in settings.addresses]
        # The address it is on, trying, or tries first next time.
        self.index = 0
        # Whether that link is (or is tried as) a clean session for want
        # of the persistent one (session_fallback).
        self.clean_fallback = False
        # Since when there has been no working link (None while there is).
        self.disconnected_since = clock.seconds()
        # (address, what the upstream did, when) of the last failed attempt.
        self.last_failure = None
        self._planned = None
        self._at_once = False

    @property
    def current(self):
        return self.addresses[self.index]

    def round(self, start=None):
        """The addresses of one round, each once, from ``start`` or where the last left off."""
        first = self.index if start is None else self.addresses.index(start)
        n = len(self.addresses)
        return [self.addresses[(first + i) % n] for i in range(n)]

    def trying(self, address, clean_fallback):
        self.index = self.addresses.index(address)
        self.clean_fallback = clean_fallback

    def failed(self, address, failure):
        """An attempt at ``address`` failed: the next one comes first."""
        address.failures[failure.kind] += 1
        self.last_failure = (address.text, failure.reason, self.clock.seconds())
        self.index = (self.addresses.index(address) + 1) % len(self.addresses)

    def settled(self, address):
        """A link to ``address`` lasted: the bridge is on it."""
        self.index = self.addresses.index(address)
        self.disconnected_since = None

    def lost(self, address):
        """The working link to ``address`` was lost."""
        self.disconnected_since = self.clock.seconds()
        if self._planned is not None:
            self.index, self._planned = self._planned, None
            self._at_once = True
        else:
            self.index = (self.addresses.index(address) + 1) % len(self.addresses)

    def plan(self, address):
        """The link is being closed on purpose: the next round starts at ``address``, at once."""
        self._planned = self.addresses.index(address)

    def at_once(self):
        """Whether the next round follows a planned move, without waiting (asked once)."""
        at_once, self._at_once = self._at_once, False
        return at_once

    def status(self):
        """The link's part of the bridge's status()."""
        since = self.disconnected_since
        failure = self.last_failure
        return {
            "address": self.current.text,
            "disconnected_since": since,
            "disconnected_s": None if since is None else round(self.clock.seconds() - since, 3),
            "last_failure": None if failure is None else dict(zip(("address", "reason", "at"), failure)),
            "failures": {a.text: dict(a.failures) for a in self.addresses if a.failures},
            "fallbacks": {a.text: [FALLBACK_NAMES[f] for f in a.fallbacks] for a in self.addresses if a.fallbacks},
            "clean_fallback": self.clean_fallback,
        }

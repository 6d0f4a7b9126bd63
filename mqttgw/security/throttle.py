"""
The login throttle.  Failed logins are answered later the more often their
source address and their user name have failed, one after another rather
than all at once; the logins under way per address and per user name are
bounded; and a per-address connection rate may be set.

Bounded everywhere: a failure count stops growing once its delay is the
longest, so the arithmetic never overflows; the table keeps at most
``size`` addresses and user names, the least recently seen going
first; an address keeps at most ``max_waiting``
answer times, a user name ``max_waiting_per_user``.
"""

import ipaddress
import math
import time
from collections import OrderedDict


def address_key(host):
    """
    The key a source address is counted under: an IPv6 address by its
    /64 (one host may hold all of it), anything else as it is.
    """
    if host is None or ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


def user_key(username):
    """The key a user name is counted under (never equal to an address's)."""
    return ("user", username)


class _Record:
    """What the throttle remembers of one address or user name."""

    __slots__ = ("failures", "free_at", "last", "hashing", "pending")

    def __init__(self):
        # Failures counted, up to the one whose delay is the longest.
        self.failures = 0
        # When the next answer for this key may be given at the earliest.
        self.free_at = 0.0
        # When it last failed.
        self.last = 0.0
        # Logins being checked (hashing), and the times answers are due
        # (a list once there are some): together at most the bound.
        self.hashing = 0
        self.pending = None

    def waiting(self, now):
        pending = self.pending
        if pending:
            pending[:] = [t for t in pending if t > now]
            return self.hashing + len(pending)
        return self.hashing


class LoginAttempt:
    """One login under way: the records it counts against."""

    __slots__ = ("records", "checking")

    def __init__(self, records):
        self.records = records
        self.checking = True


class Throttle:
    """
    The answer to a failed login waits ``first`` seconds, doubled for each
    earlier failure of its address or user name, up to ``longest``; and it
    comes after the answers already due for them, so parallel guesses are
    answered one after another.  A success is answered after the answers
    already due for its user name (never more than ``longest``), so which
    of many parallel guesses was right is not told first.  A success
    forgets nothing: failures are forgotten ``forget_after`` seconds after
    the last, so a good login cannot clear the penalty of other
    connections' failures.  At most ``max_waiting`` logins of one address
    (room for a site's devices behind one NAT address reconnecting at
    once) and ``max_waiting_per_user`` of one user name are checked or
    wait for their answer at once.  The refusals waiting are answered one
    after another, so places come free as a flood goes on, not all at its
    end: for an address's own failures, one at least every ``longest``.
    MQTT logins, 5.0 enhanced authentication and the admin listener's HTTP
    Basic logins all go through :meth:`begin` and :meth:`answer`.
    """

    def __init__(self, first=0.1, longest=10.0, size=10_000, max_waiting=256,
                 max_waiting_per_user=16, forget_after=600.0, seconds=time.monotonic):
        self.first = first
        self.longest = longest
        self.size = size
        self.max_waiting = max_waiting
        self.max_waiting_per_user = max_waiting_per_user
        self.forget_after = forget_after
        self.seconds = seconds
        # The count whose delay is already the longest: no count goes past it.
        if first <= 0 or longest <= first:
            self.most_failures = 1
        else:
            self.most_failures = math.ceil(math.log2(longest / first)) + 1
        self._records = OrderedDict()

    def __len__(self):
        return len(self._records)

    def delay(self, failures):
        """Seconds a failure waits after ``failures`` earlier ones."""
        return min(self.first * 2 ** min(failures, self.most_failures), self.longest)

    def _record(self, key, now):
        records = self._records
        record = records.get(key)
        if record is None:
            record = records[key] = _Record()
            if len(records) > self.size:
                # Logins under way keep their own reference to it.
                records.popitem(last=False)
        else:
            records.move_to_end(key)
            if record.failures and now - record.last > self.forget_after:
                record.failures = 0
        return record

    def _fail(self, records, now, most_waiting):
        """
        The answer time of a failure against ``records``, counted: never
        further ahead than ``most_waiting`` answers could be queued.
        """
        failures = max(r.failures for r in records)
        start = max(now, max(r.free_at for r in records))
        at = min(start + self.delay(failures), now + most_waiting * self.longest)
        for r in records:
            r.failures = min(r.failures + 1, self.most_failures)
            r.free_at = max(r.free_at, at)
            r.last = now
        return at

    # Logins

    def begin(self, host, username=None):
        """
        A login from ``host`` as ``username`` (None: anonymous) starts:
        a :class:`LoginAttempt` to :meth:`answer`, or None when its address or
        user name already has as many logins under way as it may.
        """
        now = self.seconds()
        address = self._record(address_key(host), now)
        if address.waiting(now) >= self.max_waiting:
            return None
        records = [address]
        if username is not None:
            user = self._record(user_key(username), now)
            if user.waiting(now) >= self.max_waiting_per_user:
                return None
            records.append(user)
        for r in records:
            r.hashing += 1
        return LoginAttempt(records)

    def answer(self, login, ok):
        """
        The credentials of ``login`` were checked: the delay before the
        answer (a refusal when not ``ok``).  Until then it counts as waiting.
        """
        if not login.checking:
            raise ValueError("login answered twice")
        self.release(login)
        now = self.seconds()
        records = login.records
        if ok:
            # After what is due for its user name, not its address's.
            at = min(max(now, records[-1].free_at if len(records) > 1 else now), now + self.longest)
        else:
            at = self._fail(records, now, max(self.max_waiting, self.max_waiting_per_user))
        if at > now:
            for r in records:
                if r.pending is None:
                    r.pending = []
                r.pending.append(at)
        return at - now

    def release(self, login):
        """``login`` is no longer being checked (answered, or its connection gone)."""
        if login.checking:
            login.checking = False
            for r in login.records:
                r.hashing -= 1


class ConnectionRate:
    """
    New connections per second from one address (an IPv6 /64), at most
    ``rate`` (a burst of as many), loopback exempt unless ``loopback``;
    0 turns it off.  The table keeps at most ``size`` addresses.
    """

    def __init__(self, rate=0.0, loopback=False, size=10_000, seconds=time.monotonic):
        self.rate = rate
        self.loopback = loopback
        self.size = size
        self.seconds = seconds
        self.burst = max(1.0, rate)
        # address: [tokens, when counted]
        self._buckets = OrderedDict()

    def allows(self, host):
        if not self.rate or host is None:
            return True
        if not self.loopback and _is_loopback(host):
            return True
        key = address_key(host)
        now = self.seconds()
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = [self.burst, now]
            if len(buckets) > self.size:
                buckets.popitem(last=False)
        else:
            buckets.move_to_end(key)
            bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
        if bucket[0] < 1.0:
            return False
        bucket[0] -= 1.0
        return True


def _is_loopback(host):
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback

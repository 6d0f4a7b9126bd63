"""
A thousand field sites coming back after a central outage, on paper: each
site's bridge reconnects through Twisted's ClientService with the bridge's
own retry policy, on a simulated clock; the centre is down for the outage,
then accepts a bounded number of connections a second and a bounded number
of messages a second in all.  Each site queued its devices' messages
during the outage and drains them once connected, at most at its uplink's
rate.  Printed: how many sites are connected and how many messages are
still queued as time goes on, with full jitter (the bridge's policy) and
with the plain doubling it replaced.

    python -m bench.storm
    python -m bench.storm --sites 1000 --outage 600 --accept-rate 200
"""

import argparse
import random

from twisted.application.internet import ClientService
from twisted.internet.defer import fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqttgw.bridges import bridge as bridge_module


class Centre:
    """Down until ``up_at``; then at most ``accept_rate`` connections a second."""

    def __init__(self, clock, up_at, accept_rate):
        self.clock = clock
        self.up_at = up_at
        self.accept_rate = accept_rate
        self._second = None
        self._accepted = 0
        self.attempts = 0
        self.refused = 0

    def accepts(self):
        now = self.clock.seconds()
        self.attempts += 1
        if now < self.up_at:
            self.refused += 1
            return False
        second = int(now)
        if second != self._second:
            self._second, self._accepted = second, 0
        if self._accepted >= self.accept_rate:
            # Shed: its accept queue is full.
            self.refused += 1
            return False
        self._accepted += 1
        return True


class Site:
    def __init__(self, centre, backlog):
        self.centre = centre
        self.backlog = backlog
        self.connected_at = None

    def connect(self, factory):
        if not self.centre.accepts():
            return fail(ConnectionRefusedError())
        protocol = factory.buildProtocol(None)
        protocol.makeConnection(StringTransport())
        if self.connected_at is None:
            self.connected_at = self.centre.clock.seconds()
        return succeed(protocol)


class _Factory(Factory):
    protocol = Protocol
    noisy = False


def doubling(initial, maximum):
    """The policy full jitter replaced: the doubled wait, capped."""

    def delay(failed_rounds):
        return min(maximum, initial * 2.0 ** min(failed_rounds, 64))

    return delay


POLICIES = {"full jitter": bridge_module.full_jitter, "doubling, no jitter": doubling}


def simulate(policy, sites=1000, outage=600.0, accept_rate=200, throughput=50_000,
             site_rate=10.0, uplink_rate=250.0, initial=1.0, maximum=60.0, horizon=3600.0, step=1.0):
    """
    ``site_rate``: messages a second each site's devices make; ``uplink_rate``:
    messages a second a site's uplink carries; ``throughput``: messages a
    second the centre takes from all sites together.  Returns the curve,
    [(t, sites connected, messages still queued, connection attempts so
    far)], and when every site was connected and every backlog drained.
    """
    clock = Clock()
    centre = Centre(clock, outage, accept_rate)
    # Backlogs grow while a site is away (the outage, then its wait).
    members = [Site(centre, 0.0) for _ in range(sites)]
    services = []
    for site in members:
        service = ClientService(site, _Factory(), retryPolicy=POLICIES[policy](initial, maximum), clock=clock)
        service.startService()
        services.append(service)
    curve = []
    all_connected = all_drained = None
    t = 0.0
    while t < horizon:
        clock.advance(step)
        t += step
        now = clock.seconds()
        draining = [s for s in members if s.connected_at is not None and s.backlog > 0]
        if draining:
            # Each connected site drains at its uplink's rate, the centre
            # sharing its throughput among them; live messages go on too.
            share = throughput / len(draining)
            for s in draining:
                s.backlog = max(0.0, s.backlog - min(uplink_rate, share) * step + site_rate * step)
        for s in members:
            if s.connected_at is None:
                s.backlog += site_rate * step
        connected = sum(s.connected_at is not None for s in members)
        queued = sum(s.backlog for s in members)
        if int(now) % 30 == 0:
            curve.append((now, connected, int(queued), centre.attempts))
        if all_connected is None and connected == sites:
            all_connected = now
        if all_connected is not None and all_drained is None and queued <= sites * site_rate * step:
            all_drained = now
            curve.append((now, connected, int(queued), centre.attempts))
            break
    for service in services:
        service.stopService()
    return {
        "curve": curve,
        "all_connected_s": None if all_connected is None else all_connected - outage,
        "all_drained_s": None if all_drained is None else all_drained - outage,
        "attempts": centre.attempts,
        "refused": centre.refused,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=600.0, help="seconds the centre is down")
    parser.add_argument("--accept-rate", type=int, default=200, help="connections the centre accepts a second")
    parser.add_argument("--throughput", type=int, default=50_000, help="messages a second the centre takes in all")
    parser.add_argument("--site-rate", type=float, default=10.0, help="messages a second each site makes")
    parser.add_argument("--uplink-rate", type=float, default=250.0, help="messages a second a site's uplink carries")
    parser.add_argument("--seed", type=int, default=1, help="of the jitter, for a run that repeats")
    args = parser.parse_args(argv)
    results = {}
    for policy in POLICIES:
        random.seed(args.seed)
        r = results[policy] = simulate(
            policy, args.sites, args.outage, args.accept_rate, args.throughput,
            args.site_rate, args.uplink_rate,
        )
        print(f"{policy}: every site back {r['all_connected_s']} s after the centre,"
              f" every backlog drained {r['all_drained_s']} s after it;"
              f" {r['attempts']:,} connection attempts, {r['refused']:,} refused")
        print("  t (s)  connected  queued messages  attempts")
        for t, connected, queued, attempts in r["curve"]:
            if t >= args.outage - 30:
                print(f"  {t:5.0f}  {connected:9d}  {queued:15,d}  {attempts:8,d}")
    return results


if __name__ == "__main__":
    main()

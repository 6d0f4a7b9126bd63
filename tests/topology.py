"""
Field sites and a centre on one machine, in network namespaces a test
makes itself: each site is joined to the centre by its own veth pair (its
uplink), on which the test caps the rate (tc's tbf) and makes partitions
(the centre's end set down, so TCP at the site sees a dead link, not a
reset).  Each namespace also has a management link to the test's own
namespace, never faulted, through which the test starts its programs'
clients and watches them.

Addresses are private to these namespaces: site N's uplink is
10.77.N.0/30 (site .2, centre .1), its management link 10.78.N.0/30 (site
.2, test .1); the centre's management link is 10.79.0.0/30 (centre .2).
No routes join them, so a site reaches the centre only by its uplink.
"""

import os
import shutil
import signal
import subprocess
import uuid

import pytest


def require_namespaces():
    """Root and iproute2, or: a skip locally, one failing line under CI."""
    why = None
    if shutil.which("ip") is None and not os.path.exists("/usr/sbin/ip"):
        why = "iproute2's ip is not installed"
    elif os.geteuid() != 0:
        why = "making network namespaces needs root"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"network namespace tests cannot run: {why}", pytrace=False)
        pytest.skip(why)


def _env():
    """The environment iproute2 and tc are run in: sbin on the path."""
    return dict(os.environ, PATH=os.environ["PATH"] + ":/usr/sbin:/sbin")


def _ip(*args, ns=None):
    command = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + list(args)
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=30,
        env=_env(),
    )
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.stdout


def _tc(*args, ns=None):
    command = (["ip", "netns", "exec", ns] if ns else []) + ["tc"] + list(args)
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=30,
        env=_env(),
    )
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


class Namespace:
    def __init__(self, name, address):
        self.name = name
        # Where the test reaches it (its management address).
        self.address = address

    def popen(self, argv, **kwargs):
        """A program run inside this namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.name] + list(argv), **kwargs)


class Site(Namespace):
    def __init__(self, name, address, index, uplink_centre_end):
        super().__init__(name, address)
        self.index = index
        # The centre as the site sees it, over the uplink.
        self.centre_address = f"10.77.{index}.1"
        self._centre_end = uplink_centre_end


def _owner():
    """This process as namespace names carry it: its pid and start time
    (so that a pid used again by another process is not taken for it)."""
    return f"{os.getpid()}.{_started(os.getpid())}"


def _started(pid):
    """When process ``pid`` started (clock ticks after boot), or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def sweep_stale():
    """
    Remove the namespaces a killed run left (named for a process that is
    gone), the programs still running in them and their management links:
    those hold the same addresses as the next run's, which would then reach
    them.  Returns the names removed.
    """
    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "mqgw":
            continue
        pid, _, started = parts[1].partition(".")
        if not pid.isdecimal() or _started(int(pid)) == started:
            continue
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30, env=_env(),
        ).stdout
        for pid in pids.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Deleting our end of the management link takes the pair at once;
        # the namespace itself goes only once its last process has.
        subprocess.run(["ip", "link", "del", f"m{parts[2]}{parts[3]}"], capture_output=True, timeout=30, env=_env())
        if subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, env=_env()).returncode == 0:
            removed.append(name)
    return removed


class Topology:
    """Namespaces for a centre and ``sites`` field sites; ``close`` removes them."""

    def __init__(self, sites):
        require_namespaces()
        sweep_stale()
        self.tag = uuid.uuid4().hex[:6]
        self._made = []
        self._links = []
        try:
            self.centre = self._namespace("c", "10.79.0.2", "10.79.0.1")
            self.sites = [self._site(i) for i in range(1, sites + 1)]
        except Exception:
            self.close()
            raise

    def _namespace(self, role, address, ours):
        # Named for this process, so that a later run knows it is left over.
        name = f"mqgw-{_owner()}-{self.tag}-{role}"
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("link", "set", "lo", "up", ns=name)
        # The management link: the test's end here, the other end there.
        here, there = f"m{self.tag}{role}", f"n{self.tag}{role}"
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        self._links.append(here)
        _ip("link", "set", there, "netns", name)
        _ip("addr", "add", f"{ours}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("addr", "add", f"{address}/30", "dev", there, ns=name)
        _ip("link", "set", there, "up", ns=name)
        return Namespace(name, address)

    def _site(self, i):
        ns = self._namespace(f"s{i}", f"10.78.{i}.2", f"10.78.{i}.1")
        centre_end, site_end = f"u{self.tag}c{i}", f"u{self.tag}s{i}"
        _ip("link", "add", centre_end, "type", "veth", "peer", "name", site_end)
        _ip("link", "set", centre_end, "netns", self.centre.name)
        _ip("link", "set", site_end, "netns", ns.name)
        _ip("addr", "add", f"10.77.{i}.1/30", "dev", centre_end, ns=self.centre.name)
        _ip("link", "set", centre_end, "up", ns=self.centre.name)
        _ip("addr", "add", f"10.77.{i}.2/30", "dev", site_end, ns=ns.name)
        _ip("link", "set", site_end, "up", ns=ns.name)
        site = Site(ns.name, ns.address, i, centre_end)
        site.uplink = site_end
        return site

    # Faults on a site's uplink

    def cap(self, site, rate="2mbit", burst="32kbit", latency="400ms"):
        """The uplink's rate, both ways, with tc's token bucket filter."""
        _tc("qdisc", "replace", "dev", site.uplink, "root", "tbf", "rate", rate,
            "burst", burst, "latency", latency, ns=site.name)
        _tc("qdisc", "replace", "dev", site._centre_end, "root", "tbf", "rate", rate,
            "burst", burst, "latency", latency, ns=self.centre.name)

    def partition(self, site):
        """The uplink goes dead: nothing crosses, nobody is told."""
        _ip("link", "set", site._centre_end, "down", ns=self.centre.name)

    def heal(self, site):
        _ip("link", "set", site._centre_end, "up", ns=self.centre.name)

    def close(self):
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._made = []
        self._links = []

"""
The field-site tests' namespaces (tests/topology.py): what a killed run
left behind is swept before the next run makes its own, since its
management links hold the addresses the next run uses.
"""

import signal
import subprocess
import time

from tests import topology

# A pid no process can have (Linux's pid_max is at most 4,194,304).
GONE = "4194999.1"
STALE, LIVE = f"mqgw-{GONE}-abc123-c", "mqgw-{}-abc124-c"


def _namespaces():
    return {line.split()[0] for line in topology._ip("netns", "list").splitlines() if line.split()}


def _in(name, pid, deadline=30):
    """Wait until process ``pid`` runs in namespace ``name``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        if str(pid) in pids:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never entered namespace {name}")


def test_a_killed_runs_namespaces_programs_and_links_are_swept_and_a_live_runs_kept():
    topology.require_namespaces()
    # What an earlier failed run of this test left.
    topology.sweep_stale()
    made, procs, live = [], [], None
    try:
        # Left by a run whose process is gone, with a program still in it
        # and a management link into this namespace.
        topology._ip("netns", "add", STALE)
        made.append(STALE)
        topology._ip("link", "add", "mabc123c", "type", "veth", "peer", "name", "nabc123c")
        topology._ip("link", "set", "nabc123c", "netns", STALE)
        left = subprocess.Popen(["ip", "netns", "exec", STALE, "sleep", "300"])
        procs.append(left)
        _in(STALE, left.pid)
        # Another run's, whose process is alive.
        other = subprocess.Popen(["sleep", "300"])
        procs.append(other)
        alive = LIVE.format(f"{other.pid}.{topology._started(other.pid)}")
        topology._ip("netns", "add", alive)
        made.append(alive)

        live = topology.Topology(sites=1)
        assert left.wait(timeout=30) == -signal.SIGKILL
        names = _namespaces()
        assert STALE not in names
        assert "mabc123c" not in topology._ip("link", "show")
        # Neither the other live run's nor this run's own are swept.
        assert alive in names and other.poll() is None
        assert live.centre.name in names and live.sites[0].name in names
        assert topology.sweep_stale() == []
    finally:
        if live is not None:
            live.close()
        for proc in procs:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", "mabc123c"], capture_output=True)
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert live.centre.name not in _namespaces()

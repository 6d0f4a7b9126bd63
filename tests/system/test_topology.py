"""
The field-site tests' namespaces (tests/topology.py): what a killed run
left behind is swept before the next run makes its own, since its
management links hold the addresses the next run uses.
"""

import subprocess

from tests import topology


def _namespaces():
    return {line.split()[0] for line in topology._ip("netns", "list").splitlines() if line.split()}


def test_a_killed_runs_namespaces_and_programs_are_swept_and_a_live_runs_kept():
    topology.require_namespaces()
    # Left by a run whose process is gone (no such pid), with a program
    # still in it and a management link into this namespace; and one of an
    # older run, named without its process.
    stale, older = "mqgw-4194999-abc123-c", "mqgw-abc124-s1"
    for name in (stale, older):
        topology._ip("netns", "add", name)
    topology._ip("link", "add", "mabc123c", "type", "veth", "peer", "name", "nabc123c")
    topology._ip("link", "set", "nabc123c", "netns", stale)
    left = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "300"])
    live = topology.Topology(sites=1)
    try:
        assert left.wait(timeout=30) != 0
        names = _namespaces()
        assert stale not in names and older not in names
        links = topology._ip("link", "show")
        assert "mabc123c" not in links
        # This run's own namespaces, named for this process, are not swept.
        assert topology.sweep_stale() == []
        assert live.centre.name in _namespaces() and live.sites[0].name in _namespaces()
    finally:
        live.close()
        left.kill()
        for name in (stale, older):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert live.centre.name not in _namespaces()

"""
A connection storm on a real broker: N clients (10,000 by default)
connecting at once, as a site's devices do when the gateway comes back.
One process opens every connection without waiting for any, sending each
its CONNECT as soon as its connection is made; it reports the time until
every client had its CONNACK, and how many connections needed a SYN
retry: the kernel's count of SYNs dropped at a full listen queue
(TcpExtListenOverflows and TcpExtListenDrops, for the whole machine) and
the connections that took over a second to be made (a retry's wait).
bench/storm.py simulates the same on paper for bridges.
"""

import random
import resource
import select
import socket
import struct
import time

from mqttgw.wire import packets as P

# A SYN dropped at a full listen queue is sent again after this long.
SYN_RETRY_S = 1.0
# One source address has about 28,000 ephemeral ports toward one port.
PORTS_PER_SOURCE = 20_000
# Connections opened between two looks at those under way.
BATCH = 64
# Seconds a storm may take before the clients give up.
TIMEOUT_S = 120.0
_RESET = struct.pack("ii", 1, 0)
# Descriptors a broker and the clients need beside the connections.
SPARE_FILES = 200
# The columns of ``results`` (a multiprocessing array of doubles).
ELAPSED, CONNACKS, REFUSED, FAILED, SLOW_CONNECTS, SLOWEST_CONNECT, DONE = range(7)
FIELDS = 7


def listen_drops():
    """The kernel's count of connections dropped at a full listen queue (this network namespace)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    counts = {}
    for names, values in zip(lines[0::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            counts = dict(zip(names.split()[1:], map(int, values.split()[1:])))
    return counts.get("ListenOverflows", 0), counts.get("ListenDrops", 0)


def storm(port, count, results, source="127.0.0"):
    """
    Open ``count`` connections to ``port`` at once from ``source``.1, .2,
    ... (the first three parts of a loopback address), each sending CONNECT
    once made; fill ``results`` (see the column names above) when every
    one has its CONNACK, was refused or failed, then close them all.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 100)), hard))
    packets = [P.Connect(client_id=f"storm-{i}", keepalive=0).encode() for i in range(count)]
    poller = select.epoll()
    # fd: [socket, index, connect started, connect took (or None), bytes read]
    under_way = {}
    held = []
    connacks = refused = failed = slow = 0
    slowest = 0.0
    clock = time.perf_counter
    started = clock()
    deadline = started + TIMEOUT_S
    made = 0
    while (made < count or under_way) and clock() < deadline:
        end = min(count, made + BATCH)
        while made < end:
            s = socket.socket()
            s.setblocking(False)
            # Each block of clients from its own address: one source has
            # about 28,000 ephemeral ports, and those of an earlier run
            # wait in TIME_WAIT, which makes every connect() search.
            s.bind((f"{source}.{1 + made // PORTS_PER_SOURCE}", 0))
            s.connect_ex(("127.0.0.1", port))
            under_way[s.fileno()] = [s, made, clock(), None, b""]
            poller.register(s.fileno(), select.EPOLLOUT)
            made += 1
        for fd, events in poller.poll(0 if made < count else 0.05):
            entry = under_way[fd]
            s = entry[0]
            if entry[3] is None and not events & (select.EPOLLERR | select.EPOLLHUP):
                # Made: its CONNECT goes now.
                took = entry[3] = clock() - entry[2]
                if took > SYN_RETRY_S:
                    slow += 1
                slowest = max(slowest, took)
                try:
                    s.send(packets[entry[1]])
                    poller.modify(fd, select.EPOLLIN)
                    continue
                except OSError:
                    pass
            else:
                try:
                    entry[4] += s.recv(4)
                except OSError:
                    pass
                got = entry[4]
                if len(got) < 4 and events & select.EPOLLIN and got:
                    continue
                if got[:2] == b"\x20\x02" and got[3:4] == b"\x00":
                    connacks += 1
                    poller.unregister(fd)
                    del under_way[fd]
                    held.append(s)
                    continue
                if got[:2] == b"\x20\x02":
                    refused += 1
            failed += not entry[4][:2] == b"\x20\x02"
            poller.unregister(fd)
            del under_way[fd]
            s.close()
    elapsed = clock() - started
    for entry in under_way.values():
        entry[0].close()
    failed += len(under_way) + (count - made)
    results[ELAPSED] = elapsed
    results[CONNACKS] = connacks
    results[REFUSED] = refused
    results[FAILED] = failed
    results[SLOW_CONNECTS] = slow
    results[SLOWEST_CONNECT] = slowest
    results[DONE] = 1
    for s in held:
        # Reset, not closed: a client's port left in TIME_WAIT for a
        # minute is one the next broker's listeners may not bind.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        s.close()
    poller.close()


def too_many(count):
    """
    Why a storm of ``count`` cannot be run here (the broker and the
    clients each hold a descriptor per connection), or None.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and count + SPARE_FILES > hard:
        return f"open-file limit {hard}"
    return None


def run(broker, count, ctx, runner):
    """
    One storm of ``count`` clients on ``broker`` (started); ``runner(target,
    *args)`` runs the clients' process (pinned to the load's CPU).
    """
    results = ctx.RawArray("d", FIELDS)
    cpu = broker.cpu_seconds()
    overflows, drops = listen_drops()
    # A source no earlier run used (see storm).
    source = f"127.{random.randrange(1, 255)}.{random.randrange(256)}"
    p = ctx.Process(target=runner, args=(storm, broker.port, count, results, source))
    p.start()
    deadline = time.monotonic() + TIMEOUT_S + 60
    while not results[DONE] and p.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    # Read before the clients close: the broker's CPU for the storm alone.
    overflows_after, drops_after = listen_drops()
    used = broker.cpu_seconds() - cpu
    rss = broker.rss_kib()
    p.join(60)
    if p.is_alive():
        p.kill()
    elapsed = results[ELAPSED]
    connacks = int(results[CONNACKS])
    return {
        "clients": count,
        "connacks": connacks,
        "refused": int(results[REFUSED]),
        "failed": int(results[FAILED]),
        "seconds": round(elapsed, 3),
        "connects_per_second": connacks / elapsed if elapsed else 0.0,
        # Connections that waited a SYN retry, by the client's clock and
        # by the kernel's count of SYNs dropped.
        "slow_connects": int(results[SLOW_CONNECTS]),
        "slowest_connect_s": round(results[SLOWEST_CONNECT], 3),
        "listen_overflows": overflows_after - overflows,
        "listen_drops": drops_after - drops,
        "broker_cpu_us_per_connect": round(used / connacks * 1e6, 1) if connacks else None,
        "broker_rss_kib": rss,
    }


def summary(r):
    return (
        f"{r['connacks']:,} of {r['clients']:,} CONNACKs in {r['seconds']} s"
        f" ({r['connects_per_second']:,.0f}/s, {r['broker_cpu_us_per_connect']} µs of broker CPU each);"
        f" SYN retries: {r['slow_connects']} connects over {SYN_RETRY_S:.0f} s,"
        f" {r['listen_overflows']} listen overflows; {r['refused']} refused, {r['failed']} failed"
    )

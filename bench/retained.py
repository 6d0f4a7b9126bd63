"""
The "retained" scenario: a broker holding many retained topics
(``ret/A/B``, a thousand B under each A) is subscribed to with narrow
wildcards.  The time to SUBACK and every match should follow what the
filter matches, not how many retained messages are stored.
"""

import time

from bench import hostile
from mqttgw.wire import packets as P

# Filters and what each matches of the stored topics.
FILTERS = {
    "ret/7/+": "the thousand topics under one branch",
    "ret/+/7": "one topic under each branch",
}


def load(port, count):
    """Store ``count`` retained messages; returns once the broker has them all."""
    sock, framer = hostile.mqtt_connect(port, "retainer")
    batch = []
    for i in range(count):
        batch.append(P.Publish(f"ret/{i // 1000}/{i % 1000}", b"v", 0, retain=True).encode())
        if len(batch) == 1000:
            sock.sendall(b"".join(batch))
            batch = []
    sock.sendall(b"".join(batch) + P.Pingreq().encode())
    # Packets of one connection are handled in order: the PINGRESP comes
    # after the last retained message is in.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if any(isinstance(p, P.Pingresp) for p in hostile.recv_packets(sock, framer, 1, timeout=5)):
            break
    sock.close()


def subscribe_and_time(port, topic_filter, expected):
    """Seconds from SUBSCRIBE to its SUBACK and ``expected`` retained messages."""
    sock, framer = hostile.mqtt_connect(port, "narrow")
    started = time.perf_counter()
    sock.sendall(P.Subscribe(1, [(topic_filter, 0)]).encode())
    got = hostile.recv_packets(sock, framer, expected + 1, timeout=120)
    elapsed = time.perf_counter() - started
    sock.close()
    matched = sum(isinstance(p, P.Publish) and p.retain for p in got)
    return elapsed, matched


def run(broker, count):
    started = time.monotonic()
    load(broker.port, count)
    loaded = time.monotonic() - started
    result = {"stored": count, "load_s": round(loaded, 1), "rss_mib": round(broker.rss_kib() / 1024, 1)}
    branches = max(1, count // 1000)
    expected = {"ret/7/+": min(1000, count - 7000) if count > 7000 else 0, "ret/+/7": branches}
    for topic_filter in FILTERS:
        # The best of three: the first may also pay for warming caches.
        timings = [subscribe_and_time(broker.port, topic_filter, expected[topic_filter]) for _ in range(3)]
        result[topic_filter] = {
            "ms": round(min(t for t, _ in timings) * 1000, 2),
            "matched": timings[0][1],
            "expected": expected[topic_filter],
        }
    return result

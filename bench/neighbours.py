"""
The "hostile neighbours" scenario: QoS 1 round trips between well-behaved
clients, measured once on their own and once while other connections do
everything in bench/hostile.py at the same time.  Reports the round trips'
p50/p99, messages lost, and the broker's peak resident memory.
"""

import functools
import os
import statistics
import threading
import time

from bench import hostile
from bench.percentile import nearest_rank
from mqttgw.wire import packets as P

# Well-behaved traffic: QoS 1 messages at a steady rate, each carrying its
# send time, from one publisher to one subscriber.
RATE = 1000


def calm_traffic(port, duration, shared, results):
    """Publish and receive QoS 1 at RATE for ``duration``; round trips in ns."""
    sub, sub_framer = hostile.mqtt_connect(port, "calm-sub")
    sub.sendall(P.Subscribe(1, [("calm/t", 1)]).encode())
    hostile.recv_packets(sub, sub_framer, 1)
    pub, pub_framer = hostile.mqtt_connect(port, "calm-pub")
    sent = 0
    received = []

    def receive():
        while not shared.stop.value or len(received) < sent:
            for packet in hostile.recv_packets(sub, sub_framer, 1, timeout=1):
                if isinstance(packet, P.Publish):
                    received.append(time.perf_counter_ns() - int.from_bytes(packet.payload[:8], "big"))
                    sub.sendall(P.Puback(packet.message_id).encode())
            if shared.stop.value == 2:
                return

    def acks():
        while shared.stop.value != 2:
            hostile.recv_packets(pub, pub_framer, 1, timeout=1)

    threads = [threading.Thread(target=receive, daemon=True), threading.Thread(target=acks, daemon=True)]
    for t in threads:
        t.start()
    shared.ready[0] = 1
    started = time.monotonic()
    while time.monotonic() - started < duration:
        payload = time.perf_counter_ns().to_bytes(8, "big") + bytes(56)
        pub.sendall(P.Publish("calm/t", payload, 1, message_id=sent % 65535 + 1).encode())
        sent += 1
        next_at = started + sent / RATE
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    shared.stop.value = 1
    deadline = time.monotonic() + 10
    while len(received) < sent and time.monotonic() < deadline:
        time.sleep(0.01)
    shared.stop.value = 2
    results[0] = sent
    results[1] = len(received)
    values = sorted(received)
    if values:
        results[2] = statistics.median(values)
        results[3] = nearest_rank(values, 0.99)


# Each neighbour misbehaves again this long after its last round ends: all
# of them at once, each about once a second, as a field network's worst
# hour might look (not a flood of each as fast as one core can send it).
PAUSE = 0.5


def _loop(stop, action):
    while not stop.is_set():
        try:
            action()
        except (OSError, RuntimeError, ValueError):
            # Being refused or cut off is what the broker should do to them.
            pass
        stop.wait(PAUSE)


def _wide(tcp_port, ws_port):
    sock, framer = hostile.wildcard_subscribe(tcp_port, "wide", filters=500)
    hostile.recv_packets(sock, framer, 2000, timeout=2)
    sock.close()


# Each hostile behaviour of bench/hostile.py, by name: (tcp_port, ws_port).
BEHAVIOURS = {
    "big-retained-ws": lambda tcp, ws: hostile.big_retained_ws_subscriber(tcp, ws, "n1"),
    "retained-amplification": lambda tcp, ws: hostile.retained_amplification(tcp, "n2"),
    "long-topics": lambda tcp, ws: hostile.long_topics(tcp, "n3", count=200),
    "ws-one-byte-messages": lambda tcp, ws: hostile.ws_one_byte_messages(ws, "n4", size=64 * 1024),
    "wide-wildcards": _wide,
    "invalid-filters": lambda tcp, ws: hostile.invalid_filters(tcp, "n5", count=100_000),
    "unread-pings": lambda tcp, ws: hostile.unread_pings(tcp, "n6", seconds=2),
    "pre-connect-hoard": lambda tcp, ws: hostile.pre_connect_hoard(tcp, connections=16, seconds=1),
    "http-post": lambda tcp, ws: hostile.http_post(ws, seconds=1),
    "slow-upgrade": lambda tcp, ws: hostile.slow_upgrade(ws, interval=0.2, limit=3),
    "raw-mqtt-to-websocket": lambda tcp, ws: hostile.raw_mqtt_to_websocket_port(ws),
    "reconnect-storm": lambda tcp, ws: hostile.reconnect_storm(tcp, "n9", count=500, timeout=5),
    "keepalive-drip": lambda tcp, ws: hostile.keepalive_drip(tcp, "n10", keepalive=1, limit=3),
}


def neighbours(tcp_port, ws_port, shared, only=None):
    """The hostile behaviours (``only`` these names, else all) at once, each
    in a loop, until told to stop."""
    # They share the load generator's CPU with the well-behaved clients:
    # at the lowest priority, they do not delay them there, so the round
    # trips measure how the broker treats its clients, not the scheduler.
    os.nice(19)
    stop = threading.Event()
    # Retained topics for the wide subscriptions to walk.
    filler, _ = hostile.mqtt_connect(tcp_port, "filler")
    for i in range(10_000):
        filler.sendall(P.Publish(f"wide/{i % 100}/{i}", b"r", 0, retain=True).encode())
    filler.sendall(P.Disconnect().encode())
    filler.close()

    actions = [
        functools.partial(behaviour, tcp_port, ws_port)
        for name, behaviour in BEHAVIOURS.items()
        if only is None or name in only
    ]
    threads = [threading.Thread(target=_loop, args=(stop, a), daemon=True) for a in actions]
    for t in threads:
        t.start()
    shared.ready[1] = 1
    while not shared.stop.value:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(15)
    os._exit(0)


class Shared:
    def __init__(self, ctx):
        self.stop = ctx.RawValue("i", 0)
        self.ready = ctx.RawArray("i", 2)


def run(broker, duration, with_neighbours, ctx, pin, only=None):
    """One run: figures for the calm traffic and the broker's peak memory;
    beside ``only`` these of the hostile behaviours, else all."""
    shared = Shared(ctx)
    results = ctx.RawArray("d", 4)
    procs = []
    if with_neighbours:
        procs.append(ctx.Process(target=pin, args=(neighbours, broker.port, broker.ws_port, shared, only)))
        procs[-1].start()
        deadline = time.monotonic() + 60
        while not shared.ready[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
    calm = ctx.Process(target=pin, args=(calm_traffic, broker.port, duration, shared, results))
    calm.start()
    peak = broker.rss_kib()
    while calm.is_alive():
        peak = max(peak, broker.rss_kib())
        time.sleep(0.1)
    calm.join()
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    sent, received = int(results[0]), int(results[1])
    return {
        "sent": sent,
        "lost": sent - received,
        "p50_ms": results[2] / 1e6,
        "p99_ms": results[3] / 1e6,
        "peak_rss_mib": round(peak / 1024, 1),
    }

"""
The "hostile neighbours" scenario: QoS 1 round trips between well-behaved
clients, measured once on their own and once while other connections do
everything in bench/hostile.py at the same time.  Reports the round trips'
p50/p99, messages lost, and the broker's peak resident memory.
"""

import os
import statistics
import threading
import time

from bench import hostile
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
        results[3] = values[min(len(values) - 1, int(len(values) * 0.99))]


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


def neighbours(tcp_port, ws_port, shared):
    """Every hostile behaviour at once, each in a loop, until told to stop."""
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

    def wide():
        sock, framer = hostile.wildcard_subscribe(tcp_port, "wide", filters=500)
        hostile.recv_packets(sock, framer, 2000, timeout=2)
        sock.close()

    actions = [
        lambda: hostile.big_retained_ws_subscriber(tcp_port, ws_port, "n1"),
        lambda: hostile.retained_amplification(tcp_port, "n2"),
        lambda: hostile.long_topics(tcp_port, "n3", count=200),
        lambda: hostile.ws_one_byte_messages(ws_port, "n4", size=64 * 1024),
        wide,
        lambda: hostile.invalid_filters(tcp_port, "n5", count=100_000),
        lambda: hostile.unread_pings(tcp_port, "n6", seconds=2),
        lambda: hostile.pre_connect_hoard(tcp_port, connections=16, seconds=1),
        lambda: hostile.http_post(ws_port, seconds=1),
        lambda: hostile.slow_upgrade(ws_port, interval=0.2, limit=3),
        lambda: hostile.raw_mqtt_to_websocket_port(ws_port),
        lambda: hostile.reconnect_storm(tcp_port, "n9", count=500, timeout=5),
        lambda: hostile.keepalive_drip(tcp_port, "n10", keepalive=1, limit=3),
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


def run(broker, duration, with_neighbours, ctx, pin):
    """One run: figures for the calm traffic and the broker's peak memory."""
    shared = Shared(ctx)
    results = ctx.RawArray("d", 4)
    procs = []
    if with_neighbours:
        procs.append(ctx.Process(target=pin, args=(neighbours, broker.port, broker.ws_port, shared)))
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

"""
MQTT-SN through mqttgw's UDP listener: publishes from 10 and from 100
MQTT-SN clients at QoS 0 and at QoS 1 (one in flight per client, as the
protocol has it) to an MQTT subscriber, delivery to 1,000 MQTT-SN
subscribers, and 10,000 connected MQTT-SN clients held (KiB each).

Payloads are 32 bytes on a short topic name (no REGISTER), as in the
anchor: the Paho MQTT-SN Gateway in front of mosquitto, measured on this
kind of machine with 10 clients, delivers about 38,700 msg/s at QoS 0
(3% lost) and 6,100 at QoS 1 (``ANCHOR``).  Run it as
``python -m bench.mqttsn``.
"""

import argparse
import json
import multiprocessing
import os
import select
import socket
import time

from bench.brokers import Mqttgw, _raise_fd_limit, free_port
from bench.loadgen import connect as mqtt_connect
from bench.loadgen import subscribe as mqtt_subscribe
from mqttgw.wire import mqttsn as S
from mqttgw.wire import packets as P
from mqttgw.wire.mqttsn import constants as C

ANCHOR = {"qos0": 38_700, "qos1": 6_100}
PAYLOAD = b"x" * 32
# The short topic names the rows publish on.
FAN_IN, FAN_OUT = "si", "so"
# Seconds a run waits for what is still on its way once publishing stops.
SETTLE = 2.0


def _udp():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def _answered(socks, port, make, want, timeout=30.0):
    """Send ``make(i)`` from each socket until each has answered with a ``want``; [(sock, message)]."""
    address = ("127.0.0.1", port)
    waiting = {s.fileno(): (i, s) for i, s in enumerate(socks)}
    poller = select.epoll()
    for fd in waiting:
        poller.register(fd, select.EPOLLIN)
    deadline = time.monotonic() + timeout
    resend_at = 0.0
    try:
        while waiting and time.monotonic() < deadline:
            if time.monotonic() >= resend_at:
                # A datagram (or its answer) may be lost: asked again after a second.
                for i, s in list(waiting.values()):
                    s.sendto(make(i), address)
                resend_at = time.monotonic() + 1.0
            for fd, _ in poller.poll(0.2):
                i, s = waiting.get(fd, (None, None))
                if s is None:
                    continue
                try:
                    data = s.recv(2048)
                except BlockingIOError:
                    continue
                message = S.decode(data)
                if isinstance(message, want):
                    if getattr(message, "return_code", C.ACCEPTED) != C.ACCEPTED:
                        raise RuntimeError(f"MQTT-SN client {i} refused: {message}")
                    del waiting[fd]
    finally:
        poller.close()
    if waiting:
        raise RuntimeError(f"{len(waiting)} MQTT-SN clients got no {want.__name__} within {timeout:g}s")


def connected(count, port, prefix, keepalive=600):
    socks = [_udp() for _ in range(count)]
    _answered(socks, port, lambda i: S.Connect(client_id=f"{prefix}{i}", duration=keepalive).encode(), S.Connack)
    return socks


def _pinned(cpu):
    """Pin this process to ``cpu`` (None: leave it); the CPUs it had."""
    had = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    return had


def _publishers(port, count, qos, duration, results, start, cpu=None):
    """One process's ``count`` clients publishing for ``duration`` seconds: results gets how many were sent (acked)."""
    _raise_fd_limit()
    _pinned(cpu)
    socks = connected(count, port, f"bench-sn-{os.getpid()}-")
    address = ("127.0.0.1", port)
    topic = S.short_topic_id(FAN_IN)
    start.wait()
    sent = acked = 0
    end = time.monotonic() + duration
    if qos == 0:
        frame = S.Publish(topic_id=topic, data=PAYLOAD, qos=0, topic_id_type=C.SHORT_TOPIC_NAME).encode()
        while time.monotonic() < end:
            for s in socks:
                try:
                    s.sendto(frame, address)
                    sent += 1
                except BlockingIOError:
                    select.select([], [s], [], 0.01)
    else:
        poller = select.epoll()
        by_fd = {s.fileno(): s for s in socks}
        for fd in by_fd:
            poller.register(fd, select.EPOLLIN)
        mids = {}

        def send(s):
            nonlocal sent
            mid = mids[s.fileno()] = mids.get(s.fileno(), 0) % 0x7FFF + 1
            s.sendto(S.Publish(topic_id=topic, data=PAYLOAD, qos=1, message_id=mid,
                               topic_id_type=C.SHORT_TOPIC_NAME).encode(), address)
            sent += 1

        for s in socks:
            send(s)
        while time.monotonic() < end:
            for fd, _ in poller.poll(0.1):
                s = by_fd[fd]
                try:
                    data = s.recv(2048)
                except BlockingIOError:
                    continue
                message = S.decode(data)
                if type(message) is S.Puback and message.message_id == mids[fd]:
                    acked += 1
                    send(s)
        poller.close()
    results.put((sent, acked))
    for s in socks:
        s.sendto(S.Disconnect().encode(), address)
        s.close()


def _mqtt_reader(sock, until_idle):
    """PUBLISHes read from an MQTT subscriber's socket (QoS 1 acknowledged) until ``until_idle`` s pass without one."""
    count = 0
    buffered = b""
    sock.settimeout(until_idle)
    while True:
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            return count
        if not data:
            return count
        buffered += data
        acks = []
        o = 0
        while True:
            if len(buffered) - o < 2:
                break
            body, length = P.decode_remaining_length(buffered, o + 1)
            if body + length > len(buffered):
                break
            first = buffered[o]
            if first >> 4 == P.PUBLISH:
                count += 1
                if (first >> 1) & 3:
                    topic_end = body + 2 + int.from_bytes(buffered[body:body + 2], "big")
                    acks.append(P.puback_bytes(int.from_bytes(buffered[topic_end:topic_end + 2], "big")))
            o = body + length
        buffered = buffered[o:]
        if acks:
            sock.sendall(b"".join(acks))


def fan_in(broker, clients, qos, duration, ctx, cpu=None):
    """
    Messages a second an MQTT subscriber got from ``clients`` MQTT-SN
    publishers, and how many were lost.  At QoS 0 the publishers send as
    fast as they can: what the gateway's core cannot read in time the
    kernel drops, as UDP does, and that is counted lost.
    """
    had = _pinned(cpu)
    try:
        return _fan_in(broker, clients, qos, duration, ctx, cpu)
    finally:
        os.sched_setaffinity(0, had)


def _fan_in(broker, clients, qos, duration, ctx, cpu):
    sub = mqtt_connect(broker.port, "bench-sn-sub")
    mqtt_subscribe(sub, FAN_IN, qos)
    processes = min(2, clients)
    results, start = ctx.Queue(), ctx.Event()
    workers = [
        ctx.Process(target=_publishers, args=(broker.mqttsn_port, clients // processes, qos, duration, results, start, cpu))
        for _ in range(processes)
    ]
    for w in workers:
        w.start()
    # Every client connected before the clock starts.
    time.sleep(0.5 + clients / 200)
    start.set()
    began = time.monotonic()
    received = _mqtt_reader(sub, SETTLE)
    elapsed = time.monotonic() - began - SETTLE
    sent = acked = 0
    for _ in workers:
        s, a = results.get(timeout=60)
        sent, acked = sent + s, acked + a
    for w in workers:
        w.join(30)
    sub.close()
    lost = (acked - received) if qos else (sent - received)
    return {"clients": clients, "qos": qos, "per_second": round(received / max(elapsed, 1e-9)), "sent": sent,
            "acknowledged": acked, "received": received, "lost": max(lost, 0)}


def fan_out(broker, subscribers, rate, duration, cpu=None):
    """Deliveries a second to ``subscribers`` MQTT-SN clients of what one MQTT publisher sends."""
    had = _pinned(cpu)
    try:
        return _fan_out(broker, subscribers, rate, duration)
    finally:
        os.sched_setaffinity(0, had)


def _fan_out(broker, subscribers, rate, duration):
    socks = connected(subscribers, broker.mqttsn_port, "bench-sn-fo-")
    topic = S.short_topic_id(FAN_OUT)
    _answered(socks, broker.mqttsn_port,
              lambda i: S.Subscribe(message_id=1, qos=0, topic_name=FAN_OUT, topic_id_type=C.SHORT_TOPIC_NAME).encode(),
              S.Suback)
    pub = mqtt_connect(broker.port, "bench-sn-fo-pub")
    frame = P.Publish(FAN_OUT, PAYLOAD, 0).encode()
    poller = select.epoll()
    for s in socks:
        poller.register(s.fileno(), select.EPOLLIN)
    by_fd = {s.fileno(): s for s in socks}
    got = sent = 0
    began = time.monotonic()
    end = began + duration
    next_at = began
    last = began
    while True:
        now = time.monotonic()
        if now < end and now >= next_at:
            pub.sendall(frame)
            sent += 1
            next_at += 1.0 / rate
        if now >= end and now - last > SETTLE:
            break
        for fd, _ in poller.poll(0.001):
            while True:
                try:
                    data = by_fd[fd].recv(2048)
                except BlockingIOError:
                    break
                if data[1 if data[0] != 1 else 3] == C.PUBLISH:
                    got += 1
                    last = time.monotonic()
    poller.close()
    elapsed = last - began
    pub.close()
    for s in socks:
        s.close()
    return {"subscribers": subscribers, "published": sent, "deliveries": got,
            "per_second": round(got / max(elapsed, 1e-9)), "lost": sent * subscribers - got}


def held(broker, count):
    """KiB of the gateway's memory per connected MQTT-SN client, ``count`` held."""
    before = broker.rss_kib()
    socks = connected(count, broker.mqttsn_port, "bench-sn-held-", keepalive=3600)
    time.sleep(1.0)
    after = broker.rss_kib()
    for s in socks:
        s.close()
    return {"clients": count, "kib_per_client": round((after - before) / count, 2)}


class MqttgwSn(Mqttgw):
    """mqttgw with an MQTT-SN listener beside its TCP one."""

    def __init__(self, workdir, **kwargs):
        super().__init__(workdir, kinds=("tcp",), **kwargs)
        self.mqttsn_port = free_port()
        # Every client of a run comes from 127.0.0.1.
        self.options += ["--mqttsn", f"127.0.0.1:{self.mqttsn_port}", "--mqttsn-max-clients-per-address", "100000"]


def run(workdir, duration=5.0, fan_out_subscribers=1000, held_clients=10_000, rate=200,
        broker_cpu=None, load_cpu=None):
    """
    Every row, each on a fresh gateway; with ``broker_cpu`` and
    ``load_cpu``, the gateway and the clients on CPUs of their own, as
    ``python -m bench`` runs them.
    """
    _raise_fd_limit()
    ctx = multiprocessing.get_context("forkserver")
    rows = {}

    def fresh():
        return MqttgwSn(workdir, cpu=broker_cpu, max_queued=1_000_000).start()

    for clients in (10, 100):
        for qos in (0, 1):
            broker = fresh()
            try:
                rows[f"mqtt-sn fan-in qos{qos} {clients} clients"] = fan_in(
                    broker, clients, qos, duration, ctx, load_cpu)
            finally:
                broker.stop()
    broker = fresh()
    try:
        rows[f"mqtt-sn fan-out qos0 {fan_out_subscribers} subscribers"] = fan_out(
            broker, fan_out_subscribers, rate, duration, load_cpu)
    finally:
        broker.stop()
    broker = fresh()
    try:
        had = _pinned(load_cpu)
        try:
            rows[f"mqtt-sn {held_clients} clients held"] = held(broker, held_clients)
        finally:
            os.sched_setaffinity(0, had)
    finally:
        broker.stop()
    return rows


def summary(rows):
    """The rows as a table: each figure, what was lost, and against the anchor where it has one."""
    header = ["mqtt-sn (mqttgw)", "figure", "lost", "/Paho MQTT-SN Gateway"]
    table = []
    for name, r in rows.items():
        row = name.removeprefix("mqtt-sn ")
        if "kib_per_client" in r:
            table.append([row, f"{r['kib_per_client']:,.2f} KiB each", "", ""])
            continue
        unit = "deliveries/s" if "deliveries" in r else "msg/s"
        sent = r.get("sent", r.get("published", 0) * r.get("subscribers", 1))
        lost = r.get("lost", 0)
        share = f" ({lost / sent:.1%})" if lost and sent else ""
        anchor = ""
        if "fan-in" in name and r["clients"] == 10:
            base = ANCHOR["qos%d" % r["qos"]]
            anchor = f"{r['per_second'] / base:.2f} (of {base:,})"
        table.append([row, f"{r['per_second']:,} {unit}", f"{lost:,}{share}", anchor])
    widths = [max(len(c) for c in column) for column in zip(header, *table)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in table]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.mqttsn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--held", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=200, help="fan-out publishes a second")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the gateway and the clients to separate CPUs")
    args = parser.parse_args(argv)
    import tempfile

    cpus = sorted(os.sched_getaffinity(0))
    broker_cpu, load_cpu = (None, None) if args.no_pin or len(cpus) < 2 else (cpus[0], cpus[1])
    with tempfile.TemporaryDirectory(prefix="bench-mqttsn-") as workdir:
        rows = run(workdir, args.duration, args.subscribers, args.held, args.rate, broker_cpu, load_cpu)
    for line in summary(rows):
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()

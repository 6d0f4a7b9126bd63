"""
Draining a backlog: QoS 1 messages queued while the way to their receiver
was down, then delivered to a client.

- ``bridge`` (mqttgw): a bridge's outage queue forwarded into a real
  mosquitto, once a reload points the bridge at it, with the client
  subscribed there.
- ``mosquitto_bridge``: the reference for the bridge drain, mosquitto
  with its own bridge: the same backlog queued while the bridge's upstream
  (another mosquitto, on the same port as before) was down, drained with
  the same in-flight window once it is back.
- ``backlog`` (any broker): the broker delivering the same backlog to a
  client whose persistent session held it while it was away.

Either way the client counts what it gets from its first message to its
last, checks that the sequence numbers in the payloads come in order, and
acknowledges each message as it goes.
"""

import os
import select
import signal
import socket
import struct
import time

from bench.brokers import MAX_INFLIGHT, Mosquitto
from bench.loadgen import connect, subscribe
from mqttgw.wire import packets as P

TOPIC = "drain/t"
PAYLOAD = 64
WINDOW = 100
# Seconds without a message after which the client gives up.
IDLE = 15

_seq = struct.Struct(">Q")


def publish(port, count):
    """``count`` QoS 1 messages, sequence-numbered, ``WINDOW`` unacknowledged at most."""
    sock = connect(port, f"bench-drain-pub-{os.getpid()}")
    # A broker that stops acknowledging ends the run instead of hanging it.
    sock.settimeout(IDLE)
    pad = b"x" * (PAYLOAD - _seq.size)
    sent = acked = 0
    buffered = b""
    while acked < count:
        batch = []
        while sent < count and sent - acked < WINDOW:
            batch.append(P.Publish(TOPIC, _seq.pack(sent) + pad, 1, message_id=sent % 65535 + 1).encode())
            sent += 1
        if batch:
            sock.sendall(b"".join(batch))
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("broker closed the publisher's connection")
        data = buffered + data
        # Nothing but PUBACKs (4 bytes) comes back.
        whole = len(data) - len(data) % 4
        acked += whole // 4
        buffered = data[whole:]
    sock.close()


def receive(port, client_id, count, clean_session, results):
    """
    Connect (subscribing on a clean session), then read and acknowledge
    until ``count`` messages came.  ``results``: ready, first and last
    arrival (ns), received, out of order, repeated.
    """
    try:
        sock = connect(port, client_id, clean_session=clean_session)
        if clean_session:
            subscribe(sock, TOPIC, 1)
        results[0] = 1
        expected = 0
        received = out_of_order = repeated = 0
        first = last = 0
        buffered = b""
        while received < count:
            readable, _, _ = select.select([sock], [], [], IDLE)
            if not readable:
                break
            data = sock.recv(1 << 20)
            if not data:
                break
            last = time.perf_counter_ns()
            first = first or last
            data = buffered + data
            acks = []
            o, end = 0, len(data)
            while o + 2 <= end:
                length, h, shift = 0, 1, 0
                while True:
                    if o + h >= end:
                        length = None
                        break
                    byte = data[o + h]
                    length |= (byte & 0x7F) << shift
                    h += 1
                    shift += 7
                    if not byte & 0x80:
                        break
                if length is None or o + h + length > end:
                    break
                if data[o] >> 4 == 3:
                    tlen = (data[o + h] << 8) | data[o + h + 1]
                    body = o + h + 2 + tlen
                    acks.append(b"\x40\x02" + data[body : body + 2])
                    seq = _seq.unpack_from(data, body + 2)[0]
                    if seq < expected:
                        repeated += 1
                    else:
                        out_of_order += seq != expected
                        expected = seq + 1
                        received += 1
                o += h + length
            buffered = data[o:]
            if acks:
                sock.sendall(b"".join(acks))
        results[1], results[2] = first, last
        results[3], results[4], results[5] = received, out_of_order, repeated
        sock.close()
    except Exception as e:
        print(f"drain client: {e!r}", flush=True)
    finally:
        results[0] = 1


def _result(count, results, queued_in):
    first, last, received = results[1], results[2], int(results[3])
    seconds = (last - first) / 1e9
    return {
        "messages": count,
        "received": received,
        "lost": count - received,
        "out_of_order": int(results[4]),
        "repeated": int(results[5]),
        "queued_s": round(queued_in, 2),
        "seconds": round(seconds, 3),
        "per_second": (received - 1) / seconds if seconds > 0 else 0.0,
    }


def _start_client(ctx, runner, port, client_id, count, clean_session):
    results = ctx.RawArray("d", 6)
    p = ctx.Process(target=runner, args=(receive, port, client_id, count, clean_session, results))
    p.start()
    deadline = time.monotonic() + 30
    while not results[0] and p.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not results[0]:
        p.kill()
        raise RuntimeError("the drain client did not connect")
    return p, results


def _finish(p, count, results, queued_in):
    p.join(IDLE + 600)
    if p.is_alive():
        p.kill()
    return _result(count, results, queued_in)


def backlog(broker, count, ctx, runner):
    """The broker delivers ``count`` messages that waited in a client's session."""
    client_id = f"bench-drain-sub-{os.getpid()}"
    sock = connect(broker.port, client_id, clean_session=False)
    subscribe(sock, TOPIC, 1)
    sock.close()
    started = time.monotonic()
    publish(broker.port, count)
    queued_in = time.monotonic() - started
    p, results = _start_client(ctx, runner, broker.port, client_id, count, False)
    return _finish(p, count, results, queued_in)


BRIDGE = """\
[[bridge]]
name = "drain"
addresses = ["127.0.0.1:{port}"]
rules = ["drain/# out 1"]
max_inflight_messages = {inflight}
max_queued_messages = {queued}
# Retried only when a reload points it at the upstream.
reconnect_initial = 3600.0
reconnect_max = 3600.0
"""


def bridge_config(workdir, port, count):
    path = workdir / "bridge.toml"
    path.write_text(BRIDGE.format(port=port, inflight=MAX_INFLIGHT, queued=count))
    return path


def bridge(mqttgw, config, count, workdir, cpu, ctx, runner):
    """
    ``mqttgw`` was started with ``config`` (from ``bridge_config``), its
    bridge pointed at a closed port: the backlog waits in its store.  A
    mosquitto then starts with a client subscribed, and a reload sends the
    bridge to it.  The upstream runs on ``cpu``, with the client: it
    stands for another machine.
    """
    started = time.monotonic()
    publish(mqttgw.port, count)
    queued_in = time.monotonic() - started
    upstream = Mosquitto(workdir, cpu, max_queued=count).start()
    try:
        p, results = _start_client(ctx, runner, upstream.port, f"bench-drain-up-{os.getpid()}", count, True)
        config.write_text(_repoint(config, upstream.port))
        mqttgw.process.send_signal(signal.SIGHUP)
        return _finish(p, count, results, queued_in)
    finally:
        upstream.stop()


def mosquitto_bridge_lines(upstream_port):
    """mosquitto.conf lines for its own bridge of the drain topic."""
    return [
        "connection drain",
        f"address 127.0.0.1:{upstream_port}",
        "topic drain/# out 1",
        # Its session at the upstream and its queue are kept across the outage.
        "cleansession false",
        "keepalive_interval 60",
        # Dialled again every second while the upstream is away.
        "restart_timeout 1",
    ]


def mosquitto_bridge(field, upstream_port, count, workdir, cpu, ctx, runner):
    """
    ``field`` (a mosquitto started with ``mosquitto_bridge_lines``) bridges
    into an upstream on ``upstream_port``.  Once the bridge has carried a
    message, the upstream stops, the backlog is published to ``field``,
    and the upstream starts again on the same port with the client
    subscribed there; the bridge finds it on its next dial.
    """
    upstream = _upstream(workdir, cpu, count, upstream_port).start()
    try:
        _bridged(field.port, upstream.port)
    finally:
        upstream.stop()
    started = time.monotonic()
    publish(field.port, count)
    queued_in = time.monotonic() - started
    upstream = _upstream(workdir, cpu, count, upstream_port).start()
    try:
        p, results = _start_client(ctx, runner, upstream.port, f"bench-drain-up-{os.getpid()}", count, True)
        return _finish(p, count, results, queued_in)
    finally:
        upstream.stop()


def _upstream(workdir, cpu, count, port):
    upstream = Mosquitto(workdir, cpu, max_queued=count)
    upstream.port = port
    return upstream


def _bridged(field_port, upstream_port, timeout=30):
    """Wait until a message published to the field broker reaches the upstream."""
    sub = connect(upstream_port, f"bench-drain-probe-{os.getpid()}")
    subscribe(sub, "drain/probe", 0)
    sub.settimeout(0.5)
    pub = connect(field_port, f"bench-drain-probe-pub-{os.getpid()}")
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            pub.sendall(P.Publish("drain/probe", b"", 0).encode())
            try:
                if sub.recv(4096):
                    return
            except socket.timeout:
                pass
        raise RuntimeError("mosquitto's bridge did not connect to its upstream")
    finally:
        sub.close()
        pub.close()


def _repoint(config, port):
    lines = config.read_text().splitlines(keepends=True)
    return "".join(f'addresses = ["127.0.0.1:{port}"]\n' if line.startswith("addresses") else line for line in lines)

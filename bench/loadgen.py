"""
The load generator: raw blocking sockets, packets encoded in advance, one
process per MQTT client.  Publishers keep the number of messages sent but
not yet received by every subscriber under a window (closed loop), so no
broker is pushed past its queues; subscribers count and acknowledge.
Counters are shared between the processes through ``multiprocessing``
arrays.
"""

import os
import select
import socket
import struct
import time

from mqttgw.wire import packets as P

_u16 = struct.Struct(">H")


def connect(port, client_id, keepalive=0, clean_session=True, v5=False):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if v5:
        # No session expiry: a clean session's, as 3.1.1's clean session.
        properties = {} if clean_session else {"session_expiry_interval": 3600}
        sock.sendall(
            P.Connect(
                client_id=client_id, keepalive=keepalive, clean_session=clean_session,
                protocol_level=P.MQTT_5, properties=properties,
            ).encode()
        )
        connack = _recv_packet(sock)
    else:
        sock.sendall(
            P.Connect(
                client_id=client_id, keepalive=keepalive, clean_session=clean_session
            ).encode()
        )
        connack = _recv_exact(sock, 4)
    if connack[0] != 0x20 or connack[3] != 0:
        raise RuntimeError(f"{client_id}: CONNECT refused: {connack!r}")
    return sock


def _recv_packet(sock):
    """One whole packet (its Remaining Length below 16,384)."""
    head = _recv_exact(sock, 2)
    length = head[1]
    if length & 0x80:
        more = _recv_exact(sock, 1)
        head += more
        length = (length & 0x7F) | (more[0] << 7)
    return head + _recv_exact(sock, length)


def acknowledgements(data):
    """
    The acknowledgements in ``data`` of any length (5.0 ones may carry a
    reason code and properties): ``(PUBACK and PUBCOMP count, message ids
    of PUBRECs, bytes left over)``.
    """
    n, rest = divmod(len(data), 4)
    if not rest and data[1::4] == b"\x02" * n and data[0::4] == b"\x40" * n:
        # PUBACKs of success without properties (3.1.1's form), the usual
        # reply: counted at C speed, as the 3.1.1 publisher does.
        return n, [], b""
    done = 0
    pubrecs = []
    o, end = 0, len(data)
    while o + 2 <= end:
        length = data[o + 1]
        h = 2
        if length & 0x80:
            if o + 3 > end:
                break
            length = (length & 0x7F) | (data[o + 2] << 7)
            h = 3
        if o + h + length > end:
            break
        kind = data[o] >> 4
        if kind == 4 or kind == 7:
            done += 1
        elif kind == 5:
            pubrecs.append(data[o + h : o + h + 2])
        o += h + length
    return done, pubrecs, data[o:]


def ws_connect(port, client_id, clean_session=True):
    """
    MQTT over WebSocket: the upgrade, then CONNECT in a binary frame.
    Returns the socket and a Deframer holding what followed the CONNACK.
    """
    from bench.hostile import ws_upgrade

    sock, rest = ws_upgrade(port)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(ws_frame(P.Connect(client_id=client_id, keepalive=0, clean_session=clean_session).encode()))
    deframer = Deframer(rest)
    connack = deframer.read_exact(sock, 4)
    if connack[:2] != b"\x20\x02" or connack[3] != 0:
        raise RuntimeError(f"{client_id}: CONNECT refused: {connack!r}")
    return sock, deframer


def ws_frame(payload, mask=b"\x6d\x71\x74\x74"):
    """A masked binary frame, as a client (a browser) sends one packet."""
    n = len(payload)
    if n < 126:
        header = bytes((0x82, 0x80 | n))
    else:
        header = bytes((0x82, 0x80 | 126)) + _u16.pack(n)
    if mask == _ZERO_MASK:
        return header + mask + payload
    key = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return header + mask + masked


# A valid mask that leaves the payload as it is: for replies made on the
# fly (acknowledgements), which would otherwise cost the load generator a
# byte-by-byte XOR.  Whole frames sent in bulk use a real mask.
_ZERO_MASK = b"\x00\x00\x00\x00"


def ws_send(sock):
    """``sendall`` for MQTT bytes made on the fly, each call one frame."""
    return lambda data: sock.sendall(ws_frame(data, _ZERO_MASK))


class Deframer:
    """The MQTT byte stream out of a server's (unmasked) WebSocket frames."""

    def __init__(self, leftover=b""):
        self.buffer = bytes(leftover)
        self.stream = b""

    def feed(self, data):
        buf = self.buffer + data if self.buffer else data
        out = []
        at = 0
        size = len(buf)
        while at + 2 <= size:
            n = buf[at + 1] & 0x7F
            h = 2
            if n == 126:
                if at + 4 > size:
                    break
                n, h = int.from_bytes(buf[at + 2 : at + 4], "big"), 4
            elif n == 127:
                if at + 10 > size:
                    break
                n, h = int.from_bytes(buf[at + 2 : at + 10], "big"), 10
            if at + h + n > size:
                break
            if buf[at] & 0x0F in (0, 2):
                out.append(buf[at + h : at + h + n])
            elif buf[at] & 0x0F == 8:
                raise ConnectionError("broker closed the WebSocket")
            at += h + n
        self.buffer = buf[at:]
        return out[0] if len(out) == 1 else b"".join(out)

    def recv(self, sock):
        """``sock.recv`` for the MQTT stream: b"" only at the end."""
        def recv(n):
            while True:
                data = sock.recv(n)
                if not data:
                    return b""
                out = self.feed(data)
                if out:
                    return out
        return recv

    def read_exact(self, sock, n):
        recv = self.recv(sock)
        while len(self.stream) < n:
            data = recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.stream += data
        out, self.stream = self.stream[:n], self.stream[n:]
        return out


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def subscribe(sock, topic_filter, qos, deframer=None, v5=False):
    if v5:
        sock.sendall(P.Subscribe(1, [(topic_filter, qos)], {}).encode())
        suback = _recv_packet(sock)
        if suback[0] != 0x90 or suback[-1] != qos:
            raise RuntimeError(f"SUBSCRIBE refused: {suback!r}")
        return
    packet = P.Subscribe(1, [(topic_filter, qos)]).encode()
    if deframer is None:
        sock.sendall(packet)
        suback = _recv_exact(sock, 5)
    else:
        sock.sendall(ws_frame(packet))
        suback = deframer.read_exact(sock, 5)
    if suback[0] != 0x90 or suback[4] != qos:
        raise RuntimeError(f"SUBSCRIBE refused: {suback!r}")


def packet_size(topic, payload_size, qos, v5=False):
    properties = {} if v5 else None
    return len(P.Publish(topic, b"x" * payload_size, qos, message_id=1, properties=properties).encode())


def publish_frame(topic, payload, qos, mid, v5, alias):
    """
    A publisher's PUBLISH; over 5.0 with ``alias`` 1, the topic and topic
    alias 1 (which sets it up), with ``alias`` 2 that alias alone.
    """
    if not v5:
        return P.Publish(topic, payload, qos, message_id=mid).encode()
    if not alias:
        return P.Publish(topic, payload, qos, message_id=mid, properties={}).encode()
    return P.Publish(
        topic if alias == 1 else "", payload, qos, message_id=mid, properties={"topic_alias": 1}
    ).encode()


class Shared:
    """Counters shared by the clients of one scenario run."""

    def __init__(self, ctx, publishers, subscribers):
        self.sent = ctx.RawArray("q", publishers)
        self.received = ctx.RawArray("q", subscribers)
        # Each subscriber (and the probe) sets its own flag when subscribed;
        # publishers set theirs when connected and ready to send, and all
        # start when the runner sets ``go``.
        self.ready = ctx.RawArray("b", subscribers + 1)
        self.publishers_ready = ctx.RawArray("b", publishers)
        self.go = ctx.RawValue("i", 0)
        self.stop = ctx.RawValue("i", 0)
        # perf_counter_ns of the first and last message each subscriber got
        self.first = ctx.RawArray("q", subscribers)
        self.last = ctx.RawArray("q", subscribers)
        self.errors = ctx.RawValue("i", 0)
        # CPU seconds each client used: publishers, subscribers, the probe.
        self.publishers = publishers
        self.cpu = ctx.RawArray("d", publishers + subscribers + 1)

    def outstanding(self):
        received = self.received
        return sum(self.sent) - min(received[i] for i in range(len(received)))


def publisher(port, index, topic, qos, payload_size, shared, window, batch, rate, inflight, websocket=False, v5=False, alias=False):
    """
    Publish until told to stop; QoS 1/2 flows are completed.  The
    publishers together keep at most ``window`` messages sent that not
    every subscriber has received (each checks it against all of them:
    see ``Shared.outstanding``).  At most
    ``inflight`` QoS 1/2 messages are unacknowledged at once, as a client
    library's in-flight window would allow (mosquitto acknowledges and
    discards what a v3 client sends beyond its own window).  Over
    ``websocket``, each packet goes in a frame of its own, as browsers
    send them.
    """
    try:
        client_id = f"bench-pub-{index}-{os.getpid()}"
        if websocket:
            sock, deframer = ws_connect(port, client_id)
            recv, reply = deframer.recv(sock), ws_send(sock)
            wrap = ws_frame
        else:
            sock = connect(port, client_id, v5=v5)
            recv, reply = sock.recv, sock.sendall
            wrap = bytes
        payload = b"x" * payload_size
        # With a topic alias, every frame but the first leaves the topic out.
        if qos == 0:
            block = wrap(publish_frame(topic, payload, 0, None, v5, alias and 2)) * batch
            frames = None
        else:
            # Every message id encoded in advance: 1..65535, back to back.
            frames = b"".join(
                wrap(publish_frame(topic, payload, qos, m, v5, alias and 2)) for m in range(1, 65536)
            )
            size = len(frames) // 65535
        ack_window = inflight
        sent = acked = 0
        mid_index = 0
        pending = b""
        shared_sent = shared.sent
        shared.publishers_ready[index] = 1
        while not shared.go.value:
            time.sleep(0.001)
        started = time.perf_counter()
        if alias:
            # The first message sets the alias up: message id 1, with its topic.
            reply(publish_frame(topic, payload, qos, 1 if qos else None, v5, 1))
            sent = 1
            mid_index = 1 if qos else 0
            shared_sent[index] = sent
        while not shared.stop.value:
            room = window - shared.outstanding()
            if qos:
                room = min(room, ack_window - (sent - acked))
            if rate:
                room = min(room, int(rate * (time.perf_counter() - started)) - sent)
            n = min(batch, room)
            if n <= 0 and not rate and qos == 0:
                time.sleep(0)
            if n > 0:
                if qos == 0:
                    sock.sendall(block if n == batch else block[: n * (len(block) // batch)])
                else:
                    end = mid_index + n
                    if end <= 65535:
                        sock.sendall(frames[mid_index * size : end * size])
                    else:
                        sock.sendall(
                            frames[mid_index * size :] + frames[: (end - 65535) * size]
                        )
                    mid_index = end % 65535
                sent += n
                shared_sent[index] = sent
            wait = 0 if n > 0 and qos == 0 else 0.0005
            if qos or n <= 0:
                readable, _, _ = select.select([sock], [], [], wait)
                if readable:
                    data = pending + recv(1 << 20)
                    if v5:
                        done, pubrecs, pending = acknowledgements(data)
                        acked += done
                        if pubrecs:
                            reply(b"".join(b"\x62\x02" + m for m in pubrecs))
                        continue
                    whole = len(data) - len(data) % 4
                    pending = data[whole:]
                    if qos == 1:
                        acked += whole // 4
                    else:
                        replies = []
                        for o in range(0, whole, 4):
                            if data[o] == 0x50:  # PUBREC -> PUBREL
                                replies.append(b"\x62\x02" + data[o + 2 : o + 4])
                            elif data[o] == 0x70:  # PUBCOMP
                                acked += 1
                        if replies:
                            reply(b"".join(replies))
        # Let the last flows complete before disconnecting.
        deadline = time.perf_counter() + 10
        while qos and acked < sent and time.perf_counter() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                data = pending + recv(1 << 20)
                if v5:
                    done, pubrecs, pending = acknowledgements(data)
                    acked += done
                    if pubrecs:
                        reply(b"".join(b"\x62\x02" + m for m in pubrecs))
                    continue
                whole = len(data) - len(data) % 4
                pending = data[whole:]
                replies = []
                for o in range(0, whole, 4):
                    if data[o] == 0x40 or data[o] == 0x70:
                        acked += 1
                    elif data[o] == 0x50:
                        replies.append(b"\x62\x02" + data[o + 2 : o + 4])
                if replies:
                    reply(b"".join(replies))
        reply(P.Disconnect().encode())
        sock.close()
    except Exception as e:
        shared.errors.value += 1
        print(f"publisher {index}: {e!r}", flush=True)
    finally:
        shared.cpu[index] = time.process_time()


def subscriber(port, index, topic_filter, qos, psize, shared, persistent=False, websocket=False, v5=False):
    """Count (and acknowledge) messages until told to stop and drained."""
    try:
        client_id = f"bench-sub-{index}-{os.getpid()}"
        buffered = b""
        if websocket:
            sock, deframer = ws_connect(port, client_id, clean_session=not persistent)
            subscribe(sock, topic_filter, qos, deframer)
            recv, send = deframer.recv(sock), ws_send(sock)
            buffered = deframer.stream
        else:
            sock = connect(port, client_id, clean_session=not persistent, v5=v5)
            subscribe(sock, topic_filter, qos, v5=v5)
            recv, send = sock.recv, sock.sendall
        shared.ready[index] = 1
        received = 0
        first = 0
        counts = shared.received
        last = 0
        while True:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if not readable:
                if shared.stop.value and received >= sum(shared.sent):
                    break
                if shared.stop.value == 2:  # drain timed out
                    break
                continue
            data = recv(1 << 20)
            if not data:
                break
            now = time.perf_counter_ns()
            if not first:
                first = now
                shared.first[index] = now
            last = now
            if qos == 0:
                # Every packet has the same size: count by bytes.
                data = buffered + data if buffered else data
                n, rest = divmod(len(data), psize)
                buffered = data[len(data) - rest :] if rest else b""
                received += n
                if len(data) < 16384:
                    # Let small writes pile up rather than waking per
                    # segment, so the load generator stays cheap.
                    time.sleep(0.0002)
            else:
                data = buffered + data if buffered else data
                acks = []
                o = 0
                end = len(data)
                while o + 2 <= end:
                    first_byte = data[o]
                    length = data[o + 1]
                    h = 2
                    if length & 0x80:
                        if o + 3 > end:
                            break
                        length = (length & 0x7F) | (data[o + 2] << 7)
                        h = 3
                    if o + h + length > end:
                        break
                    kind = first_byte >> 4
                    if kind == 3:
                        tlen = (data[o + h] << 8) | data[o + h + 1]
                        mid = data[o + h + 2 + tlen : o + h + 4 + tlen]
                        acks.append((b"\x40\x02" if qos == 1 else b"\x50\x02") + mid)
                        received += 1
                    elif kind == 6:  # PUBREL -> PUBCOMP
                        acks.append(b"\x70\x02" + data[o + 2 : o + 4])
                    o += h + length
                buffered = data[o:]
                if acks:
                    send(b"".join(acks))
            counts[index] = received
            shared.last[index] = last
        sock.close()
    except Exception as e:
        shared.errors.value += 1
        print(f"subscriber {index}: {e!r}", flush=True)
    finally:
        shared.cpu[shared.publishers + index] = time.process_time()


def probe(port, topic, interval, shared, results):
    """
    A low-rate latency probe: publishes its send time on ``topic`` until
    the load stops and records, in ``results``, how long each took to come
    back; it waits for those under way until the drain ends, and marks
    the ones that never came back -1.
    """
    count = sent = 0
    try:
        sub = connect(port, f"bench-probe-sub-{os.getpid()}")
        subscribe(sub, topic, 0)
        pub = connect(port, f"bench-probe-pub-{os.getpid()}")
        shared.ready[len(shared.ready) - 1] = 1
        while not shared.go.value:
            time.sleep(0.001)
        buffered = b""
        next_send = time.perf_counter()
        # The run sets stop 1 when the load stops, 2 when its drain ends.
        while not shared.stop.value or (shared.stop.value == 1 and count < sent):
            sending = not shared.stop.value and sent < len(results)
            if sending and time.perf_counter() >= next_send:
                pub.sendall(P.Publish(topic, struct.pack(">q", time.perf_counter_ns())).encode())
                sent += 1
                next_send += interval
            wait = max(0, next_send - time.perf_counter()) if sending else 0.05
            readable, _, _ = select.select([sub], [], [], wait)
            if readable:
                chunk = sub.recv(65536)
                if not chunk:
                    raise ConnectionError("the broker closed the probe's subscriber")
                data = buffered + chunk
                arrived = time.perf_counter_ns()
                size = 2 + 2 + len(topic) + 8
                whole = len(data) - len(data) % size
                for o in range(0, whole, size):
                    sent_ns = struct.unpack_from(">q", data, o + size - 8)[0]
                    if count < len(results):
                        results[count] = arrived - sent_ns
                        count += 1
                buffered = data[whole:]
        pub.close()
        sub.close()
    except Exception as e:
        shared.errors.value += 1
        print(f"probe: {e!r}", flush=True)
    finally:
        for i in range(count, sent):
            results[i] = -1
        shared.cpu[len(shared.cpu) - 1] = time.process_time()


PORTS_PER_SOURCE = 20_000


def hold_connections(port, count, concurrency, results):
    """
    Open ``count`` connections (CONNECT, wait for CONNACK) with at most
    ``concurrency`` handshakes under way; report the rate in ``results``
    and keep them open until ``results[1]`` is set, then close them.
    """
    import resource
    import selectors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1000)), hard))
    connect_packet = None
    selector = selectors.DefaultSelector()
    open_socks = []
    pending = 0
    started = time.perf_counter()
    made = 0
    failures = 0
    while made < count or pending:
        while made < count and pending < concurrency:
            s = socket.socket()
            s.setblocking(False)
            if count > PORTS_PER_SOURCE:
                # One source address has about 28,000 ephemeral ports
                # toward one port: beyond, each block from another.
                s.bind((f"127.0.0.{2 + made // PORTS_PER_SOURCE}", 0))
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            connect_packet = P.Connect(client_id=f"idle-{made}", keepalive=0).encode()
            selector.register(s, selectors.EVENT_WRITE, (connect_packet, b""))
            made += 1
            pending += 1
        for key, events in selector.select(timeout=5):
            s = key.fileobj
            packet, got = key.data
            if events & selectors.EVENT_WRITE and packet is not None:
                try:
                    s.send(packet)
                except OSError:
                    failures += 1
                    selector.unregister(s)
                    s.close()
                    pending -= 1
                    continue
                selector.modify(s, selectors.EVENT_READ, (None, b""))
            elif events & selectors.EVENT_READ:
                try:
                    got += s.recv(4)
                except OSError:
                    got = b""
                if len(got) >= 4 or not got:
                    selector.unregister(s)
                    pending -= 1
                    if got[:2] == b"\x20\x02" and got[3:4] == b"\x00":
                        open_socks.append(s)
                    else:
                        failures += 1
                        s.close()
                else:
                    selector.modify(s, selectors.EVENT_READ, (None, got))
    elapsed = time.perf_counter() - started
    results[0] = len(open_socks) / elapsed if elapsed else 0
    results[2] = len(open_socks)
    results[3] = failures
    while not results[1]:
        time.sleep(0.05)
    for s in open_socks:
        s.close()

"""
The broker's own cost per message, in process: the router and protocol fed
packets through fake transports, no sockets and no load generator, so the
figure moves only when the code does.  The end-to-end scenarios of
``python -m bench`` vary by some 20% from run to run on a shared machine;
use this for a hot-path change's before/after.

    python -m bench.hotpath

Wall-clock figures on a shared machine move by 20% or more between runs;
for a small change, count instructions instead (valgrind --tool=callgrind
over two message counts, the difference divided by theirs).
"""

import argparse
import time

from mqttgw.broker.session import SessionLimits
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P


def _connect(broker, client_id, v5):
    if v5:
        return broker.client(P.Connect(client_id, protocol_level=P.MQTT_5, properties={}))
    return broker.client(client_id=client_id)


def microseconds_per_message(subscribers, messages, chunk=400, payload=64, qos=0, v5=False, alias=False,
                             window=None):
    """
    Broker CPU per PUBLISH delivered to ``subscribers`` at ``qos``, over
    3.1.1 or (``v5``) 5.0, the publisher using a topic alias if ``alias``.
    The subscribers' in-flight ``window`` is as large as a chunk unless
    given: then QoS 1 deliveries beyond it wait in their queue, as they do
    in ``python -m bench``, whose receivers take 20 at a time.
    """
    broker = FakeBroker(SessionLimits(max_inflight_messages=window or chunk, max_queued_messages=10 * chunk))
    subs = []
    for i in range(subscribers):
        client = _connect(broker, f"s{i}", v5)
        client.send(P.Subscribe(1, [("bench/+", qos)], {} if v5 else None))
        client.transport.clear()
        subs.append(client)
    pub = _connect(broker, "p", v5)
    pub.transport.clear()
    frames = []
    for n in range(chunk):
        mid = n + 1 if qos else None
        if not v5:
            frames.append(P.Publish("bench/0", bytes(payload), qos, message_id=mid).encode())
        elif alias:
            topic = "bench/0" if n == 0 else ""
            frames.append(P.Publish(topic, bytes(payload), qos, message_id=mid, properties={"topic_alias": 1}).encode())
        else:
            frames.append(P.Publish("bench/0", bytes(payload), qos, message_id=mid, properties={}).encode())
    data = b"".join(frames)
    # Each subscriber's acknowledgements: its session numbers its
    # deliveries 1 to 65535, then again from 1.
    acks = b"".join(P.Puback(m).encode() for m in range(1, 65536))
    acks += acks[: chunk * 4]
    rounds = max(1, messages // chunk)
    started = time.perf_counter()
    for r in range(rounds):
        pub.protocol.dataReceived(data)
        # The turns in which the rest of the chunk and the output are handled.
        broker.clock.advance(0)
        broker.clock.advance(0)
        for client in subs:
            client.transport.clear()
            if qos:
                at = (r * chunk) % 65535 * 4
                client.protocol.dataReceived(acks[at : at + chunk * 4])
        if qos:
            broker.clock.advance(0)
            pub.transport.clear()
    elapsed = time.perf_counter() - started
    for client in subs:
        # Every message delivered and acknowledged: none queued or dropped.
        session = client.protocol.session
        assert not session.inflight and not session.queued and not session.dropped, session
    return elapsed / (rounds * chunk) * 1e6


CASES = {
    "fan-in (1 subscriber)": dict(subscribers=1),
    "fan-out (8 subscribers)": dict(subscribers=8),
    "fan-in qos1": dict(subscribers=1, qos=1),
    "fan-in qos1 queued": dict(subscribers=1, qos=1, window=20),
    "fan-in qos1 v5": dict(subscribers=1, qos=1, v5=True),
    "fan-in qos1 v5 aliases": dict(subscribers=1, qos=1, v5=True, alias=True),
}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args(argv)
    results = {}
    for name in args.cases:
        best = min(microseconds_per_message(messages=args.messages, **CASES[name]) for _ in range(args.repeat))
        results[name] = best
        print(f"{name}: {best:.3f} us per PUBLISH", flush=True)
    return results


if __name__ == "__main__":
    main()

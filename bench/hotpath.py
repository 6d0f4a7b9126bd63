"""
The broker's own cost per message, in process: the router and protocol fed
packets through fake transports, no sockets and no load generator, so the
figure moves only when the code does.  The end-to-end scenarios of
``python -m bench`` vary by some 20% from run to run on a shared machine;
use this for a hot-path change's before/after.

    python -m bench.hotpath
"""

import argparse
import time

from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P


def microseconds_per_message(subscribers, messages, chunk=400, payload=64):
    """Broker CPU per PUBLISH delivered to ``subscribers`` at QoS 0."""
    broker = FakeBroker()
    subs = []
    for i in range(subscribers):
        client = broker.client(client_id=f"s{i}")
        client.send(P.Subscribe(1, [("bench/+", 0)]))
        client.transport.clear()
        subs.append(client)
    pub = broker.client(client_id="p")
    pub.transport.clear()
    data = b"".join(P.Publish("bench/0", bytes(payload)).encode() for _ in range(chunk))
    rounds = max(1, messages // chunk)
    started = time.perf_counter()
    for _ in range(rounds):
        pub.protocol.dataReceived(data)
        # The turns in which the rest of the chunk and the output are handled.
        broker.clock.advance(0)
        broker.clock.advance(0)
        for client in subs:
            client.transport.clear()
    return (time.perf_counter() - started) / (rounds * chunk) * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = parser.parse_args(argv)
    results = {}
    for name, subscribers in (("fan-in (1 subscriber)", 1), ("fan-out (8 subscribers)", 8)):
        best = min(microseconds_per_message(subscribers, args.messages) for _ in range(args.repeat))
        results[name] = best
        print(f"{name}: {best:.3f} us per PUBLISH", flush=True)
    return results


if __name__ == "__main__":
    main()

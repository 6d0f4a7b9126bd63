"""
The cost of Sparkplug awareness on a Sparkplug fan-in, in process: 100
edge nodes, each born once, send NDATA at QoS 0 (ten metrics by alias,
seq counting up) to one host application subscribed to ``spBv1.0/#``;
broker CPU per message with awareness on and off, alternating in the same
run, best of ``--repeat``.  As ``bench.hotpath``: the router and protocol
fed through fake transports, no sockets, so the figures move only when
the code does.

    python -m bench.sparkplug
"""

import argparse
import time

from mqttgw.broker.session import SessionLimits
from mqttgw.broker.sparkplug import Sparkplug
from mqttgw.testing import FakeBroker
from mqttgw.wire import packets as P
from mqttgw.wire.sparkplug import payload as S
from mqttgw.wire.sparkplug.payload import DataType as T

NODES = 100
METRICS = 10


def birth():
    p = S.Payload(timestamp=1_700_000_000_000, seq=0)
    p.metrics.add(name="bdSeq", datatype=T.UInt64, long_value=0)
    for i in range(METRICS):
        p.metrics.add(name=f"line/sensor{i}", alias=i + 1, datatype=T.Double, double_value=float(i))
    return S.encode(p)


def data(seq):
    p = S.Payload(timestamp=1_700_000_000_000 + seq, seq=seq % 256)
    for i in range(METRICS):
        p.metrics.add(alias=i + 1, datatype=T.Double, double_value=seq + i / 10)
    return S.encode(p)


def microseconds_per_message(aware, messages, chunk=400):
    """Broker CPU per NDATA, with awareness ``aware`` or not."""
    broker = FakeBroker(SessionLimits(max_inflight_messages=chunk, max_queued_messages=10 * chunk))
    if aware:
        broker.router.sparkplug = Sparkplug(broker.router, broker.clock)
    host = broker.client(client_id="host")
    host.send(P.Subscribe(1, [("spBv1.0/#", 0)]))
    host.transport.clear()
    nodes = []
    for n in range(NODES):
        edge = broker.client(client_id=f"edge{n}")
        edge.send(P.Publish(f"spBv1.0/site/NBIRTH/edge{n}", birth(), 0))
        edge.transport.clear()
        nodes.append(edge)
    host.transport.clear()
    # Each node's next chunk: NDATA with seq 1, 2, ... (mod 256).
    per_node = max(1, chunk // NODES)
    rounds = max(1, messages // (per_node * NODES))
    frames = [
        [
            b"".join(
                P.Publish(f"spBv1.0/site/NDATA/edge{n}", data(r * per_node + k + 1), 0).encode()
                for k in range(per_node)
            )
            for n in range(NODES)
        ]
        for r in range(256)
    ]
    started = time.perf_counter()
    for r in range(rounds):
        for edge, chunk_bytes in zip(nodes, frames[r % 256]):
            edge.protocol.dataReceived(chunk_bytes)
        broker.clock.advance(0)
        broker.clock.advance(0)
        host.transport.clear()
    elapsed = time.perf_counter() - started
    session = host.protocol.session
    assert not session.queued and not session.dropped, session
    sparkplug = broker.router.sparkplug
    if sparkplug is not None:
        # Every message read, in sequence: the observer did its work.
        assert sparkplug.stats.nodes_online == NODES and not sparkplug.stats.malformed
        assert sparkplug.stats.out_of_sequence == 0, sparkplug.stats.as_dict()
    return elapsed / (rounds * per_node * NODES) * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.sparkplug", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs of each")
    args = parser.parse_args(argv)
    timings = {"off": [], "on": []}
    for _ in range(args.repeat):
        # Alternating, so that both see the same machine.
        for name, aware in (("off", False), ("on", True)):
            timings[name].append(microseconds_per_message(aware, args.messages))
    results = {name: min(values) for name, values in timings.items()}
    results["on/off"] = results["on"] / results["off"]
    print(
        f"NDATA qos0 from {NODES} edge nodes to 1 host: awareness off {results['off']:.2f} us,"
        f" on {results['on']:.2f} us per message (x{results['on/off']:.2f})",
        flush=True,
    )
    return results


if __name__ == "__main__":
    main()

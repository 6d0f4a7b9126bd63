"""
Twisted's reactor alone, loaded as the gateway loads it for listeners
without TLS (mqttgw.service.footprint), listening on one TCP port and
answering every read with a CONNACK: what the footprint scenario sets a
TCP-only gateway's idle memory beside, started and measured as the
brokers are.

    python -m bench.reactor_alone PORT
"""

import sys

from bench.brokers import Broker

CONNACK = b"\x20\x02\x00\x00"


class ReactorAlone(Broker):
    """The program below, started and measured as a broker is; its one listener is TCP."""

    name = "reactor"

    def command(self):
        return [sys.executable, "-m", "bench.reactor_alone", str(self.port)]

    def ports(self):
        return [self.port]


def main(port):
    from mqttgw.service import footprint

    footprint.load_reactor(tls=False)
    from twisted.internet import endpoints, protocol, reactor

    class Answer(protocol.Protocol):
        def dataReceived(self, data):
            self.transport.write(CONNACK)

    endpoint = endpoints.serverFromString(reactor, f"tcp:{port}:interface=127.0.0.1")
    endpoint.listen(protocol.Factory.forProtocol(Answer))
    reactor.run()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python -m bench.reactor_alone PORT")
    main(int(sys.argv[1]))

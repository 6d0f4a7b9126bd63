"""
mqttgw's twistd with its reactor timed, to find what holds a well-behaved
client up.  Every reactor turn whose work (dispatching the poll's events,
then the timed calls) takes longer than ``--long-ms`` is written to the
log as it ends: when, the poll's wait, the dispatch, the timed calls, how
many events, and whose.  So is every garbage collection longer than a
tenth of that.

    python -m bench.turns --log turns.log -- -n mqttgw --tcp 1883

``python -m bench --turns DIR`` runs the mqttgw brokers under it, a log
per broker and scenario.  Every event and timed call is timed on the
way: figures taken with it are not the benchmark's.
"""

import argparse
import gc
import sys
import time

from twisted.internet import base

from mqttgw.transports import leanreactor


def _name(selectable):
    """A connection's client id, else what the selectable is."""
    protocol = getattr(selectable, "protocol", None)
    mqtt = getattr(protocol, "_mqtt", protocol)  # a WebSocket's MQTT
    client_id = getattr(mqtt, "log_id", None)
    if client_id is not None:
        return str(client_id)
    return type(protocol if protocol is not None else selectable).__name__


class _TimedPoller:
    """The reactor's epoll object, with the time its last wait took."""

    def __init__(self, poller):
        self._poller = poller
        self.waited = 0.0

    def __getattr__(self, name):
        return getattr(self._poller, name)

    def poll(self, *args):
        started = time.perf_counter()
        try:
            return self._poller.poll(*args)
        finally:
            self.waited = time.perf_counter() - started


class Recorder:
    """Times the reactor's turns and the collector, a line per long one."""

    def __init__(self, out, long_ms):
        self.out = out
        self.long = long_ms / 1000
        self.handled = []
        self.timers = 0.0
        self.turns = 0

    def install(self, reactor_class=leanreactor.EPollReactor):
        recorder = self
        poll = reactor_class.doPoll
        dispatch = reactor_class._doReadOrWrite
        run_timers = base.ReactorBase.runUntilCurrent

        def doPoll(reactor, timeout):
            if not isinstance(reactor._poller, _TimedPoller):
                reactor._poller = _TimedPoller(reactor._poller)
            started = time.perf_counter()
            poll(reactor, timeout)
            recorder.turn(time.perf_counter() - started, reactor._poller.waited)

        def _doReadOrWrite(reactor, selectable, fd, event):
            recorder.handled.append(selectable)
            dispatch(reactor, selectable, fd, event)

        def runUntilCurrent(reactor):
            started = time.perf_counter()
            run_timers(reactor)
            recorder.timers = time.perf_counter() - started

        reactor_class.doPoll = reactor_class.doIteration = doPoll
        reactor_class._doReadOrWrite = _doReadOrWrite
        base.ReactorBase.runUntilCurrent = runUntilCurrent
        gc.callbacks.append(self.collected)

    def turn(self, took, waited):
        """A poll ended: its dispatch, and the timed calls run just before it."""
        self.turns += 1
        handled, self.handled = self.handled, []
        dispatched = took - waited
        if dispatched + self.timers > self.long:
            names = " ".join(_name(s) for s in handled[:20])
            more = f" +{len(handled) - 20}" if len(handled) > 20 else ""
            self.out.write(
                f"{time.monotonic():.4f} turn {self.turns} waited {waited * 1000:.2f}"
                f" dispatch {dispatched * 1000:.2f} timers {self.timers * 1000:.2f}"
                f" events {len(handled)}: {names}{more}\n"
            )
        self.timers = 0.0

    _collecting = 0.0

    def collected(self, phase, info):
        if phase == "start":
            self._collecting = time.perf_counter()
            return
        took = time.perf_counter() - self._collecting
        if took > self.long / 10:
            self.out.write(
                f"{time.monotonic():.4f} gc generation {info['generation']}"
                f" {took * 1000:.2f} ms, {info['collected']} collected\n"
            )


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, help="file to write the long turns to")
    parser.add_argument("--long-ms", type=float, default=2.0, help="turns longer than this are written")
    parser.add_argument("twistd", nargs=argparse.REMAINDER, help="-- then twistd's arguments")
    args = parser.parse_args(argv)
    twistd_args = args.twistd[1:] if args.twistd[:1] == ["--"] else args.twistd
    out = open(args.log, "w", buffering=1)
    Recorder(out, args.long_ms).install()
    from twisted.scripts.twistd import run

    sys.argv = ["twistd", *twistd_args]
    run()


if __name__ == "__main__":
    main()

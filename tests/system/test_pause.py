"""
A gateway stopped (SIGSTOP) longer than its clients' keepalive and then
continued: the clients that pinged on time meanwhile, their PINGREQs
waiting in the sockets, are kept and no will is published for them; a
client silent on its own is still dropped and its will published.  Real
sockets against a running gateway (bench.pause is the same scenario
beside mosquitto).
"""

import os
import re
import signal
import time

from bench import hostile, pause
from mqttgw.wire import packets as P
from tests.gateway_probes import sockets_held, wait_for_sockets


def test_clients_that_pinged_while_the_gateway_was_stopped_are_kept(gateway):
    result = pause.run(gateway.port, gateway.process.pid, clients=10, keepalive=2, pause=6.0)
    assert result["kept"] == 10, result
    assert result["false_wills"] == 0, result
    assert result["silent_dropped"] and result["silent_will"], result
    log = gateway.log()
    stalls = [float(s) for s in re.findall(r"the gateway did not run for (\d+\.\d)s", log)]
    assert stalls and max(stalls) >= 6.0, log
    assert "client pause-silent keepalive expired" in log
    assert "keepalive expired" not in log.replace("client pause-silent keepalive expired", "")


def test_a_connect_sent_while_the_gateway_was_stopped_is_answered(gateway_with, tmp_path):
    config = tmp_path / "limits.toml"
    config.write_text("[limits]\nconnect_timeout = 2.0\n")
    gw = gateway_with("--config", str(config))
    # A client whose own keepalive keeps the keepalive timer going too.
    pinger, framer = hostile.mqtt_connect(gw.port, "pinger", keepalive=2)
    before = sockets_held(gw)
    late = hostile.connection(gw.port)
    silent = hostile.connection(gw.port)
    # Accepted, their CONNECT deadlines running.
    wait_for_sockets(gw, before + 2)
    os.kill(gw.process.pid, signal.SIGSTOP)
    try:
        late.sendall(P.Connect(client_id="late", keepalive=0).encode())
        for _ in range(3):
            pinger.sendall(P.Pingreq().encode())
            # The fault: stopped past the CONNECT timeout and the keepalive.
            time.sleep(2.0)
    finally:
        os.kill(gw.process.pid, signal.SIGCONT)
    assert hostile.recv_packets(late, hostile.Framer(1 << 20), 1) == [P.Connack(0)]
    assert hostile.recv_packets(pinger, framer, 3) == [P.Pingresp()] * 3
    # The one that sent nothing is still closed, after the timeout.
    assert hostile.closed_by_peer(silent, timeout=10)
    assert not hostile.closed_by_peer(late, timeout=0.5)
    gw.wait_for_log("no CONNECT from 127.0.0.1")
    assert gw.log().count("no CONNECT from") == 1

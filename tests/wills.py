"""
Clients of the fake broker for tests of wills: one watching will/#, and a
5.0 client whose will (on ``will``, at QoS 1) has the delay, session expiry
and properties a test gives.
"""

from mqttgw.testing import V5, connected, subscribed


def will_watcher(broker):
    return subscribed(broker, "watcher", ("will/#", 2))


def will_client(broker, client_id="c", delay=0, expiry=0, retain=False, **will_props):
    if delay:
        will_props["will_delay_interval"] = delay
    properties = {"session_expiry_interval": expiry} if expiry else {}
    return connected(
        broker,
        client_id,
        properties=properties,
        will_topic="will",
        will_message=b"gone",
        will_qos=1,
        will_retain=retain,
        will_properties=will_props,
        version=V5,
    )

"""
The seams inside the MQTT-SN listener, declared: what a client's parts
(its publishing and subscribing) ask of the client, and what the client
asks of the listener that holds it.
"""

from zope.interface import Attribute, Interface


class ISnClient(Interface):
    """One MQTT-SN client, as its parts see it."""

    client_id = Attribute("Its client id.")
    log_id = Attribute("Its client id as log lines show it.")
    username = Attribute(
        "The identity its ACL rules are read for (the client id when a clients file lists it), or None."
    )
    session = Attribute("Its session (an ISession), or None once it has ended.")
    topics = Attribute("Its TopicRegistry.")
    state = Attribute("active, asleep, awake or lost.")
    deadline = Attribute("When (clock time) it is lost unless heard from, or None: never.")
    watched = Attribute("The watchdog's bucket (a whole second) it waits in, or None.")

    def received(message):
        """A message from the client; False when its state takes no such message."""

    def received_publish(fields):
        """A PUBLISH read by ``publish_fields``; False when its state takes none."""

    def send(frame):
        """Send ``frame`` (an encoded MQTT-SN message) to the client now, whatever its state."""

    def write_if_connected(frame):
        """Send ``frame`` unless the client is gone (an acknowledgement that waited for the store)."""

    def register_topic(name):
        """The normal id a delivery on ``name`` goes with, a REGISTER sent for it; None: no room."""

    def registered(topic_id, return_code):
        """The client's REGACK of the gateway's REGISTER: what waited for it goes, or is dropped."""

    def register_own(name):
        """The normal id the client's REGISTER (or SUBSCRIBE) of ``name`` gets; None: no room."""

    def unknown_topic(topic_id):
        """The client no longer knows ``topic_id`` (PUBACK "invalid topic id"): it is registered again."""

    def acknowledged():
        """An outbound flow completed (PUBACK, PUBCOMP): a client awake may go back to sleep."""

    def overdue():
        """Its keep-alive or sleep deadline passed in silence (the watchdog's call)."""

    def close(publish_will, reason=None):
        """The client is gone: its session is left (its will published if ``publish_will``)."""


class ISnListener(Interface):
    """What an MQTT-SN client asks of the listener that holds it."""

    router = Attribute("The router.")
    clock = Attribute("The reactor's clock.")
    options = Attribute("The listener's MqttSnOptions.")
    watchdog = Attribute("The Watchdog of its clients' keep-alive and sleep deadlines.")
    limits = Attribute("The listeners' ConnectionLimits (max_connections, connection_messages...).")
    kept = Attribute("The KeptTopics of persistent sessions' registrations (kept away, and stored).")

    def send(route, frame):
        """Send ``frame`` along ``route`` (a Route), counted."""

    def forget(client):
        """``client`` is gone: its address and client id leave the tables."""

"""
The MQTT bridge as a service: forwards chosen local topics to an upstream
broker and brings chosen upstream topics down.  It is a client of the
router with a persistent session of its own, so what it cannot forward
while the upstream is away waits in the store, in order, and is removed
only when the upstream has acknowledged it.  Its settings, TLS, failover
endpoint, relay and what differs per MQTT version are modules beside it.
"""

import random
from collections import Counter, deque

import attr
from twisted.application.internet import ClientService
from twisted.application.service import Service
from twisted.logger import Logger

from mqttgw.bridges import settings as bridge_settings
from mqttgw.bridges.client import MQTTClientFactory
from mqttgw.bridges.deaths import DeathCarriers
from mqttgw.bridges.endpoint import SETTLE_SECONDS, FailoverEndpoint
from mqttgw.bridges.relay import Relay
from mqttgw.bridges.returns import Returns
from mqttgw.bridges.settings import LEVEL_NAMES
from mqttgw.bridges.upstreams import Upstreams
from mqttgw.bridges.versions import upstream_versions
from mqttgw.broker.delivery_policy import DeliveryPolicy, Pacer
from mqttgw.broker.session import INTERNAL_PREFIX, NEVER_EXPIRES, SessionLimits
from mqttgw.broker.acks import OrderedAcks
from mqttgw.broker.topics import matches
from mqttgw.wire import packets as P
from mqttgw.wire import reasons as R

log = Logger()

# A link the upstream closes this soon after accepting it is counted as
# a likely takeover of its client id, or a session it cannot serve.
TAKEOVER_SECONDS = SETTLE_SECONDS


def full_jitter(initial, maximum):
    """
    Reconnect delays with full jitter: after the ``n``th failed round,
    anywhere between ``initial`` and ``min(maximum, initial * 2**n)``,
    uniformly, so gateways that lost the same upstream at once do not all
    come back at once (and none sooner than ``initial``).
    """

    def delay(failed_rounds):
        cap = min(maximum, initial * 2.0 ** min(failed_rounds, 64))
        return initial + random.random() * (cap - initial)

    return delay


class MQTTBridgeKind:
    name = "mqtt"

    check = staticmethod(bridge_settings.check)

    @staticmethod
    def make_service(router, settings, reactor):
        return MQTTBridge(router, settings, reactor)


class MQTTBridge(Service):
    def __init__(self, router, settings, reactor):
        self.router = router
        # Only the bridge itself says whether it is connected.
        router.access.reserved_topics.add(settings.state_topic)
        self.settings = settings
        self.reactor = reactor
        self.name = f"bridge {settings.name}"
        self.session_id = f"{INTERNAL_PREFIX}bridge/{settings.name}"
        self.session = None
        # How its session delivers (see broker.delivery_policy), from start.
        self.policy = None
        self.upstream = None
        self._acks = None
        self._service = None
        # Its addresses, what each made it fall back from, where it is.
        self.upstreams = Upstreams(settings, reactor)
        self._returns = Returns(reactor, settings, self.upstreams)
        # Sparkplug edge nodes' NDEATHs held upstream as wills (bridges.deaths).
        self.deaths = None
        if settings.max_sparkplug_wills:
            self.deaths = DeathCarriers(self, settings.max_sparkplug_wills)
        # Messages forwarded upstream (first sends) and brought in.
        self.sent = 0
        self.received = 0
        self.connected_since = None
        # What differs with the MQTT version spoken upstream: by level
        # (bridges.versions), and the current link's.
        self.versions = upstream_versions(settings)
        self.version = self.versions[settings.protocol_level]
        # 5.0 reason codes the upstream answered with, other than success,
        # by "PACKET reason name"; and how many said a message was refused.
        self.reason_codes = Counter()
        self.refused = 0
        # Times the link came up or went down; links lost in a row soon
        # after they were accepted.
        self.link_changes = 0
        self.short_links = 0
        # (clock time, sent) samples of the last minute, for the drain rate.
        self._sent_samples = deque(maxlen=64)

    def status(self):
        """What operators see: $SYS, /metrics and the admin API."""
        session = self.session
        upstream = self.upstream
        now = self.reactor.seconds()
        oldest = session.oldest_waiting() if session is not None else None
        dropped = session.dropped if session is not None else 0
        too_large = session.dropped_too_large if session is not None else 0
        return {
            "name": self.settings.name,
            "kind": "mqtt",
            # Spoken at the address it is on or trying (see fallbacks).
            "protocol": LEVEL_NAMES[self.upstreams.current.level],
            "addresses": list(self.settings.addresses),
            # address, disconnected_since/_s, last_failure, failures,
            # fallbacks, clean_fallback: see bridges.upstreams.
            **self.upstreams.status(),
            "connected": upstream is not None,
            "connected_since": self.connected_since,
            "queued": session.queued if session is not None else 0,
            "inflight": len(session.inflight) if session is not None else 0,
            "window": session.window.size if session is not None else 0,
            "dropped": dropped,
            "queued_bytes": session.queued_bytes if session is not None else 0,
            # Seconds the oldest message waiting for the upstream has waited.
            "oldest_queued_s": None if oldest is None else round(now - oldest, 3),
            "drain_rate": self.drain_rate(now),
            "drops": {
                "queue_full": dropped - too_large,
                "too_large": too_large,
                "expired": session.dropped_expired if session is not None else 0,
                "refused": self.refused,
            },
            "link_changes": self.link_changes,
            "sent": self.sent,
            "received": self.received,
            "refused": self.refused,
            "reason_codes": dict(self.reason_codes),
            # Sparkplug edge nodes whose NDEATH is held upstream as a will.
            "sparkplug_wills": len(self.deaths.carriers) if self.deaths is not None else 0,
            # 5.0: the limits the upstream's CONNACK gave.
            "upstream_limits": dict(upstream.server_properties) if upstream is not None else {},
        }

    def drain_rate(self, now):
        """Messages sent upstream a second, over up to the last minute."""
        samples = self._sent_samples
        if not samples or now - samples[-1][0] >= 1.0:
            samples.append((now, self.sent))
        while len(samples) > 2 and now - samples[1][0] >= 60.0:
            samples.popleft()
        first_at, first_sent = samples[0]
        if now - first_at <= 0:
            return 0.0
        return round((self.sent - first_sent) / (now - first_at), 3)

    # Rules

    def out_rule(self, topic):
        for rule in self.settings.rules:
            if rule.outgoing and matches(rule.local_filter, topic):
                return rule
        return None

    def in_rule(self, topic):
        for rule in self.settings.rules:
            if rule.incoming and matches(rule.remote_filter, topic):
                return rule
        return None

    # Service

    def startService(self):
        super().startService()
        s = self.settings
        session, _ = self.router.connect(self.session_id, clean_start=False, expiry_interval=NEVER_EXPIRES)
        pacer = None
        if s.drain_messages_per_second or s.drain_bytes_per_second:
            pacer = Pacer(s.drain_messages_per_second, s.drain_bytes_per_second)
        # Not sent back what it brought in, retained messages kept as such.
        self.policy = DeliveryPolicy(no_local=True, retain_as_published=True, pacer=pacer)
        session.deliver_as(self.policy, SessionLimits(
            max_inflight_messages=s.max_inflight_messages,
            max_queued_messages=s.max_queued_messages,
            max_queued_bytes=s.max_queued_bytes,
            queue_qos0_messages=s.qos0_policy == "memory",
            store_qos0_messages=s.qos0_policy == "store",
            drop_oldest=s.drop_policy == "oldest",
            retry_interval=0,
        ))
        self.session = session
        self._subscribe_locally()
        self._publish_local_state(b"0")
        self._factory = MQTTClientFactory(None, self, self.reactor, self.version)
        jitter = full_jitter(s.reconnect_initial, s.reconnect_max)
        self._service = ClientService(
            FailoverEndpoint(self.reactor, s, self.upstreams, self._prepare, self._returns.link),
            self._factory,
            # A move made on purpose (bridges.returns) does not wait.
            retryPolicy=lambda failed: 0.0 if self.upstreams.at_once() else jitter(failed),
            clock=self.reactor,
        )
        self._service.startService()

    def _prepare(self, address, clean_fallback):
        """The next CONNECT, for ``address`` (bridges.upstreams): ``(connect, version)``."""
        version = self.versions[address.level]
        connect = version.connect(address.try_private, clean_fallback, address.remote_state)
        self._factory.connect_packet = connect
        self._factory.version = version
        return connect, version

    def _subscribe_locally(self):
        """The bridge session's subscriptions: the out rules' local filters, at their QoS."""
        session = self.session
        wanted = {r.local_filter: r.qos for r in self.settings.rules if r.outgoing}
        for topic_filter in list(session.subscriptions):
            if topic_filter not in wanted:
                self.router.unsubscribe(session, [topic_filter])
        self.router.subscribe(
            session,
            [(f, q) for f, q in wanted.items() if session.subscriptions.get(f) != q],
        )

    def stopService(self):
        super().stopService()
        d = self._service.stopService() if self._service else None
        self._returns.stop()
        if self.session is not None and self.session.connection is not None:
            self.router.disconnect(self.session, publish_will=False)
        if self.deaths is not None:
            self.deaths.stop()
        self._publish_local_state(b"0")
        # Reserved again by whichever bridge takes it next.
        self.router.access.reserved_topics.discard(self.settings.state_topic)
        return d

    def _publish_local_state(self, value):
        self.router.publish(P.Publish(self.settings.state_topic, value, 1, True))

    # The upstream connection (the MQTTClientProtocol handler)

    def connected(self, upstream):
        s = self.settings
        log.info("bridge {name}: upstream accepted CONNECT", name=s.name)
        self.upstream = upstream
        self.version = upstream.version
        self.link_changes += 1
        self.connected_since = self.reactor.seconds()
        self._acks = OrderedAcks(self.router.store, self._write_upstream(upstream))
        store = self.router.store
        if store is not None:
            # A disk behind the traffic holds the upstream back, as it does
            # local clients (see Store.congestion_listeners).
            if self._store_congestion not in store.congestion_listeners:
                store.congestion_listeners.append(self._store_congestion)
            if store.congested:
                upstream.transport.pauseProducing()
        # The store could not commit what came in: the upstream sends it
        # again after we reconnect.
        self._acks.on_failure = lambda _: upstream.transport.abortConnection()
        session = self.session
        if not upstream.session_present:
            # A new session upstream: the ids of QoS 2 messages it had not
            # released are free again there, and must be here too.
            session.forget_inbound_qos2()
            # And what it had of ours past PUBREC is sent again.
            session.window.forget_released()
        # The upstream's limits, which the session keeps to.
        frames, receive_maximum, max_qos = self.version.attach(upstream, self.reactor, session)
        session.deliver_as(attr.evolve(self.policy, max_qos=max_qos))
        incoming = [(r.remote_filter, r.qos) for r in s.rules if r.incoming]
        if incoming:
            upstream.write(self.version.subscribe(incoming).encode())
        if self.upstreams.current.remote_state:
            upstream.write(self.version.state(s.remote_state_topic, b"1").encode())
        self._publish_local_state(b"1")
        # What waited while the upstream was away drains now, in order.
        self.session.attach(Relay(self, upstream), frames, receive_maximum)

    def _store_congestion(self, congested):
        upstream = self.upstream
        if upstream is not None:
            if congested:
                upstream.transport.pauseProducing()
            else:
                upstream.transport.resumeProducing()

    def _write_upstream(self, upstream):
        def write(data):
            if self.upstream is upstream:
                upstream.write(data)

        return write

    def disconnected(self, upstream, reason):
        log.info(
            "bridge {name}: upstream connection lost: {reason}",
            name=self.settings.name,
            reason=reason.getErrorMessage(),
        )
        since = self.connected_since
        if self.upstream is upstream and since is not None:
            if self.reactor.seconds() - since >= TAKEOVER_SECONDS:
                self.short_links = 0
            else:
                # An upstream closes a session's older connection when
                # another client connects with its client id: two bridges
                # sharing one id take each other's messages and packet ids.
                self.short_links += 1
            if self.short_links in (3, 30, 300):
                log.warn(
                    "bridge {name}: {count} connections in a row were lost within {seconds:g} s"
                    " of the upstream accepting them: is another client connecting as"
                    " {client_id!r}? Each site's bridge needs its own client_id. Or the"
                    " upstream cannot serve the session there (see session_fallback)",
                    name=self.settings.name, count=self.short_links, seconds=TAKEOVER_SECONDS,
                    client_id=self.settings.client_id,
                )
        if self.upstream is upstream:
            self.upstream = None
            store = self.router.store
            if store is not None and self._store_congestion in store.congestion_listeners:
                store.congestion_listeners.remove(self._store_congestion)
            self.link_changes += 1
            self.connected_since = None
            if self.deaths is not None:
                self.deaths.link_lost()
            if self.session.connection is not None:
                self.router.disconnect(self.session, publish_will=False)
            # A stopped bridge's state topic is its successor's (stopService).
            if self.running:
                self._publish_local_state(b"0")

    def packet(self, upstream, packet):
        session = self.session
        kind = type(packet)
        if kind is P.Publish:
            self._incoming(packet)
        elif kind is P.Puback:
            if packet.reason_code:
                self.reason("PUBACK", packet.reason_code, packet)
            if self.router.tracer is not None:
                self.router.tracer.upstream_ack(session, packet.message_id, packet.reason_code, "PUBACK")
            session.window.puback(packet.message_id)
            if self.deaths is not None:
                self.deaths.acknowledged(packet.message_id)
        elif kind is P.Pubrec:
            failed = packet.reason_code >= 0x80
            if packet.reason_code:
                self.reason("PUBREC", packet.reason_code, packet)
            if failed and self.router.tracer is not None:
                # A refusal ends the QoS 2 flow: no PUBCOMP follows.
                self.router.tracer.upstream_ack(session, packet.message_id, packet.reason_code, "PUBREC")
            session.window.pubrec(packet.message_id, failed)
        elif kind is P.Pubcomp:
            if packet.reason_code:
                self.reason("PUBCOMP", packet.reason_code, packet)
            if self.router.tracer is not None:
                self.router.tracer.upstream_ack(session, packet.message_id, packet.reason_code, "PUBCOMP")
            session.window.pubcomp(packet.message_id)
            if self.deaths is not None:
                self.deaths.acknowledged(packet.message_id)
        elif kind is P.Pubrel:
            mid = packet.message_id
            if packet.reason_code:
                self.reason("PUBREL", packet.reason_code, packet)
            self._acks.send(P.pubcomp_bytes(mid), session.qos2_released(mid))
        elif kind is P.Suback:
            self.version.suback(self, packet)
        elif kind is P.Disconnect:
            if packet.reason_code:
                self.reason("DISCONNECT", packet.reason_code, packet)
            else:
                log.info("bridge {name}: upstream disconnected normally", name=self.settings.name)

    def reason(self, packet_name, code, packet):
        """
        A 5.0 reason code other than success from the upstream: counted by
        packet and name, and a failure (0x80 and above) logged, at most a
        few times a second, with the upstream's reason string if it gave one.
        """
        self.reason_codes[f"{packet_name} {R.name(code)}"] += 1
        if code < 0x80 and packet_name != "DISCONNECT":
            return
        if packet_name in ("PUBACK", "PUBREC"):
            # The upstream will not take the message: it is not sent again.
            self.refused += 1
        why = (packet.properties or {}).get("reason_string")
        self.router.limited(f"bridge {self.settings.name} reasons", log).warn(
            "bridge {name}: upstream answered {packet} with {code:#04x} ({reason}){why}",
            name=self.settings.name,
            packet=packet_name,
            code=code,
            reason=R.name(code),
            why=f": {why}" if why else "",
        )

    def _incoming(self, packet):
        session = self.session
        self.received += 1
        self.version.inbound(packet)
        rule = self.in_rule(packet.topic)
        message = None
        if rule is not None:
            message = P.Publish(
                rule.to_local(packet.topic), packet.payload, packet.qos, packet.retain,
                properties=packet.properties,
            )
            message.expiry = packet.expiry
        if packet.qos == 0:
            if message is not None:
                self.router.publish(message, sender=session)
        elif packet.qos == 1:
            held = None if message is None else self.router.publish_held(message, session)
            self._acks.send(P.puback_bytes(packet.message_id), held is not None, held)
        else:
            mid = packet.message_id
            durable = False
            if session.qos2_received(mid):
                routed = message is not None and self.router.publish(message, sender=session)
                durable = routed or session.store is not None
            self._acks.send(P.pubrec_bytes(mid), durable)

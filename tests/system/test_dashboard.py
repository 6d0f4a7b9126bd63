"""
The dashboard in headless Chromium against a running gateway: sign-in,
live topics, a bridge going down, kicking a client, what a read-only user
may not do, screenshots of every view at desktop and phone widths, and no
request leaving the gateway's origin.  The screenshots are left in
tests/.cache/dashboard/.
"""

import json
import socket
import threading
import time

from mqttgw.passwd import main as passwd
from mqttgw.wire import packets as P
from tests.admin_api import request
from tests.dashboard import DESKTOP, SHOTS, screenshots, show, sign_in
from tests.mosquitto_broker import free_port
from tests.paho import PahoClient


def filter_topics(page, text):
    page.evaluate(
        f"(f => {{ f.value = {json.dumps(text)}; f.dispatchEvent(new Event('input')); }})"
        "(document.querySelector('#topic-filter'))"
    )


def client(port, client_id, user="device", password="devpw"):
    c = PahoClient(port, client_id, "MQTTv311")
    c.client.username_pw_set(user, password)
    c.connect()
    return c


def test_dashboard_views_and_roles_in_chromium(gateway_with, browser, tmp_path):
    passwords = tmp_path / "passwd"
    passwd(["-c", "-b", str(passwords), "root", "rootpw"])
    for user, password in (("viewer", "viewpw"), ("device", "devpw"), ("mqttgw-pipeline", "pipepw")):
        passwd(["-b", str(passwords), user, password])
    upstream = gateway_with()
    http_port = free_port()
    gw = gateway_with(
        "--http", f"0.0.0.0:{http_port}", "--password-file", str(passwords),
        "--admin-user", "root", "--read-user", "viewer",
        "--bridge", f"127.0.0.1:{upstream.port}", "--bridge-topic", "field/# out 1",
    )
    url = f"http://127.0.0.1:{http_port}/"
    publisher = client(gw.port, "publisher")
    # Retained before the page subscribes: it arrives flagged as retained.
    publisher.publish("field/plant1/raw", b"\x00\xff\x10", 1, retain=True)
    watcher = client(gw.port, "watcher")
    watcher.subscribe("field/#", 1)
    watcher.receive(1)
    page = browser.page()
    page.viewport(*DESKTOP)
    sign_in(page, url, "root", "rootpw")
    assert "root (admin)" in page.text()

    # Overview: the bridge is up, then its upstream goes away.
    bridge = "document.querySelector('tr[data-bridge=\"default\"]')"
    page.wait_for(f"{bridge} && {bridge}.dataset.state === 'up'", timeout=20)
    assert "Listeners" in page.text() and "Messages per second" in page.text()
    screenshots(page, "overview", f"{bridge} !== null")
    upstream.stop()
    page.wait_for(f"{bridge}.dataset.state === 'down'", timeout=20)
    assert "down" in page.evaluate(f"{bridge}.innerText")
    # Up once, down once.
    changes = f"{bridge}.querySelector('[data-metric=\"link-changes\"]').innerText"
    assert page.evaluate(changes) == "2"

    # Topics: a value published with paho shows within two seconds.
    show(page, "topics")
    filter_topics(page, "plant1")
    for celsius in (20.5, 21.0, 21.5):
        publisher.publish("field/plant1/temp", json.dumps({"celsius": celsius}).encode(), 1)
    row = "document.querySelector('[data-topic=\"field/plant1/temp\"]')"
    page.wait_for(f"{row} && {row}.innerText.includes('21.5')", timeout=2)
    raw = "document.querySelector('[data-topic=\"field/plant1/raw\"]')"
    page.wait_for(f"{raw} && {raw}.innerText.includes('00 ff 10')", timeout=2)
    assert page.evaluate(f"{raw}.innerText.includes('retained')")
    # Numeric JSON fields get a sparkline; the whole payload opens beside.
    page.wait_for(f"!!{row}.querySelector('.sparkbox svg path')")
    page.evaluate(f"{row}.querySelector('button.name').click()")
    page.wait_for("document.querySelector('#topic-detail pre').innerText.includes('\"celsius\": 21.5')")
    # The tree: branches closed until opened.
    filter_topics(page, "")
    page.wait_for("document.querySelector('[data-topic=\"field\"]').getAttribute('aria-expanded') === 'false'")
    assert not page.evaluate(f"!!{row}")
    page.click('[data-topic="field"] button.toggle')
    page.click('[data-topic="field/plant1"] button.toggle')
    page.wait_for(f"!!{row}")
    screenshots(page, "topics", f"!!{row}")
    # An admin clears the retained topic.
    page.evaluate(f"{raw}.querySelector('button.name').click()")
    page.wait_for("!![...document.querySelectorAll('#topic-detail button')].find(b => b.innerText === 'Clear retained')")
    page.evaluate("[...document.querySelectorAll('#topic-detail button')].find(b => b.innerText === 'Clear retained').click()")
    gw.wait_for_log("admin API: 1 retained message(s) matching field/plant1/raw deleted")
    page.wait_for(f"!{raw}.innerText.includes('retained')")
    # An admin publishes from the page.
    page.evaluate(
        "document.querySelector('#publish-form [name=topic]').value = 'field/from-page';"
        "document.querySelector('#publish-form [name=payload]').value = 'hello';"
        "document.querySelector('#publish-form').requestSubmit()"
    )
    # Three temperatures, the cleared retained topic and the page's message.
    seen = {m.topic: m.payload for m in watcher.receive(5)}
    assert seen["field/from-page"] == b"hello"

    # Analytics: the pipeline's rollups as charts.
    pipeline = client(gw.port, "pipeline", "mqttgw-pipeline", "pipepw")
    start = "2026-11-23T10:00:00+00:00"
    pipeline.publish(
        "$analytics/field/plant1/temp/1m",
        json.dumps({"topic": "field/plant1/temp", "window_start": start, "messages": 3}).encode(), 1, True,
    )
    pipeline.publish(
        "$analytics/field/plant1/temp/celsius/1m",
        json.dumps({"topic": "field/plant1/temp", "field": "celsius", "window_start": start,
                    "count": 3, "invalid": 0, "min": 20.5, "avg": 21.0, "max": 21.5}).encode(), 1, True,
    )
    show(page, "analytics")
    page.wait_for("document.querySelector('#analytics-topic') && document.querySelector('#analytics-topic').value === 'field/plant1/temp'")
    page.wait_for("document.querySelector('.charts').innerText.includes('celsius per minute')")
    assert "Messages per minute" in page.text()
    screenshots(page, "analytics", "!!document.querySelector('.charts svg')")

    # Clients: an admin kicks one.
    victim = client(gw.port, "victim")
    show(page, "clients")
    victim_row = "document.querySelector('tr[data-client=\"victim\"]')"
    page.wait_for(f"!!{victim_row}")
    screenshots(page, "clients", f"!!{victim_row}")
    page.evaluate("document.querySelector('#clients-table button.sort').click()")
    assert page.evaluate("document.querySelector('#clients-table th[aria-sort=descending]').innerText").startswith("Client")
    page.evaluate(f"{victim_row}.querySelector('button.kick').click()")
    assert victim.disconnected.wait(10)
    gw.wait_for_log("admin API: client victim disconnected")

    # Keyboard: Tab reaches the views' links.
    page.send("Input.dispatchKeyEvent", {"type": "keyDown", "key": "Tab", "code": "Tab", "windowsVirtualKeyCode": 9})
    page.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": "Tab", "code": "Tab", "windowsVirtualKeyCode": 9})
    assert page.evaluate("document.activeElement.tagName") in ("A", "BUTTON", "INPUT", "SELECT")

    # A read-only user: no kick, no publishing.
    sign_in(page, url, "viewer", "viewpw")
    assert "viewer (read-only)" in page.text()
    assert not page.evaluate("!!document.querySelector('a[data-view=clients]')")
    show(page, "topics")
    publisher.publish("field/plant1/temp", b"{\"celsius\": 22}", 1)
    page.wait_for("!!document.querySelector('[data-topic=\"field\"]')")
    assert not page.evaluate("!!document.querySelector('#publish-form') || !!document.querySelector('button.kick')")
    assert "403" in page.evaluate("mqttgw.session.api('clients').then(() => 'listed', (e) => e.message)")
    # Its token may not publish: the gateway drops what it sends.
    page.evaluate("mqttgw.mqtt.publish('field/forged', 'from a viewer', {qos: 1})")
    gw.wait_for_log("(user viewer) may not publish on field/forged")
    [temp] = watcher.receive(1)
    assert temp.topic == "field/plant1/temp"
    watcher.nothing_more(1.0)

    # Nothing left the gateway's origin, and the page threw nothing.
    requested = page.requested()
    assert any(u.startswith(f"ws://127.0.0.1:{http_port}/mqtt") for u in requested)
    elsewhere = [
        u for u in requested
        if not u.startswith((f"http://127.0.0.1:{http_port}/", f"ws://127.0.0.1:{http_port}/", "data:"))
    ]
    assert elsewhere == []
    assert page.console_errors() == []
    for c in (watcher, publisher, pipeline):
        c.disconnect()


def _publish_rounds(port, topics, rounds, stop):
    """Each of ``topics`` published once a second for ``rounds`` seconds, QoS 0, as one client."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(P.Connect(client_id="load", username="device", password=b"devpw").encode())
    sock.recv(4)
    # Drained in the background: a PUBACK-free QoS 0 stream, nothing comes back.
    start = time.monotonic()
    for n in range(rounds):
        if stop.is_set():
            break
        packets = b"".join(
            P.Publish(topic, json.dumps({"seq": n, "value": i % 97}).encode(), 0, False).encode()
            for i, topic in enumerate(topics)
        )
        # A second's messages in ten bursts over the second.
        step = len(packets) // 10 + 1
        for k in range(10):
            sock.sendall(packets[k * step:(k + 1) * step])
            time.sleep(max(0.0, start + n + (k + 1) / 10 - time.monotonic()))
    sock.close()


def test_the_topics_view_keeps_up_with_10000_topics_a_second(gateway_with, browser, tmp_path):
    passwords = tmp_path / "passwd"
    passwd(["-c", "-b", str(passwords), "root", "rootpw"])
    passwd(["-b", str(passwords), "device", "devpw"])
    http_port = free_port()
    # Above the 10,000 a second sent here, so that bursts a little over it
    # in some second are not thinned (http.dashboard_message_rate).
    gw = gateway_with(
        "--http", str(http_port), "--password-file", str(passwords), "--dashboard-message-rate", "30000",
    )
    page = browser.page()
    page.viewport(*DESKTOP)
    sign_in(page, f"http://127.0.0.1:{http_port}/", "root", "rootpw")
    show(page, "topics")
    topics = [f"site/{a}/{b}/value" for a in range(100) for b in range(100)]
    rounds = 8
    stop = threading.Event()
    load = threading.Thread(target=_publish_rounds, args=(gw.port, topics, rounds, stop))
    before = page.metrics()
    started = time.monotonic()
    load.start()
    # While it runs, a branch is open, as a user would have it.
    page.wait_for("!!document.querySelector('[data-topic=\"site\"] button.toggle')")
    page.click('[data-topic="site"] button.toggle')
    load.join(rounds + 30)
    stop.set()
    elapsed = time.monotonic() - started
    after = page.metrics()
    # Kept up: every topic is there and the last round shows.
    page.wait_for("mqttgw.views.topics.count === 10000", timeout=10)
    filter_topics(page, "site/42/+/value")
    last = f'"seq":{rounds - 1}'
    page.wait_for(
        f"[...document.querySelectorAll('#topic-tree .row')].length === 100 &&"
        f" [...document.querySelectorAll('#topic-tree .payload')].every(p => p.innerText.includes({json.dumps(last)}))",
        timeout=10,
    )
    busy = (after["TaskDuration"] - before["TaskDuration"]) / elapsed
    script = (after["ScriptDuration"] - before["ScriptDuration"]) / elapsed
    report = {
        "topics": len(topics), "messages_per_second": len(topics), "seconds": round(elapsed, 1),
        "main_thread_busy": round(busy, 3), "script_busy": round(script, 3),
    }
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "load.json").write_text(json.dumps(report, indent=1) + "\n")
    print("dashboard under load:", report)
    page.screenshot(SHOTS / "topics-under-load.png")
    assert page.console_errors() == []


def test_the_page_renews_its_token_and_stays_connected(gateway_with, browser, tmp_path):
    passwords = tmp_path / "passwd"
    passwd(["-c", "-b", str(passwords), "root", "rootpw"])
    http_port = free_port()
    gw = gateway_with(
        "--http", str(http_port), "--password-file", str(passwords), "--token-lifetime", "10",
    )
    page = browser.page()
    sign_in(page, f"http://127.0.0.1:{http_port}/", "root", "rootpw")
    first = page.evaluate("mqttgw.session.token")
    show(page, "topics")
    # Past the first token's expiry: renewed at two thirds of its life.
    page.wait_for(f"mqttgw.session.token !== {json.dumps(first)}", timeout=10)
    # Expired as the gateway sees it: it no longer takes the first token.
    deadline = time.monotonic() + 15
    while request(http_port, "/api/token", "POST", token=first)[0] != 401:
        assert time.monotonic() < deadline, "the first token is still taken"
        time.sleep(0.1)
    assert page.evaluate("document.querySelector('#connection').dataset.state") == "up"
    publisher = client(gw.port, "publisher", "root", "rootpw")
    publisher.publish("renewed/value", b"42", 1)
    page.wait_for("!!document.querySelector('[data-topic=\"renewed\"]')", timeout=5)
    # The page left before its token ran out; the gateway never had to close it.
    assert "its token expired" not in gw.log()
    assert page.console_errors() == []
    publisher.disconnect()

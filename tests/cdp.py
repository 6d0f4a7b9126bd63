"""
Headless Chromium driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: JSON messages ending in a NUL on fds 3 and
4), so the tests need no WebDriver and no WebSocket client of their own.
"""

import base64
import itertools
import json
import os
import queue
import subprocess
import threading
import time


class BrowserError(Exception):
    pass


def _as_fds_3_and_4(reading, writing, cpus=None):
    """In the child: ``reading`` becomes fd 3 and ``writing`` fd 4, both inherited; on ``cpus`` if given."""
    import fcntl

    if cpus:
        os.sched_setaffinity(0, cpus)
        # Sharing a CPU with a load generator: the browser takes what is left.
        os.nice(19)
    # Out of the way first: either may be 3 or 4 already.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (reading, writing)]
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)


class Chromium:
    def __init__(self, chromium, profile, cpus=None):
        # Chromium reads commands from fd 3 and writes answers on fd 4.
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        self.process = subprocess.Popen(
            [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            preexec_fn=lambda: _as_fds_3_and_4(to_browser, from_browser, cpus),
        )
        os.close(to_browser)
        os.close(from_browser)
        self._ids = itertools.count(1)
        self._answers = {}
        self._answered = threading.Condition()
        self.events = queue.Queue()
        self.log = []
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buffered = b""
        while True:
            try:
                chunk = os.read(self._read, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                with self._answered:
                    self._answered.notify_all()
                return
            buffered += chunk
            *messages, buffered = buffered.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self._answered:
                        self._answers[message["id"]] = message
                        self._answered.notify_all()
                else:
                    self.log.append(message)
                    self.events.put(message)

    def send(self, method, params=None, session=None, timeout=30):
        number = next(self._ids)
        message = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._answered:
            while number not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise BrowserError(f"{method}: no answer")
                self._answered.wait(left)
            answer = self._answers.pop(number)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer["result"]

    def page(self):
        """A new tab, with its network and runtime events recorded."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, session)

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except BrowserError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass


class Page:
    def __init__(self, browser, session):
        self.browser = browser
        self.session = session
        for domain in ("Page", "Runtime", "Network", "Performance"):
            self.send(f"{domain}.enable")

    def send(self, method, params=None, timeout=30):
        return self.browser.send(method, params, self.session, timeout)

    def go(self, url):
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression, timeout=30):
        """The JSON value of ``expression`` (awaited if a promise)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details["text"])
        return result["result"].get("value")

    def wait_for(self, expression, timeout=10):
        """Until ``expression`` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout}s: {expression}\npage: {self.text()[:2000]}")
            time.sleep(0.05)

    def text(self):
        return self.evaluate("document.body ? document.body.innerText : ''")

    def click(self, selector):
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def viewport(self, width, height, mobile=False):
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def metrics(self):
        return {m["name"]: m["value"] for m in self.send("Performance.getMetrics")["metrics"]}

    def requested(self):
        """Every URL the page asked for: HTTP requests and WebSockets."""
        urls = []
        for event in self.browser.log:
            if event.get("sessionId") != self.session:
                continue
            if event["method"] == "Network.requestWillBeSent":
                urls.append(event["params"]["request"]["url"])
            elif event["method"] == "Network.webSocketCreated":
                urls.append(event["params"]["url"])
        return urls

    def console_errors(self):
        errors = []
        for event in self.browser.log:
            if event.get("sessionId") != self.session:
                continue
            if event["method"] == "Runtime.exceptionThrown":
                errors.append(event["params"]["exceptionDetails"].get("text"))
            elif event["method"] == "Runtime.consoleAPICalled" and event["params"]["type"] == "error":
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in event["params"]["args"]))
        return errors

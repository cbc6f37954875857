"""A real headless Chromium, driven over the DevTools protocol, for the HTML report's browser test.

Debian's ``chromium`` (``make browser-deps`` installs it), started with a fresh profile, no network features and its
DevTools endpoint on 127.0.0.1 (port chosen by Chromium, read from ``DevToolsActivePort``); a small client over
``websockets`` sends commands and keeps the events that tell what the page did: console messages, uncaught
exceptions, log entries and every network request. Every wait has a deadline, and ``close()`` stops the browser.

Run as a script it writes a screenshot of a report (how the README's picture is made)::

    .venv/bin/python -m tests.support.report_browser REPORT.html OUT.png
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]
START_TIMEOUT = 30.0
COMMAND_TIMEOUT = 30.0


#: Why a browser test skips (off CI, where ``make browser-deps`` has not been run).
NO_CHROMIUM = "no chromium on PATH: `make browser-deps` installs Debian's chromium (as root, with apt-get)"


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless Chromium process and a DevTools connection to its first page."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900) -> None:
        from websockets.sync.client import connect

        self._profile = tempfile.mkdtemp(prefix="report-chromium-")
        self._log = open(Path(self._profile) / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        try:
            port = self._port()
            self._stack = contextlib.ExitStack()
            socket = connect(self._page_socket(port), max_size=None, open_timeout=10, close_timeout=2)
            self.ws = self._stack.enter_context(socket)
        except BaseException:
            self.close()
            raise

    # ---- start-up ----------------------------------------------------------------------------------------------

    def _port(self) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited ({self.proc.returncode}): {self.output()[-2000:]}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise TimeoutError(f"chromium did not open its DevTools port in {START_TIMEOUT} s")

    def _page_socket(self, port: int) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                    pages = [t for t in json.load(response) if t.get("type") == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise TimeoutError("chromium has no page target")

    def output(self) -> str:
        self._log.flush()
        return (Path(self._profile) / "chromium.log").read_text(errors="replace")

    # ---- the protocol ------------------------------------------------------------------------------------------

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one command; the events that arrive meanwhile are kept in ``events``."""
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, method: str, timeout: float = COMMAND_TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event["method"] == method:
                    self.events.remove(event)
                    return event
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if "method" in message:
                self.events.append(message)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event, with console, log, exceptions and network recorded."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries so far."""
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000), "scale": 1}
            params.update(captureBeyondViewport=True, clip=clip)
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)


@contextlib.contextmanager
def started_browser(width: int = 1280, height: int = 900) -> Iterator[Chromium]:
    """A started Chromium, closed after; the test skips where there is none."""
    import pytest  # not for the screenshot script (``main``)

    binary = chromium_binary()
    if binary is None:
        pytest.skip(NO_CHROMIUM)
    started = Chromium(binary, width, height)
    try:
        yield started
    finally:
        started.close()


def rendered(html: Path, script: str, screenshot: Path | None = None) -> Any:
    """What ``script`` reads of the page ``html`` once a started Chromium drew it (a full-page ``screenshot`` too,
    when asked); asserts that the page drew without an error and asked for nothing but itself."""
    with started_browser() as browser:
        browser.open(html.as_uri())
        page = browser.evaluate(script)
        assert browser.errors() == [] and browser.requests() == [html.as_uri()]
        if screenshot is not None:
            browser.screenshot(screenshot, full_page=True)
    return page


def main(argv: list[str]) -> int:
    """``REPORT.html OUT.png [HEIGHT]``: a screenshot of the top of a report, 1280 px wide."""
    binary = chromium_binary()
    if binary is None:
        print("no chromium on PATH (make browser-deps installs it)", file=sys.stderr)
        return 2
    report, out = Path(argv[0]).resolve(), Path(argv[1])
    height = int(argv[2]) if len(argv) > 2 else 900
    browser = Chromium(binary, 1280, height)
    try:
        browser.open(report.as_uri())
        print("errors:", browser.errors())
        browser.screenshot(out, full_page=False)
    finally:
        browser.close()
    print(f"screenshot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

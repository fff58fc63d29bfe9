"""The web playground in a real headless Chromium, driven over the DevTools protocol, against a live
server that needs an API key: the key entered in the page, a streamed answer with its reasoning
folded apart, thinking turned off, and a second turn that reuses the session (cached tokens shown).

Needs Debian's chromium (``apt-get install chromium``); marked ``browser`` and left out of the
default run: ``python -m pytest -m browser tests/server/test_playground_browser.py``. Without
chromium the test fails (it is never skipped). The screenshot goes to /tmp/playground.png.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from swiftlm.config import ServerConfig
from tests.server.conftest import ANSWER, REASONING, free_port

pytestmark = pytest.mark.browser
KEY = "sk-playground"
SCREENSHOT = Path("/tmp/playground.png")


class Page:
    """One tab over the DevTools protocol: commands by id, events ignored."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    def call(self, method: str, **params) -> dict:
        n = next(self._ids)
        self._ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=30))
            if message.get("id") == n:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "this test needs Debian's chromium: apt-get install -y chromium"
    return found


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    port = free_port()
    browser = subprocess.Popen(
        [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--remote-debugging-port={port}", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,900",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                tabs = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=1).json()
                ws = next(t["webSocketDebuggerUrl"] for t in tabs if t["type"] == "page")
                break
            except (httpx.HTTPError, StopIteration):
                assert time.monotonic() < deadline, "chromium did not open its DevTools port"
                time.sleep(0.1)
        with connect(ws, max_size=None, open_timeout=10) as socket:
            tab = Page(socket)
            tab.call("Page.enable")
            tab.call("Runtime.enable")
            yield tab
    finally:
        browser.terminate()
        browser.wait(timeout=10)


def send(page: Page, text: str, turn: int) -> dict:
    """Type ``text``, press Enter, wait for answer number ``turn``; its parts as the page shows them."""
    page.js(f"document.getElementById('prompt').value = {json.dumps(text)}")
    page.js("document.getElementById('prompt').dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}))")
    page.wait_for(f"document.querySelectorAll('.message.assistant[data-state=done]').length === {turn}")
    return page.js(f"""(() => {{
        const box = document.querySelectorAll('.message.assistant')[{turn - 1}];
        const details = box.querySelector('details.reasoning');
        return {{
            content: box.querySelector('.content').textContent,
            reasoning: details.hidden ? null : details.querySelector('.text').textContent,
            folded: !details.open,
            chunks: Number(box.dataset.chunks),
            ttft: box.querySelector('.stats .ttft').textContent,
            tps: box.querySelector('.stats .tps').textContent,
            cached: Number(box.querySelector('.stats .cached').dataset.value),
            stats: box.querySelector('.stats').textContent,
        }};
    }})()""")


def test_playground_chats_with_thinking_and_a_session(start_server, scripted_model_dir, page: Page) -> None:
    server = start_server(scripted_model_dir, ServerConfig(api_key=KEY))
    page.call("Page.navigate", url=server.base_url + "/")
    page.wait_for("document.readyState === 'complete'")
    assert "API key" in page.wait_for("document.getElementById('status').textContent")  # 401 until it is entered
    page.js(f"""(() => {{ const k = document.getElementById('api-key'); k.value = {json.dumps(KEY)};
                k.dispatchEvent(new Event('change')); }})()""")
    assert page.wait_for("document.getElementById('model').value") == server.model
    assert page.js("document.getElementById('thinking').checked") is True

    first = send(page, "Hello!", 1)
    print("turn 1:", first)
    assert first["content"] == ANSWER and first["reasoning"] == REASONING and first["folded"]
    assert first["chunks"] > 1  # streamed: the answer arrived in several deltas
    assert re.fullmatch(r"TTFT \d+ ms", first["ttft"]) and re.fullmatch(r"[\d.]+ tok/s", first["tps"])
    assert "n/a" not in first["stats"]

    page.js("document.getElementById('thinking').click()")
    assert page.js("document.getElementById('thinking').checked") is False
    second = send(page, "And again?", 2)
    print("turn 2:", second)
    assert second["content"] == ANSWER and second["reasoning"] is None  # thinking off
    assert second["cached"] > 0 and f"cached {second['cached']})" in second["stats"]  # the session's KV reused
    assert page.js("document.querySelectorAll('.message.user').length") == 2

    shot = page.call("Page.captureScreenshot", format="png")
    SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))
    assert SCREENSHOT.stat().st_size > 10_000
    server.assert_no_leaks()

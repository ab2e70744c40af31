"""A headless Debian chromium driven over the DevTools protocol, and Airflow's login form."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect


class DevTools:
    """A minimal Chrome DevTools protocol client for one page target."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.calls = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        self.socket.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.calls:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, condition: Any, what: str, timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition() if callable(condition) else self.evaluate(condition)
            except RuntimeError:  # the page was between documents (a navigation, a refresh)
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}; at {self.evaluate('location.href')}")


@pytest.fixture
def chromium(tmp_path) -> Iterator[DevTools]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary is not None, "no chromium: `make browser` installs Debian's"
    profile = tmp_path / "chromium-profile"
    browser = subprocess.Popen(
        [
            binary,
            *("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"),
            "--window-size=1400,1000",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and browser.poll() is None, "chromium did not start"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=30).json()
        page = next(target for target in targets if target["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None) as socket:
            yield DevTools(socket)
    finally:
        os.killpg(browser.pid, signal.SIGKILL)
        browser.wait(timeout=30)


def log_in(chromium: DevTools, username: str, password: str) -> None:
    """Fill in and submit the Airflow login form the browser is showing."""
    chromium.wait_for("!!document.querySelector('input[name=username]')", "the login form")
    for field, value in (("username", username), ("password", password)):
        chromium.evaluate(f"document.querySelector('input[name={field}]').focus()")
        chromium.call("Input.insertText", text=value)
    chromium.evaluate("document.querySelector('button[type=submit]').click()")

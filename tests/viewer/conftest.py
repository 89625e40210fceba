"""Serving the viewer for real (the ``gym-bridge view`` command in a child process) and a real browser.

The browser is Debian's ``chromium`` (``scripts/setup.sh`` installs it), driven by Playwright through
``executable_path``: no browser download. Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))


def chromium_path() -> str:
    path = os.environ.get("GYM_BRIDGE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("chromium not found: scripts/setup.sh installs Debian's chromium (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One Chromium per test module: Playwright's sync API keeps an event loop marked running on this
    thread while it is open, so it must be closed before other modules call ``asyncio.run``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser, tmp_path: Path) -> Iterator[object]:  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    p.set_default_timeout(90_000)  # a wait limit, not a speed check: the machine may be loaded
    dialogs: list[str] = []
    p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    p.dialogs = dialogs  # type: ignore[attr-defined]
    yield p
    context.close()


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[str]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture
def serve() -> Iterator[object]:
    """``serve(*args)`` runs ``gym-bridge view --port 0 ARGS`` and returns its URL once it is listening."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> Served:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gym_bridge.cli", "view", "--port", "0", *args],  # a later --port wins
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO,
        )
        procs.append(proc)
        line = proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"(http://[\d.]+:\d+)/", line)
        if not match:
            proc.kill()
            pytest.fail(f"view did not print its URL: {line!r} {proc.stderr.read()}")  # type: ignore[union-attr]
        return Served(url=match.group(1), proc=proc)

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(page, url: str, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    """Open ``url`` and wait until the file behind it is indexed (the progress page refreshes itself)."""
    page.goto(url)
    deadline = time.monotonic() + timeout
    while page.locator("#progress").count() and time.monotonic() < deadline:
        page.wait_for_timeout(200)
        page.goto(url)


class _BlankPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"<!doctype html><title>another site</title><p>another site"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_site() -> Iterator[str]:
    """The URL of a blank page served from another site than the viewer's 127.0.0.1 (``localhost``): what a
    web page the user opens is, to the browser."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlankPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()

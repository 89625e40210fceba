"""Shared fixtures of the math server tests: one real server on a free loopback port for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gym_bridge.serving.server import ServerSettings
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathServer
from resources_servers.math.tests.helpers import REFERENCE_DIR, TEST_CONFIG, TOKEN, wait_for_pool


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not REFERENCE_DIR.is_dir():
        pytest.fail(f"NeMo Gym reference records not found at {REFERENCE_DIR}")
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def math_server() -> Iterator[tuple[MathServer, str]]:
    server = MathServer(ServerSettings(auth_token=TOKEN, max_body_bytes=1024 * 1024), TEST_CONFIG)
    with start_in_thread(server.build_app()) as running:
        wait_for_pool(running.url, {"Authorization": f"Bearer {TOKEN}"})
        yield server, running.url


@pytest.fixture
def client(math_server: tuple[MathServer, str]) -> Iterator[httpx.Client]:
    _, url = math_server
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c:
        yield c

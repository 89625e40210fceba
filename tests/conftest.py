"""Shared fixtures: where the NeMo Gym reference records live (vendored in tests/data/nemo_gym)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE_DIR = REPO / "tests" / "data" / "nemo_gym"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not REFERENCE_DIR.is_dir():
        pytest.fail(f"NeMo Gym reference records not found at {REFERENCE_DIR}")
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def builtin_url() -> Iterator[Callable[[str], str]]:
    """``builtin_url(name)``: the URL of built-in server ``name``, started in-process on first use and
    shared by every test of the session (the math server's verifier pool takes seconds to start)."""
    from gym_bridge.rollout.envs import load_server_class
    from gym_bridge.serving.server import ServerSettings
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    urls: dict[str, str] = {}
    with ExitStack() as stack:

        def url(name: str) -> str:
            if name not in urls:
                server = load_server_class(name)(ServerSettings())
                urls[name] = stack.enter_context(start_in_thread(server.build_app(), timeout=120)).url
            return urls[name]

        yield url

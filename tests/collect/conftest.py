"""Fixtures for the collector tests: small real envs served on loopback.

``fake_model`` (tests/fake_model.py) is importable because tests/ is on sys.path (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from collect_helpers import BoxedAnswerEnv, NotesEnv

from gym_bridge.serving.uvicorn_thread import start_in_thread


@pytest.fixture(scope="module")
def boxed_env() -> Iterator[tuple[str, BoxedAnswerEnv]]:
    env = BoxedAnswerEnv()
    with start_in_thread(env.build_app()) as running:
        yield running.url, env


@pytest.fixture(scope="module")
def notes_env() -> Iterator[tuple[str, NotesEnv]]:
    env = NotesEnv()
    with start_in_thread(env.build_app()) as running:
        yield running.url, env

"""Fixtures for the reliability suite: real servers on loopback, and the repository's paths.

``fake_model`` (tests/fake_model.py) is importable because tests/ is on sys.path (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
from gym_bridge.serving.uvicorn_thread import start_in_thread

from .envs import ArithmeticEnv

REPO = Path(__file__).resolve().parents[2]


def landed_builtin_servers() -> list[str]:
    """Built-in resources servers whose code is in this checkout (each is tested as it lands)."""
    from gym_bridge.rollout.envs import BUILTIN_SERVERS

    return [
        name
        for name, target in BUILTIN_SERVERS.items()
        if (REPO / (target.partition(":")[0].replace(".", "/") + ".py")).is_file()
    ]


@pytest.fixture(scope="module")
def arithmetic_env() -> Iterator[tuple[str, ArithmeticEnv]]:
    env = ArithmeticEnv()
    with start_in_thread(env.build_app()) as running:
        yield running.url, env


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Llama with the project's tokenizer, saved as a model directory (for train)."""
    from gym_bridge.models.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("tiny_random")
    tokenizer = build_tokenizer()
    make_tiny_llama(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def make_tiny_llama(tokenizer: Any) -> Any:
    """A random Llama (hidden 32, 1 layer): the smallest that trains and serves, for speed."""
    return random_tiny_model(
        tokenizer, TinyRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    )


@pytest.fixture(scope="session")
def tiny_policy_url() -> Iterator[str]:
    """The embedded policy server over a tiny random Llama, generating at most 4 tokens per request."""
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.policy.server import build_policy_app

    tokenizer = build_tokenizer()
    backend = TransformersBackend(make_tiny_llama(tokenizer), tokenizer, model_name="tiny-fuzz")
    app = build_policy_app(backend, model_name="tiny-fuzz", batch_wait_ms=1, max_output_tokens=4)
    with start_in_thread(app, timeout=120) as running:
        yield running.url

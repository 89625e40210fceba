"""Fixtures for the policy-server tests: a tiny random Llama with the local chat tokenizer, no network."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.generation.backend import GenerationBackend, GenerationRequest, GenerationResult
from gym_bridge.models.tiny import TinyRecipe, random_tiny_model


def make_tiny_llama(tokenizer: Any, seed: int = 0) -> Any:
    """A random Llama (hidden 64, 2 layers) sized to the tokenizer."""
    shape = TinyRecipe(
        hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=512
    )
    return random_tiny_model(tokenizer, shape, seed)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from gym_bridge.models.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def llama_factory() -> Any:
    """``make_tiny_llama`` itself, for tests that need models with different weights."""
    return make_tiny_llama


@pytest.fixture(scope="session")
def tiny_model(tokenizer: Any) -> Any:
    return make_tiny_llama(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tiny_model: Any) -> Path:
    """The tiny model and tokenizer saved as a Hugging Face directory (what ``--model PATH`` loads)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class CountingBackend(GenerationBackend):
    """Wraps a backend and records every ``generate`` batch (to see batching happen)."""

    def __init__(self, inner: GenerationBackend) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.model_name = inner.model_name
        self.max_context = inner.max_context
        self.batches: list[list[GenerationRequest]] = []
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        with self._lock:
            self.batches.append(list(requests))
        return self.inner.generate(requests)

    def reset(self) -> None:
        with self._lock:
            self.batches.clear()


class ScriptedBackend(GenerationBackend):
    """Answers every request with a fixed completion text (tokenized), to test the server's parsing."""

    def __init__(self, tokenizer: Any, text: str, finish_reason: str = "stop") -> None:
        self.tokenizer = tokenizer
        self.model_name = "scripted"
        self.max_context = 512
        self.text = text
        self.finish_reason = finish_reason
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.requests.extend(requests)
        ids = self.tokenizer(self.text, add_special_tokens=False)["input_ids"]
        return [
            GenerationResult(
                prompt_token_ids=list(r.prompt_token_ids),
                token_ids=list(ids),
                logprobs=[-0.5] * len(ids),
                finish_reason=self.finish_reason,  # type: ignore[arg-type]
                text=self.text,
            )
            for r in requests
        ]

"""Backend-wide stop token ids (``policy.generation.stop_token_ids``): every backend ends completions on
them, besides each request's own."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.generation.backend import GenerationRequest, SamplingParams  # noqa: E402
from gym_bridge.generation.transformers_backend import TransformersBackend  # noqa: E402


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, Any]:
    from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    shape = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=256)
    return random_tiny_model(tokenizer, shape, 5), tokenizer


def test_backend_stop_ids_end_completions_like_request_ones(model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tokenizer = model_and_tokenizer
    prompt = list(tokenizer("Count to ten:", add_special_tokens=False)["input_ids"])
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
    free = TransformersBackend(model, tokenizer).generate([GenerationRequest(prompt, params)])[0]
    eos = set(TransformersBackend(model, tokenizer).eos_token_ids)
    candidates = [t for t in free.token_ids[1:-1] if t not in eos]
    assert candidates, "the free completion should be long enough to cut"
    stop = candidates[len(candidates) // 2]
    first = free.token_ids.index(stop)

    stopping = TransformersBackend(model, tokenizer, stop_token_ids=[stop])
    cut = stopping.generate([GenerationRequest(prompt, params)])[0]
    assert cut.token_ids == free.token_ids[: first + 1]  # the stop token is kept, as for EOS
    assert cut.finish_reason == "stop"
    assert cut.logprobs == pytest.approx(free.logprobs[: first + 1], abs=1e-5)
    # the request's own stop ids still apply on top of the backend's
    other = free.token_ids[0]
    both = stopping.generate([GenerationRequest(prompt, SamplingParams(**{**params.__dict__, "stop_token_ids": [other]}))])[0]
    assert both.token_ids == free.token_ids[:1]


def test_stop_ids_outside_the_vocabulary_are_refused(model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tokenizer = model_and_tokenizer
    vocab = int(model.get_input_embeddings().num_embeddings)
    with pytest.raises(ValueError, match=rf"stop_token_ids \[{vocab}\] are outside the model's vocabulary"):
        TransformersBackend(model, tokenizer, stop_token_ids=[1, vocab])


def test_vllm_backend_passes_backend_and_request_stop_ids_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM cannot run here: a stand-in module records the SamplingParams the backend builds."""
    from gym_bridge.generation.vllm_backend import VllmBackend

    built: list[dict[str, Any]] = []
    fake = types.ModuleType("vllm")

    class LLM:
        def __init__(self, model: str, **kwargs: Any) -> None:
            config = types.SimpleNamespace(max_model_len=64, get_vocab_size=lambda: 100)
            self.llm_engine = types.SimpleNamespace(model_config=config)

        def get_tokenizer(self) -> Any:
            return None

    fake.LLM = LLM
    fake.SamplingParams = lambda **kwargs: built.append(kwargs) or kwargs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    backend = VllmBackend("some/model", stop_token_ids=[7, 9])
    backend._sampling_params(GenerationRequest([1, 2], SamplingParams(stop_token_ids=[9, 11])))
    backend._sampling_params(GenerationRequest([1, 2], SamplingParams()))
    assert built[0]["stop_token_ids"] == [7, 9, 11]
    assert built[1]["stop_token_ids"] == [7, 9]
    plain = VllmBackend("some/model")
    plain._sampling_params(GenerationRequest([1, 2], SamplingParams()))
    assert built[2]["stop_token_ids"] is None

"""A judge that refuses the prompt as over its context: a judge failure, or an answer too long for the judge.

Masked (``mask_sample: true``), a sample leaves the loss: a wrong answer long enough to overflow the judge's
context escaped its 0. When the answer is most of the refused prompt it is the answer's doing (reward 0,
``answer_too_long``, not masked); with a short answer the judge's context is too small for the task
(``judge_error``, masked, as before). Over HTTP, with each server family's wording, and against the real
policy server of ``gym-bridge serve policy`` (a tiny model, 4,096 tokens of context) as the judge.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.server import ServerSettings
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.equivalence_judge.app import EquivalenceJudgeConfig, EquivalenceJudgeServer
from resources_servers.equivalence_judge.tests.fake_judge import FakeJudge, Status

LONG = "Alfred Russel Wallace, " + "and so on " * 2000

WORDINGS = {
    "vllm": "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens.",
    "vllm-v1": "The decoder prompt (length 9000) is longer than the maximum model length of 4096.",
    "sglang": "The input (9000 tokens) is longer than the model's context length (4096 tokens).",
    "llama.cpp": "the request exceeds the available context size, try increasing it",
    "tgi": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 9000",
}


def row(answer: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Who proposed natural selection?"}]},
        "response": {"output": [{"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": answer}]}]},
        "expected_answer": "Charles Darwin",
    }  # fmt: skip


def verify(url: str, answer: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/verify", json=row(answer), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    def script(prompt: str, n: int) -> Any:
        family = next((name for name in WORDINGS if f"[{name}]" in prompt), None)
        return Status(400, WORDINGS[family]) if family else Status(400, "model 'judge' does not exist")

    with FakeJudge(script) as judge:
        config = EquivalenceJudgeConfig(judge_url=judge.url, judge_timeout_s=30)
        with start_in_thread(EquivalenceJudgeServer(ServerSettings(), config).build_app()) as running:
            yield running.url


@pytest.mark.parametrize("family", sorted(WORDINGS))
def test_an_answer_over_the_judges_context_scores_zero_unmasked(url: str, family: str) -> None:
    out = verify(url, f"[{family}] {LONG}")
    assert (out["reward"], out["failure_kind"], out["mask_sample"]) == (0.0, "answer_too_long", False), out
    assert "over the judge's context" in out["failure_reason"] and out["judge_evaluations"][0]["prompt_too_long"]


@pytest.mark.parametrize("family", sorted(WORDINGS))
def test_a_short_answer_over_the_judges_context_is_a_judge_failure(url: str, family: str) -> None:
    out = verify(url, f"[{family}] Wallace")
    assert (out["reward"], out["failure_kind"], out["mask_sample"]) == (0.0, "judge_error", True), out


def test_another_bad_request_stays_a_judge_failure(url: str) -> None:
    out = verify(url, LONG)  # a 400 that says nothing of the context (a wrong model name)
    assert (out["failure_kind"], out["mask_sample"]) == ("judge_error", True)
    assert out["judge_evaluations"][0]["prompt_too_long"] is False


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_against_the_policy_server_as_the_judge(api: str) -> None:
    """``gym-bridge serve policy``'s app (a tiny model, 4,096 tokens of context) as the judge: a short answer is
    judged (no verdict from a random model, no failure), a long one is over its context: too long, unmasked."""
    pytest.importorskip("torch")
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.policy.server import build_policy_app

    tokenizer = build_tokenizer()
    shape = TinyRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=4096)
    backend = TransformersBackend(random_tiny_model(tokenizer, shape), tokenizer, model_name="tiny-judge")
    app = build_policy_app(backend, model_name="tiny-judge", batch_wait_ms=1, max_output_tokens=8)
    with start_in_thread(app, timeout=120) as policy:
        config = EquivalenceJudgeConfig(judge_url=f"{policy.url}/v1", judge_api=api, judge_timeout_s=60)
        with start_in_thread(EquivalenceJudgeServer(ServerSettings(), config).build_app()) as running:
            short = verify(running.url, "Wallace")
            long = verify(running.url, LONG)
    assert short["failure_kind"] is None and short["judge_evaluations"][0]["failure_kind"] is None, short
    assert (long["reward"], long["failure_kind"], long["mask_sample"]) == (0.0, "answer_too_long", False), long
    assert "over the model's context of 4096" in long["failure_reason"] or "context of 4096" in long["failure_reason"]

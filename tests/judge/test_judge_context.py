"""A judge that refuses the prompt as over its context: a judge failure, or an answer too long for the judge.

Masked (``mask_sample: true``), a sample leaves the loss: a wrong answer long enough to overflow the judge's
context escaped its 0. When the answer is most of the refused prompt it is the answer's doing (reward 0,
``answer_too_long``, not masked); with a short answer the judge's context is too small for the task
(``judge_error``, masked, as before). Over HTTP, with each server family's wording, and against the real
``gym-bridge serve policy`` (a tiny model, 512 tokens of context) as the judge.
"""

from __future__ import annotations

import tempfile
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


def test_against_gym_bridge_serve_policy_as_the_judge() -> None:
    from gym_bridge.models.tokenizer import build_tokenizer
    from tests.policy.conftest import make_tiny_llama
    from tests.policy.test_serve_policy_cli import serve_policy

    tokenizer = build_tokenizer()
    with tempfile.TemporaryDirectory() as model_dir:
        make_tiny_llama(tokenizer).save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        with serve_policy("--model", model_dir, "--max-output-tokens", "8") as policy:
            config = EquivalenceJudgeConfig(judge_url=f"{policy}/v1", judge_api="chat_completions", judge_timeout_s=60)
            with start_in_thread(EquivalenceJudgeServer(ServerSettings(), config).build_app()) as running:
                short = verify(running.url, "Wallace")  # the built-in prompt alone is over 512 tokens
                long = verify(running.url, LONG)
    assert (short["failure_kind"], short["mask_sample"]) == ("judge_error", True), short["failure_reason"]
    assert (long["reward"], long["failure_kind"], long["mask_sample"]) == (0.0, "answer_too_long", False)
    assert "the model's context of 512" in long["failure_reason"]

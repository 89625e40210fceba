"""The embedded policy server as the judge: both APIs, through the equivalence_judge server, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("torch")

from gym_bridge.serving.server import ServerSettings  # noqa: E402
from gym_bridge.serving.uvicorn_thread import start_in_thread  # noqa: E402
from resources_servers.equivalence_judge.app import EquivalenceJudgeConfig, EquivalenceJudgeServer  # noqa: E402


@pytest.fixture(scope="module")
def policy_url() -> Iterator[str]:
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.policy.server import build_policy_app

    tokenizer = build_tokenizer()
    model = random_tiny_model(tokenizer, TinyRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    backend = TransformersBackend(model, tokenizer, model_name="tiny-judge")
    app = build_policy_app(backend, model_name="tiny-judge", batch_wait_ms=1, max_output_tokens=8)
    with start_in_thread(app, timeout=120) as running:
        yield running.url + "/v1"


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_embedded_policy_server_answers_as_a_judge(policy_url: str, api: str) -> None:
    config = EquivalenceJudgeConfig(judge_url=policy_url, judge_model="tiny-judge", judge_api=api,
                                    judge_responses_create_params={"max_output_tokens": 8, "temperature": 0})  # fmt: skip
    with start_in_thread(EquivalenceJudgeServer(ServerSettings(), config).build_app()) as running:
        body = {"responses_create_params": {"input": "Who proposed natural selection?"}, "expected_answer": "darwin",
                "response": {"output": [{"type": "message", "role": "assistant",
                                         "content": [{"type": "output_text", "text": "Darwin"}]}]}}  # fmt: skip
        out = httpx.post(f"{running.url}/verify", json=body, timeout=120).json()
    (evaluation,) = out["judge_evaluations"]
    # A random tiny model writes no label: a real answer without a verdict, so not equal, and no failure.
    assert evaluation["failure_kind"] is None, evaluation["failure_reason"]
    assert isinstance(evaluation["response_text"], str) and evaluation["latency_s"] > 0
    assert evaluation["verdict_label"] is None and out["reward"] == 0.0 and out["failure_kind"] is None
    assert evaluation["response"]["model"] == "tiny-judge"

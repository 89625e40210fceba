"""In-process calls to the embedded servers: the same samples and the same answers as loopback HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.rollout.envs import env_app
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.retry import RequestFailed, RetryPolicy, post_json
from gym_bridge.serving.uvicorn_thread import start_in_thread
from gym_bridge.train.config import load_config
from gym_bridge.train.samplers.data import load_prompts
from gym_bridge.train.samplers.sampling import OnlineSampler
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts

ROOT = Path(__file__).resolve().parents[2]


def _samples(cfg: Any, model_dir: Path, in_process: bool) -> tuple[list[Any], bool]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_bridge.generation.transformers_backend import TransformersBackend

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    backend = TransformersBackend(model, tokenizer, model_name="policy", seed=3, max_context=64)
    sampler = OnlineSampler(cfg, backend, tokenizer, in_process=in_process)
    try:
        prompts = load_prompts(cfg.data, "train")[0]
        math_prompts = [p for p in prompts if p.env_name == "math"][:3]
        parity_prompts = [p for p in prompts if p.env_name == "parity"][:2]
        chosen = math_prompts + parity_prompts
        samples, stats = sampler.sample(chosen, [[11 * i + g for g in range(3)] for i in range(len(chosen))])
        assert stats["rollout_failures"] == 0 and len(samples) == 15
        return samples, sampler.in_process
    finally:
        sampler.close()


@pytest.mark.timeout(300)
def test_in_process_rollouts_equal_loopback_http_rollouts(tmp_path: Path) -> None:
    model_dir = save_random_tiny(tmp_path / "model", seed=1, num_layers=1)
    parity_rows = write_say_prompts(tmp_path / "parity.jsonl", 4)
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            f"policy.model_name={model_dir}",
            f"data.train=[{{data_path: {ROOT / 'recipes/data/arith_train.jsonl'}, env_name: math}}, "
            f"{{data_path: {parity_rows}, env_name: parity}}]",
            "env.math.server=math",
            f"env.parity.server={PARITY_SERVER}",
        ],
    )
    over_http, http_flag = _samples(cfg, model_dir, in_process=False)
    in_process, in_process_flag = _samples(cfg, model_dir, in_process=True)
    assert (http_flag, in_process_flag) == (False, True)
    for a, b in zip(over_http, in_process, strict=True):
        assert (a.group, a.token_ids, a.loss_mask, a.reward, a.truncated) == (
            b.group,
            b.token_ids,
            b.loss_mask,
            b.reward,
            b.truncated,
        )
        # Same tokens from the same seeds; log-probs to float rounding (requests may reach the batcher
        # in another order or split into other batches, and a batch's shape moves the last bits).
        assert a.generation_logprobs == pytest.approx(b.generation_logprobs, abs=1e-5)
        # The env's whole verify answer, less the log-probs on its output items (see above).
        assert _without_ids(a.record, "generation_log_probs") == _without_ids(b.record, "generation_log_probs")
    assert {s.reward for s in in_process} >= {0.0}


def _without_ids(value: Any, *also: str) -> Any:
    """``value`` without the fresh ids and timestamps every response gets (and the keys ``also``)."""
    if isinstance(value, dict):
        return {k: _without_ids(v, *also) for k, v in value.items() if k not in ("id", "created_at", *also)}
    if isinstance(value, list):
        return [_without_ids(v, *also) for v in value]
    return value


def _post_both(app_factory: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> list[Any]:
    """``(status, content-type, body)`` of the same request over HTTP and in-process (fresh apps)."""

    async def go(base: str, client: Any) -> Any:
        policy = RetryPolicy(max_attempts=1, request_timeout=30)
        try:
            result = await post_json(client, f"{base}{path}", body, target="env", policy=policy,
                                     headers=headers, expect_json=False, return_client_errors=True)  # fmt: skip
            return result.status, result.headers.get("content-type"), result.content
        except RequestFailed as err:
            return err.failure_class, err.status

    async def over_http() -> Any:
        running = start_in_thread(app_factory())
        try:
            async with httpx.AsyncClient() as client:
                return await go(running.url, client)
        finally:
            running.stop()

    async def in_process() -> Any:
        client = InProcessClient()
        base = await client.mount("env", app_factory())
        try:
            return await go(base, client)
        finally:
            await client.aclose()

    return [asyncio.run(over_http()), asyncio.run(in_process())]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/verify", {"responses_create_params": {"input": "1+1"}}, None),  # 422: no response
        ("/seed_session", {"responses_create_params": {"input": "1+1"}, "expected_answer": "2"}, None),
        ("/no_such_tool", {}, None),
        ("/verify", [1, 2], {"authorization": "Bearer wrong"}),
    ],
)
def test_an_in_process_answer_is_the_http_answer(path: str, body: Any, headers: dict[str, str] | None) -> None:
    over_http, in_process = _post_both(lambda: env_app("math"), path, body, headers)
    if path == "/seed_session":  # the session cookie differs per session; status and type do not
        assert over_http[:2] == in_process[:2] == (200, "application/json")
    else:
        assert over_http == in_process and over_http[0] >= 400


def test_an_app_error_is_a_500_and_an_unknown_origin_a_connection_error() -> None:
    async def failing_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raise RuntimeError("boom")

    async def go() -> tuple[Any, Any]:
        client = InProcessClient()
        base = await client.mount("broken", failing_app)
        policy = RetryPolicy(max_attempts=1, request_timeout=5)
        outcomes = []
        for url in (f"{base}/x", "http://elsewhere.in-process/x"):
            try:
                await post_json(client, url, {}, target="env", policy=policy)
            except RequestFailed as err:
                outcomes.append((err.failure_class, err.status))
        await client.aclose()
        return outcomes[0], outcomes[1]

    assert asyncio.run(go()) == (("env_http_error", 500), ("env_connection_error", None))

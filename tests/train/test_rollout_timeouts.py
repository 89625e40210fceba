"""A rollout deadline in training: a tool call or /verify that never answers costs a step the deadline.

Before it, such a request waited out ``env.<name>.timeout_s`` (60 s) and was sent again, silently, every
step (issue 37: the tiny recipe went from ~0.3 s to ~60 s a step with ``failed 0/64`` on its line). The
environment here is a real resources server in its own process, over HTTP
(:mod:`tests.train.straggler_env`), whose every N-th tool call (or /verify) never answers once the
run's first three steps are done, so each run measures its own pace before and after the stragglers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.train.bookkeeping.logging import format_line, read_metrics
from gym_bridge.train.config import load_config
from tests.reliability.procs import kill9, start, wait_for_line
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts
from tests.train.shopper import Shopper, write_shop_rows
from tests.train.straggler_env import StragglerConfig

CLEAN_STEPS, STEPS = 3, 6
ROLLOUTS = 16
"""4 prompts x 4 rollouts a step, each making one tool call and one /verify."""


@contextmanager
def straggler_server(config: StragglerConfig) -> Iterator[str]:
    """:class:`~tests.train.straggler_env.StragglerEnv` in its own process on a free loopback port."""
    args = ["--hang-every", str(config.hang_every), "--hang-after", str(config.hang_after),
            "--hang-in", config.hang_in, "--delay-s", str(config.delay_s)]  # fmt: skip
    proc = start([sys.executable, "-m", "tests.train.straggler_env", *args])
    try:
        line = wait_for_line(proc, "listening on", timeout=60)
        yield next(word for word in line.split() if word.startswith("http://"))
    finally:
        kill9(proc)


def hung(url: str) -> int:
    """How many requests the server left unanswered."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        return json.loads(answer.read())["hung"]


def shop_run(tmp_path: Path, model_dir: Path, *extra: str) -> Any:
    """Sync GRPO on the scripted :class:`Shopper` policy: turn 1 calls ``add_to_cart``, turn 2 says done."""
    rows = write_shop_rows(tmp_path / "shop.jsonl", 8)
    return load_config(
        None,
        [*SMALL_ONLINE_RUN, "policy.max_total_sequence_length=512", "policy.generation.max_new_tokens=64",
         "grpo.max_rollout_turns=2", "policy.train_micro_batch_size=16", f"policy.model_name={model_dir}",
         f"data.train.data_path={rows}", "data.train.env_name=shop", f"grpo.max_num_steps={STEPS}",
         "grpo.val_period=0", "checkpointing.enabled=false", f"logger.log_dir={tmp_path / 'logs'}",
         "logger.tensorboard_enabled=false", *extra],
    )  # fmt: skip


def train_steps(cfg: Any, monkeypatch: pytest.MonkeyPatch, *, shopper: bool = True) -> list[dict[str, Any]]:
    """Train ``cfg`` to the end; its step records."""
    from gym_bridge.train import loop, setup

    if shopper:
        monkeypatch.setattr(setup, "_generation_backend", lambda cfg, stack, learner: Shopper(learner.tokenizer))
    result = loop.train(cfg, show_progress=False)
    assert result.steps == cfg.grpo.max_num_steps  # the run finished
    return [r for r in read_metrics(Path(cfg.logger.log_dir)) if r["split"] == "train"]


def within_deadline(steps: list[dict[str, Any]], deadline_s: float) -> bool:
    """Each straggling step took about its deadline, not the env's 60 s request timeout: at most the
    deadline plus three of the slowest clean steps (step 1 warms up: left out) and a second of slack. The
    issue's "within 2x the step rate" is a figure, measured in scripts/straggler_steps.py, not asserted
    here: a test on a loaded machine cannot time a ratio that close to its bound."""
    clean = [r["time_step_s"] for r in steps[1:CLEAN_STEPS]]
    straggling = [r["time_step_s"] for r in steps[CLEAN_STEPS:]]
    return max(straggling) <= deadline_s + 3 * max(clean) + 1.0


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_straggler"), seed=4)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("policy", ["drop_group", "zero_reward"])
def test_a_tool_that_never_answers_costs_sync_steps_their_deadline_and_is_counted(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    # Tool calls 55, 62, 69, ... never answer: two rollouts in each of steps 4-6 (16 calls a step).
    config = StragglerConfig(hang_every=7, hang_after=CLEAN_STEPS * ROLLOUTS, hang_in="tool", delay_s=0.3)
    with straggler_server(config) as url:
        cfg = shop_run(tmp_path, tiny_model_dir, f"env.shop.url={url}", "grpo.rollout_timeout_s=1.5",
                       f"grpo.on_rollout_timeout={policy}")  # fmt: skip
        steps = train_steps(cfg, monkeypatch)
        left_hanging = hung(url)

    timed_out = [r["rollouts_timed_out"] for r in steps]
    assert timed_out == [0, 0, 0, 2, 2, 2] and sum(timed_out) == left_hanging == 6
    assert within_deadline(steps, 1.5), [r["time_step_s"] for r in steps]
    for r in steps:
        # Never sent again: the deadline, not a 60 s request timeout, ended each hung call.
        assert r["request_retries"] == 0 and r["request_timeouts"] == 0
        assert r["rollout_deadline_s"] == 1.5
    for r in steps[CLEAN_STEPS:]:
        line = format_line(r["step"], r)
        assert "timed_out 2/16" in line
        if policy == "drop_group":  # the two hung rollouts' groups (one or two) leave the batch
            groups = r["groups_dropped_for_timeout"]
            assert groups in (1, 2) and f"groups_dropped {groups:.0f}" in line
            assert r["num_samples"] == ROLLOUTS - 4 * groups
            assert r["rollouts_dropped_with_group"] == 4 * groups - 2
            assert r["rollout_failures"] == 2 and "failed 2/16" in line
            assert r["reward_mean"] == 1.0  # only whole, answered groups are left
        else:  # kept, scored 0, trained on the tool call they made before the deadline
            assert r["num_samples"] == ROLLOUTS and r["rollouts_scored_zero_for_timeout"] == 2
            assert r["rollout_failures"] == 0 and "failed 0/16" in line
            assert r["reward_mean"] == pytest.approx(14 / 16)
            assert not r.get("no_learning_signal") and r["gen_length_mean"] > 0


@pytest.mark.timeout(150)
def test_async_grpo_with_a_verify_that_never_answers_keeps_its_rate(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's setting: async GRPO, rollouts in the child process, the env given by URL, /verify hangs."""
    config = StragglerConfig(hang_every=7, hang_after=CLEAN_STEPS * ROLLOUTS, hang_in="verify", delay_s=0.6)
    rows = write_say_prompts(tmp_path / "say.jsonl", 16)
    with straggler_server(config) as url:
        cfg = load_config(
            None,
            [*SMALL_ONLINE_RUN, f"data.train.data_path={rows}", "data.train.env_name=say", f"env.say.url={url}",
             f"policy.model_name={tiny_model_dir}", "policy.train_micro_batch_size=16", f"grpo.max_num_steps={STEPS}",
             "grpo.val_period=0", "checkpointing.enabled=false", "grpo.async_grpo.enabled=true",
             "loss_fn.use_importance_sampling_correction=true", "grpo.rollout_timeout_s=1.2",
             f"logger.log_dir={tmp_path / 'logs'}", "logger.tensorboard_enabled=false"],
        )  # fmt: skip
        steps = train_steps(cfg, monkeypatch, shopper=False)
        left_hanging = hung(url)

    timed_out = [r["rollouts_timed_out"] for r in steps]
    assert timed_out == [0, 0, 0, 2, 2, 2] and sum(timed_out) == left_hanging == 6
    assert within_deadline(steps, 1.2), [r["time_step_s"] for r in steps]
    assert all(r["request_retries"] == 0 for r in steps)
    assert [r["trajectory_age_steps"] for r in steps] == [0] + [1] * (STEPS - 1)  # it did overlap training
    for r in steps[CLEAN_STEPS:]:
        assert r["rollout_failures"] == 2 and r["num_samples"] == ROLLOUTS - 4 * r["groups_dropped_for_timeout"]
        assert "timed_out 2/16" in format_line(r["step"], r)


@pytest.mark.timeout(150)
def test_the_automatic_deadline_follows_the_runs_own_pace_and_a_timed_out_retry_is_counted(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``rollout_timeout_s``: step 1 has no rollout deadline, so its hung call (the 13th /verify) waits
    out ``env.shop.timeout_s`` and is sent again, counted; later steps get factor x the previous batch's
    slowest rollout (at least the floor) and cut theirs off. The hang is in /verify, which reads the session
    and may be sent twice: a timed-out tool call is not sent again (it may have changed the env's state;
    tests/collect/test_agent_tool_retries.py)."""
    config = StragglerConfig(hang_every=13, hang_in="verify", delay_s=0.3)
    with straggler_server(config) as url:
        cfg = shop_run(tmp_path, tiny_model_dir, f"env.shop.url={url}", "env.shop.timeout_s=2",
                       "grpo.max_num_steps=3", "grpo.rollout_timeout_factor=1.5", "grpo.rollout_timeout_min_s=1.0")  # fmt: skip
        steps = train_steps(cfg, monkeypatch)

    first, *later = steps
    assert "rollout_deadline_s" not in first and first["rollouts_timed_out"] == 0
    assert first["request_timeouts"] == 1 and first["request_retries"] == 1  # sent again after 2 s, counted
    assert first["time_step_s"] > 2.0 and "retries 1" in format_line(1, first)
    assert first["rollout_slowest_s"] < 2.0  # the retried rollout does not set the pace
    for previous, r in zip(steps, later, strict=False):
        assert r["rollout_deadline_s"] == pytest.approx(max(1.0, 1.5 * previous["rollout_slowest_s"]))
        assert r["rollouts_timed_out"] == 1 and r["request_retries"] == 0
        assert r["time_step_s"] < r["rollout_deadline_s"] + 1.0


def test_the_agent_loop_cuts_a_rollout_off_at_its_deadline_keeping_what_it_generated() -> None:
    """``run_rollout`` (collect's and training's agent loop) with ``rollout_timeout_s``: a tool call that
    never answers ends the rollout at the deadline, not after the env request's 60 s x 3 attempts; the
    model's turn is kept, the session's replica is released and not taken for lost."""
    import asyncio
    import time

    from gym_bridge.rollout.agent import AgentConfig, make_session, run_rollout
    from gym_bridge.rollout.env_router import ReplicaEndpoints, SessionRouter
    from gym_bridge.serving.uvicorn_thread import start_in_thread
    from tests.fake_model import FakeModel, function_call
    from tests.train.straggler_env import StragglerEnv

    env = StragglerEnv(config=StragglerConfig(hang_every=1, hang_in="tool"))  # every tool call hangs
    running = start_in_thread(env.build_app())
    call = function_call("add_to_cart", {"product_id": "P1", "quantity": 2})
    row = {"responses_create_params": {"input": [{"role": "user", "content": "Add 2 of P1."}]}}
    try:
        with FakeModel(default=[call]) as model:
            router = SessionRouter("shop", ReplicaEndpoints([running.url], ["replica 0"]))
            config = AgentConfig(model_url=model.url, rollout_timeout_s=0.5)

            async def one() -> Any:
                async with make_session() as client:
                    return await run_rollout(client, row, router, config)

            started = time.perf_counter()
            rollout = asyncio.run(one())
            elapsed = time.perf_counter() - started
    finally:
        running.stop()
    assert rollout.record is None and 0.5 <= elapsed < 2.0
    failure = rollout.failure
    assert (failure.failure_class, failure.stage) == ("rollout_timeout", "tool")
    assert "0.5 s deadline in tool waiting for POST http://127.0.0.1:" in failure.message
    assert failure.message.endswith("/add_to_cart")
    assert rollout.partial_output is not None and rollout.partial_output[0]["call_id"] == call["call_id"]
    assert rollout.metrics.retries == 0 and rollout.metrics.model_calls == 1 and env.hung == 1
    assert router.replicas[0].open == 0 and router.alive == 1  # the session ended; the replica is not lost


@pytest.mark.timeout(60)
def test_a_batch_whose_rollouts_all_time_out_stops_the_run_naming_the_deadline(tmp_path: Path) -> None:
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.serving.uvicorn_thread import start_in_thread
    from gym_bridge.train.samplers.data import load_prompts
    from gym_bridge.train.samplers.rollout_failures import TooManyFailedRollouts
    from gym_bridge.train.samplers.sampling import OnlineSampler
    from tests.train.straggler_env import StragglerEnv

    running = start_in_thread(StragglerEnv(config=StragglerConfig(hang_every=1, hang_in="tool")).build_app())
    cfg = shop_run(tmp_path, Path("tiny"), f"env.shop.url={running.url}", "grpo.rollout_timeout_s=0.3")
    tokenizer = build_tokenizer()
    prompts = load_prompts(cfg.data, "train")[0][:4]
    sampler = OnlineSampler(cfg, Shopper(tokenizer), tokenizer)
    try:
        with pytest.raises(TooManyFailedRollouts) as caught:
            sampler.sample(prompts, [[1, 2, 3, 4]] * 4)
    finally:
        sampler.close()
        running.stop()
    err = caught.value
    assert err.failed == err.requested == 16 and err.kinds == {"tool/rollout_timeout": 16}
    assert "cut off at its 0.3 s deadline in tool" in str(err) and "(grpo.rollout_timeout_s: set)" in str(err)


def test_a_step_of_several_generation_batches_logs_the_deadline_not_a_sum_of_deadlines() -> None:
    """Dynamic sampling draws batches until enough groups differ: counts add up, levels do not."""
    from gym_bridge.train.samplers.sampling import sample_step
    from tests.train.test_config_audit import CountingBatches, UninformativeSampler

    class TimedSampler(UninformativeSampler):
        def sample(self, prompts: Any, seeds: Any, group_offset: int = 0) -> Any:
            samples, _ = super().sample(prompts, seeds, group_offset)
            return samples, {"rollouts_timed_out": 1, "rollout_deadline_s": 2.0, "rollout_slowest_s": 0.2}

    cfg = load_config(None, ["data.train.data_path=a.jsonl", "grpo.mode=offline", "grpo.num_prompts_per_step=2",
                             "grpo.num_generations_per_prompt=2", "grpo.use_dynamic_sampling=true",
                             "grpo.dynamic_sampling_max_gen_batches=3", "policy.train_global_batch_size=4"])  # fmt: skip
    _, stats = sample_step(cfg, TimedSampler(), CountingBatches(), 1)  # type: ignore[arg-type]
    assert stats["generation_batches"] == 3 and stats["rollouts_timed_out"] == 3
    assert stats["rollout_deadline_s"] == 2.0 and stats["rollout_slowest_s"] == 0.2


def test_a_rollout_deadline_key_is_checked() -> None:
    from gym_bridge.train.config import ConfigError

    base = ["data.train.data_path=a.jsonl"]
    with pytest.raises(ConfigError, match="grpo.on_rollout_timeout"):
        load_config(None, [*base, "grpo.on_rollout_timeout=retry"])
    with pytest.raises(ConfigError, match="grpo.rollout_timeout_s"):
        load_config(None, [*base, "grpo.rollout_timeout_s=0"])
    with pytest.raises(ConfigError, match="grpo.rollout_timeout_factor"):
        load_config(None, [*base, "grpo.rollout_timeout_factor=0.5"])

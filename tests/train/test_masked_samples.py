"""Samples the environment masks (``mask_sample: true``) count toward ``grpo.max_failed_rollouts_fraction``.

A judge that is down makes the judge servers answer ``/verify`` with ``failure_kind: judge_error`` and
``mask_sample: true`` (the verdict is unknown, so the sample stays out of the loss). Before, a run whose
judge failed every call had no sample in the loss at any step, skipped every update and ended with exit 0
having learned nothing. Now such a batch stops the run naming ``verify/judge_error (masked)``; a few masked
samples below the threshold still just drop out of the loss, counted in ``rollouts_masked``.
"""

from __future__ import annotations

import json
import pickle
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.answers import Answer
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.train import loop
from gym_bridge.train.bookkeeping.logging import format_line, read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.samplers.rollout_failures import FailureTally, TooManyFailedRollouts
from tests.reliability.procs import kill9, start, wait_for_line
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def judge_server_with_judge_down() -> Iterator[str]:
    """``gym-bridge serve equivalence_judge`` in its own process, its judge URL a port nothing listens on."""
    judge = f"http://127.0.0.1:{_closed_port()}/v1"
    proc = start([sys.executable, "-m", "gym_bridge.cli", "serve", "equivalence_judge", "--port", "0",
                  "--judge-url", judge])  # fmt: skip
    try:
        line = wait_for_line(proc, "listening on", timeout=60)
        yield next(word for word in line.split() if word.startswith("http://"))
    finally:
        kill9(proc)


def _questions(path: Path, n: int) -> Path:
    rows = (
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"Capital {i}?"}]},
            "question": f"Capital {i}?",
            "expected_answer": "Paris",
        }
        for i in range(n)
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(tmp_path: Path, model_dir: Path, data: Path, env: list[str]) -> list[str]:
    return [
        *SMALL_ONLINE_RUN,
        "grpo.num_prompts_per_step=2",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8",
        "policy.generation_batch_size=8",
        "grpo.max_num_steps=2",
        "grpo.val_period=0",
        f"policy.model_name={model_dir}",
        f"data.train.data_path={data}",
        "data.train.env_name=judge",
        *env,
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "checkpointing.save_period=1",
        f"logger.log_dir={tmp_path / 'logs'}",
        "logger.tensorboard_enabled=false",
    ]


ASYNC = ["grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1",
         "loss_fn.use_importance_sampling_correction=true"]  # fmt: skip
"""Async GRPO: the rollouts run in a child process, which sends the error to the trainer."""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [[], ASYNC], ids=["sync", "async_rollout_process"])
def test_a_judge_down_for_every_call_stops_the_run_naming_the_masked_samples(tmp_path: Path, mode: list[str]) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    data = _questions(tmp_path / "questions.jsonl", 8)
    with judge_server_with_judge_down() as url:
        env = [f"env.judge.url={url}", "env.judge.timeout_s=30", *mode]
        cfg = load_config(None, _run(tmp_path, model_dir, data, env))
        with pytest.raises(TooManyFailedRollouts) as caught:
            loop.train(cfg, show_progress=False)
    err = caught.value
    assert err.step == 1 and err.failed == err.requested == 8
    assert err.kinds == {"verify/judge_error (masked)": 8}
    message = str(err)
    assert message.startswith("step 1: 8 of 8 rollouts failed or were masked")
    assert "8 x verify/judge_error (masked)" in message and "e.g. verify/judge_error (masked): " in message
    # nothing was trained on, logged or checkpointed as if the step had happened
    assert not (tmp_path / "ckpt" / "step_1").exists()
    assert [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"] == []


@pytest.mark.timeout(180)
def test_a_validation_whose_every_sample_is_masked_stops_the_run_instead_of_reporting_accuracy_0(
    tmp_path: Path,
) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    data = _questions(tmp_path / "questions.jsonl", 8)
    env = [
        "env.judge.server=equivalence_judge",  # built in, served in-process; its judge is unreachable
        f"env.judge.config.judge_url=http://127.0.0.1:{_closed_port()}/v1",
        f"data.validation.data_path={data}",
        "data.validation.env_name=judge",
        "grpo.val_at_start=true",
    ]
    with pytest.raises(TooManyFailedRollouts) as caught:  # before: val accuracy 0.000, then two idle steps
        loop.train(load_config(None, _run(tmp_path, model_dir, data, env)), show_progress=False)
    assert caught.value.kinds == {"verify/judge_error (masked)": 8}
    assert caught.value.step is None  # the validation before step 1, not a training batch
    assert [r for r in read_metrics(tmp_path / "logs") if r["split"] == "val"] == []


class EveryFourthMasked(ResourcesServer):
    """Parity rewards (even-length answers score 1), but every fourth ``/verify`` call answers as a judge
    that failed: reward 0, ``failure_kind: judge_error``, ``mask_sample: true``."""

    name = "every_fourth_masked"
    calls = 0

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        masked = EveryFourthMasked.calls % 4 == 0
        EveryFourthMasked.calls += 1
        if masked:
            return VerifyResponse(**dump(body), reward=0.0, failure_kind="judge_error",
                                  failure_reason="judge unreachable", mask_sample=True)  # fmt: skip
        return VerifyResponse(**dump(body), reward=float(len(assistant_text(body.response.output)) % 2 == 0))


@pytest.mark.timeout(180)
def test_a_few_masked_samples_below_the_threshold_drop_out_of_the_loss_and_are_counted(tmp_path: Path) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    data = write_say_prompts(tmp_path / "say.jsonl", 8)
    EveryFourthMasked.calls = 0
    env = [f"env.judge.server={__name__}:EveryFourthMasked", "logger.num_rollout_groups_to_log=2"]
    result = loop.train(load_config(None, _run(tmp_path, model_dir, data, env)), show_progress=False)
    assert result.steps == 2
    steps = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    for record in steps:  # 2 of 8 per step: counted, kept in the batch, out of the loss
        assert record["rollouts_masked"] == 2 and record["rollout_failures"] == 0 and record["num_samples"] == 8
        assert "masked 2/8" in format_line(record["step"], record)
        logged = [json.loads(line) for line in (tmp_path / "logs" / "rollouts" / f"step_{record['step']:06d}.jsonl")
                  .read_text().splitlines()]  # fmt: skip
        assert sum(bool(r.get("mask_sample")) for r in logged) == 2
    assert any(r["optimizer_steps"] > 0 for r in steps)  # the samples left still train


class RowMaskServer(ResourcesServer):
    """Parity rewards, with the task row's ``give_mask`` sent back as ``mask_sample``, whatever it is."""

    name = "row_mask"

    async def _verify_content(self, body: dict[str, Any], session: Session) -> Any:
        answer = {**body, "reward": float(len(assistant_text(body["response"]["output"])) % 2 == 0),
                  "mask_sample": body["give_mask"]}  # fmt: skip
        return Answer(200, json.dumps(answer).encode(), (), answer)


@pytest.mark.timeout(180)
def test_a_mask_sample_that_is_not_a_boolean_is_a_bad_verify_answer_not_a_mask(tmp_path: Path) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"Say {i}."}]}, "give_mask": "false"}
            for i in range(8)]  # fmt: skip
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, _run(tmp_path, model_dir, data, [f"env.judge.server={__name__}:RowMaskServer"]))
    with pytest.raises(TooManyFailedRollouts) as caught:  # before: bool("false") masked every sample
        loop.train(cfg, show_progress=False)
    assert caught.value.kinds == {"verify/bad_reward": 8}
    assert 'mask_sample is "false", not a boolean' in str(caught.value)


def test_tally_counts_masked_samples_toward_the_threshold_and_survives_pickling() -> None:
    tally = FailureTally()
    for _ in range(2):
        tally.add("verify/http_5xx", "HTTP 500 (3 attempts)")
    for _ in range(2):
        tally.add_masked({"failure_kind": "judge_timeout", "failure_reason": "judge timed out after 60 s"})
    tally.check(8, 0.5, any_kept=True)  # 2 failed + 2 masked of 8 is not more than half
    assert tally.count == 2 and tally.masked_count == 2  # rollout_failures stays the dropped ones
    tally.add_masked({"mask_sample": True})  # no failure_kind: named by the flag
    with pytest.raises(TooManyFailedRollouts) as caught:
        tally.check(8, 0.5, any_kept=True)
    assert caught.value.kinds == {"verify/http_5xx": 2, "verify/judge_timeout (masked)": 2,
                                  "verify/mask_sample (masked)": 1}  # fmt: skip
    assert "5 of 8 rollouts failed or were masked" in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value.at_step(3)))
    assert str(again).startswith("step 3: 5 of 8 rollouts failed or were masked")

    only_masked = FailureTally()
    only_masked.add_masked({"failure_kind": "judge_error", "failure_reason": "connection refused"})
    with pytest.raises(TooManyFailedRollouts, match=r"e.g. verify/judge_error \(masked\): connection refused"):
        only_masked.check(4, 1.0, any_kept=False)  # every sample masked: nothing for the loss, always stops
    plain = FailureTally()
    plain.add("verify/http_5xx", "HTTP 500")
    with pytest.raises(TooManyFailedRollouts) as caught:
        plain.check(1, 0.5, any_kept=False)
    assert "or were masked" not in str(caught.value)  # a batch with no masked sample reads as before


def test_step_line_shows_masked_samples_only_when_there_are_some() -> None:
    line = format_line(2, {"reward_mean": 0.5, "rollout_failures": 0.0, "rollouts_requested": 16.0, "rollouts_masked": 3.0})
    assert "failed 0/16" in line and "masked 3/16" in line
    assert "masked" not in format_line(2, {"reward_mean": 0.5, "rollout_failures": 0.0, "rollouts_requested": 16.0,
                                           "rollouts_masked": 0.0})  # fmt: skip

"""A resources server killed mid-run stops training with the failures named; the last checkpoint resumes.

The math server runs as ``gym-bridge serve math`` in its own process (``env.math.url`` points at it) and
is SIGKILLed by PID right after step 1's checkpoint is written, so step 2's rollouts all fail.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gym_bridge.train import loop
from gym_bridge.train.bookkeeping.logging import format_line, read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.samplers.rollout_failures import FailureTally, TooManyFailedRollouts
from tests.reliability.procs import kill9, start, wait_for_line
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def math_server() -> Iterator[tuple[str, object]]:
    """``gym-bridge serve math`` on a free loopback port: (its URL, its process)."""
    proc = start([sys.executable, "-m", "gym_bridge.cli", "serve", "math", "--port", "0"])
    try:
        line = wait_for_line(proc, "listening on", timeout=60)
        url = next(word for word in line.split() if word.startswith("http://"))
        yield url, proc
    finally:
        kill9(proc)


def _config(tmp_path: Path, model_dir: Path, url: str):  # noqa: ANN202
    return load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.num_prompts_per_step=2",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=8",
            "policy.generation_batch_size=8",
            "grpo.max_num_steps=3",
            "grpo.val_period=0",
            f"policy.model_name={model_dir}",
            f"data.train.data_path={ROOT / 'recipes/data/arith_train.jsonl'}",
            "data.train.env_name=math",
            f"env.math.url={url}",
            "env.math.timeout_s=5",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "checkpointing.save_period=1",
            f"logger.log_dir={tmp_path / 'logs'}",
            "logger.tensorboard_enabled=false",
        ],
    )


@pytest.mark.timeout(300)
def test_killed_env_server_stops_the_run_naming_failures_and_the_rerun_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    original_save = loop.save_checkpoint
    with math_server() as (url, proc):

        def save_then_kill(cfg, checkpoints, learner, step, *args):  # noqa: ANN001, ANN202
            original_save(cfg, checkpoints, learner, step, *args)
            if step == 1:
                kill9(proc)  # by PID (its process group), after step 1 is safely on disk

        monkeypatch.setattr(loop, "save_checkpoint", save_then_kill)
        with pytest.raises(TooManyFailedRollouts) as caught:
            loop.train(_config(tmp_path, model_dir, url), show_progress=False)
        monkeypatch.undo()

    err = caught.value
    assert err.step == 2 and err.failed == err.requested == 8
    assert sum(err.kinds.values()) == 8 and all(k.startswith("seed_session/") for k in err.kinds), err.kinds
    message = str(err)
    assert message.startswith("step 2: 8 of 8 rollouts failed")
    assert "grpo.max_failed_rollouts_fraction" in message and "8 x seed_session/" in message
    assert "e.g. seed_session/" in message and "attempts)" in message

    # Step 1 trained and was checkpointed whole; nothing of step 2 was logged or saved.
    assert (tmp_path / "ckpt" / "step_1" / "training_info.json").is_file()
    assert not (tmp_path / "ckpt" / "step_2").exists()
    train_records = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert [r["step"] for r in train_records] == [1]
    assert train_records[0]["rollout_failures"] == 0 and train_records[0]["rollouts_requested"] == 8

    # A rerun against a working server resumes from step 1 and finishes.
    with math_server() as (url, _):
        result = loop.train(_config(tmp_path, model_dir, url), show_progress=False)
    assert result.resumed_from == 1 and result.steps == 3
    steps = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["rollout_failures"] == 0 for r in steps)


def test_tally_threshold_counts_and_the_error_survives_pickling() -> None:
    tally = FailureTally()
    for _ in range(4):
        tally.add("verify/http_5xx", "HTTP 500 (3 attempts)")
    tally.check(8, 0.5, any_kept=True)  # 4 of 8 is not more than half
    tally.add("seed_session/connection", "refused (3 attempts)")
    with pytest.raises(TooManyFailedRollouts, match=r"5 of 8 rollouts failed .*4 x verify/http_5xx, "
                       r"1 x seed_session/connection; e.g. verify/http_5xx: HTTP 500"):
        tally.check(8, 0.5, any_kept=True)
    FailureTally().check(8, 0.0, any_kept=True)  # no failure passes even a zero threshold
    with pytest.raises(TooManyFailedRollouts, match="8 of 8 rollouts failed .*8 x no_sample"):
        FailureTally().check(8, 1.0, any_kept=False)  # nothing to train on always stops
    err = TooManyFailedRollouts(3, 4, {"model/timeout": 3}, "model/timeout: read timed out", 0.5).at_step(7)
    again = pickle.loads(pickle.dumps(err))  # the rollout process sends it to the trainer
    assert str(again) == str(err) and again.step == 7 and again.kinds == {"model/timeout": 3}


def test_step_line_shows_failed_rollouts() -> None:
    line = format_line(4, {"reward_mean": 0.5, "rollout_failures": 2.0, "rollouts_requested": 16.0})
    assert "failed 2/16" in line
    assert "failed" not in format_line(4, {"reward_mean": 0.5})  # offline steps have no rollouts

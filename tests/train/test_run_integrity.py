"""Runs that did not do their job say so, and never lose or overwrite work (red-team round on ``train``).

Each test was written against a failure seen for real on the code before it:

* a learning rate far too high made the loss NaN; the run saved NaN weights in every later checkpoint
  and exited 0;
* one NaN reward in an offline dataset did the same; one reward of 1e39 (``inf`` in float32) too;
* a ``/verify`` answer whose reward was null trained as reward 0 without a word, a string reward crashed
  the run with a traceback, a NaN one made every weight NaN;
* a run in which no step had a learning signal said only ``done: N steps``;
* two runs on one checkpoint directory: the second one's start-up deleted the checkpoint the first was
  writing (and could load one the first was pruning);
* a resumed run with a new ``policy.optimizer.kwargs.lr`` kept the checkpoint's learning rate silently.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.bookkeeping.run_lock import RunDirectoryBusy, lock_path
from gym_bridge.train.config import ConfigError, load_config
from gym_bridge.train.learner.divergence import TrainingDiverged
from gym_bridge.train.loop import train
from gym_bridge.train.samplers.data import DataError
from tests.train.helpers import ROW_REWARD_SERVER, SMALL_ONLINE_RUN, save_random_tiny
from tests.train.test_checkpoint import saving_child
from tests.train.test_trainer_offline import offline_config, write_scored

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_integrity"), seed=0)


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scored(tmp_path_factory.mktemp("scored") / "scored.jsonl")


def with_reward(source: Path, out: Path, row: int, reward: Any) -> Path:
    """``source`` with row ``row``'s reward replaced (NaN and Infinity written as Python's json writes them)."""
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    rows[row]["reward"] = reward
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def finite_weights(step_dir: Path) -> bool:
    tensors = load_file(step_dir / "policy" / "weights" / "model.safetensors")
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


def offline_command(tmp_path: Path, model_dir: Path, data: Path, *extra: str) -> list[str]:
    """``gym-bridge train`` arguments of :func:`offline_config`'s run, as the command line gives them, then ``extra``."""
    config = tmp_path / "offline.yaml"
    config.write_text("grpo:\n  mode: offline\n")
    return [
        "train", "--config", str(config), "-q", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=4", "grpo.max_num_epochs=10", "grpo.val_period=0", "grpo.seed=3",
        "loss_fn.reference_policy_kl_penalty=0.01", f"policy.model_name={model_dir}",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8",
        "policy.max_total_sequence_length=64", "policy.generation.max_new_tokens=16", "policy.optimizer.kwargs.lr=1e-3",
        f"data.train.data_path={data}", f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "checkpointing.save_period=2", f"logger.log_dir={tmp_path / 'logs'}", *extra,
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ divergence


@pytest.mark.timeout(300)
def test_a_diverging_run_exits_2_naming_the_step_and_never_saves_nan_weights(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    extra = ["policy.optimizer.kwargs.lr=1e10", "policy.max_grad_norm=null", "checkpointing.save_period=1"]
    command = offline_command(tmp_path, model_dir, scored, *extra)
    done = CliRunner().invoke(app, command)  # the command as typed, in this process
    assert done.exit_code == 2, done.output[-3000:]
    message = " ".join(done.stderr.split())
    assert "error: step 2: training diverged (loss nan, grad_norm nan, lr 1e+10)" in message, message
    assert f"the last complete checkpoint is {tmp_path / 'ckpt' / 'step_1'}" in message
    assert "policy.optimizer.kwargs.lr" in message
    steps = sorted(p.name for p in (tmp_path / "ckpt").glob("step_*"))
    assert steps == ["step_1"] and finite_weights(tmp_path / "ckpt" / "step_1")  # nothing NaN on disk
    logged = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert [r["step"] for r in logged] == [1, 2] and math.isnan(
        logged[-1]["loss"]
    )  # the bad step is on record


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "reward", [1e39, 1e20, -1e20], ids=["inf_in_float32", "square_overflows", "negative"]
)
def test_rewards_too_large_for_float32_stop_the_step_before_any_update(
    tmp_path: Path, model_dir: Path, scored: Path, reward: float
) -> None:
    """1e39 is inf in float32 (NaN weights, exit 0); 1e20's square overflowed the group std, which then
    counted as 0, so the group trained on an unnormalised advantage of 1e20."""
    data = with_reward(scored, tmp_path / "huge.jsonl", 5, reward)
    low, high = (re.escape(f"{reward:g}"), "1") if reward < 0 else ("0", re.escape(f"{reward:g}"))
    with pytest.raises(
        TrainingDiverged,
        match=rf"step 1: the rewards \(from {low} to {high}\) are too large for the advantages' float32",
    ):
        train(offline_config(tmp_path, model_dir, data, "checkpointing.save_period=1"), show_progress=False)
    assert not list((tmp_path / "ckpt").glob("step_*"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "reward", [math.nan, math.inf, -math.inf, 10**400], ids=["nan", "inf", "-inf", "integer-past-float"]
)
def test_a_non_finite_reward_in_offline_data_is_refused_naming_the_row(
    tmp_path: Path, model_dir: Path, scored: Path, reward: float
) -> None:
    """A JSON integer too large for a float (1 and 400 zeros) ended the run in an OverflowError traceback."""
    data = with_reward(scored, tmp_path / "bad.jsonl", 5, reward)
    with pytest.raises(
        DataError, match=rf"bad.jsonl:6: 'reward' is {str(reward)[:40]}: a reward must be a finite number"
    ):
        train(offline_config(tmp_path, model_dir, data), show_progress=False)


# ------------------------------------------------------------------------------ rewards from /verify


BAD_REWARDS = [None, "NaN", "1", True, "abc", [1]]
"""What broken environments answered as a reward: null, NaN (the bare JSON token), a string, a boolean, text, a list."""


def row_reward_rows(path: Path, rewards: list[Any], good: int) -> Path:
    """One prompt per entry of ``rewards`` (the environment answers it as the reward), then ``good`` prompts
    the environment scores honestly."""
    rows = [
        {"responses_create_params": {"input": [{"role": "user", "content": f"Say {i}."}]}}
        for i in range(len(rewards) + good)
    ]
    for row, reward in zip(rows, rewards, strict=False):
        row["give_reward"] = reward
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def online_args(tmp_path: Path, rows: Path) -> list[str]:
    """Two synchronous steps of 4 prompts x 4 completions against :class:`RowRewardServer`."""
    return [
        *SMALL_ONLINE_RUN, "grpo.max_num_steps=2", "grpo.val_period=0", "grpo.async_grpo.enabled=false",
        "policy.train_micro_batch_size=16", f"data.train.data_path={rows}", "data.train.env_name=bad",
        f"env.bad.server={ROW_REWARD_SERVER}", f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "checkpointing.save_period=1", f"logger.log_dir={tmp_path / 'logs'}",
    ]  # fmt: skip


@pytest.mark.timeout(200)
def test_a_verify_reward_that_is_not_a_finite_number_is_a_counted_failed_rollout(
    tmp_path: Path, model_dir: Path
) -> None:
    """Each step: 6 prompts whose rewards are broken, 2 whose rewards are outside [0, 1] (valid: NeMo Gym
    rewards are not bounded), 2 scored honestly, 2 completions each."""
    rows = row_reward_rows(tmp_path / "rows.jsonl", [*BAD_REWARDS, -1.5, 3], good=2)
    overrides = [
        *online_args(tmp_path, rows),
        "grpo.num_prompts_per_step=10",
        "policy.train_global_batch_size=20",
        "policy.generation_batch_size=20",
        "policy.train_micro_batch_size=20",
        "grpo.num_generations_per_prompt=2",
        "grpo.max_failed_rollouts_fraction=0.9",
    ]
    result = train(load_config(None, [f"policy.model_name={model_dir}", *overrides]), show_progress=False)
    assert result.steps == 2
    logged = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    for (
        record
    ) in logged:  # every broken reward is dropped and counted, never scored (null used to train as 0)
        assert record["rollout_failures"] == 12 and record["num_samples"] == 8, record  # -1.5 and 3 train
        assert math.isfinite(record["reward_mean"])
    assert finite_weights(tmp_path / "ckpt" / "step_2")


# ---------------------------------------------------------------------------------- no learning signal


@pytest.mark.timeout(300)
def test_a_run_without_any_learning_signal_warns_that_the_weights_are_unchanged(
    tmp_path: Path, model_dir: Path
) -> None:
    """Every rollout of every prompt scores 0.5: no group has an advantage, no step updates the policy."""
    rows = row_reward_rows(tmp_path / "rows.jsonl", [0.5] * 4, good=0)
    config = tmp_path / "online.yaml"
    config.write_text("grpo:\n  mode: online\n")
    overrides = [
        f"policy.model_name={model_dir}",
        *online_args(tmp_path, rows),
        "checkpointing.enabled=false",
    ]
    done = CliRunner().invoke(app, ["train", "--config", str(config), "-q", *overrides])
    assert done.exit_code == 0, done.output[-3000:]
    message = " ".join(done.stderr.split())
    assert (
        "warning: none of this run's 2 steps updated the policy" in message
        and "weights are unchanged" in message
    )
    assert all(
        r.get("no_learning_signal") == 1.0 for r in read_metrics(tmp_path / "logs") if r["split"] == "train"
    )


# ---------------------------------------------------------------------------- one run per directory


@pytest.mark.timeout(300)
def test_a_second_run_on_a_busy_directory_is_refused_and_a_killed_run_leaves_no_stale_lock(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    run = tmp_path / "run"
    with saving_child(run, model_dir, scored, tmp_path / "marker") as child:
        writing = sorted(p.name for p in (run / "ckpt").iterdir() if p.name.startswith(".tmp-step_3"))
        assert len(writing) == 1
        with pytest.raises(
            RunDirectoryBusy,
            match=rf"checkpointing.checkpoint_dir is {run / 'ckpt'}, which another "
            rf"gym-bridge train \(pid {child.pid}\) is still using",
        ):
            train(offline_config(run, model_dir, scored, "checkpointing.save_period=1"), show_progress=False)
        # the first run's checkpoint being written is untouched (it used to be removed as a leftover)
        assert sorted(p.name for p in (run / "ckpt").iterdir() if p.name.startswith(".tmp-step_3")) == writing
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert lock_path(run / "ckpt").exists()  # SIGKILL ran no clean-up; the kernel dropped the lock itself
    result = train(offline_config(run, model_dir, scored, "checkpointing.save_period=1"), show_progress=False)
    assert result.resumed_from == 2 and result.steps == 4
    assert not lock_path(run / "ckpt").exists() and not lock_path(run / "logs").exists()


# ------------------------------------------------------------------------------------ resumed config


@pytest.mark.timeout(200)
def test_resuming_with_a_key_the_checkpoint_overrides_is_refused_naming_it(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    first = train(offline_config(tmp_path, model_dir, scored, "grpo.max_num_steps=2"), show_progress=False)
    assert first.steps == 2
    other = save_random_tiny(tmp_path / "other", seed=5)
    with pytest.raises(ConfigError) as caught:
        train(
            offline_config(
                tmp_path, model_dir, scored, "policy.optimizer.kwargs.lr=0.5", f"policy.model_name={other}"
            ),
            show_progress=False,
        )
    message = str(caught.value)
    assert (
        f"policy.optimizer.kwargs.lr is 0.5 but {tmp_path / 'ckpt' / 'step_2'} was trained with 0.001"
        in message
    )
    assert f"policy.model_name is '{other}'" in message and "--fresh" in message
    # keys a resumed run does apply may change: the run length, clipping, the optimizer's implementation
    result = train(
        offline_config(
            tmp_path, model_dir, scored, "policy.max_grad_norm=0.5", "policy.optimizer.kwargs.foreach=false"
        ),
        show_progress=False,
    )
    assert result.resumed_from == 2 and result.steps == 4


# ------------------------------------------------------------------------- keys that would do nothing


@pytest.mark.timeout(120)
def test_a_misspelt_checkpoint_metric_is_said_once(
    tmp_path: Path, model_dir: Path, scored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = [
        "checkpointing.save_period=1",
        "checkpointing.keep_top_k=1",
        "checkpointing.metric_name=train:reward_man",
    ]
    train(offline_config(tmp_path, model_dir, scored, *extra), show_progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "checkpointing.metric_name" in line]
    assert len(said) == 1, said
    assert "'train:reward_man' is not a metric of this run (did you mean 'train:reward_mean'?)" in said[0]
    assert "keep_top_k=1 keeps the newest, not the best" in said[0]
    train(
        offline_config(
            tmp_path / "right", model_dir, scored, *extra[:2], "checkpointing.metric_name=train:reward_mean"
        ),
        show_progress=False,
    )
    assert "checkpointing.metric_name" not in capsys.readouterr().err


def long_prompts(path: Path, n: int = 3) -> Path:
    """``n`` prompts of some 200 words: longer than the small runs' 64-token sequences."""
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": "Say " + "word " * 200}]}}] * n
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_split_whose_prompts_are_all_too_long_is_refused_naming_it(
    tmp_path: Path, model_dir: Path, split: str
) -> None:
    """Training used to end in a traceback ("a loader needs at least one item"); validation was left out
    without a word, so a run with val_period set never validated."""
    rows = row_reward_rows(tmp_path / "rows.jsonl", [], good=4)
    long = long_prompts(tmp_path / "long.jsonl")
    data = [f"data.train.data_path={long}"] if split == "train" else [
        f"data.validation.data_path={long}", "data.validation.env_name=bad", "grpo.val_period=1"
    ]  # fmt: skip
    cfg = load_config(None, [f"policy.model_name={model_dir}", *online_args(tmp_path, rows), *data])
    with pytest.raises(DataError, match=rf"data.{split}: all 3 {split.replace('train', 'training')} prompts are longer than "
                       r"data.max_input_seq_length \(64 tokens\)"):  # fmt: skip
        train(cfg, show_progress=False)
    assert not (tmp_path / "logs" / "metrics.jsonl").exists()


@pytest.mark.timeout(120)
def test_a_run_that_the_epoch_limit_ends_early_says_so(tmp_path: Path, model_dir: Path) -> None:
    """Two prompts, four a step, one epoch: the run ends after step 1 of 4 (it used to say only "done: 1 steps")."""
    small = write_scored(tmp_path / "small.jsonl", prompts=2)
    args = offline_command(tmp_path, model_dir, small, "grpo.max_num_epochs=1", "checkpointing.enabled=false")
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output[-3000:]
    assert "done: 1 steps" in done.stdout
    assert (
        "stopped before grpo.max_num_steps=4: grpo.max_num_epochs=1 passes over the training data are done"
        in done.stdout
    )


@pytest.mark.parametrize("key", ["logger.log_dir", "checkpointing.checkpoint_dir"])
def test_an_output_directory_that_is_a_file_is_refused_before_the_model_loads(
    tmp_path: Path, model_dir: Path, scored: Path, key: str
) -> None:
    """It used to fail with a FileExistsError traceback once everything was up."""
    taken = tmp_path / "taken"
    taken.write_text("not a directory\n")
    with pytest.raises(ConfigError, match=rf"{key} is {taken}, which is a file, not a directory"):
        train(offline_config(tmp_path, model_dir, scored, f"{key}={taken}"), show_progress=False)
    assert taken.read_text() == "not a directory\n"


@pytest.mark.timeout(300)
def test_a_metrics_file_that_stops_taking_writes_ends_the_run_with_exit_2_naming_it(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    """A file-size limit (``ulimit -f``) reached mid-run: the run used to end in a traceback (exit 1)."""
    import resource

    extra = ["grpo.max_num_steps=30", "grpo.max_num_epochs=100", "checkpointing.enabled=false"]
    command = [sys.executable, "-m", "gym_bridge.cli", *offline_command(tmp_path, model_dir, scored, *extra)]

    def limit_file_size() -> None:  # 8 KiB: a few steps' metrics lines
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=240, preexec_fn=limit_file_size
    )
    assert done.returncode == 2, done.stderr[-3000:]
    message = " ".join(done.stderr.split())
    assert f"error: cannot write {tmp_path / 'logs' / 'metrics.jsonl'}: File too large" in message, message
    assert "Traceback" not in done.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "logs")] == list(
        range(1, len(read_metrics(tmp_path / "logs")) + 1)
    )


@pytest.mark.timeout(120)
def test_resuming_on_other_training_data_is_refused_naming_data_train(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    """The checkpoint's data position (8 of 12 prompts) used to be applied to a 2-prompt file: the run went
    on at epoch 3 of a differently shuffled order, skipping and repeating prompts without a word."""
    train(offline_config(tmp_path, model_dir, scored, "grpo.max_num_steps=2"), show_progress=False)
    small = write_scored(tmp_path / "small.jsonl", prompts=2)
    with pytest.raises(
        DataError,
        match=r"data.train: the checkpoint's data position is for 12 prompts, and the data now holds 2",
    ):
        train(offline_config(tmp_path, model_dir, small), show_progress=False)
    assert train(offline_config(tmp_path, model_dir, scored), show_progress=False).resumed_from == 2


@pytest.mark.timeout(300)
def test_a_checkpoint_that_hits_a_file_size_limit_keeps_the_last_one_whole_and_the_rerun_resumes(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    """Held before this round (a regression case): ``ulimit -f`` below the optimizer state's size."""
    import resource

    train(offline_config(tmp_path, model_dir, scored, "grpo.max_num_steps=2"), show_progress=False)
    before = {
        p.relative_to(tmp_path): p.read_bytes()
        for p in (tmp_path / "ckpt" / "step_2").rglob("*")
        if p.is_file()
    }
    command = [
        sys.executable,
        "-m",
        "gym_bridge.cli",
        *offline_command(tmp_path, model_dir, scored, "checkpointing.save_period=1"),
    ]

    def limit_file_size() -> None:  # the weights fit, the optimizer state does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (200 * 1024, 200 * 1024))

    done = subprocess.run(
        command,
        cwd=ROOT, capture_output=True, text=True, timeout=240, preexec_fn=limit_file_size,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    message = " ".join(done.stderr.split())
    assert f"writing checkpoint {tmp_path / 'ckpt' / 'step_3'} failed" in message
    assert "the last complete checkpoint is step_2" in message
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_2", "tokenizer"]  # no leftovers
    after = {
        p.relative_to(tmp_path): p.read_bytes()
        for p in (tmp_path / "ckpt" / "step_2").rglob("*")
        if p.is_file()
    }
    assert after == before
    result = train(offline_config(tmp_path, model_dir, scored), show_progress=False)
    assert result.resumed_from == 2 and result.steps == 4


def test_the_lock_goes_inside_a_directory_whose_parent_takes_no_new_files(
    tmp_path: Path, model_dir: Path, scored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared mount where the run's directory is writable but its parent is not (root, running these
    tests, passes any permission check: the refusal is simulated at ``os.open``)."""
    from gym_bridge.records import file_lock
    from gym_bridge.train.bookkeeping import run_lock

    cfg = offline_config(tmp_path, model_dir, scored)
    real_open = os.open

    def no_new_files_beside(path: Any, flags: int, mode: int = 0o777) -> int:
        if Path(path).parent == tmp_path and Path(path).name.endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(file_lock.os, "open", no_new_files_beside)
    inside = [tmp_path / "ckpt" / run_lock.INSIDE_LOCK, tmp_path / "logs" / run_lock.INSIDE_LOCK]
    with run_lock.hold_run_dirs(cfg):
        assert all(lock.exists() for lock in inside)
        with (
            pytest.raises(RunDirectoryBusy, match="checkpointing.checkpoint_dir"),
            run_lock.hold_run_dirs(cfg),
        ):
            pass
    assert not any(lock.exists() for lock in inside)


def signalled_run(
    command: list[str], logs: Path, steps: int, signum: int, group: bool = False
) -> tuple[subprocess.Popen[str], str]:
    """``gym-bridge <command>`` in a subprocess, sent ``signum`` (to its whole process group with ``group``)
    once it has logged ``steps`` training steps; the ended process and its stderr."""
    from tests.train.test_trainer_offline import train_lines

    child = subprocess.Popen(
        [sys.executable, "-m", "gym_bridge.cli", *command],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while len(train_lines(logs)) < steps:
            assert child.poll() is None, child.stderr.read()[-3000:] if child.stderr else ""
            assert time.monotonic() < deadline, f"the run never reached step {steps}"
            time.sleep(0.05)
        os.killpg(child.pid, signum) if group else child.send_signal(signum)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL) if group else child.kill()
            child.wait()
    return child, err


@pytest.mark.timeout(300)
def test_sigterm_finishes_the_step_saves_it_and_the_rerun_continues_exactly(
    tmp_path: Path, model_dir: Path, scored: Path
) -> None:
    """A preemption's SIGTERM used to kill the run where it stood, losing every step since the last
    checkpoint (here: all of them, checkpoints every 100 steps)."""
    from tests.train.test_trainer_offline import train_lines, without_timings

    run = tmp_path / "run"
    run.mkdir()
    extra = ["grpo.max_num_steps=40", "grpo.max_num_epochs=100", "checkpointing.save_period=100"]
    command = offline_command(run, model_dir, scored, *extra)
    child, err = signalled_run(command, run / "logs", 3, signal.SIGTERM)
    assert child.returncode == 143, err[-3000:]
    logged = len(train_lines(run / "logs"))
    assert logged < 40  # it stopped early
    message = " ".join(err.split())
    assert (
        f"stopped by SIGTERM after step {logged} of 40: its checkpoint is {run / 'ckpt' / f'step_{logged}'}"
        in message
    )
    assert [p.name for p in (run / "ckpt").glob("step_*")] == [f"step_{logged}"]

    resumed = train(offline_config(run, model_dir, scored, *extra), show_progress=False)
    assert resumed.resumed_from == logged and resumed.steps == 40
    straight = tmp_path / "straight"
    train(offline_config(straight, model_dir, scored, *extra), show_progress=False)
    expected = [without_timings(r) for r in train_lines(straight / "logs")]
    assert [without_timings(r) for r in train_lines(run / "logs")] == expected  # as if never stopped


@pytest.mark.timeout(300)
def test_ctrl_c_finishes_the_step_saves_it_and_the_rerun_continues(tmp_path: Path, model_dir: Path) -> None:
    """Ctrl-C used to end the run in a ``KeyboardInterrupt`` traceback, losing every step since the last
    checkpoint (here: all of them). The SIGINT goes to the whole process group, as a terminal sends it, in an
    async run whose rollouts come from their own process: that process must live until the step is saved."""
    from tests.train.test_trainer_offline import train_lines

    run = tmp_path / "run"
    rows = row_reward_rows(tmp_path / "rows.jsonl", [], good=8)
    args = [
        *SMALL_ONLINE_RUN, f"policy.model_name={model_dir}", "grpo.max_num_steps=40", "grpo.val_period=0",
        "grpo.async_grpo.enabled=true", "grpo.async_grpo.rollout_process=true", "policy.train_micro_batch_size=16",
        f"data.train.data_path={rows}", "data.train.env_name=bad", f"env.bad.server={ROW_REWARD_SERVER}",
        f"checkpointing.checkpoint_dir={run / 'ckpt'}", "checkpointing.save_period=100",
        f"logger.log_dir={run / 'logs'}", "logger.tensorboard_enabled=false",
    ]  # fmt: skip
    config = tmp_path / "online.yaml"
    config.write_text("grpo:\n  mode: online\n")
    # the terminal's Ctrl-C: every process of the group
    command = ["train", "--config", str(config), "-q", *args]
    child, err = signalled_run(command, run / "logs", 2, signal.SIGINT, group=True)
    logged = len(train_lines(run / "logs"))
    assert 2 <= logged < 40
    assert [p.name for p in (run / "ckpt").glob("step_*")] == [f"step_{logged}"], err[-3000:]
    assert child.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    message = " ".join(err.split())
    assert "Ctrl-C: finishing this step and saving it, then stopping (Ctrl-C again stops at once)" in message
    assert (
        f"error: stopped by SIGINT (Ctrl-C) after step {logged} of 40: its checkpoint is "
        f"{run / 'ckpt' / f'step_{logged}'}; run the same command to resume" in message
    ), message
    deadline = time.monotonic() + 30  # the rollout process ended with the trainer: the group is empty
    while True:
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a process of the run outlived it"
        time.sleep(0.1)

    resumed = train(load_config(None, [*args, f"grpo.max_num_steps={logged + 1}"]), show_progress=False)
    assert resumed.resumed_from == logged and resumed.steps == logged + 1
    assert [r["step"] for r in train_lines(run / "logs")] == list(range(1, logged + 2))


def test_a_second_signal_after_the_first_is_left_to_its_default_action_and_the_handlers_come_back() -> None:
    """The first Ctrl-C is noted (and said at once); a second ends the process by SIGINT, no traceback."""
    from gym_bridge.train.bookkeeping.graceful_stop import stop_on_signal

    before = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
    with stop_on_signal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs in this (main) thread before the next line
        assert stop.signum == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        stopped = stop.stopped("after step 3 of 9: checkpointing is off; run the same command to resume")
        assert stopped.signum == signal.SIGINT
        assert str(stopped).startswith("stopped by SIGINT (Ctrl-C) after step 3")
    assert {each: signal.getsignal(each) for each in before} == before

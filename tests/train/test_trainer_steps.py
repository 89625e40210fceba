"""Step-level behaviour of the loop: the LR schedule never drifts, steps without a learning signal skip
their passes and say so, and a finished run says it is complete instead of running again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.train import setup as train_setup
from gym_bridge.train.algorithm.loss import ClippedPGLossFn
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager
from gym_bridge.train.bookkeeping.logging import format_line, read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.learner.update import Learner, StepBatch, update_policy
from gym_bridge.train.loop import train
from gym_bridge.train.setup import RunAlreadyComplete, build_optimizer
from tests.train.helpers import save_random_tiny


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_random"), seed=0, num_layers=1)


def write_tied(path: Path, prompts: int = 8, per_prompt: int = 4) -> Path:
    """Scored rows where every group's completions have the same reward (no advantage anywhere)."""
    with open(path, "w") as f:
        for i in range(prompts):
            for j in range(per_prompt):
                row = {"input": f"What is {i} + 1?", "output": f"\\boxed{{{i + j}}}", "reward": float(i % 2)}
                f.write(json.dumps(row) + "\n")
    return path


def run_overrides(tmp: Path, model_dir: Path, data: Path, *extra: str) -> list[str]:
    return [
        "grpo.mode=offline",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=2",
        "grpo.val_period=0",
        "loss_fn.reference_policy_kl_penalty=0.0",
        f"policy.model_name={model_dir}",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "policy.max_total_sequence_length=64",
        "policy.generation.max_new_tokens=16",
        "policy.scheduler.warmup_steps=10",
        f"data.train.data_path={data}",
        f"checkpointing.checkpoint_dir={tmp / 'ckpt'}",
        f"logger.log_dir={tmp / 'logs'}",
        *extra,
    ]


def test_a_batch_without_valid_tokens_still_steps_the_scheduler(tiny_model_dir: Path) -> None:
    cfg = load_config(
        None,
        [
            "data.train.data_path=unused.jsonl",
            "grpo.mode=offline",
            "policy.train_global_batch_size=2",
            "policy.train_micro_batch_size=2",
            "policy.scheduler.warmup_steps=4",
            "loss_fn.reference_policy_kl_penalty=0.0",
        ],
    )
    model = train_setup.load_model_and_tokenizer(str(tiny_model_dir))[0]
    optimizer, scheduler = build_optimizer(cfg, model, total_optimizer_steps=8)
    learner = Learner(model, None, optimizer, scheduler, ClippedPGLossFn(cfg.loss_fn), None, 0)
    samples = [Sample(group=0, token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], reward=float(i)) for i in range(4)]
    batch = StepBatch(samples, torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    before = {k: v.clone() for k, v in model.state_dict().items()}

    metrics = update_policy(cfg, learner, batch)

    # Two optimizer batches: the first has no sample in the loss (no update), the second trains.
    assert metrics["optimizer_steps"] == 1
    assert scheduler.last_epoch == 2  # both batches advanced the schedule, as build_optimizer planned
    expected_lr = cfg.policy.optimizer.kwargs.lr * cfg.policy.scheduler.lr_factor(2, 8)
    assert scheduler.get_last_lr()[0] == pytest.approx(expected_lr)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_step_without_learning_signal_skips_the_update_and_says_so(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = write_tied(tmp_path / "tied.jsonl")
    cfg = load_config(None, run_overrides(tmp_path, tiny_model_dir, data))
    result = train(cfg, show_progress=False)

    lines = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert [r["step"] for r in lines] == [1, 2]
    for record in lines:
        assert record["no_learning_signal"] == 1 and record["optimizer_steps"] == 0
        assert "loss" not in record and "time_training_s" not in record  # no forward/backward pass
        assert record["num_samples"] == 16 and "reward_mean" in record  # metrics still logged
        assert "no learning signal" in format_line(record["step"], record)
    # The schedule moved on by the step's two optimizer batches each time (warm-up from 0.1 to 1 over 10).
    peak, schedule = cfg.policy.optimizer.kwargs.lr, cfg.policy.scheduler
    assert [r["lr"] for r in lines] == pytest.approx([peak * schedule.lr_factor(s) for s in (2, 4)])
    # And the weights did not move.
    initial = train_setup.load_model_and_tokenizer(str(tiny_model_dir))[0].state_dict()
    final = train_setup.load_model_and_tokenizer(str(tiny_model_dir))[0]
    CheckpointManager(result.checkpoint_dir).latest().load_weights(final)
    assert all(torch.equal(initial[k], v) for k, v in final.state_dict().items())


def test_a_tied_step_still_trains_when_the_entropy_bonus_is_on(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = write_tied(tmp_path / "tied.jsonl")
    cfg = load_config(None, run_overrides(tmp_path, tiny_model_dir, data, "loss_fn.entropy_coeff=0.01"))
    result = train(cfg, show_progress=False)

    lines = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert [r["optimizer_steps"] for r in lines] == [2, 2] and "no_learning_signal" not in lines[0]
    # No advantage anywhere, so the whole loss is the bonus: -0.01 x the entropy estimate.
    assert lines[0]["loss"] == pytest.approx(-0.01 * lines[0]["approx_entropy"], rel=1e-4)
    initial = train_setup.load_model_and_tokenizer(str(tiny_model_dir))[0].state_dict()
    final = train_setup.load_model_and_tokenizer(str(tiny_model_dir))[0]
    CheckpointManager(result.checkpoint_dir).latest().load_weights(final)
    assert any(not torch.equal(initial[k], v) for k, v in final.state_dict().items())


def test_rerunning_a_finished_run_says_it_is_complete_before_loading_anything(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_tied(tmp_path / "tied.jsonl")
    cfg = load_config(None, run_overrides(tmp_path, tiny_model_dir, data))
    train(cfg, show_progress=False)

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded for a finished run")

    with monkeypatch.context() as patch:
        patch.setattr(train_setup, "load_model_and_tokenizer", no_loading)
        with pytest.raises(RunAlreadyComplete, match="already complete.*step 2 of grpo.max_num_steps=2.*--fresh"):
            train(cfg, show_progress=False)

    result = train(cfg, show_progress=False, fresh=True)  # from step 0 again, old checkpoints gone
    assert result.resumed_from is None and result.steps == 2
    assert [c.step for c in CheckpointManager(cfg.checkpointing.checkpoint_dir).checkpoints()] == [2]


def test_the_cli_says_a_finished_run_is_complete_and_fresh_starts_over(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = write_tied(tmp_path / "tied.jsonl")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("grpo: {mode: offline}\n")
    args = ["train", "--config", str(recipe), "--quiet", *run_overrides(tmp_path, tiny_model_dir, data)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "done: 2 steps" in first.output

    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "the run is already complete" in again.output and "--fresh" in again.output
    assert "done:" not in again.output

    fresh = CliRunner().invoke(app, [*args, "--fresh"])
    assert fresh.exit_code == 0, fresh.output
    assert "done: 2 steps" in fresh.output


def test_the_cli_stops_with_a_clear_error_when_the_checkpoint_does_not_fit(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import namedtuple

    from gym_bridge.train.bookkeeping import checkpoint as checkpoint_module

    data = write_tied(tmp_path / "tied.jsonl")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("grpo: {mode: offline}\n")
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 4096, 4096))
    args = ["train", "--config", str(recipe), "--quiet", *run_overrides(tmp_path, tiny_model_dir, data)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "error: no room for checkpoint" in result.output and "Traceback" not in result.output
    assert "there is no checkpoint yet" in result.output
    # The steps' metrics were written before the save failed.
    assert [r["step"] for r in read_metrics(tmp_path / "logs") if r["split"] == "train"] == [1, 2]

"""A latest checkpoint that cannot be read is named with the way on, and the one before it resumes.

Round four (crash consistency): a checkpoint is published whole (:mod:`gym_bridge.train.bookkeeping.checkpoint`),
but its files can still be damaged afterwards (a failing disk, an interrupted copy of the run directory,
storage that did not keep an fsync). Found for real: resuming on one ended in a safetensors, torch or json
traceback (exit 1) naming neither the checkpoint nor a way on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager

from .test_crash_checkpoint import offline_train_args


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


DAMAGES = {
    "weights_truncated": lambda step: truncate(step / "policy" / "weights" / "model.safetensors"),
    "weights_missing": lambda step: (step / "policy" / "weights" / "model.safetensors").unlink(),
    "optimizer_truncated": lambda step: truncate(step / "policy" / "optimizer.pt"),
    "rng_state_missing": lambda step: (step / "rng_state.pt").unlink(),
    "info_empty": lambda step: (step / "training_info.json").write_text(""),
    "data_state_garbage": lambda step: (step / "train_dataloader.json").write_text("{not json"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_latest_checkpoint_is_named_with_the_way_on_and_the_previous_one_resumes(
    tmp_path: Path, tiny_model_dir: Path, damage: str
) -> None:
    """Found for real: a latest checkpoint that cannot be read (a damaged disk, an interrupted copy of the
    run directory, a file whose fsync the storage did not keep) ended ``gym-bridge train`` in a safetensors,
    torch or json traceback (exit 1) that named neither the checkpoint nor a way on. Now exit 2, naming it
    and the checkpoint before it; moved aside as said, the run resumes from that one."""
    from typer.testing import CliRunner

    from gym_bridge.cli import app
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    args = offline_train_args(tmp_path, tiny_model_dir)
    train(load_config(None, [*args[4:], "grpo.max_num_steps=2"]), show_progress=False)
    ckpt = tmp_path / "run" / "ckpt"
    DAMAGES[damage](ckpt / "step_2")

    done = CliRunner().invoke(app, [*args, "grpo.max_num_steps=3"])
    assert done.exit_code == 2, done.output[-3000:]
    message = " ".join(done.stderr.split())
    assert f"error: checkpoint {ckpt / 'step_2'} cannot be read" in message, message
    assert f"move it out of {ckpt} to resume from step_1" in message

    (ckpt / "step_2").rename(tmp_path / "step_2.damaged")
    done = CliRunner().invoke(app, [*args, "grpo.max_num_steps=3"])
    assert done.exit_code == 0, done.output[-3000:]
    assert [c.step for c in CheckpointManager(ckpt).checkpoints()] == [1, 2, 3]

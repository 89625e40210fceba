"""Async GRPO's rollout process killed mid-run (``kill -9``, the out-of-memory killer) stops the run in one line.

Before, ``gym-bridge train`` ended in a traceback, exit 1, with "the rollout process died (exit code None)": the
process was not yet reaped when its pipe closed, so neither the signal nor the checkpoint to resume from was
named. Now it is a run stop like a lost Ray actor: ``error: ...`` naming the signal and the last complete
checkpoint, exit 2.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.reliability.procs import kill9, start
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts


def _rollout_process(trainer: psutil.Process, timeout: float) -> psutil.Process:
    """The trainer's spawned child (multiprocessing's resource tracker is its other child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in trainer.children():
            if any("spawn_main" in part for part in child.cmdline()):
                return child
        time.sleep(0.1)
    raise AssertionError("the rollout process never started")


@pytest.mark.timeout(240)
def test_a_rollout_process_killed_by_sigkill_stops_the_run_naming_the_signal_and_the_checkpoint(tmp_path: Path) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=0)
    data = write_say_prompts(tmp_path / "say.jsonl", 16)
    ckpt = tmp_path / "ckpt"
    trainer = start([
        sys.executable, "-m", "gym_bridge.cli", "train", "--config", "recipes/grpo_math_tiny.yaml", "-q",
        *SMALL_ONLINE_RUN, "grpo.max_num_steps=40", "grpo.val_period=0", "grpo.val_at_start=false",
        "grpo.val_at_end=false", "grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1",
        "loss_fn.use_importance_sampling_correction=true", f"policy.model_name={model_dir}",
        "policy.train_micro_batch_size=16", f"data.train.data_path={data}", "data.train.env_name=parity",
        f"env.parity.server={PARITY_SERVER}", f"checkpointing.checkpoint_dir={ckpt}", "checkpointing.save_period=1",
        f"logger.log_dir={tmp_path / 'logs'}", "logger.tensorboard_enabled=false",
    ])  # fmt: skip
    try:
        victim = _rollout_process(psutil.Process(trainer.pid), timeout=120)
        deadline = time.monotonic() + 150
        while not (ckpt / "step_1").is_dir() and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (ckpt / "step_1").is_dir(), trainer.communicate(timeout=30)[1][-3000:]
        victim.send_signal(signal.SIGKILL)
        _, stderr = trainer.communicate(timeout=120)
    finally:
        kill9(trainer)
    assert trainer.returncode == 2, stderr[-3000:]  # before: 1, a traceback
    assert "Traceback" not in stderr, stderr[-3000:]
    line = next(line for line in stderr.splitlines() if line.startswith("error: "))
    killed = f"the rollout process (async GRPO, pid {victim.pid}) was killed by SIGKILL (signal 9, often the out-of-memory"
    assert killed in line, line
    named = re.search(r"the same command resumes from the last complete checkpoint, (\S+) \(step (\d+)\)$", line)
    assert named, line
    steps = sorted(int(p.name.removeprefix("step_")) for p in ckpt.glob("step_*"))
    assert Path(named.group(1)) == ckpt / f"step_{steps[-1]}" and int(named.group(2)) == steps[-1]  # the latest kept
    assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE

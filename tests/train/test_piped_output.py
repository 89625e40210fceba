"""``gym-bridge train`` with its output piped, as in a log or ``| tee`` (issue 35): the validation says how
far it has come (the SmolLM2 recipe's step-0 validation ran minutes with no line), and step lines are
written whole (rich cut them at 80 columns, mid-phrase, off a terminal).

A real process: a random tiny model, the built-in math env in-process, arithmetic prompts; no terminal
and no ``$COLUMNS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_piped_validation_prints_progress_lines_and_step_lines_are_whole(tmp_path: Path) -> None:
    model = save_random_tiny(tmp_path / "model", seed=4)
    config = tmp_path / "train.yaml"
    config.write_text("grpo:\n  mode: online\n")
    command = [
        sys.executable, "-m", "gym_bridge.cli", "train", "--config", str(config), *SMALL_ONLINE_RUN,
        "grpo.max_num_steps=1", "grpo.val_period=0", "grpo.val_at_start=true", "grpo.val_at_end=false",
        "grpo.max_val_samples=8", "grpo.val_batch_size=2", f"policy.model_name={model}",
        "policy.train_micro_batch_size=16", f"data.train.data_path={ROOT / 'recipes/data/arith_train.jsonl'}",
        f"data.validation.data_path={ROOT / 'recipes/data/arith_val.jsonl'}", "data.default.env_name=math",
        "env.math.server=math", "checkpointing.enabled=false", f"logger.log_dir={tmp_path / 'logs'}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # four batches of two prompts: a line as it starts and one at each batch (each a tenth or more of 8)
    progress = [line for line in lines if line.startswith("validation: ")]
    assert progress[0] == "validation: 8 prompts ..."
    assert [line.split(",")[0] for line in progress[1:]] == [f"validation: {n}/8 prompts" for n in (2, 4, 6, 8)]
    assert all(line.endswith(" s") for line in progress[1:])
    assert lines.index(progress[-1]) < next(i for i, line in enumerate(lines) if "[val]" in line)
    # the step line is one line, more than 80 columns long, from "step" to its last field
    [step_line] = [line for line in lines if line.startswith("step    1 [train]")]
    assert len(step_line) > 80 and "s/step" in step_line and "gen tok/s" in step_line, proc.stdout

"""A training run SIGKILLed after logging steps it had not checkpointed, then resumed: its log directory
reads as the resumed run alone.

Round four (crash consistency). The resumed run drops the killed run's ``metrics.jsonl`` lines after its
checkpoint (:class:`~gym_bridge.train.bookkeeping.logging.MetricsLogger`); found for real, its sample files
(``rollouts/step_N.jsonl``, what ``gym-bridge view`` shows for step N) stayed: a resumed run that ended
earlier (a lower ``grpo.max_num_steps``, a divergence, a stop) or logged no samples for a step showed the
killed run's rollouts and advantages under steps whose metrics were gone or came from another run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.bookkeeping.sample_log import list_sample_files
from gym_bridge.train.config import load_config
from gym_bridge.train.loop import train

from .test_crash_checkpoint import offline_train_args, train_killed_in_save


@pytest.mark.timeout(300)
def test_a_resumed_run_keeps_no_sample_file_of_the_killed_runs_later_steps(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    args = offline_train_args(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    # checkpoints every 2 steps; killed while saving step 4: steps 3 and 4 are logged, step_2 is the checkpoint
    train_killed_in_save([*args, "checkpointing.save_period=2"], ".tmp-step_4", tmp_path / "marker")
    assert [step for step, _ in list_sample_files(run / "logs")] == [1, 2, 3, 4]

    overrides = [a for a in args[3:] if not a.startswith("-")]  # the same run, resumed with a shorter length
    result = train(
        load_config(None, [*overrides, "checkpointing.save_period=2", "grpo.max_num_steps=3"]),
        show_progress=False,
    )
    assert result.resumed_from == 2 and result.steps == 3
    logged = [r["step"] for r in read_metrics(run / "logs") if r["split"] == "train"]
    assert logged == [1, 2, 3]
    assert [step for step, _ in list_sample_files(run / "logs")] == logged

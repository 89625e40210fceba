"""``gym-bridge collect --resume`` SIGKILLed mid-run never leaves figures that describe another output.

Round four (crash consistency). ``<stem>_metrics.json`` and NeMo Gym's ``<stem>_aggregate_metrics.json``
summarise the whole output and are written at a run's end. Found for real: a finished run extended with
``--resume`` (more ``--num-repeats``, rows added to the task file) and SIGKILLed midway kept the finished
run's files beside the longer output (``num_rollouts: 80`` over 100 lines), so a reader took the old
figures for the new output. Now the first new line of a run removes them; its end writes them again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fake_model import arithmetic_row

from gym_bridge.collect.output import aggregate_metrics_path_for, metrics_path_for

from .procs import cli, run_cli, serving
from .test_kill_resume import line_count, run_killed


def test_a_resumed_collect_killed_midway_leaves_no_summary_of_the_earlier_output(
    tmp_path: Path, builtin_url
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(arithmetic_row(i % 10, i)) + "\n" for i in range(30)))
    out = tmp_path / "out.jsonl"
    summaries = (metrics_path_for(out), aggregate_metrics_path_for(out))
    with serving([sys.executable, "tests/fake_model.py", "--latency", "0.05"]) as model_url:
        args = ["collect", str(tasks), "-o", str(out), "--env", builtin_url("math"), "--model-url", model_url + "/v1",
                "--concurrency", "4", "--no-progress"]  # fmt: skip
        done = run_cli([*args, "--num-repeats", "2"], timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(summaries[0].read_text())["num_rollouts"] == 60 and summaries[1].is_file()

        more = cli(*args, "--num-repeats", "4", "--resume")
        assert run_killed(more, lambda: line_count(out) >= 70, 0.0)  # SIGKILLed with 10+ new rollouts written
        assert 70 <= line_count(out) < 120
        assert not [p.name for p in summaries if p.exists()]  # no figures of the 60-rollout output

        done = run_cli([*args, "--num-repeats", "4", "--resume"], timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
    assert line_count(out) == 120
    assert json.loads(summaries[0].read_text())["num_rollouts"] == 120 and summaries[1].is_file()

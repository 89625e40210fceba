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

import pytest
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


def rollout_line(task: int, repeat: int) -> bytes:
    return json.dumps({"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": 1.0}).encode() + b"\n"


@pytest.mark.parametrize(
    ("tail", "warned"),
    [
        (rollout_line(2, 0)[:-1], "torn last line"),  # the whole record, killed before its newline
        (rollout_line(2, 0)[:17], "torn last line"),  # mid-record
        (b"\0" * 4096, "torn last line"),  # a power cut on a file system that extends before it writes
        (b"\0" * 4096 + rollout_line(2, 1), "invalid JSON"),  # ... with a later line that made it to disk
    ],
    ids=["record-without-newline", "mid-record", "zeros", "zeros-then-a-line"],
)
def test_resume_counts_only_whole_lines_of_a_crashed_output(tmp_path: Path, tail: bytes, warned: str) -> None:
    """Held (a regression case): what a kill or a power cut leaves at the end of the output is never
    counted as done, so ``--resume`` makes that rollout again; each case is said."""
    from gym_bridge.collect.resume_index import read_done

    out = tmp_path / "out.jsonl"
    out.write_bytes(rollout_line(0, 0) + rollout_line(1, 0) + tail)
    said: list[str] = []
    done = read_done(out, said.append, stride=2, on_record=lambda record: None)
    assert (0, 0) in done and (1, 0) in done and (2, 0) not in done and len(done) == 2
    assert any(warned in message for message in said), said
    assert out.read_bytes().startswith(rollout_line(0, 0) + rollout_line(1, 0))

"""``train --fresh`` and step-0 starts never lose a finished run nor mix two runs in one directory (issue 37).

Real processes: each run is ``gym-bridge train`` in a subprocess (a random tiny model, the built-in
math env in-process, arithmetic prompts). A fresh run that cannot start (a missing data file, an env
URL where nothing listens) leaves the earlier run exactly as it was; one that starts moves the earlier
run's checkpoint and log directories aside whole, and its own directories hold only its own files.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_fresh"), seed=4)


def train(run: Path, model: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    config = run / "train.yaml"
    config.write_text("grpo:\n  mode: online\n")
    command = [
        sys.executable, "-m", "gym_bridge.cli", "train", "--config", str(config), "-q",
        *SMALL_ONLINE_RUN, "grpo.max_num_steps=2", "grpo.val_period=0", f"policy.model_name={model}",
        "policy.train_micro_batch_size=16", f"data.train.data_path={ROOT / 'recipes/data/arith_train.jsonl'}",
        "data.train.env_name=math", "env.math.server=math", f"checkpointing.checkpoint_dir={run / 'ckpt'}",
        "checkpointing.save_period=1", f"logger.log_dir={run / 'logs'}", *extra,
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> contents): what must not change."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_steps(log_dir: Path) -> list[int]:
    from gym_bridge.train.bookkeeping.logging import read_metrics

    return [r["step"] for r in read_metrics(log_dir) if r["split"] == "train"]


@pytest.mark.timeout(400)
def test_fresh_validates_first_then_moves_the_earlier_run_aside(tmp_path: Path, model_dir: Path) -> None:
    from gym_bridge.train.bookkeeping.sample_log import list_sample_files

    run = tmp_path / "run"
    run.mkdir()
    first = train(run, model_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_1", "step_2"]
    assert [s for s, _ in list_sample_files(run / "logs")] == [1, 2]
    before = {"ckpt": tree(run / "ckpt"), "logs": tree(run / "logs")}

    # a fresh run that cannot start (no data file; an env URL where nothing listens) changes nothing
    no_data = train(run, model_dir, "--fresh", f"data.train.data_path={run / 'nope.jsonl'}")
    assert no_data.returncode == 2, no_data.stderr[-3000:]
    assert "nope.jsonl" in no_data.stderr
    assert {"ckpt": tree(run / "ckpt"), "logs": tree(run / "logs")} == before  # the finished run is intact
    dead = f"http://127.0.0.1:{closed_port()}"
    no_env = train(run, model_dir, "--fresh", "data.train.env_name=remote", f"env.remote.url={dead}")
    assert no_env.returncode == 2, no_env.stderr[-3000:]
    assert f"env.remote.url: nothing answers at {dead}" in " ".join(no_env.stderr.split())
    assert {"ckpt": tree(run / "ckpt"), "logs": tree(run / "logs")} == before
    assert sorted(p.name for p in run.iterdir()) == ["ckpt", "logs", "train.yaml"]  # nothing moved either

    # a fresh run that starts: the earlier run is moved aside whole and said where; nothing is deleted
    fresh = train(run, model_dir, "--fresh", "grpo.max_num_steps=1")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    (old_ckpt,) = run.glob("ckpt.previous-*")
    (old_logs,) = run.glob("logs.previous-*")
    said = " ".join(fresh.stdout.split())
    assert f"({run / 'ckpt'}) was moved to {old_ckpt}" in said and f"({run / 'logs'}) was moved to {old_logs}" in said
    assert {"ckpt": tree(old_ckpt), "logs": tree(old_logs)} == before
    # ... and the new run's directories hold only the new run
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_1"]
    assert [s for s, _ in list_sample_files(run / "logs")] == [1]
    assert train_steps(run / "logs") == [1]

    # a step-0 start without --fresh (nothing to resume: checkpointing off) does not mix runs in the log dir
    again = train(run, model_dir, "checkpointing.enabled=false", "grpo.max_num_steps=2")
    assert again.returncode == 0, again.stderr[-3000:]
    moved = sorted(run.glob("logs.previous-*"))
    assert len(moved) == 2 and old_logs in moved
    (newest,) = [m for m in moved if m != old_logs]
    assert train_steps(newest) == [1]  # the fresh run's log, kept whole
    assert train_steps(run / "logs") == [1, 2]
    assert [s for s, _ in list_sample_files(run / "logs")] == [1, 2]
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_1"]  # not this run's to move


def test_a_run_directory_that_is_the_working_directory_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.train.bookkeeping.run_dirs import find_earlier_run
    from gym_bridge.train.config import ConfigError, load_config

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "split": "train"}\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, [  # fmt: skip
        "data.train.data_path=a.jsonl", "data.default.env_name=math", "env.math.server=math", "logger.log_dir=.",
        f"checkpointing.checkpoint_dir={tmp_path / 'c'}",
    ])
    with pytest.raises(ConfigError, match=r"logger\.log_dir is .* the working directory or one above it"):
        find_earlier_run(cfg, fresh=True, resuming=False)
    assert find_earlier_run(cfg, fresh=False, resuming=True).directories == []  # a resumed run moves nothing

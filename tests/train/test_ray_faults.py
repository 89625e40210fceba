"""Runs under Ray that are stopped or lose a Ray process: they end with the right exit status and message,
lose no step they could keep, and leave nothing of the run running.

``gym-bridge train`` with data-parallel learners (``cluster.train_workers_per_node=2``) on a private Ray on
127.0.0.1 runs as a child process in its own process group; its learners announce each update and pause in
it (:data:`CHILD`), so a signal or a kill lands mid-step. Every process of the run carries a marker in its
environment (Ray's workers inherit it), so what is left afterwards is found whoever its parent became.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.train.helpers import save_random_tiny
from tests.train.test_run_integrity import offline_command
from tests.train.test_trainer_offline import train_lines, write_scored

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]
MARK = "GYM_BRIDGE_TEST_RUN"

CHILD = """
import os, sys, time
from pathlib import Path
from gym_bridge.train import data_parallel

marks = Path(sys.argv[1])

class AnnouncedWorker(data_parallel.TrainingWorker):
    def update(self, batch):  # 'update-<rank>-<n>' holds the learner's pid, then the update waits 3 s
        n = len(list(marks.glob(f"update-{self.rank}-*"))) + 1
        (marks / f"update-{self.rank}-{n}").write_text(str(os.getpid()))
        time.sleep(3)
        return super().update(batch)

data_parallel.TrainingWorker = AnnouncedWorker
from gym_bridge.cli import app
sys.argv = ["gym-bridge", *sys.argv[2:]]
app()
"""


def marked(mark: str) -> dict[int, str]:
    """pid -> name of every live process whose environment carries ``MARK=mark``."""
    found = {}
    for process in psutil.process_iter(["pid", "name"]):
        try:
            if process.environ().get(MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found[process.pid] = process.info["name"]
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def left_running(mark: str, timeout: float = 30) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def data_parallel_run(tmp_path: Path, marks: Path) -> tuple[subprocess.Popen[str], str, Path]:
    """The child ``gym-bridge train`` (6 offline steps, checkpoints every 100, two learners), its marker
    and its run directory."""
    model_dir = save_random_tiny(tmp_path / "tiny", seed=0)
    data = write_scored(tmp_path / "scored.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    marks.mkdir()
    args = offline_command(
        run, model_dir, data, "grpo.max_num_steps=6", "grpo.max_num_epochs=100", "checkpointing.save_period=100",
        "cluster.train_workers_per_node=2", "logger.tensorboard_enabled=false",
    )  # fmt: skip
    mark = uuid.uuid4().hex
    ray_tmp = tempfile.mkdtemp(prefix="gbr-", dir="/tmp")  # short: Ray's unix socket paths live in it
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: mark, "RAY_TMPDIR": ray_tmp, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)  # a private Ray of the run's own
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(marks), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return child, mark, run


def wait_for(child: subprocess.Popen[str], path: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert child.poll() is None, child.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the run never reached {path.name}"
        time.sleep(0.05)


def finish(child: subprocess.Popen[str], timeout: float = 150) -> tuple[str, float]:
    """The child's stderr once it exits, and how long that took (killed with its group if it hangs)."""
    started = time.monotonic()
    try:
        _, err = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:  # it hung: its private Ray shares its fate
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    return err, time.monotonic() - started


@pytest.mark.timeout(400)
def test_sigterm_to_the_whole_group_mid_step_saves_the_step_and_exits_143_at_once(tmp_path: Path) -> None:
    """Slurm, systemd and ``kill -- -PGID`` signal every process of the run: the private Ray's GCS and raylet
    took the SIGTERM too. The step still finished and was saved, but closing the run then waited 60 s for the
    gone GCS (removing the learners' placement group) until Ray ended the process with exit status 1 and
    its own log line: the ``stopped by SIGTERM ...`` line never came."""
    marks = tmp_path / "marks"
    child, mark, run = data_parallel_run(tmp_path, marks)
    wait_for(child, marks / "update-1-2")  # both learners are inside step 2's update
    os.killpg(child.pid, signal.SIGTERM)
    err, took = finish(child)
    message = " ".join(err.split())
    assert child.returncode == 143, err[-3000:]
    saved = run / "ckpt" / "step_2"
    assert f"stopped by SIGTERM after step 2 of 6: its checkpoint is {saved}" in message, message
    assert "Traceback" not in err and "Failed to connect to GCS" not in err, err[-3000:]
    assert took < 50, f"the run took {took:.0f} s to stop"  # it used to wait out Ray's 60 s
    assert [r["step"] for r in train_lines(run / "logs")] == [1, 2]
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_2"]
    assert left_running(mark) == {}

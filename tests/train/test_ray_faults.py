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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.ray_loopback import RUN_MARK as MARK
from tests.ray_loopback import loopback_ray_fixture, marked
from tests.train.helpers import save_random_tiny
from tests.train.test_env_replicas_cluster import gone
from tests.train.test_run_integrity import offline_command
from tests.train.test_trainer_offline import offline_config, train_lines, write_scored

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]

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
    assert took < 55, f"the run took {took:.0f} s to stop"  # it used to wait out Ray's 60 s (and exit 1)
    assert [r["step"] for r in train_lines(run / "logs")] == [1, 2]
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_2"]
    assert left_running(mark) == {}


@pytest.mark.timeout(150)
def test_sigterm_after_ray_started_and_before_the_runs_handler_is_a_sigterm_not_a_crash() -> None:
    """``ray.init`` answered SIGTERM with a crash handler (``*** SIGTERM received ...``, a stack dump, then
    SIGABRT): ``gym-bridge train`` stopped while starting (its model and Ray up, its own handler not yet in
    place) exited 134 as if it had crashed; a run without Ray exits 143. Its private Ray still ends with it."""
    mark = uuid.uuid4().hex
    code = (
        "import os, signal, time; from gym_bridge.distributed.ray_local import start_local_ray; "
        "start_local_ray(1, 80); os.kill(os.getpid(), signal.SIGTERM); time.sleep(60)"
    )
    ray_tmp = tempfile.mkdtemp(prefix="gbr-", dir="/tmp")
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: mark, "RAY_TMPDIR": ray_tmp}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr[-3000:])
    assert "SIGTERM received" not in done.stderr
    assert left_running(mark) == {}  # the private Ray's GCS, raylet and workers ended with it


# ------------------------------------------------- a Ray actor killed mid-run (one private Ray for these)

local_ray = loopback_ray_fixture(num_cpus=2)


@pytest.mark.timeout(300)
def test_a_learner_killed_mid_update_stops_the_run_naming_it_and_keeps_the_last_checkpoint(
    tmp_path: Path, local_ray: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of data-parallel rank 1 inside step 2's update. The run used to end in Ray's traceback
    (``ActorDiedError ... class_name: ...``, exit 1), naming neither the rank nor what it was doing."""
    from gym_bridge.distributed.ray_cluster import RayActorLost, RayClusterError
    from gym_bridge.train import data_parallel
    from gym_bridge.train.loop import train

    marks = tmp_path / "marks"
    marks.mkdir()

    class AnnouncedWorker(data_parallel.TrainingWorker):  # defined here: Ray ships it by value
        def update(self, batch: Any) -> Any:
            n = len(list(marks.glob(f"update-{self.rank}-*"))) + 1
            (marks / f"update-{self.rank}-{n}").write_text(str(os.getpid()))
            time.sleep(3)
            return super().update(batch)

    def kill_rank_1_in_step_2() -> None:
        deadline = time.monotonic() + 200
        while not (marks / "update-1-2").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int((marks / "update-1-2").read_text()), signal.SIGKILL)

    monkeypatch.setattr(data_parallel, "TrainingWorker", AnnouncedWorker)
    model_dir = save_random_tiny(tmp_path / "tiny", seed=0)
    cfg = offline_config(
        tmp_path, model_dir, write_scored(tmp_path / "scored.jsonl"), "cluster.train_workers_per_node=2",
        "checkpointing.save_period=1", "logger.tensorboard_enabled=false",
    )  # fmt: skip
    killer = threading.Thread(target=kill_rank_1_in_step_2, daemon=True)
    killer.start()
    with pytest.raises(RayClusterError) as caught:  # `gym-bridge train`: `error: ...`, exit 2
        train(cfg, show_progress=False)
    killer.join(timeout=10)
    pids = [int((marks / f"update-{rank}-1").read_text()) for rank in (0, 1)]
    message = str(caught.value)
    assert isinstance(caught.value, RayActorLost), message
    node = ray.get_runtime_context().get_node_id()[:12]
    named = f"data-parallel training worker rank 1 of 2 (node {node}, pid {pids[1]}) is gone during the policy update"
    assert f"{named} (ActorDiedError" in message, message
    assert (
        "the run cannot go on without it: the same command resumes from the last checkpoint saved" in message
    )

    assert [r["step"] for r in train_lines(tmp_path / "logs")] == [1]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_1"]
    assert all(gone(pid) for pid in pids)  # the survivor ended with the run
    deadline = time.monotonic() + 30  # and the run's reservation went back
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2


@pytest.mark.timeout(200)
def test_a_generation_replica_killed_between_steps_is_named_not_a_traceback(local_ray: Any) -> None:
    """kill -9 of replica 1 of the Ray generation backend: the next generation and refit used to raise
    Ray's ``ActorDiedError`` (a traceback, exit 1)."""
    import torch

    from gym_bridge.distributed.ray_cluster import RayActorLost
    from gym_bridge.generation.backend import GenerationRequest, SamplingParams
    from gym_bridge.generation.ray_backend import RayBackend
    from gym_bridge.models.tokenizer import build_tokenizer
    from tests.generation.test_ray_backend import make_llama

    tokenizer = build_tokenizer()
    model = make_llama(tokenizer, seed=0)
    requests = [
        GenerationRequest(tokenizer.encode(f"What is {i} + 1?"), SamplingParams(max_new_tokens=4, seed=i))
        for i in range(4)
    ]
    threads = torch.get_num_threads()
    backend = RayBackend(model, tokenizer, seed=7, num_workers=2)
    try:
        assert len(backend.generate(requests)) == 4
        pid = ray.get(backend.replicas[1].pid.remote())
        os.kill(pid, signal.SIGKILL)
        assert gone(pid)
        with pytest.raises(RayActorLost, match=rf"policy.generation.ray replica 1 of 2 \(node \w+, pid {pid}\) "
                           r"is gone during generation \(ActorDiedError"):  # fmt: skip
            backend.generate(requests)
        with pytest.raises(
            RayActorLost, match=rf"replica 1 of 2 .*pid {pid}\) is gone during a weight update"
        ):
            backend.update_weights(model)
    finally:
        backend.close()
        torch.set_num_threads(threads)
    assert ray.is_initialized()  # the fixture's Ray: the backend joined it and left it running

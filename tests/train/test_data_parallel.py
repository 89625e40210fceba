"""Data-parallel updates on a real private Ray on 127.0.0.1: 2 workers, gloo all-reduce, the same run.

One Ray for the module (start-up takes ~10 s on 2 cores) with 2 logical CPUs, one per worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.loop import train
from tests.ray_loopback import listeners, loopback_ray_fixture, off_loopback
from tests.train.helpers import save_random_tiny
from tests.train.test_trainer_offline import offline_config, write_scored

ray = pytest.importorskip("ray")

COMPARED = ("loss", "grad_norm", "kl_penalty", "clip_fraction", "reward_mean", "lr", "optimizer_steps")


local_ray = loopback_ray_fixture(num_cpus=2)


@pytest.fixture
def one_thread() -> Any:
    """The in-process reference on one torch thread, as each worker (thread count moves float sums)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(checkpoint.rglob("*.safetensors"))
    assert files, f"no weights under {checkpoint}"
    return {k: v for f in files for k, v in load_file(f).items()}


def _run(tmp_path: Path, model_dir: Path, data: Path, name: str, *extra: str) -> list[dict[str, Any]]:
    cfg = offline_config(
        tmp_path / name, model_dir, data, "grpo.max_num_steps=2", "policy.train_micro_batch_size=4",
        "logger.tensorboard_enabled=false", *extra,
    )  # fmt: skip
    train(cfg, show_progress=False)
    return [r for r in read_metrics(tmp_path / name / "logs") if r["split"] == "train"]


@pytest.mark.timeout(600)
def test_two_workers_give_the_losses_and_weights_of_one_process(
    tmp_path: Path, local_ray: Any, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.train import data_parallel

    model_dir = save_random_tiny(tmp_path / "tiny", seed=0)
    data = write_scored(tmp_path / "scored.jsonl")
    single = _run(tmp_path, model_dir, data, "single")

    updates: list[int] = []
    original = data_parallel.TrainingWorkers.update

    def counted(self: Any, batch: Any) -> Any:
        updates.append(self.world_size)
        return original(self, batch)

    monkeypatch.setattr(data_parallel.TrainingWorkers, "update", counted)
    parallel = _run(tmp_path, model_dir, data, "dp", "cluster.train_workers_per_node=2")
    assert updates == [2, 2]  # both steps were updated by the 2 workers, not in the trainer

    assert [r["step"] for r in parallel] == [r["step"] for r in single] == [1, 2]
    for mine, reference in zip(parallel, single, strict=True):
        for key in COMPARED:
            assert mine[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    assert single[0]["grad_norm"] > 0 and single[0]["loss"] != 0  # a real update, not a skipped one

    start = _weights(model_dir)
    dp, one = _weights(tmp_path / "dp" / "ckpt" / "step_2"), _weights(tmp_path / "single" / "ckpt" / "step_2")
    assert dp.keys() == one.keys()
    moved = max(float((one[k].float() - start[k].float()).abs().max()) for k in one if k in start)
    assert moved > 1e-4  # the weights did move over the two steps
    for key in one:
        assert torch.allclose(dp[key].float(), one[key].float(), rtol=1e-4, atol=1e-6), key


@pytest.mark.timeout(300)
def test_workers_split_micro_batches_and_every_socket_is_on_loopback(tmp_path: Path, local_ray: Any) -> None:
    import psutil

    from gym_bridge.distributed.ray_local import is_loopback
    from gym_bridge.train.config import load_config
    from gym_bridge.train.data_parallel import TrainingWorkers
    from gym_bridge.train.setup import build_learner

    model_dir = save_random_tiny(tmp_path / "tiny", seed=1)
    cfg = load_config(
        None,
        [f"policy.model_name={model_dir}", "cluster.train_workers_per_node=2", "grpo.mode=offline",
         f"data.train.data_path={tmp_path / 'unused.jsonl'}"],
    )  # fmt: skip
    learner, _ = build_learner(cfg, None, rollout_process=False)
    workers = TrainingWorkers(cfg, learner)
    try:
        assert len(set(workers.pids)) == 2
        found = listeners()
        names = {name for name, *_ in found}
        assert {"gcs_server", "raylet"} <= names, found
        worker_listeners = [entry for entry in found if entry[0].startswith("ray::TrainingWorker")]
        assert len({n for n, *_ in worker_listeners}) >= 1, found  # the check sees the workers
        assert off_loopback(found) == [], f"sockets bound off loopback: {off_loopback(found)}"
        # gloo's pair connections between the two workers are on loopback too
        peers = [
            (c.laddr.ip, c.raddr.ip)
            for pid in workers.pids
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.raddr
        ]
        assert peers and all(is_loopback(a) and is_loopback(b) for a, b in peers), peers
    finally:
        workers.close()
    assert ray.is_initialized()  # a Ray the workers did not start stays up


def test_cluster_keys_it_cannot_honour_are_refused_naming_them() -> None:
    from gym_bridge.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"cluster.num_nodes is 2: only data-parallel training workers span "
                       r"nodes; set cluster.train_workers_per_node >= 1"):
        load_config(None, ["cluster.num_nodes=2"])
    with pytest.raises(ConfigError, match=r"cluster.train_workers_per_node \(2\) must not exceed cluster.gpus_per_node \(1\)"):
        load_config(None, ["cluster.train_workers_per_node=2", "cluster.gpus_per_node=1"])
    offline = ["grpo.mode=offline", "data.train.data_path=scored.jsonl"]
    cfg = load_config(None, ["cluster.num_nodes=2", "cluster.train_workers_per_node=1", *offline])
    assert cfg.cluster.num_nodes * cfg.cluster.train_workers_per_node == 2
    with pytest.raises(ConfigError, match=r"cluster.ray_address is '10.0.0.5:6379' but nothing runs on Ray"):
        load_config(None, ["cluster.ray_address=10.0.0.5:6379", *offline])
    cfg = load_config(None, ["cluster.ray_address=10.0.0.5:6379", "cluster.train_workers_per_node=1", *offline])
    assert cfg.cluster.ray_address == "10.0.0.5:6379"

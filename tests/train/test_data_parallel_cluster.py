"""Data-parallel updates across nodes: a simulated 2-node Ray cluster on 127.0.0.1 that the trainer
joins through ``cluster.ray_address``, as it would join one started with ``ray start``.

Two ``ray.cluster_utils.Cluster`` nodes of 1 CPU each (raylet, object store, workers of their own,
different node ids) on one machine. Its own module: the other data-parallel tests hold a private Ray
in this process, and the trainer here must connect (and disconnect) itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ray_loopback import listeners, off_loopback, ray_processes, two_node_cluster_fixture
from tests.train.helpers import save_random_tiny
from tests.train.test_data_parallel import COMPARED, _run, _weights
from tests.train.test_trainer_offline import write_scored

ray = pytest.importorskip("ray")


two_nodes = two_node_cluster_fixture()


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.timeout(300)
def test_one_worker_per_node_gives_the_losses_and_weights_of_one_process(
    tmp_path: Path, two_nodes: Any, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.train import data_parallel

    model_dir = save_random_tiny(tmp_path / "tiny", seed=0)
    data = write_scored(tmp_path / "scored.jsonl")
    single = _run(tmp_path, model_dir, data, "single")
    assert not ray.is_initialized()  # the reference ran without Ray

    seen: list[dict[str, Any]] = []
    original = data_parallel.TrainingWorkers.update

    def observed(self: Any, batch: Any) -> Any:  # while the workers are up: where they run, what listens
        raylets = [p.pid for p in ray_processes() if p.name() == "raylet"]
        seen.append({"where": list(self.where), "listeners": listeners(), "raylets": raylets,
                     "driver": ray.util.get_node_ip_address()})  # fmt: skip
        two_nodes.started.update(pid for _, _, pid in self.where)
        return original(self, batch)

    monkeypatch.setattr(data_parallel.TrainingWorkers, "update", observed)
    parallel = _run(
        tmp_path, model_dir, data, "dp",
        f"cluster.ray_address={two_nodes.address}", "cluster.num_nodes=2", "cluster.train_workers_per_node=1",
    )  # fmt: skip
    assert not ray.is_initialized()  # the trainer disconnected; the cluster is still up
    assert len(seen) == 2, "both steps were updated by the workers"

    where = seen[0]["where"]
    nodes = {n["NodeID"] for n in two_nodes.global_state.node_table() if n["Alive"]}
    assert len(where) == 2 and len({node for node, _, _ in where}) == 2, where  # one worker per node
    assert {node for node, _, _ in where} == nodes
    assert {ip for _, ip, _ in where} == {"127.0.0.1"} and seen[0]["driver"] == "127.0.0.1"
    found = seen[0]["listeners"]
    assert len(seen[0]["raylets"]) == 2 and {"raylet", "gcs_server"} <= {n for n, *_ in found}, found
    assert any(name.startswith("ray::TrainingWorker") for name, *_ in found), found
    assert off_loopback(found) == [], f"sockets bound off loopback: {off_loopback(found)}"

    assert [r["step"] for r in parallel] == [r["step"] for r in single] == [1, 2]
    for mine, reference in zip(parallel, single, strict=True):
        for key in COMPARED:
            assert mine[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    assert single[0]["grad_norm"] > 0 and single[0]["loss"] != 0
    dp, one = _weights(tmp_path / "dp" / "ckpt" / "step_2"), _weights(tmp_path / "single" / "ckpt" / "step_2")
    start = _weights(model_dir)
    assert max(float((one[k].float() - start[k].float()).abs().max()) for k in one if k in start) > 1e-4
    assert dp.keys() == one.keys()
    for key in one:
        assert torch.allclose(dp[key].float(), one[key].float(), rtol=1e-4, atol=1e-6), key


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("nodes", "per_node", "named"),
    [(3, 1, "cluster.num_nodes=3 x cluster.train_workers_per_node=1"),  # more nodes than the cluster has
     (2, 2, "cluster.num_nodes=2 x cluster.train_workers_per_node=2")],  # more CPUs than a node has
)  # fmt: skip
def test_a_cluster_too_small_is_a_clear_error_at_start_not_a_hang(
    tmp_path: Path, two_nodes: Any, nodes: int, per_node: int, named: str
) -> None:
    from gym_bridge.train.config import load_config
    from gym_bridge.train.data_parallel import TrainingWorkers
    from gym_bridge.train.setup import build_learner

    model_dir = save_random_tiny(tmp_path / "tiny", seed=1)
    cfg = load_config(
        None,
        [f"policy.model_name={model_dir}", "grpo.mode=offline", f"data.train.data_path={tmp_path / 'unused.jsonl'}",
         f"cluster.ray_address={two_nodes.address}", f"cluster.num_nodes={nodes}",
         f"cluster.train_workers_per_node={per_node}", "cluster.placement_timeout_s=3"],
    )  # fmt: skip
    learner, _ = build_learner(cfg, None, rollout_process=False)
    with pytest.raises(RuntimeError) as error:
        TrainingWorkers(cfg, learner)
    message = str(error.value)
    assert named in message and "do not fit the Ray cluster" in message, message
    assert "STRICT_SPREAD" in message and "2 alive node(s)" in message, message
    assert not ray.is_initialized()  # the failed start gave its connection back

    ray.init(address=two_nodes.address, log_to_driver=False)
    try:  # ... and its reservation: the cluster's CPUs are all free again
        assert ray.available_resources().get("CPU") == 2
        from ray.util import placement_group_table

        assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
    finally:
        ray.shutdown()


def test_an_unreachable_ray_address_is_an_error_naming_the_key(tmp_path: Path) -> None:
    import socket

    from gym_bridge.distributed.ray_cluster import connect_ray

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match=rf"cluster.ray_address \(or RAY_ADDRESS\) is '127.0.0.1:{port}'"):
        connect_ray(f"127.0.0.1:{port}")
    assert not ray.is_initialized()


def test_the_address_comes_from_the_key_then_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_bridge.distributed.ray_cluster import _is_loopback_address, resolve_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None) is None  # a private Ray on 127.0.0.1
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert resolve_address(None) == "10.0.0.5:6379"
    assert resolve_address("127.0.0.1:6379") == "127.0.0.1:6379"  # the key wins
    assert _is_loopback_address("127.0.0.1:6379") and _is_loopback_address("[::1]:6379")
    assert not _is_loopback_address("10.0.0.5:6379") and not _is_loopback_address("auto")


def test_collectives_bind_the_interface_of_the_ray_node_address() -> None:
    from gym_bridge.train.data_parallel import _interface_of

    assert _interface_of("127.0.0.1") == "lo"
    assert _interface_of("192.0.2.77") is None  # TEST-NET: on no interface here


@pytest.mark.timeout(180)
def test_generation_replicas_join_the_cluster_through_its_address(two_nodes: Any, one_thread: None) -> None:
    from gym_bridge.generation.backend import GenerationRequest, SamplingParams
    from gym_bridge.generation.ray_backend import RayBackend
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.tokenizer import build_tokenizer
    from tests.generation.test_ray_backend import make_llama

    tokenizer = build_tokenizer()
    model = make_llama(tokenizer, seed=0)
    requests = [
        GenerationRequest(tokenizer.encode(f"What is {i} + 1?"), SamplingParams(max_new_tokens=4, seed=i))
        for i in range(4)
    ]
    backend = RayBackend(model, tokenizer, seed=7, num_workers=2, ray_address=two_nodes.address)
    try:  # 1 CPU per node: the PACK group had to put one replica on each node
        nodes = ray.get([r.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                         for r in backend.replicas])  # fmt: skip
        assert len(set(nodes)) == 2, nodes
        results = backend.generate(requests)
    finally:
        backend.close()
    assert not ray.is_initialized()  # it joined, so it disconnected; the cluster stays up
    expected = TransformersBackend(model, tokenizer, seed=7).generate(requests)
    assert [r.token_ids for r in results] == [r.token_ids for r in expected]

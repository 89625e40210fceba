"""Data-parallel policy updates on Ray: ``cluster.num_nodes x cluster.train_workers_per_node`` workers.

Each worker is a Ray actor with a replica of the policy, its optimizer and LR schedule (built as the
trainer builds its own, then loaded with the trainer's weights and optimizer state, so a resumed run
resumes there too). For every optimizer step of a GRPO step, worker ``r`` of ``W`` runs micro-batches
``r, r + W, ...`` of it, each loss normalised by the whole global batch's valid tokens or sequences
(as in one process), so the gradients summed over the workers (``torch.distributed.all_reduce``: gloo
on CPU, NCCL on GPU) are the one-process gradient; every worker then clips and steps identically: one
optimizer step per global batch, replicas that stay equal. After the update the trainer's own model,
optimizer and schedule take rank 0's, so log-probs, generation refits and checkpoints work as before.

The trainer still computes the step's ``prev`` and reference log-probs, and generation and the
environments stay where they were; only the update is spread.

Rendezvous: on one node (a private Ray on 127.0.0.1, :func:`~gym_bridge.generation.ray_local.start_local_ray`)
through a file store, gloo bound to the loopback interface: no socket leaves 127.0.0.1. Across nodes
(``cluster.num_nodes > 1``): the existing Ray cluster at ``RAY_ADDRESS`` (``ray start --head`` and
``ray start --address=...``), ``train_workers_per_node`` workers pinned to each of ``num_nodes`` nodes,
a TCP store on rank 0's node.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
from datetime import timedelta
from typing import Any

import torch

from gym_bridge.train.config import MasterConfig
from gym_bridge.train.loss import reduce_microbatch_metrics
from gym_bridge.train.update import Learner, StepBatch, _step_scheduler, optimizer_batches, optimizer_steps

__all__ = ["TrainingWorker", "TrainingWorkers", "merge_worker_steps", "start_training_workers"]

_FROM_RANK_0 = ("grad_norm", "amp_skipped_steps")
"""Per-step metrics every worker computes identically after the all-reduce (not summed over workers)."""


def _loopback_interface() -> str | None:
    """The name of the interface holding 127.0.0.1 (``lo`` on Linux), for gloo to bind."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return None


class TrainingWorker:
    """One data-parallel rank (the body of a Ray actor): a policy replica that updates on its share."""

    def __init__(self, cfg: MasterConfig, rank: int, world_size: int, threads: int) -> None:
        from gym_bridge.train.setup import build_learner

        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        learner, _ = build_learner(cfg, None, rollout_process=False)
        learner.reference = None  # the trainer computes reference log-probs; no frozen copy here
        torch.set_num_threads(threads)
        self.learner = learner

    def node_address(self) -> tuple[str, int]:
        """This node's IP and a free port on it (rank 0's, for a TCP rendezvous across nodes)."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
            return ip, probe.getsockname()[1]

    def join(self, init_method: str, backend: str, loopback: bool, timeout_s: float) -> int:
        """Join the process group; returns this process's id (the caller ends only what it started)."""
        import torch.distributed as dist

        if loopback and backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
            interface = _loopback_interface()
            if interface is not None:
                os.environ["GLOO_SOCKET_IFNAME"] = interface
        dist.init_process_group(
            backend, init_method=init_method, rank=self.rank, world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )  # fmt: skip
        return os.getpid()

    def load_state(self, weights: dict[str, torch.Tensor], optimizer: dict[str, Any], scheduler: dict[str, Any]) -> None:
        """Take the trainer's trainable weights, optimizer state and schedule (a fresh or resumed run's)."""
        params = dict(self.learner.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
        self.learner.optimizer.load_state_dict(optimizer)
        self.learner.scheduler.load_state_dict(scheduler)

    # the shard protocol of gym_bridge.train.update.optimizer_steps: rank, world_size and this
    def all_reduce_gradients(self, params: list[torch.Tensor]) -> None:
        """Sum the gradients over the ranks, one flat buffer per dtype. A parameter no rank has a
        gradient for keeps none (AdamW then leaves it alone, as in one process)."""
        import torch.distributed as dist

        if not params:
            return
        device = params[0].device
        has_grad = torch.tensor([float(p.grad is not None) for p in params], device=device)
        dist.all_reduce(has_grad, op=dist.ReduceOp.MAX)
        used = [p for p, flag in zip(params, has_grad.tolist(), strict=True) if flag]
        for p in used:
            if p.grad is None:  # this rank ran no micro-batch that reached it
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in used:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for group in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    def update(self, batch: StepBatch) -> tuple[list[dict[str, float]], float | None]:
        """This rank's share of the step's optimizer steps: its metrics per step, and float16's scale."""
        steps = optimizer_steps(self.cfg, self.learner, batch, shard=self)
        scaler = self.learner.scaler
        return steps, (float(scaler.get_scale()) if scaler is not None else None)

    def skip(self, num_samples: int) -> None:
        """A step without learning signal: the schedule advances as the trainer's does."""
        for _ in optimizer_batches(self.cfg, num_samples):
            _step_scheduler(self.learner.scheduler)

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
        """Trainable weights, optimizer state and schedule, for the trainer to mirror."""
        weights = {n: p.detach().cpu() for n, p in self.learner.model.named_parameters() if p.requires_grad}
        return weights, self.learner.optimizer.state_dict(), self.learner.scheduler.state_dict()

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def merge_worker_steps(per_worker: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Each optimizer step's metrics over the workers' shares: sums (min/max for ``*_min``/``*_max``)
    of the micro-batch metrics, and rank 0's gradient norm (the same on every rank)."""
    merged = []
    for parts in zip(*per_worker, strict=True):
        step = reduce_microbatch_metrics([{k: v for k, v in p.items() if k not in _FROM_RANK_0} for p in parts])
        step.update({k: parts[0][k] for k in _FROM_RANK_0 if k in parts[0]})
        merged.append(step)
    return merged


def _trainable_state(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu() for n, p in learner.model.named_parameters() if p.requires_grad}


class TrainingWorkers:
    """The trainer's handle on the data-parallel workers: :attr:`Learner.workers`."""

    def __init__(self, cfg: MasterConfig, learner: Learner, *, start_timeout_s: float = 600.0) -> None:
        from gym_bridge.generation.ray_local import import_ray, start_local_ray

        ray = import_ray()
        cluster = cfg.cluster
        self.learner = learner
        self.world_size = cluster.num_nodes * cluster.train_workers_per_node
        self.workers: list[Any] = []
        self._owns_ray = False
        self._tmp = tempfile.TemporaryDirectory(prefix="gym-bridge-dp-")
        gpus = 1 if cluster.gpus_per_node > 0 else 0
        try:
            if cluster.num_nodes > 1:  # an existing cluster: RAY_ADDRESS, else the local `ray start` head
                if not ray.is_initialized():
                    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
                strategies = _node_affinity(ray, cluster.num_nodes, cluster.train_workers_per_node, gpus)
            else:
                cpus = self.world_size + _ray_generation_cpus(cfg)
                self._owns_ray = start_local_ray(cpus, num_gpus=cluster.gpus_per_node)
                strategies = [None] * self.world_size
            actor = ray.remote(TrainingWorker)
            options = [{"num_cpus": 1, "num_gpus": gpus, **({"scheduling_strategy": s} if s else {})} for s in strategies]
            self.workers = [
                actor.options(**options[rank]).remote(cfg, rank, self.world_size, 1) for rank in range(self.world_size)
            ]
            backend = "nccl" if gpus else "gloo"
            if cluster.num_nodes > 1:
                ip, port = ray.get(self.workers[0].node_address.remote(), timeout=start_timeout_s)
                init_method, loopback = f"tcp://{ip}:{port}", False
            else:
                init_method, loopback = f"file://{self._tmp.name}/rendezvous", True
            self.pids = ray.get(
                [w.join.remote(init_method, backend, loopback, start_timeout_s) for w in self.workers],
                timeout=start_timeout_s,
            )
            state = [
                ray.put(part)
                for part in (_trainable_state(learner), learner.optimizer.state_dict(), learner.scheduler.state_dict())
            ]
            ray.get([w.load_state.remote(*state) for w in self.workers], timeout=start_timeout_s)
        except BaseException:
            self.close()
            raise
        self._ray = ray

    def update(self, batch: StepBatch) -> tuple[list[dict[str, float]], float | None]:
        """Run the step's updates on the workers; then mirror rank 0 here. Returns the merged
        per-optimizer-step metrics and float16's loss scale (None otherwise)."""
        ray = self._ray
        light = dataclasses.replace(batch, samples=[dataclasses.replace(s, record=None) for s in batch.samples])
        shipped = ray.put(light)  # once into the object store, read by every worker
        results = ray.get([w.update.remote(shipped) for w in self.workers])
        self._mirror_rank_0()
        return merge_worker_steps([steps for steps, _ in results]), results[0][1]

    def skip(self, num_samples: int) -> None:
        self._ray.get([w.skip.remote(num_samples) for w in self.workers])

    def _mirror_rank_0(self) -> None:
        weights, optimizer, scheduler = self._ray.get(self.workers[0].state.remote())
        params = dict(self.learner.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
        self.learner.optimizer.load_state_dict(optimizer)
        self.learner.scheduler.load_state_dict(scheduler)

    def close(self) -> None:
        """Leave the process group, end the workers (by actor handle) and a Ray this started."""
        import ray

        if self.workers:
            try:
                ray.get([w.leave.remote() for w in self.workers], timeout=30)
            except Exception:  # a worker already gone: kill below
                pass
            for worker in self.workers:
                ray.kill(worker)
            self.workers = []
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
        self._tmp.cleanup()


def _ray_generation_cpus(cfg: MasterConfig) -> int:
    """Logical CPUs the ray generation backend will ask the same private Ray for."""
    generation = cfg.policy.generation
    if generation.backend != "ray":
        return 0
    return generation.ray.num_workers * generation.ray.threads_per_worker


def _node_affinity(ray: Any, num_nodes: int, per_node: int, gpus: int) -> list[Any]:
    """A scheduling strategy per rank: ``per_node`` ranks pinned to each of ``num_nodes`` alive nodes
    (this one first), refused when the cluster has fewer nodes that can hold them."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    fits = [
        n for n in ray.nodes()
        if n.get("Alive") and n["Resources"].get("CPU", 0) >= per_node and n["Resources"].get("GPU", 0) >= gpus * per_node
    ]  # fmt: skip
    fits.sort(key=lambda n: n["NodeID"] != here)
    if len(fits) < num_nodes:
        raise RuntimeError(
            f"cluster.num_nodes is {num_nodes} but the Ray cluster has {len(fits)} alive node(s) with "
            f"{per_node} CPUs{f' and {gpus * per_node} GPUs' if gpus else ''} for cluster.train_workers_per_node"
        )
    return [
        NodeAffinitySchedulingStrategy(node["NodeID"], soft=False) for node in fits[:num_nodes] for _ in range(per_node)
    ]


def start_training_workers(cfg: MasterConfig, stack: Any, learner: Learner) -> TrainingWorkers | None:
    """The run's data-parallel workers (closed with ``stack``), or None to train in this process."""
    if cfg.cluster.train_workers_per_node == 0:
        return None
    workers = TrainingWorkers(cfg, learner)
    stack.callback(workers.close)
    return workers

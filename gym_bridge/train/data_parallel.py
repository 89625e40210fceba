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

Placement: one Ray placement group, a bundle of ``train_workers_per_node`` CPUs (GPUs) per node,
STRICT_SPREAD over ``num_nodes`` nodes (STRICT_PACK for one): Ray places all of it or none, every
node's workers share its bundle, and no two bundles share a node (per-node PACK groups, NeMo RL's
default, can land on one node when it has room). Waited for with ``cluster.placement_timeout_s``;
too small a cluster is an error naming the keys. Ray: a private one on 127.0.0.1
(:func:`~gym_bridge.distributed.ray_local.start_local_ray`), or the cluster at ``cluster.ray_address``
/ ``RAY_ADDRESS`` (:mod:`~gym_bridge.distributed.ray_cluster`).

Rendezvous: a TCP store that rank 0 serves on its node's IP as Ray reports it (127.0.0.1 on a
private or simulated cluster), from a socket bound to that address alone (torch's own store listens on
every interface); gloo (NCCL) bound to the interface holding each worker's node IP.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta
from typing import Any

import torch

from gym_bridge.distributed.ray_cluster import gather
from gym_bridge.train.algorithm.loss import reduce_microbatch_metrics
from gym_bridge.train.config import MasterConfig
from gym_bridge.train.learner.update import (
    Learner,
    StepBatch,
    _step_scheduler,
    optimizer_batches,
    optimizer_steps,
)
from gym_bridge.train.samplers.env_replicas import private_ray_cpus

__all__ = ["TrainingWorker", "TrainingWorkers", "merge_worker_steps", "start_training_workers"]

_FROM_RANK_0 = ("grad_norm", "amp_skipped_steps")
"""Per-step metrics every worker computes identically after the all-reduce (not summed over workers)."""


def _interface_of(ip: str) -> str | None:
    """The name of the interface holding ``ip`` (``lo`` for 127.0.0.1 on Linux), for gloo/NCCL to bind."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)):
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

    def where(self) -> tuple[str, str, int]:
        """Ray's node id and node IP for this worker, and its process id."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def serve_store(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0: serve the rendezvous store on this node's IP (as Ray reports it), nowhere else."""
        import torch.distributed as dist

        ip = ray_node_ip()
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.bind((ip, 0))
        self._listener.listen(128)
        port = self._listener.getsockname()[1]
        self._store = dist.TCPStore(
            ip, port, self.world_size, True, timedelta(seconds=timeout_s),
            wait_for_workers=False, master_listen_fd=self._listener.fileno(),
        )  # fmt: skip
        return ip, port

    def join(self, master: tuple[str, int], backend: str, timeout_s: float) -> int:
        """Join the process group through rank 0's store; returns this process's id (the caller ends
        only what it started)."""
        import torch.distributed as dist

        variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
        if variable not in os.environ:  # the interface of this node's Ray address, not a guess
            interface = _interface_of(ray_node_ip())
            if interface is not None:
                os.environ[variable] = interface
        store = getattr(self, "_store", None)
        if store is None:
            store = dist.TCPStore(master[0], master[1], self.world_size, False, timedelta(seconds=timeout_s))
        dist.init_process_group(
            backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timedelta(seconds=timeout_s)
        )
        return os.getpid()

    def load_state(self, weights: dict[str, torch.Tensor], optimizer: dict[str, Any], scheduler: dict[str, Any]) -> None:
        """Take the trainer's trainable weights, optimizer state and schedule (a fresh or resumed run's)."""
        load_learner_state(self.learner, weights, optimizer, scheduler)

    # the shard protocol of gym_bridge.train.learner.update.optimizer_steps: rank, world_size and this
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
        self._store = None
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.close()


def ray_node_ip() -> str:
    """This process's node IP as Ray has it (the address ``ray start`` registered the node under)."""
    import ray

    return ray.util.get_node_ip_address()


def merge_worker_steps(per_worker: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Each optimizer step's metrics over the workers' shares: sums (min/max for ``*_min``/``*_max``)
    of the micro-batch metrics, and rank 0's gradient norm (the same on every rank)."""
    merged = []
    for parts in zip(*per_worker, strict=True):
        step = reduce_microbatch_metrics([{k: v for k, v in p.items() if k not in _FROM_RANK_0} for p in parts])
        step.update({k: parts[0][k] for k in _FROM_RANK_0 if k in parts[0]})
        merged.append(step)
    return merged


def load_learner_state(
    learner: Learner, weights: dict[str, torch.Tensor], optimizer: dict[str, Any], scheduler: dict[str, Any]
) -> None:
    """Copy trainable weights, optimizer state and schedule into ``learner`` (a worker's or the trainer's)."""
    params = dict(learner.model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    learner.optimizer.load_state_dict(optimizer)
    learner.scheduler.load_state_dict(scheduler)


def _trainable_state(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu() for n, p in learner.model.named_parameters() if p.requires_grad}


class TrainingWorkers:
    """The trainer's handle on the data-parallel workers: :attr:`Learner.workers`."""

    def __init__(self, cfg: MasterConfig, learner: Learner, *, start_timeout_s: float = 600.0) -> None:
        from gym_bridge.distributed.ray_cluster import connect_ray, in_bundle, reserve, resolve_address
        from gym_bridge.distributed.ray_local import import_ray, start_local_ray

        ray = import_ray()
        cluster = cfg.cluster
        per_node = cluster.train_workers_per_node
        self.learner = learner
        self.world_size = cluster.num_nodes * per_node
        self.workers: list[Any] = []
        self.placement: Any = None
        self.where: list[tuple[str, str, int]] = []
        self._owns_ray = False
        gpus = 1 if cluster.gpus_per_node > 0 else 0
        try:
            address = resolve_address(cluster.ray_address)
            if address is None and cluster.num_nodes > 1 and not ray.is_initialized():
                address = "auto"  # the `ray start` head on this node
            if address is not None:
                self._owns_ray = connect_ray(address)
            else:
                self._owns_ray = start_local_ray(private_ray_cpus(cfg), num_gpus=cluster.gpus_per_node)
            self.placement = reserve(
                [{"CPU": per_node, "GPU": gpus * per_node}] * cluster.num_nodes,
                "STRICT_SPREAD" if cluster.num_nodes > 1 else "STRICT_PACK",
                cluster.placement_timeout_s,
                f"cluster.num_nodes={cluster.num_nodes} x cluster.train_workers_per_node={per_node} training "
                f"workers ({'1 GPU' if gpus else '1 CPU'} each, {per_node} per node on "
                f"{cluster.num_nodes} distinct node(s)) do not fit the Ray cluster",
            )
            actor = ray.remote(TrainingWorker)
            self.workers = [
                actor.options(
                    num_cpus=1, num_gpus=gpus, scheduling_strategy=in_bundle(self.placement, rank // per_node)
                ).remote(cfg, rank, self.world_size, 1)
                for rank in range(self.world_size)
            ]
            self.where = ray.get([w.where.remote() for w in self.workers], timeout=start_timeout_s)
            master = ray.get(self.workers[0].serve_store.remote(start_timeout_s), timeout=start_timeout_s)
            backend = "nccl" if gpus else "gloo"
            self.pids = ray.get(
                [w.join.remote(master, backend, start_timeout_s) for w in self.workers], timeout=start_timeout_s
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

    @property
    def labels(self) -> list[str]:
        """What each rank's worker is and where it runs, for errors that name one."""
        return [
            f"data-parallel training worker rank {rank} of {self.world_size} (node {node[:12]}, pid {pid})"
            for rank, (node, _, pid) in enumerate(self.where)
        ]

    @property
    def node_ids(self) -> list[str]:
        """Ray's node id of each rank's worker."""
        return [node for node, _, _ in self.where]

    def update(self, batch: StepBatch) -> tuple[list[dict[str, float]], float | None]:
        """Run the step's updates on the workers; then mirror rank 0 here. Returns the merged
        per-optimizer-step metrics and float16's loss scale (None otherwise)."""
        ray = self._ray
        light = dataclasses.replace(batch, samples=[dataclasses.replace(s, record=None) for s in batch.samples])
        shipped = ray.put(light)  # once into the object store, read by every worker
        results = gather(ray, [w.update.remote(shipped) for w in self.workers], self.labels, "the policy update")
        self._mirror_rank_0()
        return merge_worker_steps([steps for steps, _ in results]), results[0][1]

    def skip(self, num_samples: int) -> None:
        gather(self._ray, [w.skip.remote(num_samples) for w in self.workers], self.labels, "a step without update")

    def _mirror_rank_0(self) -> None:
        (state,) = gather(self._ray, [self.workers[0].state.remote()], self.labels[:1], "sending its weights back")
        load_learner_state(self.learner, *state)

    def close(self) -> None:
        """Leave the process group, end the workers (by actor handle), give the placement back, and
        shut down (or disconnect from) a Ray this started (joined)."""
        import ray

        from gym_bridge.distributed.ray_cluster import remove_placement

        if self.workers:
            try:
                ray.get([w.leave.remote() for w in self.workers], timeout=30)
            except Exception:  # a worker already gone: kill below
                pass
            for worker in self.workers:
                ray.kill(worker)
            self.workers = []
        if self.placement is not None:
            remove_placement(self.placement)
            self.placement = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False


def start_training_workers(cfg: MasterConfig, stack: Any, learner: Learner) -> TrainingWorkers | None:
    """The run's data-parallel workers (closed with ``stack``), or None to train in this process."""
    if cfg.cluster.train_workers_per_node == 0:
        return None
    workers = TrainingWorkers(cfg, learner)
    stack.callback(workers.close)
    return workers

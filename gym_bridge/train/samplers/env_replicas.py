"""``env.<name>.replicas``: copies of a built-in resources server as Ray actors, for the agent loop to spread over.

Why: one server in the trainer's process scores every rollout of a step on the trainer's cores; a
slow verifier (code sandboxes, math with timeouts) or a stateful env with many sessions then bounds
the step. Here each replica is a Ray actor (:class:`EnvReplica`) that starts the server with
:func:`~gym_bridge.rollout.envs.running_env`, as a ``collect --ray`` shard does on its node, but listening on
its node's address (Ray's, so 127.0.0.1 on a private or simulated cluster) so the trainer's agent
loop reaches it over HTTP, with a bearer token made for the run. One placement group per env
(:func:`~gym_bridge.distributed.ray_cluster.reserve`: all replicas or a clear error naming the keys),
``env.<name>.placement_strategy`` (SPREAD by default), ``num_workers`` CPUs (else 1) per bundle.
The trainer gets :class:`~gym_bridge.rollout.env_router.ReplicaEndpoints`; the agent loop's
:class:`~gym_bridge.rollout.env_router.SessionRouter` keeps each session on one replica.

Ray: the cluster at ``cluster.ray_address`` (or ``RAY_ADDRESS``), else the Ray the data-parallel
workers already started, else a private one on 127.0.0.1 sized for everything the run puts there
(:func:`private_ray_cpus`). Closing kills the actors by handle and gives the placement back.
"""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from typing import Any

from gym_bridge.rollout.env_router import ReplicaEndpoints
from gym_bridge.train.config import EnvConfig, MasterConfig

__all__ = ["EnvReplica", "EnvReplicas", "private_ray_cpus", "start_env_replicas"]


def _cpus(env: EnvConfig) -> int:
    return env.num_workers or 1


def private_ray_cpus(cfg: MasterConfig) -> int:
    """Logical CPUs a private Ray needs for all the run puts on it: data-parallel workers, ray
    generation replicas and env replicas."""
    generation = cfg.policy.generation
    cpus = cfg.cluster.num_nodes * cfg.cluster.train_workers_per_node
    if generation.backend == "ray":
        cpus += generation.ray.num_workers * generation.ray.threads_per_worker
    return cpus + sum(env.replicas * _cpus(env) for env in cfg.env.values())


class EnvReplica:
    """One replica (the body of a Ray actor): a built-in server on this node's address."""

    def __init__(self, server: str, workers: int | None, settings: dict[str, Any], token: str) -> None:
        from gym_bridge.distributed.ray_cluster import node_here
        from gym_bridge.rollout.envs import running_env

        self._stack = ExitStack()
        self.place = node_here()
        network = {"host": self.place["node_ip"], "port": 0, "auth_token": token}
        self.url = self._stack.enter_context(running_env(server, workers=workers, **{**settings, **network}))

    def where(self) -> dict[str, Any]:
        """Node id, node address, process id and the server's URL."""
        return {**self.place, "url": self.url}

    def close(self) -> None:
        """Stop the server (and its worker pool) before the actor is killed."""
        self._stack.close()


class EnvReplicas:
    """``env.<name>.replicas`` actors of one env, placed together; :meth:`close` ends them."""

    def __init__(self, name: str, env: EnvConfig, placement_timeout_s: float, token: str,
                 start_timeout_s: float = 300.0) -> None:  # fmt: skip
        from gym_bridge.distributed.ray_cluster import in_bundle, reserve
        from gym_bridge.distributed.ray_local import import_ray

        ray = import_ray()
        self.name, self.token = name, token
        self._ray = ray
        self.actors: list[Any] = []
        self.where: list[dict[str, Any]] = []
        self.placement = None
        cpus = _cpus(env)
        try:
            self.placement = reserve(
                [{"CPU": cpus}] * env.replicas,
                env.placement_strategy,
                placement_timeout_s,
                f"env.{name}.replicas={env.replicas} ({cpus} CPU each, env.{name}.placement_strategy="
                f"{env.placement_strategy}) do not fit the Ray cluster",
            )
            actor = ray.remote(EnvReplica)
            self.actors = [
                actor.options(num_cpus=cpus, scheduling_strategy=in_bundle(self.placement, i)).remote(
                    env.server or name, env.num_workers, dict(env.config), token
                )
                for i in range(env.replicas)
            ]
            self.where = ray.get([a.where.remote() for a in self.actors], timeout=start_timeout_s)
        except BaseException:
            self.close()
            raise

    def endpoints(self) -> ReplicaEndpoints:
        """Where the replicas listen, labelled with their nodes, and the token they want."""
        labels = [
            f"env.{self.name} replica {i} on node {w['node_id'][:12]} ({w['url']}, pid {w['pid']})"
            for i, w in enumerate(self.where)
        ]
        return ReplicaEndpoints([w["url"] for w in self.where], labels, self.token)

    def close(self) -> None:
        """Stop each server, kill the actors by handle, give the placement back."""
        from gym_bridge.distributed.ray_cluster import close_actors, remove_placement

        if self.actors:
            close_actors(self._ray, self.actors)
            self.actors = []
        if self.placement is not None:
            remove_placement(self.placement)
            self.placement = None


def start_env_replicas(cfg: MasterConfig, stack: ExitStack) -> dict[str, EnvReplicas]:
    """Each ``env.<name>.replicas`` env's replicas (closed with ``stack``); {} when no env has any."""
    wanted = {name: env for name, env in cfg.env.items() if env.replicas}
    if not wanted:
        return {}
    from gym_bridge.distributed.ray_cluster import connect_ray, resolve_address
    from gym_bridge.distributed.ray_local import import_ray, start_local_ray

    ray = import_ray()
    address = resolve_address(cfg.cluster.ray_address)
    owned = connect_ray(address) if address else start_local_ray(private_ray_cpus(cfg))
    if owned:  # first in, last out: after every replica is gone
        stack.callback(ray.shutdown)
    token = secrets.token_urlsafe(24)
    started = {}
    for name, env in wanted.items():
        started[name] = EnvReplicas(name, env, cfg.cluster.placement_timeout_s, token)
        stack.callback(started[name].close)
    return started

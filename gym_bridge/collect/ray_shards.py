"""``collect --ray``: rollouts run on shards spread over a Ray cluster's nodes; this process writes the file.

Why this shape: the exactly-once and ``--resume`` guarantees live in the run loop and its writers
(:mod:`gym_bridge.collect.run`, :mod:`gym_bridge.collect.output`). So the driver keeps all of that
unchanged (task file, routing, materialized inputs, the one output file, failures, metrics), and only
the rollouts themselves move: one :class:`CollectShard` actor per alive node, pinned there, starts the
built-in envs (``--env math``) on its node and runs the agent loop (:func:`~gym_bridge.rollout.agent.run_rollout`)
against them and the model. Each finished rollout comes back to the driver as the actor call's result,
and the driver writes it as the single-process run does; a SIGKILL of the driver kills its actors (Ray
ends a dead driver's job) and ``--resume`` makes exactly the missing (task, repeat) pairs.

Work is spread by slot: the loop's worker ``i`` always uses shard ``i mod shards``, so each node holds
``concurrency / shards`` rollouts in flight and pulls the next row when one ends (a slow node takes fewer
rows; with ``--concurrency`` below the node count some nodes stay idle). The metrics file's
``run.ray.shards`` says which node each shard ran on, its envs' URLs and how many rollouts it made. A
shard lost mid-run (a node gone) stops the run with its node named; the rollouts already written stay,
and ``--resume`` finishes the rest on the nodes still alive (a shard that does not start is reported and
left out). An ``--env`` given as a URL is used as is by every shard, so it must be reachable from every
node, as must ``--model-url``.

Without an address Ray is started on 127.0.0.1 (:func:`~gym_bridge.distributed.ray_local.start_local_ray`);
with one (or ``RAY_ADDRESS``) the driver joins that cluster. The driver also starts the named envs
itself, only to answer ``/aggregate_metrics`` over the finished file at the end.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from gym_bridge.collect.client import ClientPool, connection_cap
from gym_bridge.collect.config import CollectConfig, CollectError, CollectResult, check_config
from gym_bridge.collect.output import check_apart, output_lock, prepare_output, side_files
from gym_bridge.collect.routing import EnvRoute, parse_env_args
from gym_bridge.collect.run import collect
from gym_bridge.collect.summary import RunStats
from gym_bridge.rollout.agent import AgentConfig, Rollout, run_rollout

__all__ = ["LOCAL", "CollectShard", "RayShards", "collect_on_ray", "join_ray"]

LOCAL = "local"
"""``--ray`` without an address: ``RAY_ADDRESS`` if set, else a private Ray started on 127.0.0.1."""


class CollectShard:
    """One node's share of the run (a Ray actor pinned to the node): its own envs, its own HTTP pool."""

    def __init__(self, targets: dict[str, str], slots: int) -> None:
        from gym_bridge.rollout.envs import running_env

        self._stack = ExitStack()
        self.url_of = {name: self._stack.enter_context(running_env(target)) for name, target in targets.items()}
        self.slots = slots
        self.pool: ClientPool | None = None

    def where(self) -> dict[str, Any]:
        """The node this shard runs on (for the metrics file) and its process id."""
        from gym_bridge.distributed.ray_cluster import node_here

        return {**node_here(), "env_urls": dict(self.url_of)}

    async def run(
        self, task: dict[str, Any], env_name: str, agent_config: AgentConfig, extra: dict[str, Any] | None
    ) -> Rollout:
        """One rollout against this node's env ``env_name`` (a URL env is the same URL everywhere)."""
        if self.pool is None:  # made in the actor's event loop, where it is used
            self.pool = ClientPool(self.slots, connection_cap(), hosts=len(self.url_of) + 1)
        return await run_rollout(
            self.pool.session, task, self.url_of[env_name], agent_config, extra_params=extra
        )

    async def close(self) -> None:
        """Close the HTTP pool and stop the envs this shard started."""
        if self.pool is not None:
            await self.pool.aclose()
        self._stack.close()


class RayShards:
    """The driver's side: one :class:`CollectShard` per alive node, and the per-shard counts
    (a :class:`~gym_bridge.collect.run.RolloutExecutor`)."""

    same_machine = False
    """The rollouts run on the cluster's nodes: this machine's limits do not bound them."""

    def __init__(
        self,
        ray: Any,
        routes: list[EnvRoute],
        concurrency: int,
        *,
        report: Callable[[str], None] = print,
        start_timeout_s: float = 300.0,
    ) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
        if not nodes:
            raise CollectError("--ray: the Ray cluster has no alive node")
        targets = {route.key or route.target: route.target for route in routes}
        slots = concurrency  # the most a shard can hold (all of the run's rollouts in flight, if others are lost)
        actor = ray.remote(CollectShard)
        self.actors = [
            actor.options(
                num_cpus=0,  # pinned by node, not by CPUs: a node busy with other work still collects
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                max_concurrency=max(8, 2 * slots),
            ).remote(targets, slots)
            for node in nodes
        ]
        refs = [a.where.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=start_timeout_s)
        places, problems = [], []
        for node, a, ref in zip(nodes, self.actors, refs, strict=True):
            try:
                if ref not in ready:
                    raise TimeoutError(f"not up after {start_timeout_s:.0f} s")
                places.append((a, ray.get(ref)))
            except Exception as e:  # an env that did not start there, or a node just lost
                problems.append(f"node {node['NodeID']} ({node.get('NodeManagerAddress')}): {_first_line(e)}")
                ray.kill(a)
        if not places:
            raise CollectError(f"--ray: no collection shard started; {problems[0]}")
        for problem in problems:
            report(f"--ray: no shard on {problem}; collecting on the other nodes")
        self.actors = [a for a, _ in places]
        if concurrency < len(self.actors):
            report(f"--ray: --concurrency {concurrency} keeps only {concurrency} of {len(self.actors)} nodes busy")
        self.shards = [
            {"shard": i, "node_id": p["node_id"], "node_ip": p["node_ip"], "env_urls": p["env_urls"],
             "rollouts": 0, "failed": 0}  # fmt: skip
            for i, (_, p) in enumerate(places)
        ]

    async def run(
        self, worker: int, task: dict[str, Any], env_name: str, agent_config: AgentConfig, extra: dict[str, Any] | None
    ) -> Rollout:
        """Run the rollout on the worker's shard; a lost shard stops the run, naming its node."""
        i = worker % len(self.actors)
        try:
            rollout: Rollout = await self.actors[i].run.remote(task, env_name, agent_config, extra)
        except self.ray.exceptions.RayActorError as e:
            raise CollectError(
                f"--ray: shard {i} on node {self.shards[i]['node_id']} ({self.shards[i]['node_ip']}) was lost: "
                f"{_first_line(e)}; the finished rollouts are written, rerun with --resume for the rest"
            ) from None
        shard = self.shards[i]
        shard["rollouts" if rollout.record is not None else "failed"] += 1
        return rollout

    def run_metrics(self) -> dict[str, Any]:
        """``run.ray``: the shards, each with its node and its counts."""
        return {"ray": {"nodes": len({s["node_id"] for s in self.shards}), "shards": [dict(s) for s in self.shards]}}

    def close(self) -> None:
        """Stop every shard's envs, then the actors themselves."""
        from gym_bridge.distributed.ray_cluster import close_actors

        close_actors(self.ray, self.actors)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def join_ray(address: str | None, report: Callable[[str], None] = print) -> tuple[Any, bool]:
    """``(ray, owned)``: join the cluster at ``address`` (or ``RAY_ADDRESS``), else start Ray on 127.0.0.1.

    ``owned``: this call connected or started Ray, so the caller ends it with ``ray.shutdown()`` (which,
    for a joined cluster, only disconnects this driver). A missing Ray is a :class:`CollectError`
    naming the extra to install; a cluster that wants a token this process cannot give, one naming what
    to set (:func:`~gym_bridge.distributed.ray_cluster.check_token_auth`).
    """
    from gym_bridge.distributed.ray_local import (
        RAY_EXTRA_HINT,
        RayUnavailableError,
        import_ray,
        start_local_ray,
    )

    try:
        ray = import_ray()
    except RayUnavailableError:
        raise CollectError(f"--ray needs Ray: {RAY_EXTRA_HINT}") from None
    if ray.is_initialized():
        return ray, False
    address = address if address and address != LOCAL else os.environ.get("RAY_ADDRESS")
    if not address:
        try:
            return ray, start_local_ray(num_cpus=os.cpu_count() or 1)
        except RuntimeError as e:
            raise CollectError(f"--ray: {e}") from None
    from gym_bridge.distributed.ray_cluster import connect_ray

    try:
        return ray, connect_ray(address, keys="--ray (or RAY_ADDRESS)", say=report)
    except RuntimeError as e:
        raise CollectError(_first_line(e)) from None


def collect_on_ray(
    config: CollectConfig,
    address: str | None = None,
    *,
    report: Callable[[str], None] = print,
    on_progress: Callable[[RunStats, int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> CollectResult:
    """:func:`~gym_bridge.collect.collect` with the rollouts run on one shard per node of a Ray cluster."""
    check_config(config)
    if config.workers > 1:
        raise CollectError("--workers runs the rollouts in local processes; it cannot be combined with --ray "
                           "(which runs one shard per node)")  # fmt: skip
    if config.policy:
        raise CollectError(
            "--policy cannot be used with --ray: serve the model where every node reaches it and pass --model-url"
        )
    check_apart(config.tasks_path, "TASKS", (config.output_path, *side_files(config.output_path)))
    with output_lock(config.output_path):  # collect() below takes it again, in this process
        prepare_output(config.output_path, config.resume, config.overwrite, side_files(config.output_path))
        return _collect_on_ray(config, address, report=report, on_progress=on_progress, on_start=on_start)


def _collect_on_ray(
    config: CollectConfig,
    address: str | None,
    *,
    report: Callable[[str], None],
    on_progress: Callable[[RunStats, int], None] | None,
    on_start: Callable[[int], None] | None,
) -> CollectResult:
    """:func:`collect_on_ray`, once the run holds its output."""
    routes = parse_env_args(config.envs)
    ray, owned = join_ray(address, report)
    try:
        shards = RayShards(ray, routes, config.concurrency, report=report)
        try:
            # The files were prepared above; collect() checks them again, with nothing left to clear.
            return collect(config, report=report, on_progress=on_progress, on_start=on_start, executor=shards)
        finally:
            shards.close()
    finally:
        if owned:
            ray.shutdown()

"""The collector: task rows in, one NeMo Gym rollout line per (task, repeat) out, nothing lost.

This package owns ``gym-bridge collect``'s engine (the CLI is ``gym_bridge.commands.collect``):

* ``config``: what a run is asked to do (:class:`CollectConfig`), what it did, and :class:`CollectError`.
* ``routing``: which env each row goes to (``--env KEY=NAME_OR_URL``).
* ``tasks``: the task file streamed as ``(_ng_task_index, row)``; bad rows reported, not fatal.
* ``client``: the HTTP connection pool (routing the envs served in-process to them), and the embedded
  ``--policy`` model served as the endpoint.
* ``run``: the loop: a bounded queue, ``concurrency`` workers, a rollout written as soon as it ends; the
  envs it starts itself are called in-process on its event loop (:mod:`gym_bridge.serving.in_process`).
* ``output``: the rollouts file and its side files, flushed line by line and read back by ``--resume``.
* ``summary``: the run's counters, the metrics file's ``run`` block and the envs' aggregate metrics.
* ``ray_shards``: ``--ray``: the rollouts run on one shard per Ray node, this process still the one writer.
* ``reverify``: ``gym-bridge reverify``: a stored run re-scored by the env's ``/verify`` (the agent's own
  verify step), with collect's queue, files and ``--resume``, no model called.

What a run promises:

* **Streaming and bounded.** Memory does not grow with the task file; at most ``concurrency`` rollouts run.
* **NeMo Gym's order and indices.** Repeats come in "aabbcc" order; ``_ng_task_index`` is the row's index
  in the file (bad rows counted, so indices stay stable when one is fixed); ``_ng_rollout_index`` is the
  repeat. With ``seed`` set, each model request carries a seed hashed from (seed, task, repeat).
* **Nothing lost.** Each finished rollout is one complete, flushed line; ``resume`` runs exactly the
  missing (task, repeat) pairs, failed ones included. Failures go to ``<out stem>_failures.jsonl``.
* **NeMo Gym's side files.** ``<out stem>_materialized_inputs.jsonl`` (each (task, repeat) as it was run)
  and ``<out stem>_aggregate_metrics.json`` (each env's own ``/aggregate_metrics`` answer), so NeMo Gym's
  ``gym eval profile`` and ``gym eval reverify`` read a run of ours. Each rollout is the record NeMo Gym
  writes, its agent ``<env>_simple_agent`` in ``agent_ref``, its env ``<env>_environment_server`` in
  ``_ng_environment_server`` and its result type in ``_ng_result_type`` (``legacy_agent``)
  (:mod:`gym_bridge.records.nemo_gym_record`).
"""

from __future__ import annotations

from gym_bridge.collect.client import ClientPool, connection_cap, running_policy
from gym_bridge.collect.config import CollectConfig, CollectError, CollectResult
from gym_bridge.collect.output import (
    AGENT_LOOP_RESULT,
    ENV_SERVER,
    FAILURE_CLASS,
    RESULT_TYPE,
    ROLLOUT_INDEX,
    TASK_INDEX,
    LazyWriter,
    aggregate_metrics_path_for,
    failures_path_for,
    keyed_records,
    materialized_path_for,
    metrics_path_for,
    prepare_output,
    read_keys,
    write_json,
)
from gym_bridge.collect.routing import EnvRoute, Router, parse_env_args
from gym_bridge.collect.run import collect, collect_async, run_all
from gym_bridge.collect.summary import RunStats, env_aggregate_metrics
from gym_bridge.collect.tasks import count_rows, iter_tasks
from gym_bridge.records.seeding import rollout_seed
from gym_bridge.serving.event_loop import new_event_loop

__all__ = [
    "AGENT_LOOP_RESULT",
    "ENV_SERVER",
    "FAILURE_CLASS",
    "RESULT_TYPE",
    "ROLLOUT_INDEX",
    "TASK_INDEX",
    "ClientPool",
    "CollectConfig",
    "CollectError",
    "CollectResult",
    "EnvRoute",
    "LazyWriter",
    "Router",
    "RunStats",
    "aggregate_metrics_path_for",
    "collect",
    "collect_async",
    "connection_cap",
    "count_rows",
    "env_aggregate_metrics",
    "failures_path_for",
    "iter_tasks",
    "keyed_records",
    "materialized_path_for",
    "metrics_path_for",
    "new_event_loop",
    "parse_env_args",
    "prepare_output",
    "read_keys",
    "rollout_seed",
    "running_policy",
    "run_all",
    "write_json",
]

"""The run loop: task rows streamed to a fixed pool of workers, each finished rollout written at once.

Rows are read one at a time and handed to ``concurrency`` workers through a small queue, so memory does
not grow with the file and no more than ``concurrency`` rollouts run. Repeats come in NeMo Gym's
"aabbcc" order; with ``seed`` set, each rollout's model request carries ``seed`` = a hash of
(seed, task, repeat): repeats differ, and a rerun asks for the same samples.

:func:`collect_async` reads top to bottom: :meth:`CollectRun.start` (what a resumed run has done, the
files, the agent, the workers), :meth:`CollectRun.produce` and the workers (:meth:`CollectRun.work`, each
rollout written by :meth:`CollectRun.finish`), the envs' aggregates, :meth:`CollectRun.write_metrics`.
:func:`collect` around it starts the named envs and the policy, and serves envs in-process.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from gym_bridge.collect.client import ClientPool, concurrency_bound, connection_cap, running_policy
from gym_bridge.collect.config import CollectConfig, CollectError, CollectResult, check_config
from gym_bridge.collect.encoded import EncodedRollout
from gym_bridge.collect.local_aggregate import server_of_app, write_aggregate_file
from gym_bridge.collect.output import (
    ENV_SERVER,
    FAILURE_CLASS,
    ROLLOUT_INDEX,
    TASK_INDEX,
    LazyWriter,
    OutputWriter,
    aggregate_metrics_path_for,
    check_apart,
    failures_path_for,
    keyed_records,
    materialized_path_for,
    metrics_path_for,
    nemo_gym_agent_ref,
    output_lock,
    output_record,
    prepare_output,
    side_files,
    stamps,
    write_json,
)
from gym_bridge.collect.resume_index import (
    PairSet,
    RowPrints,
    first_difference,
    read_done,
    read_materialized,
    row_print,
)
from gym_bridge.collect.routing import EnvRoute, Router, parse_env_args
from gym_bridge.collect.summary import AggregateSpool, RunStats, env_aggregate_metrics
from gym_bridge.collect.tasks import count_rows, iter_tasks
from gym_bridge.records.jsonl import JsonlError, JsonlWriter, compact_json
from gym_bridge.records.metrics import RewardTally
from gym_bridge.records.schema import is_finite_number
from gym_bridge.records.seeding import rollout_seed
from gym_bridge.rollout.agent import AgentConfig, Rollout, run_rollout, task_as_run
from gym_bridge.serving.event_loop import run_interruptible
from gym_bridge.serving.gc_policy import rare_collections
from gym_bridge.serving.retry import RetryPolicy

if TYPE_CHECKING:
    from gym_bridge.serving.in_process import InProcessClient

__all__ = ["CollectRun", "RolloutExecutor", "collect", "collect_async", "host_name", "run_all"]


class RolloutExecutor(Protocol):
    """Where a rollout runs when not in this process (``--ray``: a shard on some node; ``--workers``: a
    worker process here); the run loop, the files and ``--resume`` stay here, so the exactly-once
    guarantee is the single-process one."""

    same_machine: bool
    """Whether the rollouts run on this machine (then its open-file and port limits bound them here)."""

    async def run(
        self, worker: int, task: dict[str, Any], env_name: str, agent_config: AgentConfig, extra: dict[str, Any] | None
    ) -> Rollout | EncodedRollout:
        """Run one rollout of ``task`` against the env named ``env_name``; ``worker`` is the loop's slot.
        An :class:`EncodedRollout` comes with its output line made where it ran."""
        ...

    def run_metrics(self) -> dict[str, Any]:
        """Merged into the metrics file's ``run`` block at the end."""
        ...


@dataclass(slots=True)
class _Job:
    task_index: int
    rollout_index: int
    row: dict[str, Any]
    agent_name: str
    env_url: str
    env_name: str

    def agent_ref(self) -> dict[str, Any]:
        """The row's ``agent_ref``, or NeMo Gym's name for the env's agent (``<env>_simple_agent``)."""
        return nemo_gym_agent_ref(self.row, self.env_name)


async def collect_async(
    config: CollectConfig,
    router: Router,
    model_url: str,
    *,
    report: Callable[[str], None] = print,
    on_progress: Callable[[RunStats, int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    executor: RolloutExecutor | None = None,
    stop: threading.Event | None = None,
    in_process: InProcessClient | None = None,
    local_servers: dict[str, Any] | None = None,
) -> CollectResult:
    """Run the collection against running envs (``router``) and a running model (``model_url``); with
    ``executor``, each rollout runs there instead (the envs of ``router`` then serve ``/aggregate_metrics``).
    Once ``stop`` is set, workers take no more rollouts. ``in_process``: serves the router's envs mounted
    in-process on this loop (the caller mounts them and shuts them down); the other URLs go over HTTP.
    ``local_servers``: env -> the server object of each env mounted in-process (its end-of-run aggregate is
    computed here from the spool, :mod:`gym_bridge.collect.local_aggregate`)."""
    run = CollectRun.start(
        config, router, model_url, report=report, on_progress=on_progress, on_start=on_start,
        executor=executor, stop=stop, in_process=in_process,
    )  # fmt: skip
    aggregate: list[dict[str, Any]] = []
    try:
        await run_all([run.produce(), *(run.work(i) for i in range(run.workers))])
        run.writer.close()  # the rollouts file is whole before the envs are asked for their aggregates
        aggregate = await run.env_aggregates(local_servers)
    finally:
        await run.close()
    return run.write_metrics(aggregate)


@dataclass(slots=True, eq=False)
class CollectRun:
    """One collection's state, set up by :meth:`start`: :meth:`produce` queues the task rows' rollouts,
    ``workers`` copies of :meth:`work` run them, :meth:`finish` writes each one down as it ends, and
    :meth:`write_metrics` sums the run up.

    Nothing here grows with the run: the rewards are tallied as records come (a task's group reduced to
    counts once its repeats are all back), records for ``/aggregate_metrics`` wait in a file (``spool``),
    and a resumed run's earlier rollouts are a bit each (``done``), their records counted as they are read.
    """

    config: CollectConfig
    router: Router
    report: Callable[[str], None]
    on_progress: Callable[[RunStats, int], None] | None
    executor: RolloutExecutor | None
    stop: threading.Event | None
    """Once set, workers take no more rollouts (Ctrl-C)."""
    stats: RunStats
    tally: RewardTally
    spool: AggregateSpool
    """The run's records as ``/aggregate_metrics`` takes them (a resumed run's earlier ones first)."""
    done: PairSet
    """The (task, repeat) pairs already in the output (``resume``); this run makes the others."""
    already_done: int
    early_close: bool
    """Whether a task's reward group is whole once its ``num_repeats`` are back (no earlier rollout has a
    larger repeat), so it can be reduced to counts then."""
    materialized_done: PairSet
    """The (task, repeat) pairs already in the materialized inputs file."""
    prints: RowPrints
    """A fingerprint of one earlier (task, repeat) of each task as it was run (``resume``): a task row or
    request setting that differs now stops the run instead of mixing two runs' rollouts under one index."""
    writer: JsonlWriter
    failures: LazyWriter
    materialized: LazyWriter
    retry: RetryPolicy
    agent_config: AgentConfig
    workers: int
    """Rollouts at once: ``config.concurrency``, or fewer when this machine cannot hold that many open."""
    bound: tuple[int, str] | None
    """The most rollouts this machine can have in flight over HTTP, and why (None: no bound)."""
    queue: asyncio.Queue[_Job | None]
    pool: ClientPool
    outstanding: dict[int, int]
    """Task -> its rollouts of this run not finished yet; at 0 its reward group is closed."""

    @classmethod
    def start(
        cls,
        config: CollectConfig,
        router: Router,
        model_url: str,
        *,
        report: Callable[[str], None],
        on_progress: Callable[[RunStats, int], None] | None,
        on_start: Callable[[int], None] | None,
        executor: RolloutExecutor | None,
        stop: threading.Event | None,
        in_process: InProcessClient | None,
    ) -> CollectRun:
        """Read what a resumed run has done, open the files, size the pool of workers and its connections
        (inside the event loop that runs them)."""
        output = config.output_path
        # 1. What is done: a resumed run's earlier records, tallied and spooled as they are read.
        tally = RewardTally()
        spool = AggregateSpool(output.parent, router.url_of)

        def earlier(record: dict[str, Any]) -> None:
            if not is_finite_number(record.get("reward")):  # a damaged or foreign line: its "reward" ended the run
                key = (record.get(TASK_INDEX), record.get(ROLLOUT_INDEX))
                report(f"{output}: the stored rollout {key} has reward {compact_json(record.get('reward'))[:40]}, not a "
                       "finite number; kept, not counted in the metrics")  # fmt: skip
                return
            tally.add(record)
            spool.add(record, _env_of(router, record), None)

        rows = count_rows(config.tasks_path) if config.resume else None
        done = read_done(output, report, config.num_repeats, earlier, rows) if config.resume else PairSet(config.num_repeats)
        early_close = done.largest_repeat < config.num_repeats
        for task in [t for t in tally.open if early_close and isinstance(t, int)]:
            if all((task, r) in done for r in range(config.num_repeats)):
                tally.close(task)  # (the others wait for this run's rollouts of them)
        if on_start is not None:
            on_start(_planned(config, done))
        # 2. The files: rollouts and failures as they come, each (task, repeat) as it is run.
        materialized_path = materialized_path_for(output)
        materialized_done, prints = (
            read_materialized(materialized_path, report, config.num_repeats, rows) if config.resume else (PairSet(1), RowPrints())
        )
        writer = OutputWriter(output, (metrics_path_for(output), aggregate_metrics_path_for(output)))
        failures = LazyWriter(failures_path_for(output), append=config.resume)
        materialized = LazyWriter(materialized_path, append=config.resume)
        # 3. The agent: the model, the retry policy, the headers, the deadline, the user.
        retry = config.retry_policy()
        agent_config = _agent_config(config, model_url, retry)
        # 4. How many at once, and the connections they share.
        hosts = _http_hosts(model_url, router, in_process)
        workers, bound = _workers(config.concurrency, hosts, executor, report)
        return cls(
            config, router, report, on_progress, executor, stop,
            stats=RunStats(), tally=tally, spool=spool, done=done, already_done=len(done),
            early_close=early_close, materialized_done=materialized_done, prints=prints,
            writer=writer, failures=failures, materialized=materialized, retry=retry, agent_config=agent_config,
            workers=workers, bound=bound, queue=asyncio.Queue(maxsize=max(64, 2 * workers)),
            pool=ClientPool(workers, connection_cap(), hosts, in_process), outstanding={},
        )  # fmt: skip

    async def produce(self) -> None:
        """Queue each task row's rollouts not done yet, in NeMo Gym's "aabbcc" order, each written to the
        materialized inputs first; a row that cannot run is a failure. Then one None per worker."""
        config, done, queue = self.config, self.done, self.queue
        for task_index, row in iter_tasks(config.tasks_path, limit=config.limit, on_bad=self.bad_row):
            routed = self.router.route(row)
            if routed is None:
                problem = f"row {task_index}: no env for it ({self.router.describe()})"
                self.bad_row(task_index, JsonlError(config.tasks_path, -1, problem))
                continue
            if (earlier := self.prints.get(task_index)) is not None:
                self.check_unchanged(_Job(task_index, earlier[0], row, *routed), earlier[1])
            todo = [r for r in range(config.num_repeats) if (task_index, r) not in done]
            if not todo:
                if self.early_close:
                    self.tally.close(task_index)
                continue
            self.outstanding[task_index] = len(todo)  # all of them before the first is queued
            for rollout_index in todo:
                job = _Job(task_index, rollout_index, row, *routed)
                if (task_index, rollout_index) not in self.materialized_done:
                    self.materialized.write(_materialized_row(job, config, self.agent_config))
                await queue.put(job)
        # Only at the end: a cancelled producer (Ctrl-C, a failed worker) has no one left to take them, and
        # waiting on a full queue there hung the run.
        for _ in range(self.workers):
            await queue.put(None)

    def check_unchanged(self, job: _Job, fingerprint: int) -> None:
        """Refuse to resume a task whose row or request settings (``--model``, ``--temperature``, ``--param``,
        ``--seed``, ...) differ from how the earlier run ran it (its materialized inputs row)."""
        now = _materialized_row(job, self.config, self.agent_config)
        if row_print(now) == fingerprint:
            return
        path = materialized_path_for(self.config.output_path)
        before = next((r for _, key, r in keyed_records(path, self.report) if key == (job.task_index, job.rollout_index)), {})
        raise CollectError(
            f"--resume: task {job.task_index} is not what the earlier run ran ({path}, repeat {job.rollout_index}): "
            f"{first_difference(before, now)}. The task file (rows added at its end are fine) and the request "
            "settings (--model, --temperature, --top-p, --max-output-tokens, --param, --seed) must stay as they "
            "were, or the output mixes two runs under one task index: restore them, or write to a new -o"
        )

    async def work(self, i: int) -> None:
        """Worker ``i``: run the queued rollouts one at a time, here or on the executor, until a None."""
        client, queue, stop, executor = self.pool.for_worker(i), self.queue, self.stop, self.executor
        config, agent_config, finish = self.config, self.agent_config, self.finish
        while not (stop is not None and stop.is_set()) and (job := await queue.get()) is not None:
            # as NeMo Gym's /run body: the materialized row (agent_ref included), which the env echoes
            task = {**job.row, "agent_ref": job.agent_ref(), TASK_INDEX: job.task_index, ROLLOUT_INDEX: job.rollout_index}
            extra = _rollout_params(job, config)
            if executor is not None:
                rollout = await executor.run(i, task, job.env_name, agent_config, extra)
            else:
                rollout = await run_rollout(client, task, job.env_url, agent_config, extra_params=extra)
            finish(job, rollout)

    def finish(self, job: _Job, rollout: Rollout | EncodedRollout) -> None:
        """Write one ended rollout down: its record (output line, spool, tally) or its failure; close its
        task's reward group once the task's last rollout of this run is back. An :class:`EncodedRollout`
        (``--workers``) brings its line and the fields the counters read, encoded where it ran."""
        stats = self.stats
        stats.add_requests(rollout.metrics)
        if isinstance(rollout, EncodedRollout) and rollout.line is not None:
            digest = rollout.digest
            assert digest is not None
            self.spool.add_encoded(rollout.line, rollout.stripped, digest, job.env_name, self.writer.write_line)
            self.tally.add(digest)
            stats.add_written(digest, rollout.metrics.total_s)
        elif isinstance(rollout, Rollout) and rollout.record is not None:
            record = _output_record(job, rollout.record)
            self.spool.add(record, job.env_name, self.writer.write_line)  # the line, then the record kept stripped
            self.tally.add(record)
            stats.add_written(record, rollout.metrics.total_s)
        else:
            f = rollout.failure
            assert f is not None
            self.record_failure(
                {
                    TASK_INDEX: job.task_index,
                    ROLLOUT_INDEX: job.rollout_index,
                    "agent_ref": job.agent_ref(),
                    FAILURE_CLASS: f.failure_class,
                    "error": f.message,
                    "attempts": f.attempts,
                    "stage": f.stage,
                }
            )
        outstanding = self.outstanding
        left = outstanding.pop(job.task_index) - 1
        if left:
            outstanding[job.task_index] = left
        elif self.early_close:
            self.tally.close(job.task_index)
        if self.on_progress is not None:
            self.on_progress(stats, 1)

    def record_failure(self, entry: dict[str, Any]) -> None:
        self.failures.write(entry)
        self.stats.add_failure(entry[FAILURE_CLASS])

    def bad_row(self, task_index: int, err: JsonlError) -> None:
        self.report(f"skipping bad task row: {err}")
        self.record_failure(
            {TASK_INDEX: task_index, ROLLOUT_INDEX: None, FAILURE_CLASS: "bad_task", "error": str(err), "attempts": 0}
        )

    async def env_aggregates(self, local_servers: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Each env's ``/aggregate_metrics`` over the run's records (NeMo Gym's ``_aggregate_metrics.json``)."""
        return await env_aggregate_metrics(
            self.pool.client, self.config.output_path, self.router.url_of, self.report,
            timeout=self.retry.request_timeout, spool=self.spool, env_of=lambda record: _env_of(self.router, record),
            local=local_servers, group_size=self.config.num_repeats if self.early_close else None,
        )  # fmt: skip

    async def close(self) -> None:
        """Close the files and the connections (after an error or Ctrl-C too)."""
        self.spool.close()
        self.writer.close()
        self.failures.close()
        self.materialized.close()
        await self.pool.aclose()

    def write_metrics(self, aggregate: list[dict[str, Any]]) -> CollectResult:
        """Write the metrics file (rewards, pass@k, the ``run`` block) and NeMo Gym's aggregate file."""
        config, retry, stats, output = self.config, self.retry, self.stats, self.config.output_path
        metrics = self.tally.result()
        self.tally.discard()
        if components := self.tally.component_means():
            metrics["reward_components"] = components  # mean per component; pass@k stays on reward
        run = metrics["run"] = stats.run_metrics(
            already_done=self.already_done, concurrency=self.workers, num_repeats=config.num_repeats
        )
        if self.workers != config.concurrency:
            run.update(concurrency_requested=config.concurrency, concurrency_bound=self.bound and self.bound[1])
        run.update(request_timeout_s=retry.request_timeout, retry_timeouts=retry.retry_timeouts)
        if self.executor is not None:
            run.update(self.executor.run_metrics())
        metrics_path = metrics_path_for(output)
        write_json(metrics_path, metrics)
        if aggregate:
            write_aggregate_file(aggregate_metrics_path_for(output), aggregate)
        return CollectResult(
            output,
            self.failures.path,
            metrics_path,
            metrics,
            stats.done,
            stats.failed,
            stats.bad_rows,
            self.already_done,
            aggregate,
        )


def _env_of(router: Router, record: dict[str, Any]) -> str | None:
    """The env a stored record's row is routed to (None: none)."""
    routed = router.route(record)
    return None if routed is None else routed[2]


def _planned(config: CollectConfig, done: PairSet) -> int:
    """How many rollouts this run will make: every (row, repeat) up to ``limit``, less those done."""
    rows = count_rows(config.tasks_path)
    rows = rows if config.limit is None else min(rows, config.limit)
    return max(0, rows * config.num_repeats - done.count_below(rows))


def _agent_config(config: CollectConfig, model_url: str, retry: RetryPolicy) -> AgentConfig:
    """How each rollout runs: the run's model, overrides, retry policy, headers, deadline and user."""
    return AgentConfig(
        model_url=model_url,
        max_steps=config.max_steps,
        overrides=dict(config.overrides),
        model_retry=retry,
        env_retry=retry,
        model_headers=dict(config.model_headers),
        env_headers=dict(config.env_headers),
        rollout_timeout_s=config.rollout_timeout,
        user=config.user_config(model_url),
    )


def _http_hosts(model_url: str, router: Router, in_process: InProcessClient | None) -> int:
    """How many hosts the run talks to over HTTP (the envs mounted in-process are not)."""
    mounted = set(in_process.urls) if in_process is not None else set()
    return len({urlsplit(url).netloc for url in [model_url, *router.urls()] if url not in mounted})


def _workers(
    concurrency: int, hosts: int, executor: RolloutExecutor | None, report: Callable[[str], None]
) -> tuple[int, tuple[int, str] | None]:
    """``concurrency``, or the most rollouts this machine can hold open to ``hosts`` when that is fewer
    (said so with ``report``); and that bound (None with an ``executor`` whose rollouts run elsewhere)."""
    bound = concurrency_bound(hosts) if executor is None or executor.same_machine else None
    if bound is not None and concurrency > bound[0]:
        report(f"--concurrency {concurrency:,} is more than this machine can hold open at once ({bound[1]}); "
               f"running {bound[0]:,} rollouts at a time")  # fmt: skip
        return bound[0], bound
    return concurrency, bound


def _output_record(job: _Job, record: dict[str, Any]) -> dict[str, Any]:
    """The env's verify answer stamped with the rollout's indices, agent and env, as NeMo Gym writes it."""
    return output_record(record, job.row, job.task_index, job.rollout_index, job.env_name)


def _rollout_params(job: _Job, config: CollectConfig) -> dict[str, Any] | None:
    """This rollout's own request parameters (its sampling ``seed``), merged over the run's overrides."""
    if config.seed is None:
        return None
    return {"seed": rollout_seed(config.seed, job.task_index, job.rollout_index)}


def _materialized_row(job: _Job, config: CollectConfig, agent_config: AgentConfig) -> dict[str, Any]:
    """A (task, repeat) as NeMo Gym's ``_materialized_inputs.jsonl`` holds it: the row exactly as it is run."""
    row = task_as_run(job.row, agent_config, _rollout_params(job, config))
    row["agent_ref"] = job.agent_ref()
    row[TASK_INDEX] = job.task_index
    row[ROLLOUT_INDEX] = job.rollout_index
    row[ENV_SERVER] = stamps(job.task_index, job.rollout_index, row["agent_ref"], job.env_name)[ENV_SERVER]
    return row


async def run_all(coros: list[Any]) -> None:
    """Run coroutines together; if one fails, cancel the others and raise its error."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def collect(
    config: CollectConfig,
    *,
    report: Callable[[str], None] = print,
    on_progress: Callable[[RunStats, int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    executor: RolloutExecutor | None = None,
) -> CollectResult:
    """Run a whole collection: check inputs, start named envs / the policy, collect, write metrics.

    ``on_start`` is told how many rollouts this run will make (an estimate, for a progress bar). With
    ``config.workers`` above 1 the rollouts run in that many worker processes
    (:mod:`gym_bridge.collect.local_shards`); this process still writes every file, holding
    :func:`~gym_bridge.collect.output.output_lock` on it for the run.
    """
    check_config(config)
    check_apart(config.tasks_path, "TASKS", (config.output_path, *side_files(config.output_path)))
    with output_lock(config.output_path):
        return _collect_locked(config, report=report, on_progress=on_progress, on_start=on_start, executor=executor)


def _collect_locked(
    config: CollectConfig,
    *,
    report: Callable[[str], None],
    on_progress: Callable[[RunStats, int], None] | None,
    on_start: Callable[[int], None] | None,
    executor: RolloutExecutor | None,
) -> CollectResult:
    """:func:`collect`, once the run holds its output."""
    if config.workers > 1 and executor is not None:
        raise CollectError("--workers runs the rollouts in local processes; it cannot be combined with --ray")
    prepare_output(config.output_path, config.resume, config.overwrite, side_files(config.output_path))
    routes = parse_env_args(config.envs)
    if config.strict:
        try:
            for _ in iter_tasks(config.tasks_path, limit=config.limit, strict=True):
                pass
        except JsonlError as e:
            raise CollectError(f"bad task row (--strict): {e}") from None
    from gym_bridge.rollout.envs import env_app, is_url, running_env

    with ExitStack() as stack:
        urls: dict[int, str] = {}  # route index -> the env's URL (given, or of a server started for the run)
        apps: dict[int, Any] = {}  # route index -> the env's app, served in-process on the run's loop
        for i, route in enumerate(routes):
            try:
                if config.env_transport == "in-process" and not is_url(route.target):
                    apps[i] = env_app(route.target)
                else:
                    urls[i] = stack.enter_context(running_env(route.target))
            except ValueError as e:
                raise CollectError(str(e)) from None
            except (RuntimeError, TimeoutError, OSError) as e:
                raise CollectError(f"env '{route.target}' did not start: {e}") from None
        model_url = config.model_url or stack.enter_context(
            running_policy(config.policy or "", seed=config.seed or 0)
        )
        stop = threading.Event()  # Ctrl-C: workers take no more rollouts

        local = {routes[i].key or routes[i].target: server_of_app(app) for i, app in apps.items()}
        local = {env: server for env, server in local.items() if server is not None}
        shards = None
        if config.workers > 1:
            from gym_bridge.collect.local_shards import LocalShards

            processes = min(config.workers, config.concurrency)  # each needs a rollout in flight to do anything
            if processes < config.workers:
                report(f"--workers {config.workers} with --concurrency {config.concurrency}: starting "
                       f"{processes} worker process(es), one for each rollout in flight")  # fmt: skip
            executor = shards = LocalShards(processes, routes, config.env_transport, report=report)

        def main(router: Router, in_process: InProcessClient | None = None) -> Coroutine[Any, Any, CollectResult]:
            run = collect_async(config, router, model_url, report=report, on_progress=on_progress,
                                on_start=on_start, executor=executor, stop=stop, in_process=in_process,
                                local_servers=local if executor is None or shards is not None else None)  # fmt: skip
            if shards is None:
                return run
            slots = -(-config.concurrency // shards.count)
            agent_config = _agent_config(config, model_url, config.retry_policy())
            return shards.around(run, agent_config, slots, _http_hosts(model_url, router, in_process))

        stack.enter_context(rare_collections())  # a busy loop's rollouts hold no cycles: see gc_policy
        if apps:
            return run_interruptible(_serving_in_process(routes, urls, apps, main), stop)
        return run_interruptible(main(Router(routes, list(urls.values()))), stop)


async def _serving_in_process(
    routes: list[EnvRoute],
    urls: dict[int, str],
    apps: dict[int, Any],
    main: Callable[[Router, InProcessClient], Awaitable[CollectResult]],
) -> CollectResult:
    """Mount the env apps (route index -> app) on this loop, run ``main`` with every route's URL (``urls``:
    the others'), then shut the apps down: their lifespans end here on an error or Ctrl-C too (the math
    server's verifier processes stop)."""
    from gym_bridge.serving.in_process import InProcessClient

    client = InProcessClient()
    try:
        names: set[str] = set()
        mounted = {}
        for i, app in apps.items():
            try:
                mounted[i] = await client.mount(host_name(routes[i], names), app)
            except Exception as e:
                raise CollectError(f"env '{routes[i].target}' did not start: {e}") from None
        every = {**urls, **mounted}
        return await main(Router(routes, [every[i] for i in range(len(routes))]), client)
    finally:
        await client.aclose()


def host_name(route: EnvRoute, taken: set[str]) -> str:
    """A host name for an env served in-process, from its ``--env`` key (``math`` -> ``math``, so its
    URL reads ``http://math.in-process``); unique among ``taken``, which it joins."""
    slug = re.sub(r"[^a-z0-9]+", "-", (route.key or route.target).lower()).strip("-") or "env"
    name, n = slug, 1
    while name in taken:
        n += 1
        name = f"{slug}-{n}"
    taken.add(name)
    return name

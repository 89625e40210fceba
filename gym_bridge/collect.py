"""The collector: task rows in, one NeMo Gym rollout line per (task, repeat) out, nothing lost.

* **Streaming and bounded.** Rows are read one at a time and handed to a fixed pool of workers through a
  small queue, so memory does not grow with the file, and no more than ``concurrency`` rollouts run.
* **NeMo Gym's order and indices.** Repeats come in "aabbcc" order (task 0 repeat 0, task 0 repeat 1,
  ..., task 1 repeat 0, ...). ``_ng_task_index`` is the row's index in the file (0-based, counting every
  non-blank line, bad ones too, so indices stay stable when a bad row is fixed); ``_ng_rollout_index`` is
  the repeat. With ``seed`` set, each rollout's model request carries ``seed`` = a hash of
  (seed, task, repeat): repeats differ, and a rerun asks for the same samples.
* **Nothing lost.** Each finished rollout is one complete, flushed line. ``resume`` cuts a torn last line,
  reads which (task, repeat) pairs are done and runs exactly the others, failed ones included.
  Failures go to ``<out stem>_failures.jsonl`` and the run goes on.
* **Routing.** With one env every row goes to it. With several (``--env KEY=NAME_OR_URL``; a bare name
  is its own key, so ``--env math`` is ``math=math``), a row goes to the env keyed by its ``env`` field,
  else by its ``agent_ref.name``, else by that name without a ``_simple_agent``/``_agent`` suffix, else to
  the env keyed ``default`` (or the one env given as a bare URL). A row that matches none is a bad row.
* **NeMo Gym's side files.** Beside ``OUT`` go the files NeMo Gym's ``gym eval run`` writes, in its
  shapes, so its tools (``gym eval profile``, ``gym eval reverify``) read a run of ours:
  ``<out stem>_materialized_inputs.jsonl`` (each (task, repeat) as it was run: the row with its merged
  ``responses_create_params``, indices, ``agent_ref``, ``_ng_environment_server``) and
  ``<out stem>_aggregate_metrics.json`` (one entry per env: the env's own ``/aggregate_metrics`` answer on
  the records stripped as NeMo Gym strips them). Each rollout names its env in ``_ng_environment_server``
  (the ``--env`` key) and its result type in ``_ng_result_type`` (``legacy_agent``: a verify response
  from an agent loop, as NeMo Gym labels such records).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import ValidationError

from gym_bridge.agent import AgentConfig, Rollout, make_session, run_rollout, task_as_run
from gym_bridge.aggregate import strip_for_aggregation
from gym_bridge.event_loop import new_event_loop
from gym_bridge.jsonl import JsonlError, JsonlWriter, iter_jsonl, repair_torn_tail
from gym_bridge.metrics import aggregate_rewards, latency_summary
from gym_bridge.retry import RetryPolicy
from gym_bridge.schema import TaskRow
from gym_bridge.seeding import rollout_seed

__all__ = [
    "CollectConfig",
    "CollectError",
    "CollectResult",
    "EnvRoute",
    "Router",
    "aggregate_metrics_path_for",
    "collect",
    "collect_async",
    "failures_path_for",
    "materialized_path_for",
    "metrics_path_for",
    "parse_env_args",
    "rollout_seed",
]

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
FAILURE_CLASS = "_ng_failure_class"
ENV_SERVER = "_ng_environment_server"
RESULT_TYPE = "_ng_result_type"
AGENT_LOOP_RESULT = "legacy_agent"
"""NeMo Gym's ``_ng_result_type`` for a verify response made by an agent loop (its ``legacy_agent`` server)."""


class CollectError(Exception):
    """A problem with the run's inputs or set-up, said in words a user can act on."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class EnvRoute:
    """One ``--env``: an optional routing key and a built-in env name or a URL."""

    key: str | None
    target: str


_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_env_args(values: list[str]) -> list[EnvRoute]:
    """``["math", "tools=http://h:1", "http://h:2"]`` -> routes; a bare name is its own key."""
    from gym_bridge.envs import is_url

    routes: list[EnvRoute] = []
    for value in values:
        key, sep, target = value.partition("=")
        if sep and _KEY.match(key) and "://" not in key and target:
            routes.append(EnvRoute(key, target))
        elif is_url(value):
            routes.append(EnvRoute(None, value))
        elif _KEY.match(value) or ":" in value:
            routes.append(EnvRoute(value, value))
        else:
            raise CollectError(f"--env {value!r}: expected NAME, URL or KEY=NAME_OR_URL")
    keys = [r.key for r in routes if r.key is not None]
    duplicates = sorted(k for k, n in Counter(keys).items() if n > 1)
    if duplicates:
        raise CollectError(f"--env: key(s) given more than once: {', '.join(duplicates)}")
    if sum(r.key is None for r in routes) > 1:
        raise CollectError("--env: only one env may be a bare URL (the default); give the others a KEY=URL")
    return routes


class Router:
    """Picks a row's env (see the module docstring for the rule)."""

    def __init__(self, routes: list[EnvRoute], urls: list[str]) -> None:
        self.by_key = {r.key: (r, url) for r, url in zip(routes, urls, strict=True) if r.key is not None}
        self.url_of = {r.key or r.target: url for r, url in zip(routes, urls, strict=True)}
        """Env name (its ``--env`` key, or the URL of a bare-URL env) -> URL."""
        self.default: tuple[EnvRoute, str] | None = None
        if len(routes) == 1:
            self.default = (routes[0], urls[0])
        else:
            for route, url in zip(routes, urls, strict=True):
                if route.key is None or route.key == "default":
                    self.default = (route, url)

    def route(self, row: dict[str, Any]) -> tuple[str, str, str] | None:
        """``(agent name, env URL, env name)`` for a row, or None when no env fits."""
        agent_name = (
            (row.get("agent_ref") or {}).get("name") if isinstance(row.get("agent_ref"), dict) else None
        )
        candidates = [row.get("env"), agent_name]
        if isinstance(agent_name, str):
            candidates += [re.sub(r"(_simple)?_agent$", "", agent_name)]
        for key in candidates:
            if isinstance(key, str) and key in self.by_key:
                route, url = self.by_key[key]
                return agent_name or key, url, key
        if self.default is not None:
            route, url = self.default
            return agent_name or route.key or route.target, url, route.key or route.target
        return None

    def urls(self) -> list[str]:
        """Every env URL a row can be routed to."""
        found = [url for _, url in self.by_key.values()]
        return found + ([self.default[1]] if self.default is not None else [])

    def describe(self) -> str:
        keys = ", ".join(sorted(self.by_key)) or "none"
        return f"env keys: {keys}" + ("; with a default" if self.default else "; no default")


@dataclass
class CollectConfig:
    """Everything a collection run needs (the CLI fills this in)."""

    tasks_path: Path
    output_path: Path
    envs: list[str]
    model_url: str | None = None
    policy: str | None = None
    concurrency: int = 16
    num_repeats: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    limit: int | None = None
    seed: int | None = None
    max_steps: int | None = 32
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    request_timeout: float = 300.0
    max_retries: int = 3
    progress: bool = True
    model_headers: dict[str, str] = field(default_factory=dict)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(max_attempts=self.max_retries + 1, request_timeout=self.request_timeout)


@dataclass
class CollectResult:
    """What a run did: counts, and where its files are."""

    output_path: Path
    failures_path: Path
    metrics_path: Path
    metrics: dict[str, Any]
    written: int
    failed: int
    skipped_rows: int
    already_done: int
    aggregate_metrics: list[dict[str, Any]] = field(default_factory=list)


def failures_path_for(output: Path) -> Path:
    return output.with_name(output.stem + "_failures.jsonl")


def metrics_path_for(output: Path) -> Path:
    return output.with_name(output.stem + "_metrics.json")


def materialized_path_for(output: Path) -> Path:
    """NeMo Gym's name: ``rollouts.jsonl`` -> ``rollouts_materialized_inputs.jsonl``."""
    return output.with_name(output.stem + "_materialized_inputs.jsonl")


def aggregate_metrics_path_for(output: Path) -> Path:
    """NeMo Gym's name: ``rollouts.jsonl`` -> ``rollouts_aggregate_metrics.json``."""
    return output.with_name(output.stem + "_aggregate_metrics.json")


# --------------------------------------------------------------------------- reading tasks and results


def _row_problem(obj: dict[str, Any]) -> str | None:
    """Why a JSON object is not a usable task row, or None."""
    if "responses_create_params" not in obj:
        return "not a task row: 'responses_create_params' is missing"
    try:
        TaskRow.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "row"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        return f"not a task row: {loc}: {first.get('msg')}{more}"
    return None


def iter_tasks(
    path: Path,
    *,
    limit: int | None = None,
    strict: bool = False,
    on_bad: Callable[[int, JsonlError], None] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream ``(task_index, row)`` for the good rows; bad rows go to ``on_bad`` (or raise with ``strict``)."""
    index = 0

    def bad_line(err: JsonlError) -> None:
        nonlocal index
        if limit is None or index < limit:
            if on_bad is not None:
                on_bad(index, err)
        index += 1

    for lineno, obj in iter_jsonl(path, strict=strict, on_error=bad_line):
        if limit is not None and index >= limit:
            return
        problem = _row_problem(obj)
        if problem is not None:
            err = JsonlError(path, lineno, problem)
            if strict:
                raise err
            bad_line(err)
            continue
        yield index, obj
        index += 1


def count_rows(path: Path) -> int:
    """Lines in a file (fast, for the progress bar's total; blank lines are counted too)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def _slim(record: dict[str, Any]) -> dict[str, Any]:
    """The fields the end-of-run metrics need, so a long run does not keep whole rollouts in memory."""
    keep = {
        k: record[k]
        for k in (TASK_INDEX, ROLLOUT_INDEX, "reward", "extracted_answer", "failure_kind", "mask_sample")
        if k in record
    }
    usage = (record.get("response") or {}).get("usage") if isinstance(record.get("response"), dict) else None
    if usage:
        keep["response"] = {"usage": usage}
    return keep


def _keyed_records(
    path: Path, warn: Callable[[str], None]
) -> Iterator[tuple[int, tuple[int, int] | None, dict[str, Any]]]:
    """``(line, (task, repeat) or None, record)`` of a JSONL file of rows or rollouts, after cutting a torn tail."""
    cut = repair_torn_tail(path)
    if cut:
        warn(f"{path}: removed a torn last line ({cut} bytes) left by an interrupted run")
    if not path.exists():
        return
    for lineno, record in iter_jsonl(path, strict=False, on_error=lambda e: warn(f"{e}; ignored")):
        key = (record.get(TASK_INDEX), record.get(ROLLOUT_INDEX))
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in key)
        yield lineno, (key if ok else None), record  # type: ignore[misc]


def read_keys(path: Path, warn: Callable[[str], None]) -> set[tuple[int, int]]:
    """The (task, repeat) pairs of a JSONL file of rows or rollouts."""
    return {key for _, key, _ in _keyed_records(path, warn) if key is not None}


def read_finished(
    output: Path, warn: Callable[[str], None]
) -> tuple[set[tuple[int, int]], list[dict[str, Any]]]:
    """The (task, repeat) pairs already in ``output`` and their slim records (after cutting a torn tail)."""
    done: set[tuple[int, int]] = set()
    slim: list[dict[str, Any]] = []
    for lineno, key, record in _keyed_records(output, warn):
        if key is None:
            warn(f"{output}:{lineno}: no {TASK_INDEX}/{ROLLOUT_INDEX}; ignored for resuming")
            continue
        if key in done:
            warn(f"{output}:{lineno}: duplicate rollout {key}; counted once")
            continue
        done.add(key)
        slim.append(_slim(record))
    return done, slim
    for lineno, record in iter_jsonl(output, strict=False, on_error=lambda e: warn(f"{e}; ignored")):
        key = (record.get(TASK_INDEX), record.get(ROLLOUT_INDEX))
        if not all(isinstance(x, int) for x in key):
            warn(f"{output}:{lineno}: no {TASK_INDEX}/{ROLLOUT_INDEX}; ignored for resuming")
            continue
        if key in done:
            warn(f"{output}:{lineno}: duplicate rollout {key}; counted once")
            continue
        done.add(key)  # type: ignore[arg-type]
        slim.append(_slim(record))
    return done, slim


# --------------------------------------------------------------------------- the run


@dataclass
class _Job:
    task_index: int
    rollout_index: int
    row: dict[str, Any]
    agent_name: str
    env_url: str
    env_name: str


@dataclass
class RunStats:
    """Live counters of a run (the progress bar reads them)."""

    started: float = field(default_factory=time.perf_counter)
    done: int = 0
    failed: int = 0
    reward_sum: float = 0.0
    first_rollout_s: float | None = None

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return (self.done + self.failed) / elapsed if elapsed > 0 else 0.0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.done if self.done else None


class ClientPool:
    """The run's HTTP client: one aiohttp session with up to a connection per worker to each host.

    A rollout makes one request at a time, so a worker never needs two connections to one host. The
    session keeps idle connections per host, so its open connections are bounded per host:
    ``connection_cap`` (what the open-file limit affords) is shared by the ``hosts`` it talks to.
    """

    def __init__(self, workers: int, connection_cap: int, hosts: int = 1) -> None:
        per_host = max(2, min(workers, connection_cap // max(1, hosts)))
        self.session = make_session(max_connections=per_host * max(1, hosts), max_per_host=per_host)

    def for_worker(self, i: int) -> aiohttp.ClientSession:
        return self.session

    async def aclose(self) -> None:
        await self.session.close()


def _connection_cap() -> int:
    """Client connections we can afford: half the open-file limit (raised to its hard maximum)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
        return max(64, (soft - 512) // 2)
    except (ImportError, OSError):
        return 512


class LazyWriter:
    """A JSONL writer that creates its file only when the first line comes (no empty failure files)."""

    def __init__(self, path: Path, append: bool) -> None:
        self.path, self.append, self.writer = path, append, None
        if not append and path.exists():
            path.unlink()

    def write(self, obj: dict[str, Any]) -> None:
        if self.writer is None:
            if self.append:
                repair_torn_tail(self.path)
            self.writer = JsonlWriter(self.path, append=True)
        self.writer.write(obj)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def prepare_output(out: Path, resume: bool, overwrite: bool, side_files: tuple[Path, ...]) -> None:
    """Refuse to clobber a finished output unless told to resume or overwrite (which clears its side files)."""
    if out.exists() and out.is_dir():
        raise CollectError(f"{out} is a directory; give a .jsonl file path with -o")
    if resume and overwrite:
        raise CollectError("--resume and --overwrite contradict each other; pick one")
    nonempty = out.exists() and out.stat().st_size > 0
    if nonempty and not (resume or overwrite):
        raise CollectError(
            f"{out} already holds rollouts; use --resume to finish that run or --overwrite to replace it"
        )
    if overwrite:
        for p in (out, *side_files):
            p.unlink(missing_ok=True)


def _side_files(out: Path) -> tuple[Path, ...]:
    return (failures_path_for(out), metrics_path_for(out), materialized_path_for(out), aggregate_metrics_path_for(out))


def _check_config(config: CollectConfig) -> None:
    if not config.tasks_path.is_file():
        raise CollectError(f"task file not found: {config.tasks_path}")
    if config.concurrency < 1:
        raise CollectError("--concurrency must be at least 1")
    if config.num_repeats < 1:
        raise CollectError("--num-repeats must be at least 1")
    if config.limit is not None and config.limit < 0:
        raise CollectError("--limit must not be negative")
    if not config.envs:
        raise CollectError("give at least one --env (a built-in name such as 'math', or a URL)")
    if bool(config.model_url) == bool(config.policy):
        raise CollectError("give exactly one of --model-url (an OpenAI-compatible endpoint) and --policy")
    if config.max_retries < 0:
        raise CollectError("--max-retries must not be negative")


async def collect_async(
    config: CollectConfig,
    router: Router,
    model_url: str,
    *,
    report: Callable[[str], None] = print,
    on_progress: Callable[[RunStats, int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> CollectResult:
    """Run the collection against running envs (``router``) and a running model (``model_url``)."""
    stats = RunStats()
    output, failures_path = config.output_path, failures_path_for(config.output_path)
    done, slim = read_finished(output, report) if config.resume else (set(), [])
    already_done = len(done)
    if on_start is not None:
        rows = count_rows(config.tasks_path)
        rows = rows if config.limit is None else min(rows, config.limit)
        planned = rows * config.num_repeats
        on_start(max(0, planned - sum(1 for t, r in done if t < rows and r < config.num_repeats)))
    materialized_path = materialized_path_for(output)
    materialized_done = read_keys(materialized_path, report) if config.resume else set()
    writer = JsonlWriter(output, append=True)
    failures = LazyWriter(failures_path, append=config.resume)
    materialized = LazyWriter(materialized_path, append=config.resume)
    retry = config.retry_policy()
    agent_config = AgentConfig(
        model_url=model_url,
        max_steps=config.max_steps,
        overrides=dict(config.overrides),
        model_retry=retry,
        env_retry=retry,
        model_headers=dict(config.model_headers),
    )
    metrics_run: dict[str, list[float]] = {"model": [], "rollout": []}
    totals: Counter[str] = Counter()
    failure_classes: Counter[str] = Counter()
    skipped_rows = 0
    workers = config.concurrency
    queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=max(64, 2 * workers))
    hosts = len({urlsplit(url).netloc for url in [model_url, *router.urls()]})
    pool = ClientPool(workers, _connection_cap(), hosts)

    def record_failure(entry: dict[str, Any]) -> None:
        failures.write(entry)
        failure_classes[entry[FAILURE_CLASS]] += 1
        stats.failed += 1

    def bad_row(task_index: int, err: JsonlError) -> None:
        nonlocal skipped_rows
        skipped_rows += 1
        report(f"skipping bad task row: {err}")
        record_failure(
            {
                TASK_INDEX: task_index,
                ROLLOUT_INDEX: None,
                FAILURE_CLASS: "bad_task",
                "error": str(err),
                "attempts": 0,
            }
        )

    async def produce() -> None:
        try:
            for task_index, row in iter_tasks(config.tasks_path, limit=config.limit, on_bad=bad_row):
                routed = router.route(row)
                if routed is None:
                    bad_row(
                        task_index,
                        JsonlError(
                            config.tasks_path, -1, f"row {task_index}: no env for it ({router.describe()})"
                        ),
                    )
                    continue
                agent_name, env_url, env_name = routed
                for rollout_index in range(config.num_repeats):
                    if (task_index, rollout_index) in done:
                        continue
                    job = _Job(task_index, rollout_index, row, agent_name, env_url, env_name)
                    if (task_index, rollout_index) not in materialized_done:
                        materialized.write(_materialized_row(job, config, agent_config))
                    await queue.put(job)
        finally:
            for _ in range(workers):
                await queue.put(None)

    def finish(job: _Job, rollout: Rollout) -> None:
        agent_ref = (
            job.row.get("agent_ref")
            if isinstance(job.row.get("agent_ref"), dict)
            else {"name": job.agent_name}
        )
        m = rollout.metrics
        metrics_run["model"].extend(m.model_latencies_s)
        totals.update(
            model_calls=m.model_calls,
            tool_calls=m.tool_calls,
            input_tokens=m.input_tokens,
            output_tokens=m.output_tokens,
            retries=m.retries,
        )
        if rollout.record is not None:
            record = rollout.record
            for key in (TASK_INDEX, ROLLOUT_INDEX, "agent_ref"):
                record.pop(key, None)
            record[TASK_INDEX] = job.task_index
            record[ROLLOUT_INDEX] = job.rollout_index
            record["agent_ref"] = agent_ref
            record[ENV_SERVER] = job.env_name
            record[RESULT_TYPE] = AGENT_LOOP_RESULT
            writer.write(record)
            metrics_run["rollout"].append(m.total_s)
            slim.append(_slim(record))
            stats.done += 1
            try:
                stats.reward_sum += float(record.get("reward") or 0.0)
            except (TypeError, ValueError):
                pass
            if stats.first_rollout_s is None:
                stats.first_rollout_s = time.perf_counter() - stats.started
        else:
            f = rollout.failure
            assert f is not None
            record_failure(
                {
                    TASK_INDEX: job.task_index,
                    ROLLOUT_INDEX: job.rollout_index,
                    "agent_ref": agent_ref,
                    FAILURE_CLASS: f.failure_class,
                    "error": f.message,
                    "attempts": f.attempts,
                    "stage": f.stage,
                }
            )
        if on_progress is not None:
            on_progress(stats, 1)

    async def work(i: int) -> None:
        client = pool.for_worker(i)
        while (job := await queue.get()) is not None:
            task = {**job.row, TASK_INDEX: job.task_index, ROLLOUT_INDEX: job.rollout_index}
            extra = _rollout_params(job, config)
            rollout = await run_rollout(client, task, job.env_url, agent_config, extra_params=extra)
            finish(job, rollout)

    aggregate: list[dict[str, Any]] = []
    try:
        await run_all([produce(), *(work(i) for i in range(workers))])
        writer.close()
        aggregate = await env_aggregate_metrics(
            pool.session, output, router.url_of, report, timeout=config.request_timeout
        )
    finally:
        writer.close()
        failures.close()
        materialized.close()
        await pool.aclose()

    elapsed = time.perf_counter() - stats.started
    metrics = aggregate_rewards(slim)
    metrics["run"] = {
        "rollouts_written": stats.done,
        "rollouts_failed": stats.failed - skipped_rows,
        "bad_task_rows": skipped_rows,
        "already_done": already_done,
        "failures_by_class": dict(failure_classes),
        "elapsed_s": elapsed,
        "rollouts_per_s": stats.done / elapsed if elapsed > 0 else None,
        "time_to_first_rollout_s": stats.first_rollout_s,
        "model_latency_s": latency_summary(metrics_run["model"]),
        "rollout_latency_s": latency_summary(metrics_run["rollout"]),
        "mean_reward": stats.mean_reward,
        **{k: totals[k] for k in ("model_calls", "tool_calls", "input_tokens", "output_tokens", "retries")},
        "concurrency": workers,
        "num_repeats": config.num_repeats,
    }
    metrics_path = metrics_path_for(output)
    _write_json(metrics_path, metrics)
    if aggregate:
        _write_json(aggregate_metrics_path_for(output), aggregate)
    return CollectResult(
        output,
        failures_path,
        metrics_path,
        metrics,
        stats.done,
        stats.failed,
        skipped_rows,
        already_done,
        aggregate,
    )


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _rollout_params(job: _Job, config: CollectConfig) -> dict[str, Any] | None:
    """This rollout's own request parameters (its sampling ``seed``), merged over the run's overrides."""
    if config.seed is None:
        return None
    return {"seed": rollout_seed(config.seed, job.task_index, job.rollout_index)}


def _materialized_row(job: _Job, config: CollectConfig, agent_config: AgentConfig) -> dict[str, Any]:
    """A (task, repeat) as NeMo Gym's ``_materialized_inputs.jsonl`` holds it: the row exactly as it is run."""
    row = task_as_run(job.row, agent_config, _rollout_params(job, config))
    if not isinstance(row.get("agent_ref"), dict):
        row["agent_ref"] = {"name": job.agent_name}
    row[TASK_INDEX] = job.task_index
    row[ROLLOUT_INDEX] = job.rollout_index
    row[ENV_SERVER] = job.env_name
    return row


async def env_aggregate_metrics(
    session: aiohttp.ClientSession,
    output: Path,
    url_of: dict[str, str],
    report: Callable[[str], None],
    env_of: Callable[[dict[str, Any]], Any] = lambda record: record.get(ENV_SERVER),
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Each env's ``/aggregate_metrics`` over its rollouts in ``output``, as NeMo Gym's collector asks for them.

    Records are stripped as NeMo Gym strips them and grouped by ``env_of`` (their ``_ng_environment_server``); the answer
    (NeMo Gym's ``AggregateMetrics``) becomes one entry of NeMo Gym's ``_aggregate_metrics.json`` list.
    An env that cannot answer is reported and left out; the rollouts are already safe on disk.
    """
    by_env: dict[str, list[dict[str, Any]]] = {}
    agent_of: dict[str, str] = {}
    if output.exists():
        for _, record in iter_jsonl(output, strict=False):
            env = env_of(record)
            if env in url_of and isinstance(record.get("reward"), int | float):
                by_env.setdefault(env, []).append(strip_for_aggregation(record))
                agent_ref = record.get("agent_ref")
                if isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str):
                    agent_of.setdefault(env, agent_ref["name"])
    entries = []
    for env, records in by_env.items():
        url = url_of[env].rstrip("/") + "/aggregate_metrics"
        try:
            limit = aiohttp.ClientTimeout(total=timeout)
            async with session.post(url, json={"verify_responses": records}, timeout=limit) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(body, dict):
                    raise ValueError(f"HTTP {resp.status}: {str(body)[:300]}")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            report(f"env '{env}': /aggregate_metrics failed ({e}); no aggregate metrics for it")
            continue
        entries.append(
            {
                "agent_ref": {"name": agent_of.get(env, env)},
                ENV_SERVER: env,
                **{
                    key: body.get(key, default)
                    for key, default in (
                        ("agent_metrics", {}),
                        ("key_metrics", {}),
                        ("group_level_metrics", []),
                        ("repeat_level_metrics", []),
                    )
                },
            }
        )
    return entries


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


@contextmanager
def running_policy(name: str, seed: int = 0) -> Iterator[str]:
    """Serve the embedded policy model ``name`` in-process for the run; yield its API base URL.

    This is the only path of ``collect`` that imports torch and transformers.
    """
    try:
        from gym_bridge.generation import load_backend
        from gym_bridge.policy.server import build_policy_app
    except ImportError as e:
        raise CollectError(
            f"--policy needs the embedded policy server (gym_bridge.policy.server), which is not available "
            f"in this install ({e}); serve the model yourself and pass --model-url"
        ) from None
    from gym_bridge.server import start_in_thread

    try:
        backend = load_backend(name, kind="transformers", seed=seed)
    except (ValueError, OSError) as e:
        raise CollectError(f"--policy {name}: {e}") from None
    running = start_in_thread(build_policy_app(backend, model_name=name), timeout=120.0)
    try:
        yield running.url + "/v1"
    finally:
        running.stop()


def collect(
    config: CollectConfig,
    *,
    report: Callable[[str], None] = print,
    on_progress: Callable[[RunStats, int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> CollectResult:
    """Run a whole collection: check inputs, start named envs / the policy, collect, write metrics.

    ``on_start`` is told how many rollouts this run will make (an estimate, for a progress bar).
    """
    _check_config(config)
    prepare_output(config.output_path, config.resume, config.overwrite, _side_files(config.output_path))
    routes = parse_env_args(config.envs)
    if config.strict:
        try:
            for _ in iter_tasks(config.tasks_path, limit=config.limit, strict=True):
                pass
        except JsonlError as e:
            raise CollectError(f"bad task row (--strict): {e}") from None
    from gym_bridge.envs import running_env

    with ExitStack() as stack:
        urls = []
        for route in routes:
            try:
                urls.append(stack.enter_context(running_env(route.target)))
            except ValueError as e:
                raise CollectError(str(e)) from None
            except (RuntimeError, TimeoutError, OSError) as e:
                raise CollectError(f"env '{route.target}' did not start: {e}") from None
        router = Router(routes, urls)
        model_url = config.model_url or stack.enter_context(
            running_policy(config.policy or "", seed=config.seed or 0)
        )
        main = collect_async(
            config, router, model_url, report=report, on_progress=on_progress, on_start=on_start
        )
        if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10
            return asyncio.run(main)
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(main)

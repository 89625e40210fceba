"""A run's numbers: live counters for the progress bar, the ``run`` block of ``<stem>_metrics.json``, and
each env's own ``/aggregate_metrics`` answer for NeMo Gym's ``<stem>_aggregate_metrics.json``."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from gym_bridge.collect.output import ENV_SERVER, FAILURE_CLASS
from gym_bridge.records.aggregate import strip_for_aggregation, whole_and_stripped_json
from gym_bridge.records.jsonl import compact_json, iter_jsonl
from gym_bridge.records.metrics import LatencySketch
from gym_bridge.records.nemo_gym_record import (
    ENVIRONMENT_SERVER_SUFFIX,
    agent_name_for,
    environment_server_for,
)
from gym_bridge.rollout.agent import RolloutMetrics
from gym_bridge.serving.retry import Client, RoutedClient, SendFailed, post_once

__all__ = [
    "COUNTED",
    "AggregateSpool",
    "RunStats",
    "env_aggregate_metrics",
    "env_of_stamp",
    "failure_causes",
    "reward_component_means",
]

COUNTED = ("model_calls", "tool_calls", "input_tokens", "output_tokens", "retries")
"""Per-rollout counts summed over the run (``retries``: extra attempts of any request, model or env)."""


def reward_component_means(records: list[dict[str, Any]]) -> dict[str, float]:
    """Mean of each reward component over the records that carry it (``reward_components`` of ``/verify``),
    by name in sorted order; {} when no record has components. pass@k and majority@k stay on ``reward``."""
    sums: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for record in records:
        components = record.get("reward_components")
        if not isinstance(components, dict):
            continue
        for name, value in components.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                sums[name] = sums.get(name, 0.0) + float(value)
                counts[name] += 1
    return {name: sums[name] / counts[name] for name in sorted(sums)}


def failure_causes(failures: Path, last: int, limit: int = 3) -> list[tuple[str, str, int]]:
    """The first ``limit`` distinct causes among the last ``last`` entries of a failures file (this run's:
    a resumed run appends), as ``(failure class, error, how many of those entries had it)``.

    Why: the console says *why* a collection failed, not only how many rollouts did; the per-rollout
    errors stay in the file. The file is read twice, line by line, so its size costs no memory."""
    if last <= 0 or not failures.is_file():
        return []
    total = sum(1 for _ in iter_jsonl(failures, strict=False))
    causes: dict[tuple[str, str], int] = {}
    for i, (_, entry) in enumerate(iter_jsonl(failures, strict=False)):
        if i < total - last:
            continue
        key = (str(entry.get(FAILURE_CLASS)), " ".join(str(entry.get("error")).split())[:500])
        if key in causes:
            causes[key] += 1
        elif len(causes) < limit:
            causes[key] = 1
    return [(kind, error, count) for (kind, error), count in causes.items()]


@dataclass
class RunStats:
    """Counters of a run, fed one rollout at a time (the progress bar reads them live)."""

    started: float = field(default_factory=time.perf_counter)
    done: int = 0
    failed: int = 0
    """Rollouts that failed plus bad task rows."""
    bad_rows: int = 0
    reward_sum: float = 0.0
    first_rollout_s: float | None = None
    model_latencies_s: LatencySketch = field(default_factory=LatencySketch)
    rollout_latencies_s: LatencySketch = field(default_factory=LatencySketch)
    """Bounded summaries (exact up to a few thousand values, then within 0.5 %): a long run keeps no list."""
    totals: Counter[str] = field(default_factory=Counter)
    failure_classes: Counter[str] = field(default_factory=Counter)
    masked_kinds: Counter[str] = field(default_factory=Counter)
    """Rollouts written with ``mask_sample: true`` (the env could not judge them, e.g. a judge down: the
    reward is no score), by ``failure_kind``."""

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return (self.done + self.failed) / elapsed if elapsed > 0 else 0.0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.done if self.done else None

    def add_requests(self, metrics: RolloutMetrics) -> None:
        """Count a finished rollout's requests, tokens and retries, whether it succeeded or not."""
        self.model_latencies_s.extend(metrics.model_latencies_s)
        self.totals.update({name: getattr(metrics, name) for name in COUNTED})

    def add_written(self, record: dict[str, Any], total_s: float) -> None:
        """Count a rollout written to the output."""
        self.rollout_latencies_s.add(total_s)
        self.done += 1
        try:
            self.reward_sum += float(record.get("reward") or 0.0)
        except (TypeError, ValueError):
            pass
        if self.first_rollout_s is None:
            self.first_rollout_s = time.perf_counter() - self.started
        if record.get("mask_sample") is True:
            kind = record.get("failure_kind")
            self.masked_kinds[kind[:60] if isinstance(kind, str) and kind else "mask_sample"] += 1

    @property
    def masked(self) -> int:
        """Rollouts written this run that the env masked."""
        return sum(self.masked_kinds.values())

    def add_failure(self, failure_class: str) -> None:
        """Count a failed rollout or (class ``bad_task``) a bad task row."""
        self.failure_classes[failure_class] += 1
        self.failed += 1
        self.bad_rows += failure_class == "bad_task"

    def run_metrics(self, *, already_done: int, concurrency: int, num_repeats: int) -> dict[str, Any]:
        """The ``run`` block of the metrics file: what this run did and how fast."""
        elapsed = time.perf_counter() - self.started
        return {
            "rollouts_written": self.done,
            "rollouts_failed": self.failed - self.bad_rows,
            "bad_task_rows": self.bad_rows,
            "already_done": already_done,
            "failures_by_class": dict(self.failure_classes),
            "rollouts_masked": self.masked,
            "masked_by_kind": dict(self.masked_kinds),
            "elapsed_s": elapsed,
            "rollouts_per_s": self.done / elapsed if elapsed > 0 else None,
            "time_to_first_rollout_s": self.first_rollout_s,
            "model_latency_s": self.model_latencies_s.summary(),
            "rollout_latency_s": self.rollout_latencies_s.summary(),
            "mean_reward": self.mean_reward,
            **{name: self.totals[name] for name in COUNTED},
            "concurrency": concurrency,
            "num_repeats": num_repeats,
        }


def env_of_stamp(record: dict[str, Any], envs: dict[str, Any]) -> str | None:
    """The env of ``envs`` whose rollout ``record`` is, by its ``_ng_environment_server``: NeMo Gym's
    ``<env>_environment_server``, or the bare env name older files carry."""
    stamp = record.get(ENV_SERVER)
    if not isinstance(stamp, str):
        return None
    for name in (stamp, stamp.removesuffix(ENVIRONMENT_SERVER_SUFFIX)):
        if name in envs:
            return name
    return None


def _note_names(record: dict[str, Any], env: Any, agent_of: dict[str, str], server_of: dict[str, str]) -> None:
    """Keep the first agent name and environment server stamped on ``env``'s records (NeMo Gym labels an
    aggregate entry by them)."""
    agent_ref = record.get("agent_ref")
    if env not in agent_of and isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str):
        agent_of[env] = agent_ref["name"]
    if env not in server_of and isinstance(server := record.get(ENV_SERVER), str):
        server_of[env] = server


class AggregateSpool:
    """A run's records as ``/aggregate_metrics`` takes them, stripped and serialized as they are written
    (one unlinked temporary file per env, beside the output), so the run's end posts them as they are.

    Why: reading the output back, parsing every rollout whole, stripping it and encoding the request
    again cost about a seventh of a no-op rollout's instructions (``bench/ab_instructions.py``); here the
    stripped record is spliced from the encoding of the output line. A resumed run, whose earlier
    rollouts are only in the output file, reads that file instead (:func:`env_aggregate_metrics`
    without a spool).
    """

    def __init__(self, directory: Path, url_of: dict[str, str]) -> None:
        self.directory, self.url_of = directory, url_of
        self.files: dict[str, IO[bytes]] = {}
        self.agent_of: dict[str, str] = {}
        self.server_of: dict[str, str] = {}
        """Env -> the agent and the environment server its first record was stamped with (NeMo Gym's names)."""

    def add(self, record: dict[str, Any], env: Any, write_line: Callable[[str], None] | None) -> None:
        """Write ``record``'s output line with ``write_line``, then keep it stripped if it is one to
        aggregate (``env``: the env it ran against). Both are encoded together (:func:`whole_and_stripped_json`).
        ``write_line`` None: keep it only (a resumed run's earlier records, already in the output)."""
        if env not in self.url_of or not isinstance(record.get("reward"), int | float):
            if write_line is not None:
                write_line(compact_json(record))
            return
        if write_line is None:
            stripped = compact_json(strip_for_aggregation(record))
        else:
            line, stripped = whole_and_stripped_json(record)
            write_line(line)
        self._keep(stripped, record, env)

    def add_encoded(
        self, line: str, stripped: str | None, digest: dict[str, Any], env: Any, write_line: Callable[[str], None]
    ) -> None:
        """:meth:`add` for a record encoded where it ran (:mod:`gym_bridge.collect.encoded`): ``line`` and
        ``stripped`` (None: not one to aggregate) are its two encodings, ``digest`` its ``agent_ref`` and
        environment server stamp."""
        write_line(line)
        if stripped is not None and env in self.url_of:
            self._keep(stripped, digest, env)

    def _keep(self, stripped: str, record: dict[str, Any], env: Any) -> None:
        spool = self.files.get(env)
        if spool is None:
            spool = self.files[env] = tempfile.TemporaryFile(dir=self.directory, prefix=".aggregate-spool-")
            spool.write(_BODY_HEAD)
        else:
            spool.write(_BODY_SEPARATOR)
        spool.write(stripped.encode())
        _note_names(record, env, self.agent_of, self.server_of)

    def body(self, env: str) -> IO[bytes]:
        """``env``'s ``/aggregate_metrics`` request body, NeMo Gym's ``{"verify_responses": [...]}``, as the
        spool file itself (read from the start), so a run's records are never all in memory at once."""
        spool = self.files[env]
        spool.seek(0, 2)
        if spool.tell() < len(_BODY_HEAD) + 1 or not _ends_body(spool):
            spool.write(_BODY_TAIL)
        spool.flush()
        spool.seek(0)
        return spool

    def bodies(self) -> dict[str, bytes]:
        """Each env's request body as bytes (:meth:`body` read whole)."""
        return {env: self.body(env).read() for env in self.files}

    def close(self) -> None:
        for spool in self.files.values():
            spool.close()


_BODY_HEAD, _BODY_SEPARATOR, _BODY_TAIL = b'{"verify_responses":[\n', b",\n", b"\n]}"
"""A record a line (JSON allows the newlines), so the body can be read back a record at a time."""


def _ends_body(spool: IO[bytes]) -> bool:
    spool.seek(-len(_BODY_TAIL), 2)
    ended = spool.read() == _BODY_TAIL
    spool.seek(0, 2)
    return ended


async def env_aggregate_metrics(
    client: Client,
    output: Path,
    url_of: dict[str, str],
    report: Callable[[str], None],
    env_of: Callable[[dict[str, Any]], Any] | None = None,
    timeout: float = 300.0,
    spool: AggregateSpool | None = None,
    local: dict[str, Any] | None = None,
    group_size: int | None = None,
) -> list[dict[str, Any]]:
    """Each env's ``/aggregate_metrics`` over its rollouts in ``output``, as NeMo Gym's collector asks for them.

    Records are stripped as NeMo Gym strips them and grouped by ``env_of`` (default: the env of ``url_of``
    their ``_ng_environment_server`` names, :func:`env_of_stamp`); the answer
    (NeMo Gym's ``AggregateMetrics``) becomes one entry of NeMo Gym's ``_aggregate_metrics.json`` list.
    ``spool``: the same records, kept as they were written (then ``output`` is not read). ``client``: the
    run's (a :class:`~gym_bridge.serving.retry.RoutedClient` reaches the envs served in-process too).
    An env that cannot answer is reported and left out; the rollouts are already safe on disk.
    ``local``: env -> its :class:`~gym_bridge.serving.server.ResourcesServer` served in-process; with ``spool``,
    its answer is computed from the spool a record at a time (:mod:`gym_bridge.collect.local_aggregate`;
    ``group_size``: the most records a task has).
    """
    bodies: dict[str, bytes | IO[bytes]] = {}
    agent_of: dict[str, str] = {}
    server_of: dict[str, str] = {}
    if spool is not None:  # each body streamed from its file over HTTP (read whole for an env in-process)
        bodies = {env: spool.body(env) for env in spool.files}
        agent_of, server_of = spool.agent_of, spool.server_of
    elif output.exists():
        by_env: dict[str, list[dict[str, Any]]] = {}
        for _, record in iter_jsonl(output, strict=False):
            env = env_of(record) if env_of is not None else env_of_stamp(record, url_of)
            if env in url_of and isinstance(record.get("reward"), int | float):
                by_env.setdefault(env, []).append(strip_for_aggregation(record))
                _note_names(record, env, agent_of, server_of)
        bodies = {env: json.dumps({"verify_responses": records}).encode() for env, records in by_env.items()}
    entries = []
    for env, request in bodies.items():
        url = url_of[env].rstrip("/") + "/aggregate_metrics"
        server = (local or {}).get(env)
        try:
            if server is not None and not isinstance(request, bytes):
                body = await _local_answer(server, request, group_size, spool)
            else:
                if not isinstance(request, bytes):
                    request = _payload(client, url, request)
                status, _, content = await post_once(client, url, request, {"content-type": "application/json"}, timeout)
                body = json.loads(content) if content.strip() else None  # as aiohttp's ``json()`` reads it
                if status != 200 or not isinstance(body, dict):
                    raise ValueError(f"HTTP {status}: {str(body)[:300]}")
        except (SendFailed, TimeoutError, ValueError) as e:
            report(f"env '{env}': /aggregate_metrics failed ({e}); no aggregate metrics for it")
            continue
        agent = agent_of.get(env, agent_name_for(env))
        entries.append(
            {
                "agent_ref": {"name": agent},
                ENV_SERVER: server_of.get(env, environment_server_for(agent)),
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


async def _local_answer(server: Any, body: IO[bytes], group_size: int | None, spool: Any) -> dict[str, Any]:
    """``server``'s answer computed here from the spooled ``body`` (in a thread, as its route runs it); an
    error of the env's own summary is a failed answer, as the route's 500 would be."""
    from gym_bridge.collect.local_aggregate import local_aggregate

    try:
        return await asyncio.to_thread(local_aggregate, server, body, group_size, spool.directory)
    except ValueError:
        raise
    except Exception as e:  # the env's own code (its route answers 500)
        raise ValueError(f"HTTP 500 (as the route answers it): {type(e).__name__}: {e}") from e


def _payload(client: Client, url: str, body: IO[bytes]) -> bytes | IO[bytes]:
    """The body as the client that serves ``url`` sends it: the file itself for an aiohttp session (which
    streams it), its bytes for an env served in-process (whose app takes the body whole)."""
    target = client.client_for(url) if isinstance(client, RoutedClient) else client
    return body if isinstance(target, aiohttp.ClientSession) else body.read()

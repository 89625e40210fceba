"""Re-score stored rollouts with the current verifier (NeMo Gym's ``gym eval reverify``), streaming and resumable.

Each rollout is sent back to the env's ``/verify`` as it is stored (the task fields and the model's
``response`` it carries), without its old verdict (``reward``, ``reward_components``, ``failure_kind``,
``failure_reason``, ``mask_sample``); the env's answer, with the rollout's bookkeeping (``_ng_*`` keys,
``agent_ref``) put back, is the new record. No model is called. The request is the agent's own verify step
(:func:`gym_bridge.rollout.agent.verify_rollout`), so its answer is checked as a collected rollout's is.

The run is collect's, minus the model: the same bounded queue and workers, flushed lines, failures file,
``--resume`` (a torn tail cut, only the rollouts the output lacks re-verified; changes among the ones
already done are counted again from the two files) and NeMo Gym's ``_aggregate_metrics.json`` from the
env. A stored line that is not a rollout with ``_ng_task_index``/``_ng_rollout_index`` is reported as
``file:line`` and skipped (``strict`` stops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_bridge.collect.config import CollectError, RunOptions, check_run_options
from gym_bridge.collect.output import (
    FAILURE_CLASS,
    ROLLOUT_INDEX,
    TASK_INDEX,
    LazyWriter,
    OutputWriter,
    aggregate_metrics_path_for,
    check_apart,
    failures_path_for,
    keyed_records,
    output_lock,
    prepare_output,
    write_json,
)
from gym_bridge.collect.run import run_all
from gym_bridge.collect.summary import env_aggregate_metrics
from gym_bridge.records.jsonl import JsonlError, iter_jsonl
from gym_bridge.records.schema import VERDICT_FIELDS
from gym_bridge.rollout.agent import EnvSession, make_session, verify_rollout
from gym_bridge.serving.event_loop import run_interruptible
from gym_bridge.serving.retry import RequestFailed, RetryPolicy

__all__ = ["ReverifyConfig", "ReverifyResult", "RewardChange", "reverify", "verify_payload"]



@dataclass
class ReverifyConfig(RunOptions):
    """What a reverify run is asked to do (the CLI fills this in); the options it shares with collect are
    :class:`~gym_bridge.collect.config.RunOptions`."""

    rollouts_path: Path
    output_path: Path
    env: str
    request_timeout: float = 300.0
    """Seconds for one ``/verify`` attempt."""
    max_examples: int = 5


@dataclass
class RewardChange:
    task_index: int
    rollout_index: int
    old: float | None
    new: float | None


@dataclass
class ReverifyResult:
    output_path: Path
    failures_path: Path
    verified: int = 0
    already_done: int = 0
    changed: int = 0
    raised: int = 0
    lowered: int = 0
    failed: int = 0
    skipped: int = 0
    masked: int = 0
    """Re-verified this run with ``mask_sample: true``: the env could not judge them (a judge down), so
    their new reward is no verdict."""
    examples: list[RewardChange] = field(default_factory=list)
    aggregate_metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.verified + self.already_done


def verify_payload(record: dict[str, Any]) -> dict[str, Any]:
    """The ``/verify`` body for a stored rollout: the record without its old verdict."""
    return {k: v for k, v in record.items() if k not in VERDICT_FIELDS}


def _reward(record: dict[str, Any]) -> float | None:
    value = record.get("reward")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _problem(record: dict[str, Any]) -> str | None:
    if not isinstance(record.get("response"), dict):
        return "not a rollout: no 'response' object to verify"
    if not isinstance(record.get("responses_create_params"), dict):
        return "not a rollout: no 'responses_create_params' object"
    key = (record.get(TASK_INDEX), record.get(ROLLOUT_INDEX))
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in key):
        return f"no {TASK_INDEX}/{ROLLOUT_INDEX} (needed to match and resume)"
    return None


class _Tally:
    def __init__(self, result: ReverifyResult, max_examples: int) -> None:
        self.result, self.max_examples = result, max_examples

    def add(self, key: tuple[int, int], old: float | None, new: float | None) -> None:
        if old == new:
            return
        self.result.changed += 1
        if old is not None and new is not None:
            self.result.raised += new > old
            self.result.lowered += new < old
        if len(self.result.examples) < self.max_examples:
            self.result.examples.append(RewardChange(key[0], key[1], old, new))


def _stored_rollouts(
    config: ReverifyConfig, result: ReverifyResult, report: Callable[[str], None]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, record)`` of the usable stored rollouts, bad lines reported (or raised with ``strict``)."""

    def bad(err: JsonlError) -> None:
        result.skipped += 1
        report(f"skipped {err}")

    count = 0
    for lineno, record in iter_jsonl(config.rollouts_path, strict=config.strict, on_error=bad):
        if config.limit is not None and count >= config.limit:
            return
        count += 1
        problem = _problem(record)
        if problem is not None:
            err = JsonlError(config.rollouts_path, lineno, problem)
            if config.strict:
                raise err
            bad(err)
            continue
        yield lineno, record


async def reverify_async(config: ReverifyConfig, env_url: str, report: Callable[[str], None]) -> ReverifyResult:
    """Re-verify ``config.rollouts_path`` against the running env at ``env_url``."""
    output = config.output_path
    result = ReverifyResult(output, failures_path_for(output))
    tally = _Tally(result, config.max_examples)
    done: dict[tuple[int, int], float | None] = {}
    if config.resume:
        for _, key, record in keyed_records(output, report):
            if key is not None:
                done[key] = _reward(record)
    writer = OutputWriter(output, (aggregate_metrics_path_for(output),))
    failures = LazyWriter(result.failures_path, append=config.resume)
    policy = RetryPolicy(max_attempts=config.max_retries + 1, request_timeout=config.request_timeout)
    workers = config.concurrency
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=max(64, 2 * workers))
    session = make_session(max_connections=workers, max_per_host=workers)
    env_name = config.env

    async def produce() -> None:
        try:
            for _, record in _stored_rollouts(config, result, report):
                key = (record[TASK_INDEX], record[ROLLOUT_INDEX])
                if key in done:
                    result.already_done += 1
                    tally.add(key, _reward(record), done[key])
                    continue
                await queue.put(record)
        finally:
            for _ in range(workers):
                await queue.put(None)

    async def work() -> None:
        while (record := await queue.get()) is not None:
            key = (record[TASK_INDEX], record[ROLLOUT_INDEX])
            # the agent's own /verify step, in a session of this record alone (no cookie carried over);
            # the body is the record as stored, its old verdict left out ("response" keeps its place)
            env = EnvSession(env_url, policy, config.env_headers)
            try:
                answer = await verify_rollout(session, env, verify_payload(record), record["response"])
            except RequestFailed as e:
                result.failed += 1
                failures.write(
                    {TASK_INDEX: key[0], ROLLOUT_INDEX: key[1], FAILURE_CLASS: e.failure_class, "error": e.message}
                )
                continue
            new = dict(answer)
            for name, value in record.items():
                if name.startswith("_ng_") or name == "agent_ref":
                    new[name] = value
            writer.write(new)
            result.verified += 1
            result.masked += new.get("mask_sample") is True
            tally.add(key, _reward(record), _reward(new))

    try:
        await run_all([produce(), *(work() for _ in range(workers))])
        writer.close()
        result.aggregate_metrics = await env_aggregate_metrics(
            session, output, {env_name: env_url}, report, env_of=lambda record: env_name, timeout=config.request_timeout
        )
    finally:
        writer.close()
        failures.close()
        await session.close()
    return result


def reverify(config: ReverifyConfig, report: Callable[[str], None] = print) -> ReverifyResult:
    """Check the inputs, start a built-in env when named, re-verify, write NeMo Gym's aggregate file."""
    if not config.rollouts_path.is_file():
        raise CollectError(f"rollout file not found: {config.rollouts_path}")
    check_run_options(config)
    if not config.request_timeout > 0:  # (was a ValueError traceback from the retry policy, mid-run)
        raise CollectError("--request-timeout must be a positive number of seconds")
    side_files = (failures_path_for(config.output_path), aggregate_metrics_path_for(config.output_path))
    check_apart(config.rollouts_path, "ROLLOUTS", (config.output_path, *side_files))
    with output_lock(config.output_path):
        return _reverify_locked(config, side_files, report)


def _reverify_locked(
    config: ReverifyConfig, side_files: tuple[Path, Path], report: Callable[[str], None]
) -> ReverifyResult:
    """:func:`reverify`, once the run holds its output."""
    from gym_bridge.rollout.envs import running_env

    prepare_output(config.output_path, config.resume, config.overwrite, side_files)
    if config.strict:
        try:
            for _ in _stored_rollouts(config, ReverifyResult(config.output_path, side_files[0]), report):
                pass
        except JsonlError as e:
            raise CollectError(f"bad rollout (--strict): {e}") from None
    with ExitStack() as stack:
        try:
            env_url = stack.enter_context(running_env(config.env))
        except ValueError as e:
            raise CollectError(str(e)) from None
        main = reverify_async(config, env_url, report)
        result = run_interruptible(main)
    if result.aggregate_metrics:
        write_json(aggregate_metrics_path_for(config.output_path), result.aggregate_metrics, flat_below=3)
    return result

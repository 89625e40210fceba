"""What a collection run is asked to do (:class:`CollectConfig`), what it did (:class:`CollectResult`),
and the one error type a user sees (:class:`CollectError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_bridge.retry import RetryPolicy

__all__ = ["CollectConfig", "CollectError", "CollectResult", "check_config"]


class CollectError(Exception):
    """A problem with the run's inputs or set-up, said in words a user can act on."""


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


def check_config(config: CollectConfig) -> None:
    """Refuse a config that cannot run, naming the option to fix."""
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

"""What a collection run is asked to do (:class:`CollectConfig`), what it did (:class:`CollectResult`),
the options it shares with ``reverify`` (:class:`RunOptions`), and the one error type a user sees
(:class:`CollectError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from gym_bridge.rollout.user_sim import UserSimConfig
from gym_bridge.serving.retry import RetryPolicy

__all__ = [
    "ENV_TRANSPORTS",
    "CollectConfig",
    "CollectError",
    "CollectResult",
    "EnvTransport",
    "RunOptions",
    "check_config",
    "check_run_options",
    "sized_request_timeout",
]

EnvTransport = Literal["in-process", "http"]
ENV_TRANSPORTS: tuple[EnvTransport, ...] = get_args(EnvTransport)
"""How the run talks to the envs it starts itself (``--env math``, ``--env module:Class``): their apps
called on the run's own event loop (:mod:`gym_bridge.serving.in_process`: the same requests and answers, less CPU),
or served on a loopback port and called over HTTP. Envs given by URL are always called over HTTP."""

SLOWEST_TOKENS_PER_S = 10.0
"""The slowest model server a default timeout waits for, in generated tokens per second over all the
requests it holds: SmolLM2-135M in fp32 on 2 busy CPU cores made about 23 with 64 requests in flight."""
ASSUMED_MAX_TOKENS = 1024
"""Tokens a model call may generate when the run does not cap them (the embedded policy server's cap)."""
TIMEOUT_RANGE = (300.0, 3600.0)
"""Least and most seconds of a sized timeout: an hour at most, so a hung server still ends the run."""


def sized_request_timeout(concurrency: int, max_output_tokens: int | None) -> float:
    """Seconds one request may take when the run sends ``concurrency`` of them at once.

    A server shares its generation rate among the requests it holds, so the last token of a request can
    come ``concurrency x max_output_tokens / rate`` seconds after it was sent (plus a minute for prompts).
    Sized for :data:`SLOWEST_TOKENS_PER_S`, clamped to :data:`TIMEOUT_RANGE`: 64 in flight at 128 tokens
    gives about 880 s, where 300 s made a 135M CPU model answer every request of its first batch twice.
    """
    tokens = max_output_tokens if max_output_tokens else ASSUMED_MAX_TOKENS
    low, high = TIMEOUT_RANGE
    return min(high, max(low, 60.0 + concurrency * tokens / SLOWEST_TOKENS_PER_S))


class CollectError(Exception):
    """A problem with the run's inputs or set-up, said in words a user can act on."""


@dataclass(kw_only=True)
class RunOptions:
    """How a run over a file of rows calls its env servers and treats its output, the same for ``collect``
    and ``reverify`` (keyword-only: each run's own fields come first). Each run keeps its own
    ``request_timeout``: collect's is sized for a model's generation, reverify's is one ``/verify``."""

    concurrency: int = 16
    """Requests in flight at once (collect: rollouts, over all its workers; reverify: ``/verify`` calls)."""
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    limit: int | None = None
    """Only the first N rows of the input file (tasks, or stored rollouts)."""
    max_retries: int = 3
    env_headers: dict[str, str] = field(default_factory=dict)
    """Sent with every request to the env servers (``--env-api-key``: servers started with ``--token``)."""


def check_run_options(options: RunOptions) -> None:
    """Refuse shared options that cannot run, naming the option to fix."""
    if options.concurrency < 1:
        raise CollectError("--concurrency must be at least 1")
    if options.limit is not None and options.limit < 0:
        raise CollectError("--limit must not be negative")
    if options.max_retries < 0:
        raise CollectError("--max-retries must not be negative")


@dataclass
class CollectConfig(RunOptions):
    """Everything a collection run needs (the CLI fills this in)."""

    tasks_path: Path
    output_path: Path
    envs: list[str]
    model_url: str | None = None
    policy: str | None = None
    num_repeats: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    max_steps: int | None = 32
    request_timeout: float | None = None
    """Seconds for one request attempt; None: :func:`sized_request_timeout` of the run's concurrency and
    ``max_output_tokens`` override."""
    rollout_timeout: float | None = None
    """Seconds one whole rollout may take (set-up, every model and tool call, /verify, retries and waits);
    past it the rollout is cut off and written to the failures file as ``rollout_timeout``
    (:attr:`~gym_bridge.rollout.agent.AgentConfig.rollout_timeout_s`). None: only the per-request policy bounds it."""
    retry_timeouts: bool = False
    """Send a request again when it timed out (off: the server may still be working on it, and a slow
    model asked twice only gets slower). 429, retryable 5xx and connection errors are retried either way."""
    progress: bool = True
    model_headers: dict[str, str] = field(default_factory=dict)
    env_transport: EnvTransport = "in-process"
    """One of :data:`ENV_TRANSPORTS`: ``http`` serves the envs the run starts itself on loopback ports
    (for an env that needs a real socket, or one whose handlers block the event loop)."""
    user_model_url: str | None = None
    """The LLM user of multi-turn rows (:mod:`gym_bridge.rollout.user_sim`): an OpenAI-compatible base URL, or
    ``policy`` for the run's own model (``--model-url`` or the embedded ``--policy``). None: rows with a
    ``user_script`` get a scripted user."""
    user_params: dict[str, Any] = field(default_factory=dict)
    """The LLM user's ``responses_create_params`` (NeMo Gym's ``user_responses_create_params``)."""
    max_user_turns: int = 8
    max_conversation_tokens: int | None = None
    workers: int = 1
    """Processes that run the rollouts (``--workers``): 1 runs them in this process; more start that many
    worker processes, each with its own envs and HTTP pool, while this process alone writes the files
    (:mod:`gym_bridge.collect.local_shards`). ``concurrency`` is the total in flight over all of them."""

    def user_config(self, model_url: str) -> UserSimConfig:
        """The user side of this run's conversations (``model_url``: the run's model, for ``policy``)."""
        url = model_url if self.user_model_url == "policy" else self.user_model_url
        headers = self.model_headers if self.user_model_url == "policy" else {}
        return UserSimConfig(
            model_url=url, responses_create_params=dict(self.user_params), headers=dict(headers),
            retry=self.retry_policy(), max_user_turns=self.max_user_turns,
            max_conversation_tokens=self.max_conversation_tokens,
        )  # fmt: skip

    def _max_output_tokens(self) -> int | None:
        tokens = self.overrides.get("max_output_tokens", self.overrides.get("max_tokens"))
        valid = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0
        return tokens if valid else None

    def timeout_s(self) -> float:
        """The request timeout this run uses (given, or sized)."""
        if self.request_timeout is not None:
            return self.request_timeout
        return sized_request_timeout(self.concurrency, self._max_output_tokens())

    def timeout_origin(self) -> str:
        """Where :meth:`timeout_s` comes from, in the summary's words: ``--request-timeout``, or what the
        default was sized for (a bare 1698 s read as a budget nobody had asked for)."""
        if self.request_timeout is not None:
            return "--request-timeout"
        tokens = self._max_output_tokens() or ASSUMED_MAX_TOKENS
        return f"sized for {self.concurrency} in flight x {tokens} tokens"

    def retry_policy(self) -> RetryPolicy:
        """How each model and env request of the run is retried."""
        return RetryPolicy(
            max_attempts=self.max_retries + 1,
            request_timeout=self.timeout_s(),
            retry_timeouts=self.retry_timeouts,
        )


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
    check_run_options(config)
    if isinstance(config.workers, bool) or not isinstance(config.workers, int) or config.workers < 1:
        raise CollectError(f"--workers must be a whole number of processes, at least 1 (not {config.workers!r})")
    if config.num_repeats < 1:
        raise CollectError("--num-repeats must be at least 1")
    if not config.envs:
        raise CollectError("give at least one --env (a built-in name such as 'math', or a URL)")
    if bool(config.model_url) == bool(config.policy):
        raise CollectError("give exactly one of --model-url (an OpenAI-compatible endpoint) and --policy")
    if config.request_timeout is not None and not config.request_timeout > 0:
        raise CollectError("--request-timeout must be a positive number of seconds")
    if config.rollout_timeout is not None and not config.rollout_timeout > 0:
        raise CollectError("--rollout-timeout must be a positive number of seconds")
    if config.max_steps is not None and config.max_steps < 0:  # -1 ran one step, as if a limit of 1
        raise CollectError("--max-steps must be 0 (no limit) or more")
    if config.max_user_turns < 0:
        raise CollectError("--max-user-turns must be 0 or more")
    if config.max_conversation_tokens is not None and config.max_conversation_tokens < 1:
        raise CollectError("--max-conversation-tokens must be at least 1")
    if config.env_transport not in ENV_TRANSPORTS:
        choices = ", ".join(ENV_TRANSPORTS)
        raise CollectError(f"--env-transport must be one of {choices}, not {config.env_transport!r}")

"""TRL's ``GRPOTrainer`` against a resources server (ours or NeMo Gym's), over HTTP.

Three pieces, following TRL 1.16's calling conventions without importing TRL:

* :func:`task_dataset`: a NeMo Gym task JSONL as a ``datasets.Dataset`` with a ``prompt`` column (chat
  messages), the whole row as JSON in ``gym_task_row`` (lossless: Arrow would merge the nested objects
  of different rows into one struct and fill the gaps with nulls) and each scalar field (``expected_answer``,
  ``question``...) as its own column.
* :class:`GymReward`: a reward function ``(prompts, completions, **columns) -> list[float]`` for
  single-turn tasks: per completion ``/seed_session`` then ``/verify`` in the rollout's own session.
* :func:`gym_environment_factory`: TRL's ``environment_factory`` for multi-turn tool use: one object per
  rollout with ``reset(**row)`` (seeds its session), one method per tool of the task row (posts to the
  server's tool route) and ``get_reward()`` (``/verify`` with the calls made).

Every request goes through the agent's env steps (:func:`~gym_bridge.rollout.agent.seed_session`,
:func:`~gym_bridge.rollout.agent.post_tool`, :func:`~gym_bridge.rollout.agent.verify_rollout` over an
:class:`~gym_bridge.rollout.agent.EnvSession`): the same retry policy (429, 5xx and connection errors tried
again with backoff), cookie jar and answer checks as ``collect`` and training; ``timeout_s`` is the
policy's ``request_timeout``.

A rollout whose ``/verify`` still fails after the retries (or whose answer lacks ``reward_key``, or has
``mask_sample: true``: the env could not judge it, e.g. its LLM judge is down, and its 0 is no verdict) is
handled as ``on_verify_failure`` says: ``"mask"`` (default) gives TRL ``None``, which TRL (1.16) leaves
out of the group's baseline and gives advantage 0 (a reward of 0 was learned as a wrong answer: a
server hiccup pushed down an honest completion and lifted the rest of its group); ``"zero"`` scores it 0
(the behaviour before); ``"raise"`` stops training. A batch in which more than ``max_failed_fraction``
(0.5, as the trainer's ``grpo.max_failed_rollouts_fraction``) of the rollouts failed raises, and so does
one in which every rollout failed, whatever the fraction (the server is down or the rows do not fit it):
training on the few left would go on as if nothing were wrong.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import keyword
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import ValidationError

from gym_bridge.records.jsonl import parse_json
from gym_bridge.records.schema import (
    FunctionCall,
    FunctionCallOutput,
    OutputMessage,
    OutputText,
    Response,
    TaskRow,
    content_text,
    input_items,
    new_id,
)
from gym_bridge.rollout.agent import (
    EnvSession,
    is_tool_name,
    make_session,
    post_tool,
    seed_session,
    verify_rollout,
)
from gym_bridge.serving.auth import bearer
from gym_bridge.serving.retry import Client, HttpResult, RequestFailed, RetryPolicy

__all__ = [
    "TASK_ROW_COLUMN",
    "GymReward",
    "ServerEnvironment",
    "completion_response",
    "enable_tool_call_parsing",
    "grpo_config_from",
    "gym_environment_factory",
    "prompt_messages",
    "response_body",
    "task_dataset",
]

logger = logging.getLogger(__name__)

TASK_ROW_COLUMN = "gym_task_row"
"""Dataset column holding the NeMo Gym task row as JSON (what ``/seed_session`` and ``/verify`` get)."""

DEFAULT_TIMEOUT_S = 60.0
"""Seconds for one request attempt unless ``timeout_s`` or a ``retry`` policy says otherwise."""

T = TypeVar("T")

OnVerifyFailure = Literal["mask", "zero", "raise"]
"""What a rollout whose ``/verify`` failed scores: ``mask`` (None: TRL leaves it out), ``zero``, or ``raise``."""

_TRL_KWARGS = frozenset(
    {"trainer_state", "log_extra", "log_metric", "environments", "completion_ids", "prompt"}
)
"""What TRL passes to reward functions beside the dataset's columns."""


# --------------------------------------------------------------------------- dataset


def prompt_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The task row's request as chat messages ``{"role", "content"}`` (``instructions`` first, as a system
    message). Only message items are accepted: a prompt that already holds tool calls is refused by name."""
    params = row.get("responses_create_params")
    if not isinstance(params, Mapping):
        raise ValueError("responses_create_params: missing or not an object")
    messages = []
    if params.get("instructions"):
        messages.append({"role": "system", "content": str(params["instructions"])})
    for i, item in enumerate(input_items(dict(params))):
        kind = item.get("type", "message")
        if kind != "message" or "role" not in item:
            raise ValueError(f"responses_create_params.input[{i}]: a {kind!r} item is not a chat message")
        role = "system" if item["role"] == "developer" else item["role"]
        messages.append({"role": role, "content": content_text(item.get("content"))})
    return messages


def task_dataset(source: str | Path | Iterable[Mapping[str, Any]]) -> Any:
    """A ``datasets.Dataset`` of NeMo Gym task rows (a JSONL path or rows) for TRL's GRPOTrainer.

    Columns: ``prompt`` (chat messages), :data:`TASK_ROW_COLUMN` (the row as JSON) and the row's scalar
    top-level fields. A row that is not a task row is a ValueError naming its line.
    """
    from datasets import Dataset

    if isinstance(source, str | Path):
        from gym_bridge.records.jsonl import iter_jsonl

        rows: Iterable[tuple[Any, Mapping[str, Any]]] = iter_jsonl(Path(source))
    else:
        rows = enumerate(source, start=1)
    records = []
    for where, row in rows:
        try:
            TaskRow.model_validate(row)
            prompt = prompt_messages(row)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"task row {where}: {field}: {first['msg']}") from None
        except ValueError as e:
            raise ValueError(f"task row {where}: {e}") from None
        scalars = {  # never over the row JSON: a stale ``gym_task_row`` field had replaced the row sent
            k: v
            for k, v in row.items()
            if isinstance(v, str | int | float | bool) and k not in _TRL_KWARGS and k != TASK_ROW_COLUMN
        }
        records.append({"prompt": prompt, TASK_ROW_COLUMN: json.dumps(row), **scalars})
    if not records:
        raise ValueError("no task rows")
    # A scalar field whose type differs between rows (``expected_answer`` 12 here, "12" there) has no
    # Arrow column type: leave it out, the row JSON keeps it.
    kinds: dict[str, set[type]] = {}
    for record in records:
        for k, v in record.items():
            kinds.setdefault(k, set()).add(type(v))
    mixed = {k for k, ts in kinds.items() if len(ts) > 1}
    if mixed:
        logger.info("task_dataset: %s left to %s (types differ between rows)", sorted(mixed), TASK_ROW_COLUMN)
        records = [{k: v for k, v in r.items() if k not in mixed} for r in records]
    return Dataset.from_list(records)


def _rows_from_columns(n: int, columns: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The task row of each of ``n`` completions, from :data:`TASK_ROW_COLUMN` or else the other columns."""
    if TASK_ROW_COLUMN in columns:
        return [json.loads(v) if isinstance(v, str) else dict(v) for v in columns[TASK_ROW_COLUMN]]
    fields = {k: v for k, v in columns.items() if k not in _TRL_KWARGS and isinstance(v, list | tuple)}
    return [{k: v[i] for k, v in fields.items()} for i in range(n)]


# --------------------------------------------------------------------------- responses


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def completion_response(completion: str | list[Mapping[str, Any]]) -> Response:
    """The NeMo Gym ``response`` of a TRL completion: a string, or chat messages (assistant turns with
    optional ``tool_calls``, ``tool`` results) as TRL's tool loop leaves them. A tool call as the model
    wrote it, odd or not (a name that is a number, no arguments), is passed on for the server to score:
    it had failed the rollout, which left the model's own malformed call unpunished."""
    if isinstance(completion, str):
        return Response(output=[OutputMessage(id=new_id("msg"), content=[OutputText(text=completion)])])
    output: list[Any] = []
    pending: list[str] = []  # call ids awaiting their tool result, in order
    for message in completion:
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                call = call if isinstance(call, Mapping) else {"name": call}
                fn = call.get("function", call)
                fn = fn if isinstance(fn, Mapping) else {"name": fn}
                call_id = _as_text(call.get("id") or new_id("call"))
                pending.append(call_id)
                output.append(FunctionCall(
                    call_id=call_id, name=_as_text(fn.get("name", "")), arguments=_as_text(fn.get("arguments", {}))
                ))  # fmt: skip
            text = content_text(message.get("content"))
            if text:
                output.append(OutputMessage(id=new_id("msg"), content=[OutputText(text=text)]))
        elif role == "tool":
            call_id = pending.pop(0) if pending else new_id("call")
            output.append(FunctionCallOutput(call_id=call_id, output=content_text(message.get("content"))))
    return Response(output=output)


def response_body(response: Response) -> dict[str, Any]:
    """The ``response`` JSON of a ``/verify`` body, defaults included (``type``, ``role``: servers need them;
    :func:`~gym_bridge.records.schema.dump` would leave out what was not set explicitly)."""
    return response.model_dump(mode="json", by_alias=True)


def _run(coro_fn: Callable[[], Any]) -> Any:
    """Run a coroutine to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro_fn())
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="gym-reward")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _blocking(step: Callable[[Client], Awaitable[T]]) -> T:
    """One protocol step from sync code (TRL calls ``reset``, tools and ``get_reward`` synchronously),
    on a connection of its own: the session lives in the :class:`EnvSession` (its cookies), not the client."""

    async def once() -> T:
        async with make_session(max_connections=1) as client:
            return await step(client)

    return _run(once)


def _policy(timeout_s: float | None, retry: RetryPolicy | None) -> RetryPolicy:
    """``retry`` (default: the agent's policy with a :data:`DEFAULT_TIMEOUT_S` attempt), its attempt
    timeout set to ``timeout_s`` when given."""
    policy = retry or RetryPolicy(request_timeout=DEFAULT_TIMEOUT_S)
    return policy if timeout_s is None else replace(policy, request_timeout=timeout_s)


def _failure_mode(value: str) -> OnVerifyFailure:
    if value not in get_args(OnVerifyFailure):
        raise ValueError(f"on_verify_failure: {value!r} is not one of {', '.join(get_args(OnVerifyFailure))}")
    return value  # type: ignore[return-value]


def _failed_reward(mode: OnVerifyFailure, where: str, reason: str) -> float | None:
    """The reward of a rollout the server could not score, under ``on_verify_failure`` ``mode``."""
    if mode == "raise":
        raise RuntimeError(f"{where} has no reward (on_verify_failure='raise'): {reason}")
    logger.warning("%s %s: %s", where, "left out (None)" if mode == "mask" else "scored 0", reason)
    return None if mode == "mask" else 0.0


def _masked(answer: Mapping[str, Any]) -> str | None:
    """Why an answer with ``mask_sample: true`` has no reward (the env could not judge it, e.g. its judge
    is down: its 0 is no verdict), else None."""
    if answer.get("mask_sample") is not True:
        return None
    reason = answer.get("failure_reason")
    return (f"the env masked it (mask_sample, failure_kind {answer.get('failure_kind')!s:.60}"
            f"{': ' + str(reason)[:200] if reason else ''}): its reward is no verdict")  # fmt: skip


def _detail(answer: HttpResult) -> str:
    try:
        return str(parse_json(answer.content).get("detail", answer.text))[:300]
    except (ValueError, AttributeError):
        return answer.text[:300]


# --------------------------------------------------------------------------- the same job in TRL


def _untranslatable(cfg: Any) -> list[str]:
    """The recipe's settings that change the job and that TRL's GRPOTrainer has no field for."""
    grpo, loss = cfg.grpo, cfg.loss_fn
    unmapped = {
        "loss_fn.ratio_clip_c": loss.ratio_clip_c is not None,
        "loss_fn.entropy_coeff": loss.entropy_coeff > 0,
        "loss_fn.truncated_importance_sampling_ratio": loss.truncated_importance_sampling_ratio is not None,
        "loss_fn.token_level_loss": not loss.token_level_loss,
        f"loss_fn.policy_loss ({loss.policy_loss_name})": loss.policy_loss_name != "ppo",
        "loss_fn.reference_policy_kl_type": loss.reference_policy_kl_penalty > 0
        and loss.reference_policy_kl_type != "k3",  # TRL's KL is the k3 estimator
        "grpo.adv_estimator.name": grpo.adv_estimator.name != "grpo",
        "grpo.advantage_clip_low": grpo.advantage_clip_low is not None,
        "grpo.advantage_clip_high": grpo.advantage_clip_high is not None,
        "grpo.reward_shaping.enabled": grpo.reward_shaping.enabled,
    }
    return [key for key, differs in unmapped.items() if differs]


def grpo_config_from(cfg: Any, output_dir: str | Path, *, max_steps: int, seed: int, **overrides: Any) -> Any:
    """TRL's ``GRPOConfig`` for the job a gym-bridge recipe (:class:`~gym_bridge.train.config.MasterConfig`)
    describes: prompts x generations per step, completion length, temperature, learning rate and its
    schedule, grad clipping, weight decay, the KL penalty (``beta``), the ratio clip (``epsilon``,
    ``epsilon_high``), reward normalisation (``scale_rewards``), overlong filtering
    (``mask_truncated_completions``) and the token-level mean (``dapo``); on a machine without CUDA, TRL's
    CPU settings (no bf16, no gradient checkpointing, ``use_cpu``). ``overrides`` are further
    ``GRPOConfig`` fields. A recipe setting that changes the job and has no TRL field (dual clip, an
    entropy bonus, another policy loss, DAPO's reward shaping...) is a ValueError naming it; before, KL
    and clip-higher were dropped silently (``beta=0``, ``epsilon_high=epsilon``). Differences that remain:
    the scheduler's ``warmup_start_factor`` (TRL warms up from 0), ``policy.generation.precision`` (TRL
    generates with the model it trains), ``grpo.use_leave_one_out_baseline`` (TRL's baseline is the
    plain group mean: advantages (G-1)/G of the leave-one-out ones before normalisation) and
    ``grpo.use_dynamic_sampling`` (TRL keeps the groups whose rewards tie, at advantage 0)."""
    import torch
    from trl import GRPOConfig

    if unmapped := _untranslatable(cfg):
        raise ValueError(f"{', '.join(unmapped)}: no equivalent in TRL's GRPOConfig; set it to its default")
    grpo, policy, loss = cfg.grpo, cfg.policy, cfg.loss_fn
    scheduler = policy.scheduler
    kind = scheduler.name
    if kind == "constant" and scheduler.warmup_steps:
        kind = "constant_with_warmup"
    on_cpu = not torch.cuda.is_available()
    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": grpo.samples_per_step,
        "num_generations": grpo.num_generations_per_prompt,
        "max_completion_length": policy.generation.max_new_tokens,
        "temperature": policy.generation.temperature,
        "learning_rate": policy.optimizer.kwargs.lr,
        "lr_scheduler_type": kind,
        "warmup_steps": scheduler.warmup_steps,
        "max_grad_norm": policy.max_grad_norm or 0.0,  # null: no clipping, which TRL spells 0
        "weight_decay": policy.optimizer.kwargs.weight_decay,
        "beta": loss.reference_policy_kl_penalty,
        "epsilon": loss.ratio_clip_min,
        **({"epsilon_high": loss.ratio_clip_max} if loss.ratio_clip_max != loss.ratio_clip_min else {}),
        "scale_rewards": "group" if grpo.normalize_rewards else "none",
        **({"mask_truncated_completions": True} if grpo.overlong_filtering else {}),
        "loss_type": "dapo",
        "max_steps": max_steps,
        "seed": seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        **({"bf16": False, "fp16": False, "gradient_checkpointing": False, "use_cpu": True} if on_cpu else {}),
        **overrides,
    }
    return GRPOConfig(**settings)


# --------------------------------------------------------------------------- single-turn reward


class GymReward:
    """TRL reward function scoring each completion with a resources server's ``/verify``.

    Each completion is its own rollout: ``/seed_session`` with its task row, then ``/verify`` with the
    row and the completion as ``response``, both in the session the seed opened (its cookies are kept
    in the rollout's own :class:`~gym_bridge.rollout.agent.EnvSession`). All completions of a batch run
    concurrently, at most ``max_concurrency`` at once. ``reward_key`` picks another number of the
    ``/verify`` answer than ``reward`` (a ``reward_components`` entry is looked up there; an answer
    without it is a failed rollout). ``retry``: how each request is tried (default: the agent's policy, 4
    attempts); ``timeout_s`` sets its attempt timeout (default 60 s). ``on_verify_failure``: what a
    rollout whose ``/verify`` still failed scores (module docstring): ``"mask"`` (None), ``"zero"`` or
    ``"raise"``; a batch where more than ``max_failed_fraction`` of the rollouts failed, or every one
    did, raises whatever it says.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float | None = None,
        max_concurrency: int = 64,
        auth_token: str | None = None,
        seed: bool = True,
        reward_key: str = "reward",
        name: str = "gym_reward",
        retry: RetryPolicy | None = None,
        on_verify_failure: OnVerifyFailure = "mask",
        max_failed_fraction: float = 0.5,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency: must be at least 1")
        if not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"max_failed_fraction: must be within [0, 1], got {max_failed_fraction}")
        self.max_failed_fraction = max_failed_fraction
        self.base_url = base_url.rstrip("/")
        self.retry = _policy(timeout_s, retry)
        self.max_concurrency = max_concurrency
        self.headers = bearer(auth_token)
        self.seed = seed
        self.reward_key = reward_key
        self.on_verify_failure = _failure_mode(on_verify_failure)
        self.__name__ = name  # TRL logs the reward under the callable's name
        self.last_answers: list[dict[str, Any] | None] = []
        """The ``/verify`` answers of the last batch (None where the rollout failed), for inspection."""

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        rows = _rows_from_columns(len(completions), columns)
        if len(rows) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(rows)} task rows")
        answers = _run(lambda: self._score_all(rows, completions))
        self.last_answers = [a if isinstance(a, dict) else None for a in answers]
        # A reward, or why the rollout has none (its /verify failed, or the answer lacks reward_key).
        outcomes: list[float | str] = [self._reward_of(a) if isinstance(a, dict) else a for a in answers]
        failures = [o for o in outcomes if isinstance(o, str)]
        if failures and len(failures) == len(outcomes):
            raise RuntimeError(
                f"every /verify of the batch failed ({len(failures)}), the first: {failures[0]}"
            )
        if len(failures) > self.max_failed_fraction * len(outcomes):
            raise RuntimeError(
                f"{len(failures)} of {len(outcomes)} rollouts of the batch failed, more than max_failed_fraction "
                f"{self.max_failed_fraction:g}; the first: {failures[0]}"
            )
        return [
            _failed_reward(self.on_verify_failure, f"rollout {i}", o) if isinstance(o, str) else o
            for i, o in enumerate(outcomes)
        ]

    def _reward_of(self, answer: dict[str, Any]) -> float | str:
        """The answer's reward (checked a finite number by :func:`verify_rollout`), or why it has none."""
        if (masked := _masked(answer)) is not None:
            return masked
        if self.reward_key == "reward":
            return float(answer["reward"])
        components = answer.get("reward_components") or {}
        if self.reward_key not in components:
            return f"the /verify answer has no reward_components[{self.reward_key!r}] (reward_key)"
        return float(components[self.reward_key])

    async def _score_all(
        self, rows: list[dict[str, Any]], completions: list[Any]
    ) -> list[dict[str, Any] | str | float]:
        gate = asyncio.Semaphore(self.max_concurrency)
        async with make_session(self.max_concurrency) as client:
            return await asyncio.gather(
                *(self._score_one(client, gate, row, c) for row, c in zip(rows, completions, strict=True))
            )

    async def _score_one(
        self, client: Client, gate: asyncio.Semaphore, row: dict[str, Any], completion: Any
    ) -> dict[str, Any] | str | float:
        """The ``/verify`` answer; why the server could not score the rollout (a str); or 0.0 for a
        completion that is no response at all (the policy's fault: never left out as a server's)."""
        try:
            response = response_body(completion_response(completion))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            logger.warning("a completion that is no response scored 0: %s", e)
            return 0.0
        # The client (the connection pool) is shared; the session (its cookies) is this rollout's own.
        env = EnvSession(self.base_url, self.retry, self.headers)
        async with gate:
            try:
                if self.seed:
                    await seed_session(client, env, row)
                return await verify_rollout(client, env, row, response)
            except (RequestFailed, ValueError) as e:
                return str(e) or type(e).__name__


# --------------------------------------------------------------------------- multi-turn tool use

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool,
                                "array": list, "object": dict}  # fmt: skip


def _python_type(schema: Mapping[str, Any]) -> Any:
    """The type hint transformers turns back into (roughly) this JSON schema when it renders the tool."""
    kinds = schema.get("type", "string")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    nullable = "null" in kinds
    kinds = [k for k in kinds if k != "null"] or ["string"]
    hint: Any = _JSON_TYPES.get(kinds[0], str)
    if len(kinds) > 1:
        for k in kinds[1:]:
            hint = hint | _JSON_TYPES.get(k, str)
    return hint | None if nullable else hint


def _argument_doc(name: str, schema: Mapping[str, Any]) -> str:
    doc = " ".join(str(schema.get("description") or name).split())
    bounds = [
        f"{label} {schema[key]}"
        for key, label in (("minimum", "at least"), ("maximum", "at most"))
        if key in schema
    ]
    if bounds:
        doc += f" ({', '.join(bounds)})"
    if "enum" in schema:  # transformers reads this back into the schema's enum
        doc += f" (choices: {json.dumps(schema['enum'])})"
    return doc


def _tool_method(spec: Mapping[str, Any]) -> Callable[..., str]:
    """A method named after a Responses API function tool whose signature and Google-style docstring
    render back into its schema (TRL shows the model what transformers derives from them)."""
    fn_spec = spec.get("function", spec)  # Chat Completions nests it, the Responses API does not
    name = fn_spec.get("name")
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"tool name {name!r}: must be a Python identifier to become a method")
    if name in ("reset", "get_reward") or name.startswith("_"):
        raise ValueError(f"tool name {name!r}: clashes with TRL's environment interface")
    if not is_tool_name(name):
        raise ValueError(f"tool name {name!r}: is a route of the protocol itself, not a tool")
    params = fn_spec.get("parameters") or {}
    properties: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or [])

    def call(self: ServerEnvironment, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for arg, schema in properties.items():
        if not arg.isidentifier() or keyword.iskeyword(arg) or arg == "self":
            raise ValueError(f"tool {name!r} argument {arg!r}: must be a Python identifier other than self")
        annotations[arg] = _python_type(schema)
        default = inspect.Parameter.empty if arg in required else None
        parameters.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotations[arg]))  # fmt: skip
    annotations["return"] = str
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    call.__name__ = call.__qualname__ = name
    lines = [" ".join(str(fn_spec.get("description") or name).split())]
    if properties:
        lines += ["", "Args:"] + [f"    {arg}: {_argument_doc(arg, s)}" for arg, s in properties.items()]
    lines += ["", "Returns:", "    The server's answer as JSON."]
    call.__doc__ = "\n".join(lines)
    return call


class ServerEnvironment:
    """One rollout's side of a resources server, for TRL's ``environment_factory``.

    :func:`gym_environment_factory` subclasses it with one method per tool. ``reset(**row)`` opens a
    fresh session and seeds it with the task row (from :data:`TASK_ROW_COLUMN`); each tool call posts
    its arguments to ``/<tool>`` in that session and returns the answer as JSON (a 4xx comes back as
    ``{"error": detail}``, which the model sees, as NeMo Gym's agents pass it on); ``get_reward()``
    posts ``/verify`` with the row and the calls made (their ``function_call`` and
    ``function_call_output`` items). TRL does not hand the environment the final assistant text, so
    verifiers that read it should score with :class:`GymReward` instead. Requests are tried as
    :class:`GymReward`'s are (``retry``, ``timeout_s``), and a ``/verify`` that still fails scores as
    ``on_verify_failure`` says (default ``"mask"``: None, which TRL leaves out). So does a rollout one of
    whose tool calls still failed (5xx, timeout, connection; the model is shown the error and goes on):
    the server's state lacks what the call would have done, so its score would not be the model's (in
    ``collect`` such a rollout fails too).
    """

    base_url: str = ""
    timeout_s: float | None = None
    auth_token: str | None = None
    retry: RetryPolicy | None = None
    on_verify_failure: OnVerifyFailure = "mask"

    def __init__(self) -> None:
        self._session: EnvSession | None = None
        self._lost_call: str | None = None  # why a tool call of this rollout failed, if one did
        self.row: dict[str, Any] = {}
        self.output: list[Any] = []
        self.last_answer: dict[str, Any] | None = None
        """The last ``/verify`` answer (None when it failed)."""

    def reset(self, **columns: Any) -> None:
        """Start this rollout: a new session (new cookie jar) seeded with the example's task row."""
        self.row = _rows_from_columns(1, {k: [v] for k, v in columns.items()})[0]
        self.output = []
        self.last_answer = None
        self._lost_call = None
        session = self._session = EnvSession(
            self.base_url, _policy(self.timeout_s, self.retry), bearer(self.auth_token)
        )
        try:
            _blocking(lambda client: seed_session(client, session, self.row))
        except RequestFailed as e:
            raise RuntimeError(f"/seed_session failed: {e}") from None
        return None

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        session = self._session
        if session is None:
            raise RuntimeError("reset() first: this environment has no session")
        call_id = new_id("call")
        self.output.append(FunctionCall(call_id=call_id, name=name, arguments=json.dumps(arguments)))
        try:
            answer = _blocking(lambda client: post_tool(client, session, name, arguments))
            text = json.dumps({"error": _detail(answer)}) if answer.status >= 400 else answer.text
        except RequestFailed as e:
            text = json.dumps({"error": str(e)})
            self._lost_call = self._lost_call or f"tool call {name!r} failed: {e}"
        self.output.append(FunctionCallOutput(call_id=call_id, output=text))
        return text

    def get_reward(self) -> float | None:
        """``/verify`` of this rollout in its session; when that fails, or a tool call of the rollout did,
        what ``on_verify_failure`` says (None by default, which TRL leaves out of the group). Before
        ``reset()`` there is no rollout to score: a RuntimeError (it had scored 0)."""
        session = self._session
        if session is None:
            raise RuntimeError("get_reward() before reset(): this environment has no rollout to score")
        if self._lost_call is not None:
            return _failed_reward(self.on_verify_failure, "tool-use rollout", self._lost_call)
        response = response_body(Response(output=self.output))
        try:
            self.last_answer = _blocking(lambda client: verify_rollout(client, session, self.row, response))
        except (RequestFailed, ValueError) as e:
            return _failed_reward(self.on_verify_failure, "tool-use rollout", str(e) or type(e).__name__)
        if (masked := _masked(self.last_answer)) is not None:
            return _failed_reward(self.on_verify_failure, "tool-use rollout", masked)
        return float(self.last_answer["reward"])  # checked a finite number by verify_rollout


def gym_environment_factory(
    base_url: str,
    tools: list[Mapping[str, Any]] | Any,
    *,
    timeout_s: float | None = None,
    auth_token: str | None = None,
    retry: RetryPolicy | None = None,
    on_verify_failure: OnVerifyFailure = "mask",
) -> type[ServerEnvironment]:
    """An ``environment_factory`` for TRL: a :class:`ServerEnvironment` subclass with a method per tool.

    ``tools`` is a task row's ``responses_create_params.tools`` or a dataset from :func:`task_dataset`
    (then its rows must all offer the same tools: TRL reads the methods once, from one instance).
    ``on_verify_failure`` as :class:`GymReward`'s.
    """
    mode = _failure_mode(on_verify_failure)
    if hasattr(tools, "column_names"):
        tools = _shared_tools(tools)
    specs = [t for t in tools if t.get("type", "function") == "function"]
    if not specs:
        raise ValueError("tools: no function tools to expose")
    methods = {}
    for spec in specs:
        method = _tool_method(spec)
        if method.__name__ in methods:  # the later schema had silently replaced the earlier one
            raise ValueError(f"tool name {method.__name__!r}: offered twice")
        methods[method.__name__] = method
    attrs = {"base_url": base_url.rstrip("/"), "timeout_s": timeout_s, "auth_token": auth_token, "retry": retry,
             "on_verify_failure": mode, **methods}  # fmt: skip
    return type("GymToolEnvironment", (ServerEnvironment,), attrs)


HERMES_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""transformers' ``response_template`` for ChatML chat templates that write tool calls as
``<tool_call>{"name", "arguments"}</tool_call>`` (Hermes style: Qwen's, and the project's ``tiny``)."""


def enable_tool_call_parsing(tokenizer: Any) -> Any:
    """Make ``tokenizer.parse_response`` read tool calls, which TRL's tool loop needs: TRL's own
    ``add_response_schema`` for the chat templates it knows, else :data:`HERMES_RESPONSE_TEMPLATE` for a
    ChatML template with Hermes-style tool calls; a ValueError for any other template."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return tokenizer
    from trl.chat_template_utils import add_response_schema

    try:
        return add_response_schema(tokenizer)
    except ValueError:
        template = tokenizer.chat_template or ""
        if "<tool_call>" not in template or "<|im_start|>" not in template:
            raise ValueError(
                "the tokenizer's chat template is neither one TRL knows nor ChatML with <tool_call> blocks: "
                "set tokenizer.response_template for its tool-call format"
            ) from None
    tokenizer.response_template = HERMES_RESPONSE_TEMPLATE
    return tokenizer


def _shared_tools(dataset: Any) -> list[Mapping[str, Any]]:
    first: list[Mapping[str, Any]] | None = None
    for i, text in enumerate(dataset[TASK_ROW_COLUMN]):
        tools = json.loads(text)["responses_create_params"].get("tools") or []
        if first is None:
            first = tools
        elif sorted(t.get("name", "") for t in tools) != sorted(t.get("name", "") for t in first):
            raise ValueError(f"row {i}: offers other tools than row 0; build one factory per tool set")
    return first or []

"""The single source of record formats: NeMo Gym's protocol objects as pydantic models.

Every record gym-bridge reads or writes (task rows, ``/verify`` bodies, rollouts) is one of the models
here. They mirror the OpenAI Responses API objects that NeMo Gym uses, with two deliberate choices:

* **Lenient, lossless parsing.** Every model keeps unknown fields (``extra="allow"``), and dumping with
  :func:`dump` (``exclude_unset``) gives back exactly the JSON that was read. Real NeMo Gym records
  carry fields that the ``openai`` package's strict models reject (``function_call_output`` items inside
  ``response.output``, ``usage`` without ``cache_write_tokens``, ``id: null``), so the output items are
  modelled here by ``type``, keeping the ``openai`` field names, and unknown item types pass through.
* **Pass-through extras.** Task fields such as ``expected_answer``, ``question``, ``verifier_metadata``
  travel untouched from the task row to ``/verify`` and into the rollout.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, Tag, field_validator

__all__ = [
    "ITEM_TYPES",
    "AgentRef",
    "EpisodeId",
    "FunctionCall",
    "FunctionCallOutput",
    "MCPServerMetadata",
    "OutputMessage",
    "OutputText",
    "Reasoning",
    "ResourcesCloseSessionRequest",
    "ResourcesCloseSessionResponse",
    "ResourcesSeedSessionRequest",
    "ResourcesSeedSessionResponse",
    "ResourcesVerifyRequest",
    "Response",
    "ResponsesCreateParams",
    "RolloutRecord",
    "TaskId",
    "TaskRow",
    "TrainingFields",
    "Usage",
    "VERDICT_FIELDS",
    "VerifyRequest",
    "VerifyResponse",
    "assistant_text",
    "dump",
    "input_items",
    "item_dict",
    "item_union",
    "last_user_text",
    "new_id",
    "reward_components_problem",
]

MAX_REWARD_COMPONENTS = 64
"""Most entries a ``reward_components`` object may have (a verifier scores a handful of objectives)."""
MAX_COMPONENT_NAME = 128
"""Longest component name, in characters (names become metric keys)."""


class _Open(BaseModel):
    """Base for protocol models: unknown fields are kept and round-trip unchanged."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict with exactly the fields that were read or set (lossless round-trip)."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def new_id(prefix: str) -> str:
    """An id in OpenAI's style, e.g. ``msg_3f2a...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- requests


class AgentRef(_Open):
    """Which agent (and so which environment) a task row belongs to: ``{"name": ...}``."""

    name: str


class ResponsesCreateParams(_Open):
    """The body of ``POST /v1/responses`` (non-streaming), as stored in a task row.

    ``input`` is a string or a list of input items (messages with ``role``/``content``,
    ``function_call`` and ``function_call_output`` items). The common sampling fields are typed so that
    a wrong type is reported by name; anything else the API accepts passes through.
    """

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, Any] | None = None


class TaskRow(_Open):
    """One line of a task JSONL file: the model request plus environment-specific fields."""

    responses_create_params: ResponsesCreateParams
    agent_ref: AgentRef | None = None


# --------------------------------------------------------------------------- response objects


class OutputText(_Open):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class TrainingFields(_Open):
    """NeMo Gym's training extras, attached by a policy server when asked for them (and carried back in
    the conversation by a later turn's input)."""

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None


class OutputMessage(TrainingFields):
    type: Literal["message"] = "message"
    id: str | None = None
    role: str = "assistant"
    status: str | None = "completed"
    content: str | list[OutputText | dict[str, Any]] = Field(default_factory=list)
    """A list of parts; a user turn of a conversation may carry a plain string, as NeMo Gym's records do."""


class FunctionCall(TrainingFields):
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = "completed"


class FunctionCallOutput(_Open):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str | list[Any]
    id: str | None = None
    status: str | None = None


class Reasoning(_Open):
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    encrypted_content: str | None = None


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
"""The item types modelled here; an item of any other ``type`` is kept as a plain dict (tag ``other``)."""


def item_union(message: type[BaseModel], tag: Callable[[Any], str | None]) -> Any:
    """A Responses item as a union discriminated by ``tag(item)``: ``message`` (the given message model:
    an output message, or a policy server's input message), :class:`FunctionCall`,
    :class:`FunctionCallOutput`, :class:`Reasoning`, any other tag a plain dict."""

    def tagged(item: Any) -> str:
        kind = tag(item)
        return kind if kind in ITEM_TYPES else "other"

    return Annotated[
        Annotated[message, Tag("message")]
        | Annotated[FunctionCall, Tag("function_call")]
        | Annotated[FunctionCallOutput, Tag("function_call_output")]
        | Annotated[Reasoning, Tag("reasoning")]
        | Annotated[dict[str, Any], Tag("other")],
        Discriminator(tagged),
    ]


def _item_type(item: Any) -> str | None:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


OutputItem = item_union(OutputMessage, _item_type)


class Usage(_Open):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class Response(_Open):
    """A Responses API ``response`` object (what the model endpoint returns)."""

    id: str = Field(default_factory=lambda: new_id("resp"))
    object: str = "response"
    created_at: float = Field(default_factory=time.time)
    model: str | None = None
    output: list[OutputItem] = Field(default_factory=list)
    status: str | None = "completed"
    usage: Usage | None = None
    error: Any = None
    incomplete_details: Any = None


# --------------------------------------------------------------------------- verify and rollouts


class VerifyRequest(TaskRow):
    """``POST /verify`` body: the task row as run, plus the model's final ``response``."""

    response: Response


def reward_components_problem(value: Any) -> str | None:
    """What is wrong with a ``reward_components`` value, naming the entry (``"<name>: ..."``); None when it is fine.

    NeMo Gym's multi-reward shape is ``{objective: score}``. Scores become group statistics and metric
    keys, so each must be a finite number (not a boolean) under a non-empty name of at most
    ``MAX_COMPONENT_NAME`` characters, and there are at most ``MAX_REWARD_COMPONENTS`` of them.
    """
    if not isinstance(value, dict):
        return f"expected an object of {{name: number}}, got {type(value).__name__}"
    if len(value) > MAX_REWARD_COMPONENTS:
        return f"{len(value)} components, at most {MAX_REWARD_COMPONENTS} allowed"
    for name, score in value.items():
        if not isinstance(name, str) or not name or len(name) > MAX_COMPONENT_NAME:
            return f"{str(name)[:40]!r}: a component name must be 1 to {MAX_COMPONENT_NAME} characters"
        if not is_finite_number(score):
            return f"{name}: expected a finite number, got {score!r:.40}"
    return None


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number a float can hold: not a boolean, NaN or infinity, nor an integer too
    large for a float (Python's JSON reads ``1`` followed by 400 zeros as one, and ``float()`` of it raises)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class VerifyResponse(VerifyRequest):
    """``/verify`` answer: the request echoed back with the reward and, where they apply, diagnostics."""

    reward: float
    reward_components: dict[str, float] | None = None
    """Optional per-objective scores beside ``reward`` (NeMo Gym's multi-reward verifiers):
    ``{name: finite number}``; collect reports a mean per component, the trainer can weight them
    (``grpo.reward_weights``) or normalise each within its group (GDPO)."""
    failure_kind: str | None = None
    failure_reason: str | None = None
    mask_sample: bool | None = None

    @field_validator("reward_components", mode="before")
    @classmethod
    def _components_valid(cls, value: Any) -> Any:
        problem = None if value is None else reward_components_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


VERDICT_FIELDS: frozenset[str] = frozenset(VerifyResponse.model_fields) - frozenset(VerifyRequest.model_fields)
"""What ``/verify`` decides (``VerifyResponse``'s own fields: ``reward``, ``reward_components``, ``failure_kind``,
``failure_reason``, ``mask_sample``); the rest of a rollout is its input. A request carrying them (a rollout fed
back as a task) has them dropped, never echoed beside a new verdict: reverify's payload, every server's
``/verify`` (:attr:`~gym_bridge.serving.server.ResourcesServer.verdict_keys`)."""


class RolloutRecord(VerifyResponse):
    """One line of rollout JSONL, as NeMo Gym writes it (``_ng_*`` keys are its bookkeeping)."""

    reward: float | None = None  # type: ignore[assignment]  # third-party rollouts may lack it
    ng_task_index: int | None = Field(default=None, alias="_ng_task_index")
    ng_rollout_index: int | None = Field(default=None, alias="_ng_rollout_index")


# --------------------------------------------------------------------------- record helpers


def input_items(params: ResponsesCreateParams | dict[str, Any]) -> list[dict[str, Any]]:
    """The request's input as a list of items (a bare string becomes one user message)."""
    raw = params.input if isinstance(params, ResponsesCreateParams) else params.get("input", [])
    if isinstance(raw, str):
        return [{"role": "user", "content": raw, "type": "message"}]
    return list(raw or [])


def content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts (``input_text``/``output_text``/``text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
        elif isinstance(getattr(part, "text", None), str):
            parts.append(part.text)
    return "".join(parts)


def last_user_text(params: ResponsesCreateParams | dict[str, Any]) -> str:
    """Text of the last user message of a request ("" when there is none)."""
    for item in reversed(input_items(params)):
        if isinstance(item, dict) and item.get("role") == "user":
            return content_text(item.get("content"))
    return ""


def item_dict(item: Any) -> dict[str, Any] | None:
    """An input/output item as a dict (models dumped); None for anything that is not an item object.

    Real NeMo Gym rollouts carry output entries that are not items (one environment stores each turn as
    a list of items); readers skip them, as NeMo Gym's own readers skip item types they do not know.
    """
    if isinstance(item, dict):
        return item
    if isinstance(item, BaseModel):
        return dump(item)
    return None


def assistant_text(output: list[Any], sep: str = " ") -> str:
    """All assistant message text of a response's ``output``, messages joined by ``sep``; other entries skipped."""
    texts = []
    for item in output:
        if type(item) is OutputMessage:
            # Read in place: what its dump would say (a ``type`` that was set, the role, the text parts)
            # without the dump, which cost more than the rest of the math server's check of an answer.
            if "type" in item.model_fields_set and item.role == "assistant":
                texts.append(content_text(item.content))
            continue
        d = item_dict(item)
        if d is not None and d.get("type") == "message" and d.get("role", "assistant") == "assistant":
            texts.append(content_text(d.get("content")))
    return sep.join(texts)


# --------------------------------------------------------------------------- Environment Server sessions


class _Closed(BaseModel):
    """Base for NeMo Gym 0.7.0's Environment Server session models: unknown fields are refused, as there."""

    model_config = ConfigDict(extra="forbid")


class EpisodeId(_Closed):
    """One physical attempt of a logical rollout (``nemo_gym.episode_types.EpisodeId``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, rollout_id: str) -> str:
        # NeMo Gym reserves ``-a<N>`` for the attempt-qualified capture key (``<rollout_id>-a<attempt>``).
        if re.search(r"-a[1-9][0-9]*$", rollout_id):
            raise ValueError("rollout_id must not end with the reserved attempt suffix '-a<N>'")
        return rollout_id


class TaskId(_Closed):
    """One task of a run-qualified taskset (``nemo_gym.episode_types.TaskId``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class MCPServerMetadata(BaseModel):
    """How an agent reaches one session's tools over MCP: ``url_path`` on the server, with ``headers``
    (the session's signed token) on every request."""

    server_name: str
    url_path: str = "/mcp"
    transport: str = "http"
    headers: dict[str, str]


class ResourcesSeedSessionRequest(_Closed):
    """``POST /seed_session`` from an Environment Server: state under a caller-assigned id; the task row
    (without ``responses_create_params``) is ``task_data``. Repeating it returns the existing session."""

    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, JsonValue]


class ResourcesSeedSessionResponse(_Closed):
    """The seeded session's id, and the session's MCP access when the server exposes its tools over MCP."""

    resources_session_id: str
    resources_tools: MCPServerMetadata | None = None
    sandbox_access: dict[str, Any] | None = None


class ResourcesVerifyRequest(_Closed):
    """``POST /verify`` from an Environment Server: the episode's identity and the server's own verify
    body as ``verification_input``; the session is the one the seed's cookie names."""

    episode_id: EpisodeId
    task_id: TaskId
    verification_input: dict[str, Any]


class ResourcesCloseSessionRequest(_Closed):
    """``POST /close_session``: release the session; idempotent, and it keeps a later seed of the id out."""

    resources_session_id: str
    episode_id: EpisodeId


class ResourcesCloseSessionResponse(_Closed):
    resources_session_id: str

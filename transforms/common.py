"""What every transform needs from a rollout record: checked access to its prompt, response and reward.

Rollouts are handled as plain dicts (as read from JSONL), not pydantic models: a transform touches a
handful of fields, and building the full model for a million lines would cost more than the transform.
The text and chat mappings themselves live once, in :mod:`gym_bridge.records.schema` and :mod:`gym_bridge.records.chat`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from gym_bridge.records.chat import items_to_messages
from gym_bridge.records.jsonl import JsonlError, ReadStats, iter_jsonl
from gym_bridge.records.schema import assistant_text, input_items, is_finite_number, last_user_text

__all__ = [
    "RecordError",
    "check_rollout",
    "check_scored_rollout",
    "in_reward_range",
    "is_cut_off",
    "iter_rollouts",
    "output_items",
    "prompt_messages",
    "prompt_text",
    "response_messages",
    "response_text",
    "reward_of",
    "task_name_of",
]


class RecordError(ValueError):
    """A JSON object that is not a usable record (a missing or mistyped field); the reader adds file:line."""


def _params(record: dict[str, Any]) -> dict[str, Any]:
    params = record.get("responses_create_params")
    if not isinstance(params, dict):
        raise RecordError("missing 'responses_create_params' object")
    raw = params.get("input")
    if not isinstance(raw, str | list):
        raise RecordError("'responses_create_params.input' must be a string or a list of items")
    return params


def output_items(record: dict[str, Any]) -> list[Any]:
    """The rollout's ``response.output`` items (a top-level ``output`` list, as in NeMo Gym's docs, also works)."""
    response = record.get("response")
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        return response["output"]
    if isinstance(record.get("output"), list):
        return record["output"]
    raise RecordError("missing 'response.output' list")


def reward_of(record: dict[str, Any], default: float | None = None) -> float:
    """The rollout's reward as a float; ``default`` when absent or null, and with no default a RecordError
    (an unscored rollout is no training signal: read as 0 it was learned as a wrong answer); RecordError
    when not a finite number."""
    reward = record.get("reward")
    if reward is None:
        if default is None:
            raise RecordError("no 'reward': the rollout was not scored (score it with `gym-bridge reverify`)")
        return default
    if not is_finite_number(reward):  # NaN, inf, "1", true, or an integer too large for a float
        raise RecordError(f"'reward' must be a finite number, got {str(reward)[:60]!r}")
    return float(reward)


def check_rollout(record: dict[str, Any]) -> dict[str, Any]:
    """Return ``record`` if it has what every transform reads (prompt, output items, a numeric reward
    where it has one)."""
    _params(record)
    output_items(record)
    reward_of(record, 0.0)
    return record


def check_scored_rollout(record: dict[str, Any]) -> dict[str, Any]:
    """:func:`check_rollout`, and the record must have a reward (what every ``transform`` verb reads)."""
    check_rollout(record)
    reward_of(record)
    return record


def is_cut_off(record: dict[str, Any]) -> bool:
    """Whether the rollout's response was cut off (``status: incomplete`` or ``incomplete_details`` set, as
    at ``max_output_tokens``, on the response or an output message; a function call marked incomplete is
    not, as Codex's rollouts in NeMo Gym's examples mark finished calls): a text that stops mid-answer,
    no demonstration to imitate."""
    response = record.get("response")
    if not isinstance(response, dict):
        return False
    if response.get("status") == "incomplete" or response.get("incomplete_details"):
        return True
    items = response.get("output")
    return isinstance(items, list) and any(
        isinstance(i, dict) and i.get("type") == "message" and i.get("status") == "incomplete" for i in items
    )


def prompt_text(record: dict[str, Any]) -> str:
    """Text of the last user message of the rollout's request (string or content parts)."""
    return last_user_text(_params(record))


def prompt_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as chat messages: ``instructions`` as system, developer -> system, user, earlier turns."""
    params = _params(record)
    return items_to_messages(input_items(params), params.get("instructions"))


def response_text(record: dict[str, Any]) -> str:
    """All assistant message text of the rollout's output, messages joined by a space (NeMo Gym's rule)."""
    return assistant_text(output_items(record))


def response_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The rollout's output as chat messages: assistant text, ``tool_calls`` and ``tool`` results."""
    return items_to_messages(output_items(record))


def task_name_of(record: dict[str, Any], default: str = "default") -> str:
    """NeMo RL ``task_name`` of a rollout: its ``agent_ref`` name, else its environment server, else ``default``."""
    agent_ref = record.get("agent_ref")
    if isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str) and agent_ref["name"]:
        return agent_ref["name"]
    env = record.get("_ng_environment_server")
    return env if isinstance(env, str) and env else default


def in_reward_range(reward: float, min_reward: float | None = None, max_reward: float | None = None) -> bool:
    """Whether ``reward`` passes an inclusive ``[min_reward, max_reward]`` filter (None = unbounded)."""
    return (min_reward is None or reward >= min_reward) and (max_reward is None or reward <= max_reward)


def iter_rollouts(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    on_error: Callable[[JsonlError], None] | None = None,
    stats: ReadStats | None = None,
    check: Callable[[dict[str, Any]], Any] = check_rollout,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream ``(line_number, record)`` of the usable records of a JSONL file.

    A line that is not JSON, or a record that ``check`` rejects, is reported as a :class:`JsonlError`
    naming file and line: raised with ``strict``, otherwise passed to ``on_error``, counted in
    ``stats.skipped`` and skipped.
    """
    stats = stats if stats is not None else ReadStats()
    for lineno, record in iter_jsonl(path, strict=strict, on_error=on_error, stats=stats):
        try:
            check(record)
        except RecordError as e:
            err = JsonlError(path, lineno, str(e))
            if strict:
                raise err from None
            stats.read -= 1
            stats.skipped += 1
            if on_error is not None:
                on_error(err)
            continue
        yield lineno, record

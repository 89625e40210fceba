"""Rollout -> NeMo RL GRPO record, one rollout at a time (strictly streaming).

Two shapes, both read by NeMo RL:

* ``ResponseDataset`` (default): ``{"input": <last user text>, "output": <assistant text>, "reward": r}``;
  the key names follow the dataset's ``input_key``/``output_key`` (and ``reward_key``).
* HF chat: ``{"messages": [...], "task_name": ..., "reward": r}``; ``messages`` is the prompt (system,
  user, earlier turns) followed by the rollout's assistant turn(s) with tool calls, or the prompt alone
  with ``prompt_only`` (online GRPO, where the policy generates the answer).

A rollout without a reward is a :class:`~transforms.common.RecordError` unless ``default_reward`` is given
(NeMo Gym's documented script reads it as 0, which trains an unscored answer as a wrong one).

``keep_fields`` copies task fields (``expected_answer``, ``verifier_metadata`` ...) that the
environment needs to score a fresh generation; absent fields are left out, and they never overwrite the
record's own keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from transforms.common import (
    prompt_messages,
    prompt_text,
    response_messages,
    response_text,
    reward_of,
    task_name_of,
)

__all__ = ["check_keys", "to_grpo", "to_grpo_chat"]


def check_keys(**keys: str) -> None:
    """ValueError when two of the output's keys (``input_key="text"``...) are one name: the later value
    would overwrite the earlier in every record (``--input-key text --output-key text`` wrote records
    without their prompt)."""
    seen: dict[str, str] = {}
    for option, key in keys.items():
        if key in seen:
            raise ValueError(f"{seen[key]} and {option} are both {key!r}: one would overwrite the other")
        seen[key] = option


def _with_kept(out: dict[str, Any], record: dict[str, Any], keep_fields: Iterable[str]) -> dict[str, Any]:
    kept = {name: record[name] for name in keep_fields if name in record and name not in out}
    if not kept:
        return out
    return {**out, **kept}


def to_grpo(
    record: dict[str, Any],
    *,
    input_key: str = "input",
    output_key: str = "output",
    reward_key: str = "reward",
    keep_fields: Iterable[str] = (),
    default_reward: float | None = None,
) -> dict[str, Any]:
    """A rollout as a NeMo RL ``ResponseDataset`` record ``{input, output, reward}`` (keys renameable,
    distinct: :func:`check_keys`)."""
    check_keys(input_key=input_key, output_key=output_key, reward_key=reward_key)
    out = {
        input_key: prompt_text(record),
        output_key: response_text(record),
        reward_key: reward_of(record, default_reward),
    }
    return _with_kept(out, record, keep_fields)


def to_grpo_chat(
    record: dict[str, Any],
    *,
    task_name: str | None = None,
    reward_key: str = "reward",
    keep_fields: Iterable[str] = (),
    prompt_only: bool = False,
    default_reward: float | None = None,
) -> dict[str, Any]:
    """A rollout in NeMo RL's HF chat form ``{messages, task_name, reward}``.

    ``task_name`` defaults to the rollout's ``agent_ref`` name (else its environment server, else
    ``"default"``), which is how NeMo RL routes a datum to its environment. ``reward_key`` may not be
    ``messages`` or ``task_name``.
    """
    check_keys(messages="messages", task_name="task_name", reward_key=reward_key)
    messages = prompt_messages(record)
    if not prompt_only:
        messages.extend(response_messages(record))
    out = {
        "messages": messages,
        "task_name": task_name or task_name_of(record),
        reward_key: reward_of(record, default_reward),
    }
    return _with_kept(out, record, keep_fields)

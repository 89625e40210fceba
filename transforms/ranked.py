"""A task's rollouts <-> a ranked group ``{"prompt", "group": [{"response", "rank"}]}``.

Ranks (rollouts -> ranked): by reward, highest first, rank 1 = best. Equal rewards share a rank and the
next lower reward takes the next rank ("dense" ranking: rewards 1.0, 0.5, 0.5, 0.0 rank 1, 2, 2, 3).
Members are listed by rank, file order among equals, and each also carries its ``reward``.

Rewards (ranked -> GRPO): linear in the rank, ``(worst - rank) / (worst - best)`` with ``best``/``worst``
the group's lowest/highest rank numbers: 1.0 for the best, 0.0 for the worst, evenly spaced between.
A group whose members all share one rank (a tie, or a single member) has no order and gives no records:
it had given 1.0 to each, so a group of wrong answers tied at reward 0 came out as 1.0 rewards.
With dense ranks, rewards that were evenly spaced (e.g. 0/1, or 0/0.5/1) survive the round trip exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gym_bridge.records.schema import content_text
from transforms.common import (
    RecordError,
    prompt_messages,
    prompt_text,
    response_messages,
    response_text,
    reward_of,
)
from transforms.grpo import check_keys

__all__ = ["check_ranked", "dense_ranks", "rank_reward", "ranked_to_grpo", "to_ranked"]


def dense_ranks(rewards: Sequence[float]) -> list[int]:
    """Rank 1 for the highest reward; equal rewards share a rank; the next distinct reward is the next rank."""
    rank_of = {reward: rank for rank, reward in enumerate(sorted(set(rewards), reverse=True), start=1)}
    return [rank_of[r] for r in rewards]


def to_ranked(group: Sequence[dict[str, Any]], *, chat: bool = False) -> dict[str, Any]:
    """One task's rollouts as a ranked group (text by default, chat messages with ``chat``)."""
    rewards = [reward_of(r) for r in group]
    ranks = dense_ranks(rewards)
    respond = response_messages if chat else response_text
    order = sorted(range(len(group)), key=ranks.__getitem__)
    return {
        "prompt": prompt_messages(group[0]) if chat else prompt_text(group[0]),
        "group": [{"response": respond(group[i]), "rank": ranks[i], "reward": rewards[i]} for i in order],
    }


def rank_reward(rank: int, best: int, worst: int) -> float:
    """Linear reward of ``rank`` in a group ranked ``best``..``worst``: 1.0 at best, 0.0 at worst."""
    if worst == best:
        return 1.0
    return (worst - rank) / (worst - best)


def check_ranked(record: dict[str, Any]) -> dict[str, Any]:
    """Return ``record`` if it is a ranked group: a prompt and a non-empty list of ``{response, rank >= 1}``."""
    if not isinstance(record.get("prompt"), str | list):
        raise RecordError("missing 'prompt' (text or chat messages)")
    group = record.get("group")
    if not isinstance(group, list) or not group:
        raise RecordError("missing non-empty 'group' list")
    for n, member in enumerate(group):
        if not isinstance(member, dict) or not isinstance(member.get("response"), str | list):
            raise RecordError(f"group[{n}] has no 'response'")
        rank = member.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise RecordError(f"group[{n}] 'rank' must be an integer >= 1, got {rank!r}")
    return record


def _prompt_as_text(prompt: str | list[Any]) -> str:
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _response_as_text(response: str | list[Any]) -> str:
    if isinstance(response, str):
        return response
    return " ".join(
        content_text(m.get("content"))
        for m in response
        if isinstance(m, dict) and m.get("role") == "assistant"
    )


def ranked_to_grpo(
    record: dict[str, Any],
    *,
    input_key: str = "input",
    output_key: str = "output",
    reward_key: str = "reward",
) -> list[dict[str, Any]]:
    """A ranked group as GRPO records, one per member, with the rank-derived linear reward; none (an empty
    list) for a group without an order (every member at one rank)."""
    check_keys(input_key=input_key, output_key=output_key, reward_key=reward_key)
    check_ranked(record)
    ranks = [m["rank"] for m in record["group"]]
    best, worst = min(ranks), max(ranks)
    if best == worst:
        return []
    prompt = _prompt_as_text(record["prompt"])
    return [
        {
            input_key: prompt,
            output_key: _response_as_text(m["response"]),
            reward_key: rank_reward(m["rank"], best, worst),
        }
        for m in record["group"]
    ]

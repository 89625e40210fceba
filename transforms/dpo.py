"""A task's rollouts -> DPO preference pairs ``{prompt, chosen, rejected, chosen_reward, rejected_reward}``.

Default: one pair per task, the best rollout against the worst (the first one in file order among
equals); a task whose best and worst rewards are equal gives no pair, since a tie teaches no preference.
``all_pairs`` pairs every rollout with every lower-rewarded one instead. Either way a pair needs
``chosen_reward - rejected_reward >= min_margin`` and strictly above zero. A rollout whose response was
cut off (:func:`~transforms.common.is_cut_off`, e.g. at ``max_output_tokens``) is never chosen, unless
``chosen_cut_off``: DPO would teach its text, which stops mid-answer, as the preferred one. Every rollout
needs a reward (a RecordError otherwise). With ``drop_equal`` (what ``gym-bridge transform dpo`` passes) a
pair whose chosen and rejected are written the same is left out (in the text form, two tool-using
rollouts that differ only in their calls, which that form leaves out): it holds no preference, only a
claim that one of two equal answers is better.

``chat=False`` (default, NeMo Gym's documented shape) writes the prompt as the last user message's text
and the responses as assistant text; ``chat=True`` writes chat messages (prompt with system/developer
turns, responses with ``tool_calls`` and ``tool`` results).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transforms.common import (
    is_cut_off,
    prompt_messages,
    prompt_text,
    response_messages,
    response_text,
    reward_of,
)

__all__ = ["dpo_pairs"]


def _pair_indices(
    rewards: list[float], all_pairs: bool, min_margin: float, choosable: list[bool]
) -> list[tuple[int, int]]:
    def wanted(i: int, j: int) -> bool:
        gap = rewards[i] - rewards[j]
        return choosable[i] and gap > 0 and gap >= min_margin

    if all_pairs:
        order = sorted(range(len(rewards)), key=lambda i: -rewards[i])  # stable: file order among equals
        return [(i, j) for pos, i in enumerate(order) for j in order[pos + 1 :] if wanted(i, j)]
    candidates = [i for i in range(len(rewards)) if choosable[i]]
    if not candidates:
        return []
    best = max(candidates, key=rewards.__getitem__)
    worst = min(range(len(rewards)), key=rewards.__getitem__)
    return [(best, worst)] if wanted(best, worst) else []


def dpo_pairs(
    group: Sequence[dict[str, Any]],
    *,
    all_pairs: bool = False,
    min_margin: float = 0.0,
    chat: bool = False,
    chosen_cut_off: bool = False,
    drop_equal: bool = False,
) -> list[dict[str, Any]]:
    """Preference pairs from the rollouts of one task (empty when all rewards tie or the group is too small)."""
    rewards = [reward_of(r) for r in group]  # first: an unscored rollout is refused even on its own
    if len(group) < 2:
        return []
    choosable = [chosen_cut_off or not is_cut_off(r) for r in group]
    pairs = _pair_indices(rewards, all_pairs, min_margin, choosable)
    if not pairs:
        return []
    respond = response_messages if chat else response_text
    prompt = prompt_messages(group[0]) if chat else prompt_text(group[0])
    written = [(i, j, respond(group[i]), respond(group[j])) for i, j in pairs]
    return [
        {
            "prompt": prompt,
            "chosen": chosen,
            "rejected": rejected,
            "chosen_reward": rewards[i],
            "rejected_reward": rewards[j],
        }
        for i, j, chosen, rejected in written
        if not (drop_equal and chosen == rejected)
    ]

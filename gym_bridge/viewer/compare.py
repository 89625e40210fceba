"""Two runs of the same tasks side by side: per task the mean reward before and after, and what flipped.

Tasks are matched by their prompt (the same prompt in both files is the same task, whatever its
``_ng_task_index``). A task *passes* when at least half of its rollouts are correct
(``reward >= 1``); it *flipped* when it passes in one run and not in the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from gym_bridge.viewer.index import RolloutIndex

__all__ = ["CompareRow", "compare_runs", "passes"]


def passes(index: RolloutIndex, tid: int) -> bool:
    """At least half of the task's rollouts are correct."""
    return index.task_pass_1[tid] >= 0.5


@dataclass
class CompareRow:
    tid_a: int
    tid_b: int
    reward_a: float
    reward_b: float
    flip: str
    """``up`` (now passes), ``down`` (no longer passes) or ``""``."""

    @property
    def delta(self) -> float:
        return self.reward_b - self.reward_a


def compare_runs(a: RolloutIndex, b: RolloutIndex) -> tuple[list[CompareRow], dict[str, int]]:
    """Rows for the tasks in both runs, and counts (in both, only in a / b, improved, regressed, flips)."""
    by_prompt_b = {b.task_prompt_keys[t]: t for t in range(b.num_tasks)}
    rows = []
    matched_b = set()
    for ta in range(a.num_tasks):
        tb = by_prompt_b.get(a.task_prompt_keys[ta])
        if tb is None:
            continue
        matched_b.add(tb)
        pa, pb = passes(a, ta), passes(b, tb)
        flip = "up" if pb and not pa else "down" if pa and not pb else ""
        rows.append(CompareRow(ta, tb, a.task_mean_reward[ta], b.task_mean_reward[tb], flip))
    counts = {
        "both": len(rows),
        "only_a": a.num_tasks - len(rows),
        "only_b": b.num_tasks - len(matched_b),
        "improved": sum(r.delta > 0 for r in rows),
        "regressed": sum(r.delta < 0 for r in rows),
        "flipped_up": sum(r.flip == "up" for r in rows),
        "flipped_down": sum(r.flip == "down" for r in rows),
    }
    return rows, counts

"""Failed rollouts: counted per batch, named by kind, and fatal above ``grpo.max_failed_rollouts_fraction``.

A rollout fails when the agent loop gives up on it (an environment or the policy server unreachable,
timing out, answering garbage) or when its record cannot become a training sequence (no token ids,
a turn whose prompt does not extend the previous one). Such a rollout is dropped from the batch. A few
are noise; many mean a broken environment, and training on what is left is training on a partial,
biased batch (NeMo RL users lost days to a crashed environment that left training on empty epochs,
its issue 2305). Above the threshold the run stops with :class:`TooManyFailedRollouts`, which names
the failure kinds, their counts and an example message; the checkpoints already written stay, and a
restarted run resumes from the latest.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["BadReward", "FailureTally", "TooManyFailedRollouts"]


class BadReward(ValueError):
    """A rollout whose ``/verify`` answer has a reward that is not a finite number (null, a string, a
    boolean, NaN): counted as a failed rollout of kind ``verify/bad_reward``, never trained on."""


class TooManyFailedRollouts(RuntimeError):
    """More rollouts of a batch failed than ``grpo.max_failed_rollouts_fraction`` allows (or all did)."""

    def __init__(
        self,
        failed: int,
        requested: int,
        kinds: dict[str, int],
        example: str,
        threshold: float,
        step: int | None = None,
    ) -> None:
        self.failed, self.requested, self.kinds = failed, requested, dict(kinds)
        self.example, self.threshold, self.step = example, threshold, step
        super().__init__(self._message())

    def __reduce__(self) -> tuple[Any, ...]:  # pickled across the rollout process's pipe
        return (
            TooManyFailedRollouts,
            (self.failed, self.requested, self.kinds, self.example, self.threshold, self.step),
        )

    def at_step(self, step: int) -> TooManyFailedRollouts:
        """The same error, naming the training step it happened in."""
        return TooManyFailedRollouts(self.failed, self.requested, self.kinds, self.example, self.threshold, step)

    def _message(self) -> str:
        where = f"step {self.step}: " if self.step is not None else ""
        kinds = ", ".join(f"{n} x {kind}" for kind, n in sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        share = self.failed / self.requested if self.requested else 1.0
        return (
            f"{where}{self.failed} of {self.requested} rollouts failed ({share:.0%}; "
            f"grpo.max_failed_rollouts_fraction is {self.threshold:g}): {kinds}; e.g. {self.example}. "
            "The run stops rather than train on a partial batch; the checkpoints written so far are kept "
            "and a rerun resumes from the latest once the cause (often an environment server) is fixed."
        )


class FailureTally:
    """The failed rollouts of one batch, by kind (``stage/failure_class``), with the first message."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.example = ""

    def add(self, kind: str, message: str) -> None:
        self.kinds[kind] += 1
        if not self.example:
            self.example = f"{kind}: {message}"

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    def check(self, requested: int, threshold: float, *, any_kept: bool) -> None:
        """Raise :class:`TooManyFailedRollouts` when more than ``threshold`` of ``requested`` failed, or
        nothing is left to train on."""
        if self.count > threshold * requested or (not any_kept and requested):
            kinds = dict(self.kinds) or {"no_sample": requested}
            example = self.example or "no rollout of the batch became a training sequence"
            raise TooManyFailedRollouts(sum(kinds.values()), requested, kinds, example, threshold)

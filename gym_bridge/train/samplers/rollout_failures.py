"""Failed rollouts: counted per batch, named by kind, and fatal above ``grpo.max_failed_rollouts_fraction``.

A rollout fails when the agent loop gives up on it (an environment or the policy server unreachable,
timing out, answering garbage) or when its record cannot become a training sequence (no token ids,
a turn whose prompt does not extend the previous one). Such a rollout is dropped from the batch. A few
are noise; many mean a broken environment, and training on what is left is training on a partial,
biased batch (NeMo RL users lost days to a crashed environment that left training on empty epochs,
its issue 2305). Above the threshold the run stops with :class:`TooManyFailedRollouts`, which names
the failure kinds, their counts and an example message; the checkpoints already written stay, and a
restarted run resumes from the latest.

A sample the environment masks (``mask_sample: true``: a judge down or failing, the verdict unknown) is
kept out of the loss but counts toward the same threshold, named ``verify/<failure_kind> (masked)``: a
judge failing every call otherwise left every step without a sample in the loss, each update skipped,
and a run that learned nothing ending with exit 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["MASKED", "BadReward", "FailureTally", "TooManyFailedRollouts", "masked_kind"]

MASKED = " (masked)"
"""Suffix of a kind counted for a sample the environment masked (kept, but out of the loss)."""


def masked_kind(record: dict[str, Any]) -> str:
    """The kind a masked sample is counted as: ``verify/<its failure_kind> (masked)``."""
    kind = record.get("failure_kind")
    kind = kind[:60] if isinstance(kind, str) and kind else "mask_sample"
    return f"verify/{kind}{MASKED}"


class BadReward(ValueError):
    """A rollout whose ``/verify`` answer has a reward that is not a finite number (null, a string, a
    boolean, NaN): counted as a failed rollout of kind ``verify/bad_reward``, never trained on."""


class TooManyFailedRollouts(RuntimeError):
    """More rollouts of a batch failed (or were masked by the environment) than
    ``grpo.max_failed_rollouts_fraction`` allows, or none is left for the loss."""

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
        masked = " or were masked by the env (mask_sample)" if any(MASKED in k for k in self.kinds) else ""
        return (
            f"{where}{self.failed} of {self.requested} rollouts failed{masked} ({share:.0%}; "
            f"grpo.max_failed_rollouts_fraction is {self.threshold:g}): {kinds}; e.g. {self.example}. "
            "The run stops rather than train on a partial batch; the checkpoints written so far are kept "
            "and a rerun resumes from the latest once the cause (often an environment server) is fixed."
        )


class FailureTally:
    """The failed rollouts of one batch, by kind (``stage/failure_class``), with the first message; and the
    samples the environment masked, by kind (:func:`masked_kind`)."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.masked: Counter[str] = Counter()
        self.example = ""
        self.masked_example = ""

    def add(self, kind: str, message: str) -> None:
        self.kinds[kind] += 1
        if not self.example:
            self.example = f"{kind}: {message}"

    def add_masked(self, record: dict[str, Any]) -> None:
        """Count a sample whose ``/verify`` answer has ``mask_sample: true`` (it stays in the batch)."""
        kind = masked_kind(record)
        self.masked[kind] += 1
        if not self.masked_example:
            reason = record.get("failure_reason")
            self.masked_example = f"{kind}: {str(reason)[:300] if reason else 'mask_sample: true'}"

    @property
    def count(self) -> int:
        """Failed rollouts (dropped from the batch); masked samples are :attr:`masked_count`."""
        return sum(self.kinds.values())

    @property
    def masked_count(self) -> int:
        return sum(self.masked.values())

    def check(self, requested: int, threshold: float, *, any_kept: bool) -> None:
        """Raise :class:`TooManyFailedRollouts` when more than ``threshold`` of ``requested`` failed or were
        masked, or nothing is left for the loss (``any_kept``: a sample not masked is left)."""
        if self.count + self.masked_count > threshold * requested or (not any_kept and requested):
            kinds = dict(self.kinds + self.masked) or {"no_sample": requested}
            example = self.example or self.masked_example or "no rollout of the batch became a training sequence"
            raise TooManyFailedRollouts(sum(kinds.values()), requested, kinds, example, threshold)

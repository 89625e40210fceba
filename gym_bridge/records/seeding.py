"""Per-rollout sampling seeds, one function for ``collect`` and the trainer.

A rollout's seed is a hash of the run's seed and the rollout's position (``collect``: task index and
repeat; the trainer: step, prompt and generation): repeats differ, a rerun or a resumed run asks for
the same samples, and the seed is independent of how rollouts are batched or ordered.
"""

from __future__ import annotations

import hashlib

__all__ = ["rollout_seed"]


def rollout_seed(seed: int, *position: int) -> int:
    """A reproducible sampling seed in [0, 2**31) for the rollout at ``position`` of a run seeded ``seed``."""
    key = ":".join(str(int(part)) for part in (seed, *position))
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31)

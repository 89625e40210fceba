"""Fewer passes of the cycle collector while a run's event loop is busy.

Why: CPython runs its cycle collector after every 700 net allocations of container objects (generation 0),
the next generation every 10 of those, and each pass walks every live object of the generations it
collects. ``collect`` at high concurrency holds thousands of rollouts in flight, each with fresh dicts
and lists (request bodies, answers, records), so the passes kept walking objects that reference counting
was about to free anyway: at ``--concurrency 4096``, 32,768 math rollouts, the collector took 7.5 of the
run's 44 CPU-seconds (1,825 young, 166 middle and 13 full passes, ~0.3 s each; ``gc.callbacks`` timing).
A rollout's values (JSON, pydantic dumps) hold no reference cycles and are freed by reference counting;
the collector is needed only for the rare cycle (an exception's traceback, a closed connection), which the
larger thresholds still collect, a little later.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["RUN_THRESHOLDS", "rare_collections"]

RUN_THRESHOLDS = (50_000, 20, 20)
"""Allocations before a young pass, and young (middle) passes before a middle (full) one. With these
the collector took 1.4 CPU-s of the run above (121, 9 and 1 passes)."""


@contextmanager
def rare_collections(thresholds: tuple[int, int, int] = RUN_THRESHOLDS) -> Iterator[None]:
    """Run the block with the collector's thresholds at ``thresholds``, then restore the previous ones."""
    previous = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*previous)

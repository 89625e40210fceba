"""The run's collector thresholds: raised inside the block, restored after it, and cycles still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from gym_bridge.serving.gc_policy import RUN_THRESHOLDS, rare_collections


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_thresholds_are_raised_inside_and_restored_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), rare_collections():
        assert gc.get_threshold() == RUN_THRESHOLDS
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == before


def test_a_reference_cycle_is_still_collected_without_asking() -> None:
    """Past the young threshold the collector runs by itself and frees an unreachable cycle."""
    gc.collect()
    with rare_collections((5_000, 10, 10)):
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # a cycle: reference counting alone cannot free it
        kept = [[] for _ in range(6_000)]  # more than the young threshold, all alive
        assert gone() is None
        assert len(kept) == 6_000

"""Which (task, repeat) pairs a run has already done, in a bit each, read from its files as a stream.

Why: ``--resume`` kept a Python set of tuples (about 150 bytes a rollout) and every earlier record
slimmed (about 1 KB) to summarise the run at the end; a run of a million rollouts resumed with gigabytes.
Here a pair is one bit of a bitmap (task x repeats + repeat), and each earlier record is handed to the
caller once (its metrics are counted as it goes by) instead of being kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_bridge.collect.output import ROLLOUT_INDEX, TASK_INDEX, keyed_records

__all__ = ["PairSet", "read_done", "read_pairs"]


class PairSet:
    """A set of non-negative ``(task, repeat)`` pairs: one bit each for ``repeat < stride``, a plain set beyond."""

    def __init__(self, stride: int) -> None:
        self.stride = max(1, stride)
        self.bits = bytearray()
        self.others: set[tuple[int, int]] = set()
        self.count = 0
        self.largest_repeat = -1

    def _where(self, key: tuple[int, int]) -> tuple[int, int] | None:
        task, repeat = key
        if task < 0 or repeat < 0 or repeat >= self.stride:
            return None
        i = task * self.stride + repeat
        return i >> 3, 1 << (i & 7)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        where = self._where(key)  # type: ignore[arg-type]
        if where is None:
            return key in self.others
        byte, bit = where
        return byte < len(self.bits) and bool(self.bits[byte] & bit)

    def add(self, key: tuple[int, int]) -> None:
        if key in self:
            return
        where = self._where(key)
        if where is None:
            self.others.add(key)
        else:
            byte, bit = where
            if byte >= len(self.bits):
                self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))  # doubles: amortized
            self.bits[byte] |= bit
        self.count += 1
        self.largest_repeat = max(self.largest_repeat, key[1])

    def __len__(self) -> int:
        return self.count

    def count_below(self, tasks: int) -> int:
        """Pairs with ``task < tasks`` and ``repeat < stride``."""
        end = max(0, tasks) * self.stride
        whole = int.from_bytes(self.bits[: end >> 3], "little").bit_count()
        if end & 7 and (end >> 3) < len(self.bits):
            whole += (self.bits[end >> 3] & ((1 << (end & 7)) - 1)).bit_count()
        return whole


def read_done(
    output: Path, warn: Callable[[str], None], stride: int, on_record: Callable[[dict[str, Any]], None]
) -> PairSet:
    """The (task, repeat) pairs already in ``output`` (after cutting a torn tail); ``on_record`` sees each
    one's record once, in file order (a duplicate is warned of and counted once, as before)."""
    done = PairSet(stride)
    for lineno, key, record in keyed_records(output, warn):
        if key is None:
            warn(f"{output}:{lineno}: no {TASK_INDEX}/{ROLLOUT_INDEX}; ignored for resuming")
            continue
        if key in done:
            warn(f"{output}:{lineno}: duplicate rollout {key}; counted once")
            continue
        done.add(key)
        on_record(record)
    return done


def read_pairs(path: Path, warn: Callable[[str], None], stride: int) -> PairSet:
    """The (task, repeat) pairs of a JSONL file of rows or rollouts (NeMo Gym's materialized inputs)."""
    pairs = PairSet(stride)
    for _, key, _ in keyed_records(path, warn):
        if key is not None:
            pairs.add(key)
    return pairs

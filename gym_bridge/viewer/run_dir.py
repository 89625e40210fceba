"""A training run's directory as the viewer reads it while the trainer writes it.

``<log_dir>/metrics.jsonl`` (one line per step and split, see :mod:`gym_bridge.train.bookkeeping.logging`) is read
incrementally: :class:`MetricsTail` remembers how far it got and returns only complete new lines, so the
page can poll it while training runs. ``<log_dir>/rollouts/step_NNNNNN.jsonl`` are the per-step rollout
samples :mod:`gym_bridge.train.bookkeeping.sample_log` writes; each is opened as a rollout file of its own.
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

from gym_bridge.train.bookkeeping.logging import METRICS_FILE
from gym_bridge.train.bookkeeping.sample_log import SAMPLES_DIR, list_sample_files

__all__ = ["CURVES", "MetricsTail", "is_run_dir", "list_sample_files"]

CURVES: list[tuple[str, str, str]] = [
    # (title, split, metric key or prefix ending in '*')
    ("reward (train)", "train", "reward_mean"),
    ("validation accuracy", "val", "accuracy*"),
    ("KL penalty", "train", "kl_penalty"),
    ("entropy (approx.)", "train", "approx_entropy"),
    ("generation length (tokens)", "train", "gen_length_mean"),
    ("step time (s)", "train", "time_step_s"),
]
"""The curves the run page draws (the page also offers every other numeric key)."""


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / METRICS_FILE).exists() or (p / SAMPLES_DIR).is_dir())


def _jsonable(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsTail:
    """The records of ``metrics.jsonl`` read so far; :meth:`poll` reads what was appended since."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.path = Path(log_dir) / METRICS_FILE
        self.records: list[dict[str, Any]] = []
        self.bad_lines = 0
        self._offset = 0
        self._lineno = 0
        self._lock = threading.Lock()

    def poll(self) -> int:
        """Read complete new lines; return how many records there are. A file that shrank (a resumed
        run rewrites it) is read again from the start."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                return len(self.records)
            if size < self._offset:
                self.records, self._offset, self._lineno, self.bad_lines = [], 0, 0, 0
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
            end = data.rfind(b"\n") + 1  # a torn last line waits for its newline
            for raw in data[:end].splitlines():
                self._lineno += 1
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if isinstance(rec, dict):
                    self.records.append({k: _jsonable(v) for k, v in rec.items()})
                else:
                    self.bad_lines += 1
            self._offset += end
            return len(self.records)

    def since(self, after: int) -> list[dict[str, Any]]:
        self.poll()
        return self.records[max(0, after) :]

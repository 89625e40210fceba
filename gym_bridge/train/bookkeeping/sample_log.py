"""A few of each step's rollouts, kept for reading later (``gym-bridge view <log_dir>`` shows them by step).

Why: metrics say *that* reward moved, the rollouts say *why*; NeMo RL's per-step files keep token ids
without text and TRL's table is overwritten each step. This keeps whole GRPO groups, readable.

Format: ``<log_dir>/rollouts/step_NNNNNN.jsonl`` (step zero-padded to 6 digits), one JSON object per line:
the rollout record as the agent loop returned it (NeMo Gym's format, token ids and log-probs on the
output items when the policy sent them; offline rows as they were read), plus

* ``_gb_step``: the GRPO step;
* ``_gb_group``: the sample's group (prompt) index within the step;
* ``advantage``: the advantage the trainer used for it (when given).

The first ``max_groups`` groups of the step are written whole (all G samples), so a group can be
read side by side. The file is written to a temporary name and renamed, so a reader never sees half
of it; a resumed run first removes the files of steps after its checkpoint (:func:`drop_steps_after`),
which a killed run wrote and the resumed one may not write again.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["SAMPLES_DIR", "drop_steps_after", "list_sample_files", "sample_file", "sample_record", "write_rollout_samples", "write_step_samples"]

SAMPLES_DIR = "rollouts"
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def sample_file(log_dir: str | os.PathLike[str], step: int) -> Path:
    """``<log_dir>/rollouts/step_NNNNNN.jsonl``."""
    return Path(log_dir) / SAMPLES_DIR / f"step_{step:06d}.jsonl"


def write_rollout_samples(
    log_dir: str | os.PathLike[str],
    step: int,
    rollouts: Sequence[dict[str, Any]],
    group_ids: Sequence[int],
    *,
    advantages: Sequence[float] | None = None,
    max_groups: int = 2,
) -> Path | None:
    """Write the step's first ``max_groups`` groups (whole) to :func:`sample_file`; None when nothing is kept.

    ``rollouts[i]`` belongs to group ``group_ids[i]`` and had advantage ``advantages[i]``.
    ``max_groups=0`` writes nothing (the feature is off).
    """
    if max_groups < 0:
        raise ValueError(f"max_groups must be >= 0, got {max_groups}")
    if len(group_ids) != len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(group_ids)} group ids")
    if advantages is not None and len(advantages) != len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
    kept_groups: list[int] = []
    for g in group_ids:
        if g not in kept_groups:
            if len(kept_groups) == max_groups:
                break
            kept_groups.append(g)
    if not kept_groups:
        return None
    keep = set(kept_groups)
    path = sample_file(log_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i, (rollout, group) in enumerate(zip(rollouts, group_ids, strict=True)):
            if group not in keep:
                continue
            line: dict[str, Any] = {**rollout, "_gb_step": step, "_gb_group": int(group)}
            if advantages is not None:
                line["advantage"] = float(advantages[i])
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def sample_record(sample: Any) -> dict[str, Any]:
    """A training sample as a line to keep: its rollout record when it has one (online), else a NeMo
    RL-shaped token record (offline rows), which the viewer decodes with ``--tokenizer``."""
    if sample.record is not None:
        return sample.record
    return {
        "token_ids": sample.token_ids,
        "token_loss_mask": sample.loss_mask,
        "generation_logprobs": sample.generation_logprobs,
        "rewards": sample.reward,
    }


def write_step_samples(
    log_dir: str | os.PathLike[str], step: int, samples: Sequence[Any], advantages: Sequence[float], max_groups: int
) -> Path | None:
    """:func:`write_rollout_samples` for a step's training samples
    (``gym_bridge.train.batches.rollouts.Sample``)."""
    if max_groups == 0:
        return None
    return write_rollout_samples(
        log_dir,
        step,
        [sample_record(s) for s in samples],
        [s.group for s in samples],
        advantages=advantages,
        max_groups=max_groups,
    )


def list_sample_files(log_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(step, path)`` of every sample file of a run, by step."""
    folder = Path(log_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _STEP_FILE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def drop_steps_after(log_dir: str | os.PathLike[str], step: int) -> list[Path]:
    """Remove the sample files of steps after ``step`` (a resumed run's checkpoint), and temporary ones a
    killed write left; return what was removed. Why: a run killed after logging steps it had not saved
    left their files, and a resumed run that ended sooner or logged no samples for a step showed the
    killed run's rollouts under it (its ``metrics.jsonl`` lines are dropped alike)."""
    folder = Path(log_dir) / SAMPLES_DIR
    stale = [p for s, p in list_sample_files(log_dir) if s > step]
    stale += folder.glob("step_*.jsonl.tmp") if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale

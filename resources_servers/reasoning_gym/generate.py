"""Generate reasoning_gym task rows (train and validation JSONL) by family, size and seed.

    python -m resources_servers.reasoning_gym.generate --family basic_arithmetic --train-size 2000 \\
        --validation-size 200 --seed 0 --out-dir data/reasoning_gym [--config '{"max_terms": 2}'] \\
        [--suffix ' Put the answer in \\boxed{}.']

writes ``train.jsonl`` and ``validation.jsonl`` in NeMo Gym's row shape (its ``create_dataset.py``):
``responses_create_params.input`` = the question as the user message (plus ``--suffix``), and the
entry's ``question``, ``answer``, ``metadata`` (``source_dataset`` names the family). Several families
(``--family a,b``) are mixed evenly with reasoning-gym's ``composite`` dataset. Validation is drawn from
another seed and holds no question that train has, so accuracy on it is not memorisation (unless
``--allow-overlap``: for a family whose whole problem space is small).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import reasoning_gym
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS

__all__ = ["generate", "task_rows"]

VALIDATION_SEED_OFFSET = 1_000_003
"""Validation seed = train seed + this (a different stream of the same generator)."""


def _dataset(families: list[str], size: int, seed: int, config: dict[str, Any]) -> Any:
    unknown = [f for f in families if f not in DATASETS]
    if unknown:
        raise ValueError(f"unknown reasoning-gym families: {', '.join(unknown)} (see reasoning_gym.factory.DATASETS)")
    if len(families) == 1:
        return reasoning_gym.create_dataset(families[0], size=size, seed=seed, **config)
    stray = sorted(set(config) - set(families))
    if stray:
        raise ValueError(f"--config with several families takes one object per family; not a family here: {stray}")
    specs = [DatasetSpec(name=f, weight=1.0, config=config.get(f, {})) for f in families]
    return reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)


def task_rows(
    families: list[str], size: int, seed: int, config: dict[str, Any] | None = None, suffix: str = ""
) -> Iterator[dict[str, Any]]:
    """``size`` task rows of ``families`` from ``seed``, in NeMo Gym's reasoning_gym row shape."""
    if size <= 0:
        return
    dataset = _dataset(families, size, seed, dict(config or {}))
    for i in range(size):
        entry = dataset[i]
        yield {
            "responses_create_params": {"input": [{"role": "user", "content": entry["question"] + suffix}]},
            "question": entry["question"],
            "answer": entry["answer"],
            "metadata": entry["metadata"],
            "agent_ref": {"name": "reasoning_gym"},
        }


def generate(
    families: list[str],
    out_dir: Path,
    train_size: int,
    validation_size: int,
    seed: int,
    config: dict[str, Any] | None = None,
    suffix: str = "",
    allow_overlap: bool = False,
) -> dict[str, int]:
    """Write ``train.jsonl`` and ``validation.jsonl``; returns the row counts written.

    ``allow_overlap`` lets validation repeat train questions (a family whose whole problem space is
    small, e.g. single-digit sums, has no unseen question left once train is large).
    """
    _dataset(families, 1, seed, dict(config or {}))  # unknown families and options fail before any file
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    counts = {"train": 0, "validation": 0}
    with open(out_dir / "train.jsonl", "w", encoding="utf-8") as f:
        for row in task_rows(families, train_size, seed, config, suffix):
            seen.add(row["question"])
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            counts["train"] += 1
    with open(out_dir / "validation.jsonl", "w", encoding="utf-8") as f:
        # draw more than asked so that dropping questions train already has still leaves enough
        for row in task_rows(families, 4 * validation_size, seed + VALIDATION_SEED_OFFSET, config, suffix):
            if counts["validation"] >= validation_size:
                break
            if row["question"] in seen and not allow_overlap:
                continue
            seen.add(row["question"])
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            counts["validation"] += 1
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True, help="A reasoning-gym family, or several comma-separated.")
    parser.add_argument("--train-size", type=int, default=1000)
    parser.add_argument("--validation-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--config", default="{}", help="Family options as JSON (per family when several).")
    parser.add_argument("--suffix", default="", help="Text appended to each question in the prompt.")
    parser.add_argument(
        "--allow-overlap", action="store_true", help="Validation may repeat train questions (small problem spaces)."
    )
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config)
    except json.JSONDecodeError as e:
        parser.error(f"--config: not JSON ({e})")
    if not isinstance(config, dict):
        parser.error("--config: expected a JSON object")
    if args.train_size < 0 or args.validation_size < 0:
        parser.error("--train-size and --validation-size must not be negative")
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    try:
        counts = generate(
            families, args.out_dir, args.train_size, args.validation_size, args.seed, config, args.suffix,
            args.allow_overlap,
        )  # fmt: skip
    except (ValueError, TypeError, AssertionError) as e:  # reasoning-gym checks its options with assert
        parser.error(f"{type(e).__name__}: {e}")
    print(f"wrote {counts['train']} train and {counts['validation']} validation rows to {args.out_dir}")


if __name__ == "__main__":
    main()

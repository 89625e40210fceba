"""Deterministic single-digit arithmetic problems, written as NeMo Gym task rows or OpenMath rows.

Why: the README's main job trains the tiny embedded model with GRPO on CPU, so it needs a task
small enough to learn in minutes, with answers the math verifier can check from ``\\boxed{}``.
The rows have NeMo Gym's math task shape, so they work with a NeMo Gym math resources server too.

The single-digit problem space is tiny (100 pairs per operation), so a training set of a few
thousand rows covers all of it: the validation file is the whole problem space, each problem
once, and cannot be disjoint from training. It measures how reliably the policy samples the
right answer, not generalisation to unseen problems.

Regenerate the committed files with ``python -m gym_bridge.data.arithmetic --out-dir recipes/data``.
"""

from __future__ import annotations

import argparse
import operator
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gym_bridge.records.jsonl import JsonlWriter

# Short on purpose: every prompt token is processed in each GRPO step, and on CPU that is the cost.
PROMPT_SUFFIX = " Put the answer in \\boxed{}."
DEFAULT_OPS: tuple[str, ...] = ("+", "-")
OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}
TRAIN_ROWS = 2000
TRAIN_SEED = 0
TRAIN_FILE = "arith_train.jsonl"
VAL_FILE = "arith_val.jsonl"
VAL_SEED = 1


def make_problem(a: int, op: str, b: int) -> dict[str, Any]:
    """One problem as a plain dict: operands, operator, question text and the answer as a string."""
    if op not in OPERATIONS:
        raise ValueError(f"unknown operation {op!r}; expected one of {sorted(OPERATIONS)}")
    return {
        "a": a,
        "op": op,
        "b": b,
        "question": f"What is {a} {op} {b}?",
        "answer": str(OPERATIONS[op](a, b)),
    }


def problem_space(ops: Sequence[str] = DEFAULT_OPS, max_operand: int = 9) -> list[dict[str, Any]]:
    """Every problem with operands in ``0..max_operand``, in a fixed order (op, a, b)."""
    return [
        make_problem(a, op, b) for op in ops for a in range(max_operand + 1) for b in range(max_operand + 1)
    ]


def make_problems(
    n: int, seed: int, ops: Sequence[str] = DEFAULT_OPS, max_operand: int = 9
) -> list[dict[str, Any]]:
    """``n`` problems drawn uniformly (with replacement) from the problem space; same seed, same list."""
    rng = random.Random(seed)
    space = problem_space(ops, max_operand)
    return [rng.choice(space) for _ in range(n)]


def validation_problems(
    seed: int = VAL_SEED, ops: Sequence[str] = DEFAULT_OPS, max_operand: int = 9
) -> list[dict[str, Any]]:
    """The whole problem space, each problem once, shuffled by ``seed`` (a fixed validation sample)."""
    space = problem_space(ops, max_operand)
    random.Random(seed).shuffle(space)
    return space


def prompt_for(question: str) -> str:
    """The user message that asks for the answer inside ``\\boxed{}``."""
    return question + PROMPT_SUFFIX


def to_nemo_gym_row(problem: dict[str, Any]) -> dict[str, Any]:
    """A NeMo Gym math task row (``responses_create_params`` + ``question`` + ``expected_answer``)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt_for(problem["question"])}]},
        "question": problem["question"],
        "expected_answer": problem["answer"],
    }


def to_openmath_row(problem: dict[str, Any]) -> dict[str, Any]:
    """An OpenMathInstruct-2 style row (``problem`` + ``expected_answer``)."""
    return {"problem": problem["question"], "expected_answer": problem["answer"]}


def write_rows(rows: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write rows to a fresh JSONL file (replacing it); return the number written."""
    with JsonlWriter(path, append=False) as writer:
        for row in rows:
            writer.write(row)
        return writer.count


def write_default_files(out_dir: str | Path) -> dict[str, int]:
    """(Re)generate the committed train/validation NeMo Gym task files in ``out_dir``."""
    out = Path(out_dir)
    train = make_problems(TRAIN_ROWS, seed=TRAIN_SEED)
    val = validation_problems()
    return {
        TRAIN_FILE: write_rows((to_nemo_gym_row(p) for p in train), out / TRAIN_FILE),
        VAL_FILE: write_rows((to_nemo_gym_row(p) for p in val), out / VAL_FILE),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the arithmetic task files.")
    parser.add_argument("--out-dir", default="recipes/data", help="directory for the JSONL files")
    args = parser.parse_args(argv)
    for name, count in write_default_files(args.out_dir).items():
        print(f"wrote {count} rows to {Path(args.out_dir) / name}")


if __name__ == "__main__":
    main()

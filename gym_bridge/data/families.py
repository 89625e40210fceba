"""Arithmetic task families large enough for a held-out validation set, and the phrase answer format.

Why: a pretrained model (SmolLM2-135M-Instruct) must show that it *learns* under GRPO, which needs a
validation set disjoint from the training problems. Single-digit sums (81 problems) cannot give one;
these families have hundreds to thousands of distinct problems, and :func:`split_problems` cuts each
problem space into disjoint train and validation parts.

The answer format is a sentence the verifier's ``boxed_or_final`` extraction reads ("The answer is
N."): the base model already writes it now and then, so GRPO has a signal to sharpen, and the grade
stays exact (the number after the phrase must equal the expected answer; a trailing operand is not
rewarded). Families:

- ``sum_2d1d``: a two-digit plus a one-digit number ("What is 47 + 8?"), 810 problems.
- ``add_sub``: ``a + b - c`` with ``a, b`` in 10..49 and ``c`` in 1..9, 14,400 problems.
- ``word``: one-line word problems ("Tom has 12 apples. Tom buys 7 more. How many apples does Tom have
  now?") over names, items, verbs and numbers, 7,680 problems, none giving away more than is had.

Regenerate the committed recipe files with ``python -m gym_bridge.data.families --out-dir recipes/data``.
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gym_bridge.data.arithmetic import write_rows

ANSWER_FORMAT_SYSTEM_PROMPT = "Solve the problem. End your reply with: The answer is N."
"""System prompt asking for the phrase answer format (read by the math server's ``boxed_or_final``)."""

WORKED_EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "sum_2d1d": (("What is 100 + 5?", "100 + 5 = 105. The answer is 105."),),
    "add_sub": (("What is 3 + 4 - 2?", "3 + 4 = 7, and 7 - 2 = 5. The answer is 5."),),
    "word": (
        ("Sam has 3 pens. Sam buys 4 more. How many pens does Sam have now?", "3 + 4 = 7. The answer is 7."),
        ("Ann has 14 cards. Ann gives away 5. How many cards does Ann have now?", "14 - 5 = 9. The answer is 9."),
    ),
}
"""Per family, worked exchanges (question, answer) shown before the question by ``phrase_one_shot``:
the same shape of problem as the family's (the answer's arithmetic written out, then the phrase), and
outside the family's problem space, so no validation problem is answered in its own prompt. Measured
with SmolLM2-135M-Instruct at temperature 0.7 (bench/smollm2_base_accuracy.py): matched examples
lifted ``word`` from 0.05 to about 0.23 and ``sum_2d1d`` from 0.075 to about 0.2 against one generic
example."""

PromptFormat = str
PROMPT_FORMATS: tuple[PromptFormat, ...] = ("boxed", "phrase", "phrase_one_shot")
"""``boxed``: the question plus "Put the answer in \\boxed{}." (the tiny recipe's format);
``phrase``: the answer-format system prompt; ``phrase_one_shot``: that plus the family's
:data:`WORKED_EXAMPLES`."""

_NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Max", "Zoe")
_ITEMS = ("apples", "books", "coins", "cards", "pens", "stamps", "shells", "marbles")


def _sum_2d1d() -> list[dict[str, Any]]:
    return [
        {"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(10, 100) for b in range(1, 10)
    ]


def _add_sub() -> list[dict[str, Any]]:
    return [
        {"question": f"What is {a} + {b} - {c}?", "answer": str(a + b - c)}
        for a in range(10, 50)
        for b in range(10, 50)
        for c in range(1, 10)
    ]


def _word() -> list[dict[str, Any]]:
    """Buys when ``a + b`` is odd, gives away when even, except that nobody gives away more than they
    have (that one buys instead: every answer is a count of things, 0 or more)."""
    problems = []
    for name, item, a, b in itertools.product(_NAMES, _ITEMS, range(5, 20), range(2, 10)):
        if (a + b) % 2 or b > a:
            problems.append(
                {
                    "question": f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?",
                    "answer": str(a + b),
                }
            )
        else:
            problems.append(
                {
                    "question": f"{name} has {a} {item}. {name} gives away {b}. How many {item} does {name} have now?",
                    "answer": str(a - b),
                }
            )
    return problems


FAMILIES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "sum_2d1d": _sum_2d1d,
    "add_sub": _add_sub,
    "word": _word,
}


def problem_space(family: str) -> list[dict[str, Any]]:
    """Every problem of ``family`` in a fixed order, each with ``question`` and ``answer`` (a string)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; expected one of {sorted(FAMILIES)}")
    return FAMILIES[family]()


def split_problems(
    family: str, n_val: int, n_train: int | None = None, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint (train, validation) problem lists: the shuffled space, ``n_val`` first, then training.

    ``n_train`` None takes all remaining problems. Raises if the space is too small for both.
    """
    space = problem_space(family)
    random.Random(seed).shuffle(space)
    if n_val < 1 or n_val >= len(space):
        raise ValueError(f"n_val must be in 1..{len(space) - 1} for family {family!r}, got {n_val}")
    val, rest = space[:n_val], space[n_val:]
    if n_train is not None:
        if n_train > len(rest):
            raise ValueError(f"family {family!r} has {len(rest)} problems left for training, asked {n_train}")
        rest = rest[:n_train]
    return rest, val


def messages_for(question: str, prompt_format: PromptFormat, family: str = "add_sub") -> list[dict[str, str]]:
    """The chat messages that ask ``question`` (of ``family``) in ``prompt_format`` (see
    :data:`PROMPT_FORMATS`)."""
    if prompt_format == "boxed":
        return [{"role": "user", "content": question + " Put the answer in \\boxed{}."}]
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {prompt_format!r}; expected one of {PROMPT_FORMATS}")
    system = [{"role": "system", "content": ANSWER_FORMAT_SYSTEM_PROMPT}]
    shots: list[dict[str, str]] = []
    if prompt_format == "phrase_one_shot":
        for shot_question, shot_answer in WORKED_EXAMPLES[family]:
            shots += [{"role": "user", "content": shot_question}, {"role": "assistant", "content": shot_answer}]
    return [*system, *shots, {"role": "user", "content": question}]


def to_nemo_gym_row(problem: dict[str, Any], prompt_format: PromptFormat, family: str = "add_sub") -> dict[str, Any]:
    """A NeMo Gym math task row whose input messages ask the question in ``prompt_format``."""
    return {
        "responses_create_params": {"input": messages_for(problem["question"], prompt_format, family)},
        "question": problem["question"],
        "expected_answer": problem["answer"],
    }


def write_split(
    family: str,
    out_dir: str | Path,
    *,
    prompt_format: PromptFormat,
    n_val: int,
    n_train: int | None = None,
    seed: int = 0,
) -> dict[str, int]:
    """Write ``<family>_train.jsonl`` and ``<family>_val.jsonl`` (disjoint) into ``out_dir``."""
    train, val = split_problems(family, n_val, n_train, seed)
    out = Path(out_dir)
    return {
        f"{family}_train.jsonl": write_rows((to_nemo_gym_row(p, prompt_format, family) for p in train), out / f"{family}_train.jsonl"),
        f"{family}_val.jsonl": write_rows((to_nemo_gym_row(p, prompt_format, family) for p in val), out / f"{family}_val.jsonl"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write disjoint train/validation files of a task family.")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="add_sub")
    parser.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="phrase")
    parser.add_argument("--n-val", type=int, default=200)
    parser.add_argument("--n-train", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="recipes/data")
    args = parser.parse_args(argv)
    counts = write_split(
        args.family, args.out_dir, prompt_format=args.prompt_format, n_val=args.n_val, n_train=args.n_train, seed=args.seed
    )
    for name, count in counts.items():
        print(f"wrote {count} rows to {Path(args.out_dir) / name}")


if __name__ == "__main__":
    main()

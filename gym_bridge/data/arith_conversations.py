"""Two-turn arithmetic conversations with a scripted user, train and held-out files (deterministic by seed).

Why: the multi-turn recipe (``recipes/grpo_multi_turn_tiny.yaml``) needs a conversation the 1M-parameter
``tiny`` model can learn something from on CPU in minutes, and a held-out set that measures it. The
tiny model was warm-started on single-digit sums, always answers ``\\boxed{N}`` and never asks a
question, so the task is one it can start on: the user corrects their question after the first answer.

    user:      What is 3 + 9? Put the answer in \\boxed{}.
    assistant: \\boxed{12}
    user:      Sorry, I meant: What is 3 + 4? Put the answer in \\boxed{}.   (the scripted user, on any
                                                                     reply holding "boxed")
    assistant: \\boxed{7}                     (scored: the reply to the user's last message)

The tiny model answers a question well alone (greedy 0.885, its build report) but poorly after an
earlier turn: before training, about one reply in six to the corrected question is right (step 0 of
``bench/results/multi_turn_recipe.json``). The reward (the ``math_chat`` server:
only the reply to the user's last message counts, ``extraction: boxed``) pays for answering the corrected
question; ``verifier_metadata.near_scale`` adds the shaped ``near`` component (how close the answer is),
which the recipe trains on beside ``correct``. A reply without a box is not answered by the user and
scores 0, so the first answer can never be scored against the corrected question.

Held out: the final questions (op, a, b) are split first; no validation conversation's final question is
the final question of any training conversation (so no validation conversation is in the training file).

    python -m gym_bridge.data.arith_conversations --out-dir recipes/data
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gym_bridge.data.arithmetic import DEFAULT_OPS, OPERATIONS, prompt_for, write_rows

TRAIN_FILE = "arith_conv_train.jsonl"
VAL_FILE = "arith_conv_val.jsonl"
SEED = 0
HELDOUT_FINALS = 50
"""Final questions (of 200) kept for validation."""
TRAIN_ROWS = 1000
VAL_ROWS = 100
TRIGGER = "boxed"
"""What the scripted user reacts to: any reply that holds a boxed answer."""
NEAR_SCALE = 4
"""``near`` = 1 - |answer - expected| / 4 (at least 0): off by one still earns 0.75."""


def conversation_row(a: int, op: str, first_b: int, b: int) -> dict[str, Any]:
    """One conversation: asked ``a op first_b``, corrected to ``a op b`` after the first answer."""
    if OPERATIONS[op](a, first_b) == OPERATIONS[op](a, b):
        raise ValueError(f"the correction {a} {op} {b} must change the answer of {a} {op} {first_b}")
    question = f"What is {a} {op} {b}?"
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt_for(f"What is {a} {op} {first_b}?")}]},
        "question": question,
        "expected_answer": str(OPERATIONS[op](a, b)),
        "extraction": "boxed",  # a reply with no box is never corrected and never scores (see above)
        "user_script": {"reveal": [{"when": [TRIGGER], "say": f"Sorry, I meant: {prompt_for(question)}"}], "max_turns": 1},
        # min_user_turns: a first reply cut off at max_output_tokens ends the conversation uncorrected; it scores 0.
        "verifier_metadata": {"near_scale": NEAR_SCALE, "min_user_turns": 1},
        "task_kind": "correction",
    }


def _conversations(finals: list[tuple[str, int, int]]) -> list[tuple[int, str, int, int]]:
    """Every (a, op, first_b, b) whose final question is in ``finals`` and whose correction changes the answer."""
    return [(a, op, first, b) for op, a, b in finals for first in range(10) if first != b]


def generate(
    seed: int = SEED,
    n_train: int = TRAIN_ROWS,
    n_val: int = VAL_ROWS,
    heldout_finals: int = HELDOUT_FINALS,
    ops: Sequence[str] = DEFAULT_OPS,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, validation rows): distinct conversations, the final questions split first."""
    rng = random.Random(f"arith_conversations:{seed}")
    finals = [(op, a, b) for op in ops for a in range(10) for b in range(10)]
    rng.shuffle(finals)
    val_pool, train_pool = _conversations(finals[:heldout_finals]), _conversations(finals[heldout_finals:])
    if n_val > len(val_pool) or n_train > len(train_pool):
        raise ValueError(f"at most {len(train_pool)} train and {len(val_pool)} validation conversations")
    return (
        [conversation_row(*c) for c in rng.sample(train_pool, n_train)],
        [conversation_row(*c) for c in rng.sample(val_pool, n_val)],
    )


def write_default_files(out_dir: str | Path, seed: int = SEED) -> dict[str, int]:
    """(Re)generate the committed train and held-out files in ``out_dir``."""
    train, val = generate(seed)
    out = Path(out_dir)
    return {TRAIN_FILE: write_rows(train, out / TRAIN_FILE), VAL_FILE: write_rows(val, out / VAL_FILE)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the multi-turn arithmetic conversation files.")
    parser.add_argument("--out-dir", default="recipes/data", help="directory for the JSONL files")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    for name, count in write_default_files(args.out_dir, args.seed).items():
        print(f"wrote {count} rows to {Path(args.out_dir) / name}")


if __name__ == "__main__":
    main()

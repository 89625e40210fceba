"""reasoning-gym scorers that pay answers their task does not warrant, and the scorers used instead.

Why: a reward that pays a wrong answer is learned. Each entry here is a family whose own ``score_answer``
(reasoning-gym 0.1.25, the scorer NeMo Gym 0.7.0's ``reasoning_gym`` server calls too) pays such answers
for a reason that is a bug, not a partial-credit design; the replacement keeps what the family means to
pay for a right answer. Partial credit the package gives by design (see the server's README) is kept.

* ``game_of_life_halting``: the package compares ``bool(answer) == bool(entry["answer"])``. Both are
  non-empty strings (``"True"``, ``"False"``), so every non-empty answer (``"False"`` for ``"True"``,
  ``"banana"``) scored 1.0. Here the answer must be the expected ``True``/``False`` (case and surrounding
  spaces aside).
* ``spell_backward``: a right answer with more after it (``"olleh or hello"`` for ``"olleh"``) is meant to
  score 0.8 (every expected letter in place, but not the exact answer), yet the package tests its sum of
  ``1/len`` steps with ``== 1.0``, which float rounding misses for most lengths, so it paid 0.9999999.
  Here the letters in place are counted, not summed; every other score is the package's.
* ``complex_arithmetic``: the score is ``min(1.0, exp(-|answer - expected|))``; an answer of ``nan``
  (``NaN``, ``nan+1j``...) makes the distance NaN, and ``min(1.0, nan)`` is 1.0, so ``nan`` scored 1.0 on
  every task. Here an answer that parses to a complex number with a part that is not finite scores 0.0;
  every other score is the package's.
* ``coin_flip``: an answer off by more than ``1e-4`` earns the share of its leading characters that agree
  with the expected probability's, but the package divides by the *shorter* string's length, so any prefix
  of the expected answer scored 1.0: ``"0"`` (or ``"0.0"``, ``"-0"``) was paid 1.0 on every task whose
  probability is below 1, ``"0.5"`` 0.67. Here the share is over the longer string (``"0"`` for
  ``0.171875``: 1/8); every other score is the package's.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

__all__ = ["CORRECTED"]


def game_of_life_halting(answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 when the answer says what the expected ``True``/``False`` says, else 0.0."""
    if not isinstance(answer, str):
        return 0.0
    return float(answer.strip().lower() == str(entry["answer"]).strip().lower())


def spell_backward(answer: str | None, entry: dict[str, Any]) -> float:
    """The package's scorer (letters in place over the expected length), with 0.8, not ~1.0, for an answer
    that holds every expected letter in place but is not the expected answer."""
    if not isinstance(answer, str):
        return 0.0
    expected, given = str(entry["answer"]).lower(), answer.lower()
    if given == expected:
        return 1.0
    if not expected:
        return 0.0
    in_place = sum(a == b for a, b in zip(expected, given, strict=False))
    return 0.8 if in_place == len(expected) else in_place / len(expected)


def complex_arithmetic(answer: str | None, entry: dict[str, Any]) -> float:
    """The package's scorer, but 0.0 for an answer that is NaN or infinite in either part."""
    from reasoning_gym import get_score_answer_fn
    from reasoning_gym.factory import DATASETS

    if isinstance(answer, str):
        registered = DATASETS["complex_arithmetic"]
        dataset = registered[0] if isinstance(registered, tuple) else registered
        try:
            parsed = dataset.parse_string_to_complex(answer)
        except Exception:  # the package's scorer decides what an unparsable answer scores
            parsed = None
        if isinstance(parsed, complex) and not (math.isfinite(parsed.real) and math.isfinite(parsed.imag)):
            return 0.0
    return float(get_score_answer_fn("complex_arithmetic")(answer=answer, entry=entry))


def coin_flip(answer: str | None, entry: dict[str, Any], tol: float = 1e-4) -> float:
    """The package's scorer (1.0 within ``tol``, else the agreeing leading characters' share), with the share
    taken over the longer of the two numbers as written, not the shorter."""
    if answer is None or not answer.strip():
        return 0.0
    try:
        given = float(Fraction(answer.replace(",", "")))
        expected = float(Fraction(str(entry["answer"]).replace(",", "")))
    except (ValueError, ZeroDivisionError):
        return 0.0
    if abs(given - expected) <= tol:
        return 1.0
    given_text, expected_text = f"{given:.10g}", f"{expected:.10g}"
    agreeing = 0
    for a, b in zip(given_text, expected_text, strict=False):
        if a != b:
            break
        agreeing += 1
    return agreeing / max(len(given_text), len(expected_text))


_PUZZLE24_OPERATORS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__,
                       ast.Div: Fraction.__truediv__}  # fmt: skip
"""The operators a puzzle24 question allows (the package's default ``operators``)."""


def _exact_arithmetic(node: ast.AST, used: list[int]) -> Fraction:
    """The exact value of ``node`` if it is whole numbers joined by ``+ - * /`` (numbers collected in ``used``)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _PUZZLE24_OPERATORS:
        left, right = _exact_arithmetic(node.left, used), _exact_arithmetic(node.right, used)
        return _PUZZLE24_OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _exact_arithmetic(node.operand, used)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(f"not part of a 24 expression: {type(node).__name__}")


def puzzle24(answer: str | None, entry: dict[str, Any]) -> float:
    """The package's scorer, but its 1.0 only for the task's own numbers making exactly 24 with ``+ - * /``."""
    from reasoning_gym import get_score_answer_fn

    score = float(get_score_answer_fn("puzzle24")(answer=answer, entry=entry))
    if score < 1.0 or not isinstance(answer, str):
        return score
    used: list[int] = []
    try:
        value = _exact_arithmetic(ast.parse(answer.strip(), mode="eval").body, used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return 0.01
    return 1.0 if value == 24 and sorted(used) == sorted(int(n) for n in entry["metadata"]["numbers"]) else 0.01


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def _arc_board(family: str) -> Callable[..., float]:
    def score(answer: str | None, entry: dict[str, Any]) -> float:
        from reasoning_gym import get_score_answer_fn

        metadata = entry.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("output"), list | tuple):
            entry = {**entry, "metadata": {**metadata, "output": _as_tuples(metadata["output"])}}
        return float(get_score_answer_fn(family)(answer=answer, entry=entry))

    score.__doc__ = f"{family}'s own scorer, with the expected grid as the tuples the package compares."
    return score


@lru_cache(maxsize=64)
def _scorer_with(family: str, options: tuple[tuple[str, int], ...]) -> Callable[..., float]:
    """The package's scorer of ``family`` built with ``options`` in place of its defaults."""
    from reasoning_gym.factory import DATASETS

    dataset_cls, config_cls = DATASETS[family]
    return dataset_cls(config=dataclasses.replace(config_cls(), **dict(options))).score_answer


def _whole(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def _task_options(family: str, difficulty: Any) -> dict[str, int]:
    """The scoring options ``family``'s task was generated with, from its ``metadata.difficulty`` (none if absent)."""
    if not isinstance(difficulty, dict):
        return {}
    if family == "time_intervals":
        keys = ("max_time_difference_seconds", "max_date_difference_days")
        return {k: v for k in keys if (v := _whole(difficulty.get(k))) is not None}
    places = difficulty.get("decimal_places")  # decimal_arithmetic: (min, max)
    if isinstance(places, list | tuple) and len(places) == 2 and all(_whole(p) for p in places):
        lo, hi = places
        return {"min_num_decimal_places": lo, "max_num_decimal_places": hi, "precision": max(12, hi + 2)}
    return {}


def _with_task_options(family: str) -> Callable[..., float]:
    def score(answer: str | None, entry: dict[str, Any]) -> float:
        options = _task_options(family, (entry.get("metadata") or {}).get("difficulty"))
        return float(_scorer_with(family, tuple(sorted(options.items())))(answer=answer, entry=entry))

    score.__doc__ = f"{family}'s own scorer, built with the options its task was generated with."
    return score


CORRECTED: dict[str, Callable[..., float]] = {
    "coin_flip": coin_flip,
    "game_of_life_halting": game_of_life_halting,
    "spell_backward": spell_backward,
    "complex_arithmetic": complex_arithmetic,
    "puzzle24": puzzle24,
    "time_intervals": _with_task_options("time_intervals"),
    "decimal_arithmetic": _with_task_options("decimal_arithmetic"),
    "arc_agi": _arc_board("arc_agi"),
    "rearc": _arc_board("rearc"),
}
"""The scorer the workers use in place of the package's, by family."""

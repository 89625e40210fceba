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

import math
from collections.abc import Callable
from fractions import Fraction
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


CORRECTED: dict[str, Callable[..., float]] = {
    "coin_flip": coin_flip,
    "game_of_life_halting": game_of_life_halting,
    "spell_backward": spell_backward,
    "complex_arithmetic": complex_arithmetic,
}
"""The scorer the workers use in place of the package's, by family."""

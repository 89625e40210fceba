"""What counts as the program and as a correct answer (host side, never inside the sandbox).

* The program is the last fenced Python block of the assistant's text (```` ```python ````, ```` ```py ````,
  ```` ```python3 ```` or an untagged fence), as NeMo Gym's and LiveCodeBench's graders take it.
* Stdin/stdout tests pass when the outputs agree line by line after whitespace normalisation (blank lines
  dropped, runs of spaces collapsed, ends stripped), token by token. What each expected token accepts
  depends on the expected token alone, never on what the program printed:

  - an integer (``[+-]?digits``): only the same text. ``1000000008``, ``1000000007.0``, ``1.0e9`` and
    ``007`` never pass for ``1000000007`` / ``7``;
  - a non-integer decimal number (a point or an exponent, e.g. ``0.333333``, ``1e-9``): any decimal number
    within NeMo Gym 0.7.0's ``code_gen`` tolerance, computed exactly in ``Decimal``: ``|got - expected| <=
    1e-6`` or ``|got - expected| / max(|expected|, 1) <= 1e-6``. (NeMo Gym applies it when *either* token has
    a point or an exponent, which lets ``2000000001.0`` pass for ``2000000000``; upstream LiveCodeBench
    compares the decimal values exactly);
  - anything else (words, ``nan``, ``inf``, hex): only the same text.
* Function-call tests pass when the return value equals the expected one after tuples become lists, or
  equals the single element of a one-element expected list (APPS wraps return values in a list).
  Again the expected value decides: an expected int (JSON integer) is matched only by a number of exactly
  that value (``7`` or ``7.0``; ``7.0000000001`` and ``bool`` never), however large; an expected float is
  matched within NeMo Gym 0.7.0's ``values_are_close`` (``numpy.allclose``: ``|got - expected| <= 1e-8 +
  1e-5 * |expected|``, LeetCode's 1e-5 for real answers). An int too large for a float equals no float.
"""

from __future__ import annotations

import json
import math
import re
from decimal import MAX_EMAX, MIN_EMIN, Decimal, localcontext
from typing import Any

__all__ = ["call_output_matches", "extract_code", "parse_expected_value", "stdout_matches"]

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = {"python", "py", "python3", "py3", ""}


def extract_code(text: str) -> str | None:
    """The last fenced Python (or untagged) code block of ``text``; None when there is none."""
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1]


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
"""A decimal number as a contest prints one (no ``_``, no ``nan``/``inf``: those are compared as text)."""
_MAX_NUMBER_CHARS = 4300
"""Longer tokens are compared as text only (Python's own int-parsing bound; keeps ``Decimal`` cheap)."""
_STDOUT_TOLERANCE = Decimal("1e-6")


def _tokens_match(got: str, expected: str) -> bool:
    """One output token against the expected one; see the module docstring (the expected token decides)."""
    if got == expected:
        return True
    if (
        len(expected) > _MAX_NUMBER_CHARS or len(got) > _MAX_NUMBER_CHARS
        or _INTEGER.fullmatch(expected) or not _DECIMAL.fullmatch(expected) or not _DECIMAL.fullmatch(got)
    ):  # fmt: skip
        return False  # an integer, a word or an oversized token: the same text only
    want, have = Decimal(expected), Decimal(got)
    with localcontext() as ctx:
        ctx.prec = 2 * _MAX_NUMBER_CHARS  # exact arithmetic for any token we accept
        ctx.Emax, ctx.Emin = MAX_EMAX, MIN_EMIN
        error = abs(have - want)
        return error <= _STDOUT_TOLERANCE or error <= _STDOUT_TOLERANCE * max(abs(want), Decimal(1))


def stdout_matches(got: str, expected: str) -> bool:
    """Whitespace-normalised line comparison, token by token (see the module docstring)."""
    got_lines, expected_lines = _lines(got), _lines(expected)
    if len(got_lines) != len(expected_lines):
        return False
    for g, e in zip(got_lines, expected_lines, strict=True):
        if len(g) != len(e) or not all(_tokens_match(x, y) for x, y in zip(g, e, strict=True)):
            return False
    return True


def parse_expected_value(expected: Any) -> Any:
    """An expected return value as data: JSON text is decoded (LiveCodeBench), anything else kept."""
    if isinstance(expected, str):
        try:
            return json.loads(expected)
        except ValueError:
            return expected
    return expected


def _normalise(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    return value


def _number_matches(got: Any, expected: int | float) -> bool:
    """``got`` against an expected number: exact for an int, ``numpy.allclose``'s tolerance for a float."""
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    if isinstance(expected, int):
        return got == expected  # Python compares int with float exactly: 7.0 == 7, 1e23 != 10**23 + 1
    if got == expected:
        return True
    try:
        return math.isfinite(expected) and abs(float(got) - expected) <= 1e-8 + 1e-5 * abs(expected)
    except OverflowError:  # an int too large for a float equals no float
        return False


def _equal(got: Any, expected: Any) -> bool:
    """``got`` against ``expected``, recursively; the expected value decides how numbers compare."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)):
        return _number_matches(got, expected)
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(
            _equal(g, e) for g, e in zip(got, expected, strict=True)
        )  # fmt: skip
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(_equal(got[k], expected[k]) for k in expected)
        )
    return got == expected


def call_output_matches(got: Any, expected: Any) -> bool:
    """APPS/LiveCodeBench function-call comparison (see the module docstring)."""
    got, expected = _normalise(got), _normalise(parse_expected_value(expected))
    if _equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(got, expected[0])

"""What counts as the program and as a correct answer (host side, never inside the sandbox).

* The program is the last fenced Python block of the assistant's text (```` ```python ````, ```` ```py ````,
  ```` ```python3 ```` or an untagged fence), as NeMo Gym's and LiveCodeBench's graders take it.
* Stdin/stdout tests pass when the outputs agree line by line after whitespace normalisation (blank lines
  dropped, runs of spaces collapsed, ends stripped). Integer tokens (``[+-]?digits``) must be equal as
  integers, exactly; only when either token is a real number (a point or an exponent) are they compared
  with a 1e-6 relative/absolute tolerance. So ``1000000008`` never passes for ``1000000007``.
* Function-call tests pass when the return value equals the expected one after tuples become lists, or
  equals the single element of a one-element expected list (APPS wraps return values in a list). Two
  ints compare exactly; tolerance (1e-9) applies only where a float is involved, and a number too large
  for a float is simply unequal to one (never an error).
"""

from __future__ import annotations

import json
import math
import re
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


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


_INTEGER = re.compile(r"[+-]?\d+")


def _tokens_match(got: str, expected: str) -> bool:
    if got == expected:
        return True
    if _INTEGER.fullmatch(got) and _INTEGER.fullmatch(expected):
        return int(got) == int(expected)  # integers are exact: a near-miss is a wrong answer
    a, b = _number(got), _number(expected)
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def stdout_matches(got: str, expected: str) -> bool:
    """Whitespace-normalised line comparison with numeric tolerance."""
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


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b  # exact, however large
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        try:
            return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        except OverflowError:  # an int too large for a float equals no float
            return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def call_output_matches(got: Any, expected: Any) -> bool:
    """APPS/LiveCodeBench function-call comparison (see the module docstring)."""
    got, expected = _normalise(got), _normalise(parse_expected_value(expected))
    if _equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(got, expected[0])

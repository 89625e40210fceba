r"""Exact comparison of plain rational answers in the server process, skipping the verifier pool.

Most answers in arithmetic training are integers or simple fractions (``12``, ``-3``, ``\frac{83}{499}``,
``3/4``). For those, math-verify's verdict is exact rational equality, so the server decides them with
:class:`fractions.Fraction` in microseconds instead of a round trip to a SymPy worker. Anything else
(decimals, which math-verify compares after rounding, thousands separators, expressions) goes to the
pool. ``extracted_answer`` is written the way SymPy prints the rational (``83/499``), as math-verify's
path reports it.
"""

from __future__ import annotations

import re
from fractions import Fraction

_MAX_CHARS = 200
_INTEGER = re.compile(r"[+-]?\d+")
_SLASH = re.compile(r"(?P<num>[+-]?\d+)/(?P<den>[+-]?\d+)")
_FRAC = re.compile(r"(?P<sign>[+-]?)\\[dt]?frac\{(?P<num>[+-]?\d+)\}\{(?P<den>[+-]?\d+)\}")


def plain_rational(text: str) -> int | Fraction | None:
    r"""The value of an integer, ``a/b`` or ``\frac{a}{b}`` written alone; None for anything else.

    An integer stays an ``int`` (it compares and prints as the equal ``Fraction`` does): most answers
    are integers, and ``Fraction``'s construction, comparison and printing are Python code.
    """
    text = text.strip().replace(" ", "")
    if not text or len(text) > _MAX_CHARS:
        return None
    if _INTEGER.fullmatch(text):
        return int(text)
    match = _SLASH.fullmatch(text) or _FRAC.fullmatch(text)
    if match is None or int(match["den"]) == 0:
        return None
    value = Fraction(int(match["num"]), int(match["den"]))
    return -value if match.groupdict().get("sign") == "-" else value


def sympy_style(value: int | Fraction) -> str:
    """How SymPy prints a rational: ``7``, ``-3/4``."""
    return str(value)


def compare_plain(expected: str, candidate: str) -> tuple[bool, str] | None:
    """``(correct, extracted_answer)`` when both answers are plain rationals, else None (use the pool)."""
    gold = plain_rational(expected)
    if gold is None:
        return None
    value = plain_rational(candidate)
    if value is None:
        return None
    return value == gold, sympy_style(value)

r"""Exact comparison of plain rational answers in the server process, skipping the verifier pool.

Most answers in arithmetic training are integers or simple fractions (``12``, ``-3``, ``\frac{83}{499}``,
``3/4``). For those, math-verify's verdict is exact rational equality, so the server decides them with
:class:`fractions.Fraction` in microseconds instead of a round trip to a SymPy worker. Anything else
(decimals, which math-verify compares after rounding, spaced digits, thousands separators, non-ASCII
digits, expressions) goes to the pool. ``extracted_answer`` is written the way SymPy prints the rational
(``83/499``), as math-verify's path reports it.

A boxed response is judged as NeMo Gym judges it, from the whole text (math-verify may prefer a
"final answer is X" phrase to the box, or read a percent sign after it), so :func:`compare_boxed_plain`
takes the fast path only for texts where math-verify can only read the one box.
"""

from __future__ import annotations

import re
from fractions import Fraction

_MAX_CHARS = 200
"""Longer numbers go to the pool (Python refuses int() of more than 4300 digits; the pool decides)."""
_INTEGER = re.compile(r"-?[0-9]+")
_SLASH = re.compile(r"(?P<num>-?[0-9]+)/(?P<den>[0-9]+)")
_FRAC = re.compile(r"(?P<sign>-?)\\d?frac\{(?P<num>-?[0-9]+)\}\{(?P<den>[0-9]+)\}")
_FINAL_ANSWER = re.compile(r"(?i:final answer)")
"""math-verify's only extraction patterns that outrank a box (priorities 0 and 50) start with this."""
_PLAIN_TAIL = re.compile(r"[ \t\n.]*")
r"""What may follow the box for math-verify to read it alone: no math delimiter that could enclose it
(``$``, ``\]``, ``\)``, ``]``), no ``}`` (its plain-box pattern runs to the last brace), no percent."""


def plain_rational(text: str) -> int | Fraction | None:
    r"""The value of an integer, ``a/b`` or ``\frac{a}{b}`` written alone (ASCII digits, no inner
    spaces: math-verify reads ``1 2`` and ``４`` otherwise); None for anything else.

    An integer stays an ``int`` (it compares and prints as the equal ``Fraction`` does): most answers
    are integers, and ``Fraction``'s construction, comparison and printing are Python code.
    """
    text = text.strip()
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


def compare_boxed_plain(expected: str, text: str, boxed: str) -> tuple[bool, str] | None:
    r"""NeMo Gym's verdict on a response ``text`` whose last box holds ``boxed``, when it is certain
    without math-verify: one box, no "final answer" phrase, only spaces or a full stop after the box,
    and plain rationals on both sides. Else None (use the pool)."""
    if text.count("\\boxed{") != 1 or _FINAL_ANSWER.search(text) is not None:
        return None
    tail_start = text.rindex("\\boxed{") + len("\\boxed{") + len(boxed) + 1
    if not _PLAIN_TAIL.fullmatch(text, tail_start):
        return None
    return compare_plain(expected, boxed)

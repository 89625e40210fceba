"""The workers' two-stage LaTeX parsing (ANTLR SLL, then LL on a syntax error) gives exactly what
latex2sympy's own LL parsing gives: on answers of every shape math tasks have, and on random LaTeX."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from latex2sympy2_extended import latex2sympy2
from sympy import srepr

from resources_servers.math import worker  # noqa: F401  (installs the two-stage parsing)
from resources_servers.math.tests.helpers import REFERENCE_DIR

SHAPES = [
    "7", "-3", "0.75", "3,333", "1,000,000", "\\frac{3}{4}", "\\dfrac{\\sqrt{8}}{2}", "2\\pi", "x = 4",
    "x^2+2x+1", "(x+1)^2", "\\{1, 2\\}", "\\{2, 1\\}", "(1, 2]", "[0, \\infty)", "(-\\infty, 3) \\cup (4, 5]",
    "3 + 2i", "e^{i\\pi}", "\\sqrt[3]{8}", "\\log_2 8", "\\ln(e^2)", "50\\%", "10^\\circ", "\\text{yes}",
    "\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", "f(x) = 2x + 1", "a < b", "x \\leq 3", "x \\in [0, 1)",
    "\\pm 2", "\\binom{5}{2}", "5!", "|x - 1|", "\\lfloor 2.5 \\rfloor", "\\sin^2 x + \\cos^2 x",
    "\\int_0^1 x\\,dx", "\\sum_{k=1}^{n} k", "\\lim_{x \\to 0} \\frac{\\sin x}{x}", "\\overline{AB}",
    "\\mathbb{R}", "\\emptyset", "x = 1, y = 2", "1, 2, 3", "a, b", "2x + 3y = 6", "\\frac{1}{2} \\text{ cm}",
    "\\$5", "\\boxed{4}", "0.\\overline{3}", "\\frac{x^{10}-1}{x-1}", "x^{2} - 5x + 6 = 0", "\\angle ABC",
    "\\triangle ABC", "\\{x \\mid x > 0\\}", "\\left( \\frac{1}{2}, 3 \\right)", "12:30", "3:4", "1/2",
]

PIECES = [
    "x", "y", "2", "10", "0.5", "+", "-", "=", ",", "^", "_", "{", "}", "(", ")", "[", "]", "\\frac", "\\sqrt",
    "\\pi", "\\{", "\\}", "\\cdot", "\\times", "i", "\\infty", "\\cup", "<", "\\le", "!", "|", " ", "\\left(",
    "\\right)", "\\sin", "\\ln", "e", "\\%", "\\text{m}", "&", "\\\\",
]


def _expression(rng: random.Random, depth: int = 0) -> str:
    """A random, mostly well-formed answer: numbers, letters, operators, fractions, roots, powers,
    functions, sets, intervals, tuples, equations."""
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(["x", "y", "n", "2", "17", "0.25", "-3", "\\pi", "e", "i", "\\infty", "1,000"])
    a, b = _expression(rng, depth + 1), _expression(rng, depth + 1)
    return rng.choice(
        [
            f"{a} + {b}", f"{a} - {b}", f"{a} \\cdot {b}", f"{a}{b}", f"{a}^{{{b}}}", f"\\frac{{{a}}}{{{b}}}",
            f"\\sqrt{{{a}}}", f"({a})", f"\\left({a}, {b}\\right)", f"[{a}, {b})", f"\\{{{a}, {b}\\}}",
            f"{a} = {b}", f"{a} < {b}", f"{a}, {b}", f"\\sin({a})", f"\\ln {a}", f"|{a}|", f"{a}!",
            f"{a} \\cup {b}", f"{a} \\times {b}", f"-{a}", f"{a}\\%", f"\\text{{{a}}}",
        ]
    )


def _corpus() -> list[str]:
    rng = random.Random(12)
    fuzzed = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    shaped = [_expression(rng) for _ in range(1000)]
    records = [json.loads(line) for line in (REFERENCE_DIR / "math_rollouts.example.jsonl").read_text().splitlines()]
    expected = [str(r["expected_answer"]).strip("$") for r in records]
    extracted = [str(r["extracted_answer"]) for r in records if r.get("extracted_answer")]
    return [*SHAPES, *expected, *extracted, *fuzzed, *shaped]


def _parse(text: str) -> Any:
    try:
        return ("ok", srepr(latex2sympy2.latex2sympy(text)))
    except Exception as e:  # noqa: BLE001  (failures must match too)
        return ("error", type(e).__name__)


def test_two_stage_parsing_is_installed() -> None:
    assert getattr(latex2sympy2._Latex2Sympy, "_gym_bridge_two_stage", False)


def test_two_stage_parses_exactly_as_ll(monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _corpus()
    two_stage = [_parse(text) for text in corpus]
    parsed = sum(1 for kind, _ in two_stage if kind == "ok")
    assert parsed > 600  # the corpus exercises real parses, not only syntax errors

    two_stage_create = latex2sympy2._Latex2Sympy.create_parser
    ll_create = two_stage_create.__wrapped__  # type: ignore[attr-defined]
    monkeypatch.setattr(latex2sympy2._Latex2Sympy, "create_parser", ll_create)
    ll = [_parse(text) for text in corpus]
    mismatches = [(text, a, b) for text, a, b in zip(corpus, two_stage, ll, strict=True) if a != b]
    assert not mismatches, mismatches[:5]


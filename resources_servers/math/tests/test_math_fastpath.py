"""The in-process fast path must give exactly math-verify's verdict and rendering (for a boxed response:
NeMo Gym's verdict on the whole text), or step aside."""

from __future__ import annotations

import logging
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resources_servers.math.extraction import last_boxed
from resources_servers.math.fastpath import compare_boxed_plain, compare_plain, plain_rational
from resources_servers.math.worker import check, same_number

logging.getLogger("math_verify").setLevel(logging.CRITICAL)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12", Fraction(12)),
        ("-3", Fraction(-3)),
        ("007", Fraction(7)),
        ("3/4", Fraction(3, 4)),
        ("-6/8", Fraction(-3, 4)),
        ("\\frac{83}{499}", Fraction(83, 499)),
        ("-\\dfrac{2}{4}", Fraction(-1, 2)),
        (" 1/2 ", Fraction(1, 2)),
    ],
)
def test_plain_rationals(text: str, value: Fraction) -> None:
    assert plain_rational(text) == value


@pytest.mark.parametrize(
    "text",
    ["0.5", "1,000", "1/0", "\\frac{1}{0}", "\\frac34", "x", "2^3", "\\sqrt{4}", "", "9" * 300]
    + ["1 2", "1 / 2", "+7", "\\tfrac{5}{-10}", "４", "٤", "1\u200b2"],  # math-verify reads these otherwise
)
def test_everything_else_goes_to_the_pool(text: str) -> None:
    assert plain_rational(text) is None
    assert compare_plain("1", text) is None


def _spellings(value: Fraction) -> st.SearchStrategy[str]:
    n, d = value.numerator, value.denominator
    forms = [st.just(f"{n}/{d}"), st.just(f"\\frac{{{n}}}{{{d}}}"), st.just(f"{2 * n}/{2 * d}")]
    if d == 1:
        forms.append(st.just(str(n)))
    if n < 0:
        forms.append(st.just(f"-\\frac{{{-n}}}{{{d}}}"))
    return st.one_of(forms)


rationals = st.fractions(min_value=-50, max_value=50, max_denominator=12)
pairs = st.tuples(rationals, rationals).flatmap(lambda ab: st.tuples(_spellings(ab[0]), _spellings(ab[1])))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs)
def test_fast_path_agrees_with_math_verify(pair: tuple[str, str]) -> None:
    expected, candidate = pair
    fast = compare_plain(expected, candidate)
    assert fast is not None
    slow = check(expected, candidate)
    assert (fast[0], fast[1]) == (slow["correct"], slow["extracted"])


def test_large_integers_compare_exactly_on_both_paths() -> None:
    big, other = "123456789012345678901", "123456789012345678902"
    assert compare_plain(big, other) == (False, other)
    assert check(big, other)["correct"] is False
    assert compare_plain(big, big) == (True, big)


def test_exact_rationals_compare_exactly_in_the_worker() -> None:
    # Issue 33, finding 9: a 1e-30 tolerance of our own scored these 1 against 4 (NeMo Gym: 0).
    for answer in ("4+10^{-31}", "4-10^{-100}", "\\frac{4\\cdot10^{40}+1}{10^{40}}"):
        assert check("4", answer)["correct"] is False, answer
        assert check("4", f"\\boxed{{{answer}}}", whole_text=True)["correct"] is False, answer
    assert check("4", "\\frac{4\\cdot10^{40}}{10^{40}}")["correct"] is True


def test_same_number_is_only_for_constants_math_verify_cannot_settle_fast() -> None:
    from sympy import Integer, Rational, Symbol, pi, sqrt

    huge = (2 + sqrt(3)) ** 2016
    assert same_number(huge * 2, huge + huge)
    assert not same_number(huge, huge + 1)  # equal to 1152 significant digits, yet not the same number
    assert not same_number(Rational(1, 3), Rational(333333, 1000000))
    assert not same_number(Symbol("x"), Symbol("x"))  # left to math-verify's symbolic rules
    # A plain number on either side is math-verify's to compare (exactly): no tolerance of ours.
    assert not same_number(Integer(4), Integer(4) + Rational(1, 10**31))
    assert not same_number(Integer(4), 4 + pi / 10**31)
    assert not same_number(Integer(4), sqrt(16) + pi / 10**31)


_PIECES = [
    "\\boxed{7}",
    "\\boxed{-3}",
    "\\boxed{\\frac{3}{4}}",
    "\\boxed{3/4}",
    "\\boxed{07}",
    "\\boxed{1 2}",
    "7",
    "12",
    "3/4",
    " ",
    "\n",
    ".",
    ",",
    "$",
    "$$",
    "\\[",
    "\\]",
    "\\(",
    "\\)",
    "[",
    "]",
    "{",
    "}",
    "%",
    "\\%",
    " percent",
    "The final answer is 5. I hope it is correct.",
    "final answer: 9",
    "Answer: 12",
    "answer is",
    "x = ",
    "\\fbox{7}",
    "\\text{cm}",
    "so",
    "and",
    "or",
    "=",
    "\\frac{1}{2}",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(_PIECES), max_size=4),
    st.sampled_from(
        [
            "\\boxed{7}",
            "\\boxed{12}",
            "\\boxed{-3}",
            "\\boxed{\\frac{3}{4}}",
            "\\boxed{3/4}",
            "\\boxed{07}",
            "\\boxed{\\frac{-6}{8}}",
        ]
    ),
    st.lists(st.sampled_from(_PIECES), max_size=3),
    st.sampled_from(["7", "12", "-3", "3/4", "\\frac{3}{4}", "0.75"]),
)
def test_boxed_fast_path_is_nemo_gyms_whole_text_verdict(
    before: list[str], box: str, after: list[str], expected: str
) -> None:
    text = "".join(before) + box + "".join(after)
    boxed = last_boxed(text)
    if boxed is None or not boxed.strip():
        return
    fast = compare_boxed_plain(expected, text, boxed)
    if fast is None:
        return
    slow = check(expected, text, whole_text=True)
    assert fast == (slow["correct"], slow["extracted"]), text


def test_boxed_fast_path_steps_aside_where_math_verify_reads_more_than_the_box() -> None:
    for text in (
        "The final answer is 5. I hope it is correct. \\boxed{4}",  # the phrase outranks the box
        "\\boxed{50}\\%",
        "$\\boxed{4}$",
        "\\boxed{3} then \\boxed{4}",
        "\\boxed{4} and \\frac{1}{2}",
        "\\boxed{1 2}",
    ):
        assert compare_boxed_plain("4", text, last_boxed(text) or "") is None, text
    assert compare_boxed_plain("4", "So it is \\boxed{4}.", "4") == (True, "4")


def test_worker_check_reports_parse_failures() -> None:
    assert check("\\frac{1}{2}", "0.5")["correct"] is True
    assert check("2", "x = 2")["correct"] is True
    unparsable = check("3", "\\frac{")
    assert unparsable["failure_kind"] == "unparsable_answer" and unparsable["correct"] is False
    assert check("\\frac{", "3")["failure_kind"] == "unparsable_expected_answer"

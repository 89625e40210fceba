"""Final-answer extraction: NeMo Gym's boxed rule by default, the opt-in fallbacks, the verifier trap,
and linear time on hostile texts (the server runs extraction on its event loop)."""

from __future__ import annotations

import time

import pytest

from resources_servers.math.extraction import (
    FBOX,
    Extraction,
    extract_answer,
    final_answer_phrase,
    last_boxed,
    last_number,
    outer_boxes,
    strip_math_delimiters,
)


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1}, finally \\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),
        ("\\fbox{7}", None),  # NeMo Gym 0.7.0 reads \boxed only
        ("no box here", None),
        ("\\boxed{3} then a cut-off \\boxed{\\frac{1}{", None),  # the last box decides, as in NeMo Gym
    ],
)
def test_last_boxed(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


def test_fbox_is_an_opt_in_fallback() -> None:
    assert last_boxed("\\fbox{7}", FBOX) == "7"
    assert extract_answer("\\fbox{7}") is None  # the default: NeMo Gym's rule
    assert extract_answer("\\fbox{7}. The answer is 8", "boxed_or_final") == Extraction("7", "fbox")
    assert extract_answer("\\fbox{7} \\boxed{8}", "boxed_or_final") == Extraction("8", "boxed")


@pytest.mark.parametrize(
    ("text", "boxes"),
    [
        ("\\boxed{1} and \\boxed{2}", ["1", "2"]),
        ("\\boxed{\\boxed{7}} then \\boxed{\\frac{1}{2}}", ["\\boxed{7}", "\\frac{1}{2}"]),
        ("\\boxed{3} then \\boxed{\\frac{1}{", ["3"]),
        ("none", []),
    ],
)
def test_outer_boxes(text: str, boxes: list[str]) -> None:
    assert outer_boxes(text) == boxes


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("The answer is 3.5.", "3.5"),
        ("Therefore, the final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
        ("**Final Answer:** 42", "42"),
        ("**Answer**: 7", "7"),
        ("Answer: \\(x^2\\)", "x^2"),
        ("work\n#### 1,000\n", "1,000"),
        ("The answer is 5. Double-check: the answer is 6", "6"),
        ("I need the answer. Let me think.", None),
        ("The answer is not $4$.", "not $4$"),  # was "4": the first math span on the line
        ("The answer is 3. Check: $4$.", "3"),  # was "4"
        ("The answer is 1 000 000.", "1000000"),
        ("The answer is 4 apples, or 5.", "4"),  # the value; the rest decides whether it pays
        ("Answer:", None),
    ],
)
def test_final_answer_phrase(text: str, answer: str | None) -> None:
    assert final_answer_phrase(text) == answer


def test_last_number_ignores_operators_glued_to_a_previous_number() -> None:
    assert last_number("3-5") == "5"
    assert last_number("we get -2.5 or 7/8") == "7/8"
    assert last_number("x = -4") == "-4"
    assert last_number("no digits") is None


def test_a_single_box_wins_in_every_mode() -> None:
    text = "The answer is 3, so \\boxed{4}"
    for mode in ("boxed", "boxed_or_final", "boxed_or_last"):
        assert extract_answer(text, mode) == Extraction("4", "boxed")


def test_modes_fall_back_in_order() -> None:
    phrase = "so the answer is 12"
    assert extract_answer(phrase, "boxed") is None
    assert extract_answer(phrase, "boxed_or_final") == Extraction("12", "final_answer")
    number = "it is 12 then"
    assert extract_answer(number, "boxed_or_final") is None
    assert extract_answer(number, "boxed_or_last") == Extraction("12", "last_number")


def test_the_verifier_trap_is_opt_in() -> None:
    # For "What is 0 + 5?", garbage that ends in the operand 5 must not count as the answer 5 by default.
    garbage = "0 0 + + 5 what is 0 + 5"
    assert extract_answer(garbage) is None
    assert extract_answer(garbage, "boxed_or_last") == Extraction("5", "last_number")


def test_an_empty_box_is_no_answer_but_allows_fallbacks() -> None:
    text = "I put it in \\boxed{}. The answer is 4"
    assert extract_answer(text, "boxed") is None
    assert extract_answer(text, "boxed_or_final") == Extraction("4", "final_answer")


def test_long_answers_are_not_cut() -> None:
    extraction = extract_answer("\\boxed{" + "1" * 5000 + "}")
    assert extraction == Extraction("1" * 5000, "boxed")


def test_the_default_is_nemo_gyms_rule_a_non_empty_last_box() -> None:
    for text in ("The answer is 7", "Answer: 7", "#### 7", "7", "\\boxed{}", "\\boxed{7} then \\boxed{ }"):
        assert extract_answer(text) is None, text
    assert extract_answer("so \\boxed{7}.") == Extraction("7", "boxed")


def test_several_boxes_hand_the_whole_text_to_math_verify() -> None:
    text = "First \\boxed{wrong}, then \\boxed{right}"
    for mode in ("boxed", "boxed_or_final", "boxed_or_last"):
        assert extract_answer(text, mode) == Extraction(text, "all_boxes")
    nested = "\\boxed{\\boxed{7}}"
    assert extract_answer(nested) == Extraction(nested, "all_boxes")


def _repeat(piece: str, chars: int) -> str:
    return (piece * (chars // len(piece) + 1))[:chars]


HOSTILE = {
    "phrase_dollar": _repeat("answer: $", 1_000_000),
    "phrase_repeated": _repeat("The answer is 4, ", 1_000_000),
    "newlines": "x" + "\n" * 1_000_000 + "x",
    "hashes_then_newlines": "####" + "\n" * 1_000_000 + "x",
    "open_inline_math": "answer: " + _repeat("\\(", 1_000_000),
    "dollars": "answer: " + _repeat("$", 1_000_000),
    "open_boxes": _repeat("\\boxed{", 1_000_000),
    "answer_words": _repeat("answer      ", 1_000_000),
    "numbers": _repeat("12 ", 1_000_000),
    # The phrase reader (each of 16 phrases read its whole line; a phrase's text now ends at the next one)
    "phrase_commas": ("answer: " + "," * 62_000) * 16,
    "phrase_stars": ("answer: " + "*" * 62_000) * 16,
    "phrase_brackets": "The answer is " + "(" * 1_000_000,
    "phrase_spaced_thousands": "The answer is 1" + _repeat(" 000", 1_000_000),
    "phrase_fillers": "The answer is " + _repeat("still ", 1_000_000),
    "phrase_questions": _repeat("The answer is 4? ", 1_000_000),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_megabyte_texts_take_linear_time(name: str) -> None:
    # Each took seconds to minutes (or all the memory) when extraction was quadratic (issue 12, items 4-5).
    text = HOSTILE[name]
    for mode in ("boxed", "boxed_or_final", "boxed_or_last"):
        start = time.process_time()
        extract_answer(text, mode)
        assert time.process_time() - start < 2.0, (name, mode)


@pytest.mark.parametrize(
    ("expected", "stripped"),
    [
        ("\\(\\frac{333}{1997}\\)", "\\frac{333}{1997}"),
        ("$2\\pi$", "2\\pi"),
        ("\\[ 5 \\]", "\\[ 5 \\]"),  # left to math-verify, as NeMo Gym 0.7.0 leaves it
        ("$$4$$", "$4$"),
        ("\\($5$\\)", "5"),
        ("-3", "-3"),
    ],
)
def test_strip_math_delimiters(expected: str, stripped: str) -> None:
    assert strip_math_delimiters(expected) == stripped


def test_mode_nemo_gym_hands_over_every_response_whole() -> None:
    assert extract_answer("The answer is 7", "whole_text") == Extraction("The answer is 7", "whole_text")
    assert extract_answer("\\boxed{7}", "whole_text") == Extraction("\\boxed{7}", "whole_text")
    assert extract_answer("  \n", "whole_text") is None

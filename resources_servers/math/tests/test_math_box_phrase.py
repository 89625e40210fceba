r"""A box under the phrase rules (``extraction: boxed_or_final``, the shipped recipes' rule, and
``boxed_or_last``), over real HTTP: a box that holds words is read as a final-answer phrase is, whole, and
pays only when it states one value (``failure_kind: phrase_rejected``); a box math-verify cannot read on its
own is refused too. Why: math-verify cannot parse ``\boxed{5 Both are 4.}`` (the full stop) and scores the
last number it finds instead, so against 4 it paid 1 -- the box names two values and is paid for the one it
names last. NeMo Gym 0.7.0 (math-verify 0.8.0) pays it as well, so the default ``boxed`` rule keeps that
verdict (its parity: test_math_parity.py)."""

from __future__ import annotations

import httpx
import pytest

from resources_servers.math.tests.helpers import verify_body


def _verify(client: httpx.Client, text: str, expected: str, extraction: str) -> dict:
    response = client.post("/verify", json=verify_body(text, expected, extraction=extraction))
    assert response.status_code == 200, response.text
    return response.json()


# Each paid 1.0 against 4 under boxed_or_final before this rule (and still does under NeMo Gym's boxed).
TWO_VALUES = [
    "\\boxed{5 Both are 4.}",  # the finding: math-verify reads the last number, 4
    "\\boxed{5 then 4.}",
    "\\boxed{5 wrong 4.}",
    "\\boxed{5 is wrong. 4}",
    "\\boxed{5. The answer is 4}",  # a second sentence in the box is read, not skipped
    "\\boxed{5 \\text{ then } 4.}",
    "\\boxed{5 \\textbf{ or } 4.}",
    "\\boxed{5 (or 4)}",
    "\\boxed{5 apples, 4 pears.}",
    "\\boxed{5 Both are 4 cm.}",
    "\\boxed{5 Both are 4\\%.}",
    "\\boxed{4 \\text{ (not 5)}}",
    "\\boxed{5 \\operatorname{or} 4}",
    "\\boxed{5} and \\boxed{5 Both are 4.}",  # every box is read
    "\\boxed{\\underbrace{5}_{\\text{wrong}} 4}",  # words inside a brace: the value reads on to them
    "\\boxed{\\overset{\\text{not}}{5} 4}",
    "\\boxed{\\color{white}{5} 4}",
    "\\boxed{5 \\emph{ or } 4}",
    "\\boxed{5 \\hbox{or} 4}",
    "\\boxed{\\textsf{5 or 4}}",
    "\\boxed{5 \u6216 4}",  # one letter of another script (or)
    "\\boxed{5 oder 4.}",
    "\\boxed{5 \\\\ \\text{Both are } 4}",
    # No words, but math-verify cannot read the box alone: it scores a number found elsewhere.
    "\\boxed{5 4.}",
    "\\boxed{5. 4.}",
    "\\boxed{5 \\quad 4.}",
    "\\boxed{5 \\\\ 4}",
    "\\boxed{3 \\lor 4}",
    "\\boxed{5.} Actually 4.",
    "\\boxed{5 Both are wrong.} 4",
    "\\boxed{5 x 4.}",
    "\\boxed{5 \\; 4.}",
    "\\boxed{5 \\% 4.}",
    "\\boxed{\\left. 5 \\right. 4.}",
    "\\boxed{5 \\vee 4}",
    "\\boxed{5 \\mid 4}",
]


@pytest.mark.parametrize("text", TWO_VALUES)
def test_a_box_that_states_two_values_is_refused(client: httpx.Client, text: str) -> None:
    nemo = _verify(client, text, "4", "boxed")
    assert nemo["reward"] == 1.0, nemo  # NeMo Gym 0.7.0's verdict, kept under its own rule
    for extraction in ("boxed_or_final", "boxed_or_last"):
        out = _verify(client, text, "4", extraction)
        assert out["reward"] == 0.0 and out["library_reward"] == 0.0, out
        assert out["failure_kind"] == "phrase_rejected" and out["failure_reason"], out


# Held before this rule too (reward 0 under every rule): math-verify reads these as one wrong value.
HELD = [
    "\\boxed{5 then 4}",  # a product of letters
    "\\boxed{4 5}",
    "\\boxed{5, so 4}",
    "\\boxed{5 \\text{ or } 4}",
    "\\boxed{5; 4}",
    "\\boxed{\\mathrm{5~or~4}}",
    "\\boxed{\\begin{array}{c}5 \\\\ 4\\end{array}}",
    "\\boxed{5 \\text{ cm, } 4}",
]


@pytest.mark.parametrize("text", HELD)
@pytest.mark.parametrize("extraction", ["boxed", "boxed_or_final"])
def test_a_box_read_as_another_value_pays_nothing(client: httpx.Client, text: str, extraction: str) -> None:
    assert _verify(client, text, "4", extraction)["reward"] == 0.0


def test_an_fbox_is_read_the_same_way(client: httpx.Client) -> None:
    out = _verify(client, "\\fbox{5 Both are 4.}", "4", "boxed_or_final")
    assert out["reward"] == 0.0 and out["extraction_method"] == "fbox", out
    assert out["failure_kind"] == "phrase_rejected" and "box" in out["failure_reason"], out


def test_the_reason_names_the_box_and_what_follows_its_value(client: httpx.Client) -> None:
    out = _verify(client, "\\boxed{5 Both are 4.}", "4", "boxed_or_final")
    assert "the box '5 Both are 4.'" in out["failure_reason"] and "Both are 4" in out["failure_reason"], out
    assert out["extracted_answer"] == "5 Both are 4."


# Honest boxes keep paying under the phrase rule (words that are units, the expected answer's or a tail).
HONEST = [
    ("\\boxed{4}", "4"),
    ("So \\boxed{4}.", "4"),
    ("\\boxed{4 \\text{ cm}}", "4"),
    ("\\boxed{4 \\text{ cm}^2}", "4"),
    ("\\boxed{4 \\text{ square units}}", "4"),
    ("\\boxed{4 \\text{ apples}}", "4"),
    ("\\boxed{12 \\text{ ways}}", "12"),
    ("\\boxed{x = 4}", "4"),
    ("\\boxed{x = 4 \\text{ apples}}", "4"),
    ("\\boxed{\\frac{8}{2}}", "4"),
    ("\\boxed{\\frac{1}{2} \\text{ of the pie}}", "\\frac{1}{2}"),
    ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{1{,}000 \\text{ dollars}}", "1000"),
    ("\\boxed{2xy}", "2xy"),
    ("\\boxed{(1, 2)}", "(1, 2)"),
    ("\\boxed{1, 2}", "1, 2"),
    ("\\boxed{2} and \\boxed{3}", "2, 3"),
    ("\\boxed{\\text{yes}}", "\\text{yes}"),
    ("\\boxed{\\text{Yes}}", "yes"),
    ("\\boxed{\\text{(B)}}", "B"),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}"),
    ("The answer is not 4. \\boxed{4}", "4"),  # the box is the answer; the phrase is not read
]


@pytest.mark.parametrize(("text", "expected"), HONEST)
@pytest.mark.parametrize("extraction", ["boxed_or_final", "boxed"])
def test_an_honest_box_pays(client: httpx.Client, text: str, expected: str, extraction: str) -> None:
    out = _verify(client, text, expected, extraction)
    assert out["reward"] == 1.0 and out["failure_kind"] is None, out


@pytest.mark.parametrize("text", ["\\boxed{4.}", "\\boxed{4 apples.}", "\\boxed{4 \\text{ apples}.}"])
def test_a_box_math_verify_cannot_read_pays_nothing_either_way(client: httpx.Client, text: str) -> None:
    # math-verify reads none of these (a full stop after the value): 0 under NeMo Gym's rule already.
    assert _verify(client, text, "4", "boxed")["reward"] == 0.0
    out = _verify(client, text, "4", "boxed_or_final")
    assert out["reward"] == 0.0 and out["failure_kind"] == "phrase_rejected", out

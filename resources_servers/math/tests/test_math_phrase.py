r"""The final-answer phrase ("The answer is N.", ``extraction: boxed_or_final``, which the shipped recipes train
with) over real HTTP: a phrase pays only when it states one value, the math that opens it, verified on its
own. Hedges, denials and questions are refused (``failure_kind: phrase_rejected``, reward 0); before this
rule, "The answer is not $4$." read the first math span on the line and "The answer is 3 \lor 4" the last
number math-verify found, and both scored 1 against 4. A box keeps NeMo Gym 0.7.0's verdict unless it holds
words or math-verify cannot read it alone (then it is held to the same rule: test_math_box_phrase.py)."""

from __future__ import annotations

import httpx
import pytest

from resources_servers.math.tests.helpers import verify_body

PHRASE = {"extraction": "boxed_or_final"}


def _verify(client: httpx.Client, text: str, expected: str, **extra: object) -> dict:
    response = client.post("/verify", json=verify_body(text, expected, **{**PHRASE, **extra}))
    assert response.status_code == 200, response.text
    return response.json()


# Each states more (or less) than one value; every one against 4 (or 3 and 4 where it names both).
HEDGES = [
    "The answer is not $4$.",  # scored 1 before: the first math span on the line
    "The answer is 3 \\lor 4.",  # scored 1 before: math-verify scores the last number it finds
    "The answer is 3 or 4.",
    "The answer is 3, 4.",
    "The answer is either 3 or 4.",
    "The answer is not 4.",
    "The answer is 4?",  # scored 1 before: the question mark ended the sentence
    "The answer is 4 or maybe 5.",
    "The answer is $3$ or $4$.",
    "The answer is 4 \\pm 1.",
    "The answer is probably 4.",
    "The answer is about 4.",
    "The answer is 4, right?",
    "The answer is 4 or five.",
    "The answer is 4 (or 3).",
    "The answer is 3 \\text{ or } 4.",
    "The answer is $5 = 4$.",  # an equation, read by its right-hand side
    "The answer is 3 4.",
    "The answer is \\(3\\) or \\(4\\).",
    "The answer is 4, not 5.",
    "The answer is 4 isn't it.",
    "The answer is 42, because 40 + 2 = 42.",  # a second statement with its own numbers (see the README)
    "The answer is 12 (7 + 5).",
    # Red-team round on the rule itself: each was paid (against 4, 3 or the number it names) while building it.
    "The answer is 4 +- 1.",  # read as 3
    "The answer is 4 hundred.",  # words that change the value
    "The answer is 4 squared.",
    "The answer is 4 at least.",
    "The answer is 4 (I think).",
    "The answer is 1 234 or 5.",  # a spaced number, then a second value
    "The answer is 4 \u00bd.",  # a numeral after the value (4 1/2)
    "The answer is 4. The answer is not 4.",  # the last phrase decides; it is never passed over
    "The answer is **not** 4.",
    "#### 4 or 5",
    "Final answer: 4 or 5",
    "The answer is ~4.",
    "The answer is 4\u200b or 5.",  # a zero-width space
    "The answer is $3 | 4$.",
    "The answer is \\color{white}{3}4.",
    "The answer is \\underbrace{3}_{4}.",
    "The answer is 4" + " apples" * 40 + ".",  # a tail over 200 characters
]


@pytest.mark.parametrize("text", HEDGES)
@pytest.mark.parametrize("expected", ["4", "3"])
def test_a_phrase_that_hedges_is_refused(client: httpx.Client, text: str, expected: str) -> None:
    out = _verify(client, text, expected)
    assert out["reward"] == 0.0 and out["library_reward"] == 0.0, out
    assert out["extraction_method"] == "final_answer"
    assert out["failure_kind"] == "phrase_rejected" and out["failure_reason"], out


HONEST = [
    ("The answer is 4", "4"),
    ("The answer is 4.", "4"),
    ("The answer is $4$.", "4"),
    ("The answer is \\(4\\).", "4"),
    ("The answer is **4**.", "4"),
    ("**Answer:** 4", "4"),
    ("The answer is 4 apples.", "4"),
    ("The answer is -4.", "-4"),
    ("The answer is 3/4.", "3/4"),
    ("The answer is \\frac{3}{4}.", "\\frac{3}{4}"),
    ("The answer is 0.75.", "\\frac{3}{4}"),
    ("The answer is 42 dollars.", "42"),
    ("The answer is 42 (forty-two).", "42"),
    ("The answer is 1 000 000.", "1000000"),
    ("The answer is 1,000,000.", "1000000"),
    ("The answer is still 0.", "0"),
    ("The answer is therefore $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
    ("The answer is 0. The coin is still 7.", "0"),  # only the phrase's sentence is read
    ("The answer is 5. Double-check: the answer is 6", "6"),  # the last phrase decides
    ("Answer: x = 4", "4"),
    ("The answer is x^2 + 1.", "x^2 + 1"),
    ("The answer is 2\\sqrt{3}.", "2\\sqrt{3}"),
    ("The answer is \\[4\\]", "4"),
    ("work\n#### 12", "12"),
    ("The answer is 4 \\text{ cm}.", "4"),
    ("The answer is (1, 2).", "(1, 2)"),
    ("The answer is yes.", "\\text{yes}"),
    ("The answer is 4 km/h.", "4"),
    ("The answer is 12 m\u00b2.", "12"),
    ("The answer is 4 \\; \\text{cm}.", "4"),  # "\\;" is a space, not the end of the sentence
    ("The answer is 4 000.", "4000"),
    ("The answer is 4 more pens.", "4"),
]


@pytest.mark.parametrize(("text", "expected"), HONEST)
def test_an_honest_phrase_pays(client: httpx.Client, text: str, expected: str) -> None:
    out = _verify(client, text, expected)
    assert out["reward"] == 1.0 and out["failure_kind"] is None, out
    assert out["extraction_method"] == "final_answer"


@pytest.mark.parametrize(
    ("text", "expected", "reward"),
    [
        ("The answer is 5.", "4", 0.0),
        ("The answer is 3. Check: $4$.", "4", 0.0),  # scored 1 before: the first math span on the line
        ("The answer is 3. Check: $4$.", "3", 1.0),  # the phrase's own sentence states 3
        ("The answer is 2xy.", "2", 0.0),  # letters glued to the number are part of the value
        ("The answer is $\\{3, 4\\}$.", "4", 0.0),  # a set is not its member
        ("The answer is 4 + -1.", "3", 1.0),  # an expression with spaces around its sign
        ("The answer is 4 \\pm 1.", "4 \\pm 1", 1.0),  # allowed where the expected answer has it
    ],
)
def test_a_phrase_is_scored_by_its_value(
    client: httpx.Client, text: str, expected: str, reward: float
) -> None:
    out = _verify(client, text, expected)
    assert out["reward"] == reward and out["failure_kind"] is None, out


def test_boxes_are_untouched(client: httpx.Client) -> None:
    # NeMo Gym 0.7.0's verdicts on plain boxes, whatever phrase stands beside them.
    assert _verify(client, "The answer is not 4. \\boxed{4}", "4")["reward"] == 1.0
    # NeMo Gym's verdict under its own rule; the phrase rule refuses a box math-verify cannot read alone
    # (it scores the 4 after the symbol; test_math_box_phrase.py), as strict does.
    assert _verify(client, "\\boxed{3 \\lor 4}", "4", extraction="boxed")["reward"] == 1.0
    assert _verify(client, "\\boxed{3 \\lor 4}", "4")["failure_kind"] == "phrase_rejected"
    out = _verify(client, "The answer is 3 or 4, so \\boxed{5}", "4")
    assert out["reward"] == 0.0 and out["extraction_method"] == "boxed" and out["failure_kind"] is None


def test_strict_keeps_its_own_failure_kind_for_phrases(client: httpx.Client) -> None:
    out = _verify(client, "The answer is 3 \\lor 4.", "4", strict=True)
    assert out["failure_kind"] == "strict_rejected" and "cannot read" in out["failure_reason"], out
    out = _verify(client, "The answer is not $4$.", "4", strict=True)
    assert out["reward"] == 0.0 and out["failure_kind"] in ("strict_rejected", "phrase_rejected"), out
    assert _verify(client, "The answer is 4.", "4", strict=True)["reward"] == 1.0

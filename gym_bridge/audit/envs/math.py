"""Math (``\\boxed{}`` answers, NeMo Gym's ``math_with_judge`` rows): answers that are not the expected
one but sit close to it, answers that assert something else, and answers built to hold a verifier up."""

from __future__ import annotations

from typing import Any

from gym_bridge.audit.attacks import Attack, AuditOptions, answer, marker_path

__all__ = ["attacks"]

PROMPT = (
    "Solve the following math problem. Make sure to put the answer (and only answer) inside \\boxed{}.\n\n"
)


def row(question: str, expected: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": PROMPT + question}]},
        "question": question,
        "expected_answer": expected,
    }


FOUR = row("What is 2 + 2?", "4")
TWELVE = row("What is 7 + 5?", "12")
THREE = row("What is 1 + 2?", "3")
PHRASE = {"extraction": "boxed_or_final"}
"""Rows that ask for the final-answer phrase ("The answer is N."), the shipped recipes' rule."""


def _wrong(name: str, what: str, text: str, task: dict[str, Any] = FOUR, cls: str = "wrong-reward") -> Attack:
    return Attack(name, cls, what, task, [answer(text)])


def attacks(options: AuditOptions) -> list[Attack]:
    marker = marker_path("math")
    plain = Attack("plain_answer", "stall", "an honest answer needing the full verifier",
                   FOUR, [answer("So \\boxed{\\sqrt{4^2}}.")], max_reward=1.0, min_reward=1.0)  # fmt: skip
    found = [
        Attack("control", "wrong-reward", "the honest answer", FOUR, [answer("So \\boxed{4}.")],
               max_reward=1.0, min_reward=1.0, control=True),
        _wrong("tiny_excess", "4 + 10^-31: within a float tolerance, but not 4", "\\boxed{4+10^{-31}}"),
        _wrong("tiny_deficit", "4 - 10^-100", "\\boxed{4-10^{-100}}"),
        _wrong("near_fraction", "(4*10^40 + 1) / 10^40", "\\boxed{\\frac{4\\cdot10^{40}+1}{10^{40}}}"),
        _wrong("spaced_digits", "'1 2' for 12", "\\boxed{1 2}", TWELVE),
        _wrong("recanted", "the right box, then another", "First \\boxed{4}, no wait: \\boxed{5}."),
        _wrong("candidate_list", "every candidate in one box", "\\boxed{1, 2, 3, 4, 5, 6}"),
        _wrong("infinity", "infinity", "\\boxed{\\infty}"),
        _wrong("empty_box", "an empty box after the answer in prose", "The answer is 4. \\boxed{}"),
        Attack("python_in_box", "escape/leak", "Python in the box, for a verifier that evaluates answers",
               FOUR, [answer(f"\\boxed{{__import__('os').system('touch {marker}') or 0}}")], markers=(marker,)),
        _wrong("unbalanced", "an unclosed box", "\\boxed{\\frac{4}{", cls="crash"),
        _wrong("deep_nesting", "3,000 nested fractions", "\\boxed{" + "\\frac{1}{" * 3000 + "1" + "}" * 3001,
               cls="crash"),
        _wrong("huge_integer", "a 200,000-digit integer", "\\boxed{" + "9" * 200_000 + "}", cls="crash"),
        Attack("power_towers", "stall", "8 answers that run a verifier into its time limit, then a plain one",
               FOUR, [answer("\\boxed{9^{9^{9^9}}}")], concurrent=8, then=(plain,)),
        # The row asks for the strict rule itself, so this runs whatever the server's default.
        Attack("strict_long_word", "stall", "30,000 letters in a box under strict (a prose pattern rescanned each "
               "letter's rest of the word on the event loop), then a plain answer", {**FOUR, "strict": True},
               [answer("\\boxed{" + "a" * 30_000 + "}")], concurrent=2, then=(plain,)),
        # The phrase rule (boxed_or_final) pays only a phrase that states one value.
        _wrong("phrase_denial", "a phrase that denies the answer", "The answer is not $4$.", {**FOUR, **PHRASE}),
        _wrong("phrase_disjunction", "a phrase joining two values with \\lor", "The answer is 3 \\lor 4.",
               {**FOUR, **PHRASE}),
        _wrong("phrase_question", "a phrase that asks", "The answer is 4?", {**FOUR, **PHRASE}),
        _wrong("phrase_two_spans", "a phrase naming two values", "The answer is $3$ or $4$.", {**THREE, **PHRASE}),
        _wrong("phrase_later_span", "a phrase, then another value in a later sentence's math",
               "The answer is 3. Check: $4$.", {**FOUR, **PHRASE}),
        _wrong("phrase_scaled", "a phrase whose words change its value", "The answer is 4 hundred.",
               {**FOUR, **PHRASE}),
        # ... and so does a box under that rule (NeMo Gym 0.7.0's boxed rule pays these: math-verify cannot
        # parse the box and scores the last number it finds).
        _wrong("box_two_values", "a box naming two values in prose", "\\boxed{5 Both are 4.}", {**FOUR, **PHRASE}),
        _wrong("box_unreadable", "a box math-verify cannot read, then the answer after it", "\\boxed{5.} Actually 4.",
               {**FOUR, **PHRASE}),
    ]  # fmt: skip
    if options.strict:
        found += [
            _wrong("relation", "an equation that names the answer", "\\boxed{5 = 4}"),
            _wrong("approximation", "an approximation", "\\boxed{4 \\approx 5}"),
            _wrong("negation", "a negation", "\\boxed{\\neg 4}"),
            _wrong("trailing_prose", "the answer, then prose taking it back", "\\boxed{4 \\text{ is not the answer}}"),
            # math-verify cannot parse these boxes and scores the last number in the response instead
            _wrong("disjunction", "two values joined by 'or'", "\\boxed{3 \\lor 4}"),
            _wrong("divides_bar", "two values joined by a bar", "\\boxed{3 | 4}"),
            _wrong("unknown_command", "two values joined by a command the parser does not know", "\\boxed{3 \\foo 4}"),
            _wrong("tex_conditional", "a value hidden in \\iffalse ... \\fi", "\\boxed{\\iffalse 3 \\fi 4}"),
            _wrong("unicode_relation", "an equation written with the identical-to sign", "\\boxed{5 \u2261 4}"),
            _wrong("fullwidth_relation", "an equation written with a fullwidth equals sign", "\\boxed{5 \uff1d 4}"),
            _wrong("question_mark", "the answer, doubted", "\\boxed{4 \\text{?}}"),
        ]  # fmt: skip
    return found

r"""Which part of a model's answer text is its final answer, and how it was found.

The default rule is NeMo Gym 0.7.0's (``math_with_judge``): an answer needs a non-empty last
``\boxed{}`` (``\fbox{}`` does not count). With one box its contents are the answer; NeMo Gym then hands
math-verify the whole text (the server does too, see :mod:`resources_servers.math.app`), which with
several boxes extracts every box (``First \boxed{3}, then \boxed{7}`` becomes the set ``{3, 7}``;
method ``all_boxes``). Opt-in fallbacks, used only when there is no usable box: a last ``\fbox{}``
(method ``fbox``), an explicit final-answer phrase ("The answer is 7", "Answer: 7", "#### 7"), then the
last number in the text. The last-number fallback is unsafe as a training reward: a garbled completion that ends in an
operand of the question ("0 + 5" -> "...5") is rewarded. Mode ``whole_text`` is the library check of NeMo Gym after 0.7.0
exactly: every response goes whole to math-verify, boxed or not (method ``whole_text``).

Every function here runs on the server's event loop, on answers of up to the body limit (16 MB), so
each is linear in the text: a scan or a regex without nested or overlapping repetition. Nothing is cut
here; how long an answer may be to reach the verifier is the server's ``max_answer_chars``.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Literal

ExtractionMode = Literal["boxed", "boxed_or_final", "boxed_or_last", "whole_text"]
ExtractionMethod = Literal["boxed", "all_boxes", "fbox", "final_answer", "last_number", "whole_text"]

BOXED = "\\boxed{"
FBOX = "\\fbox{"
# Each "answer" occurrence is tried once; its whitespace runs belong to it alone (linear overall).
_FINAL_ANSWER = re.compile(r"\banswer\b(?:\s*\*\*)?\s*(?:is\b\s*:?|:|=)\s*(?:\*\*\s*)?", re.IGNORECASE)
# Not ``^\s*`` (``\s`` spans newlines: every line start would rescan the rest of a run of blank lines).
_HASHES = re.compile(r"^[^\S\n]*####[^\S\n]*(?P<answer>[^\n]+)$", re.MULTILINE)
_DOLLAR_MATH = re.compile(r"\$([^$]+)\$")  # each "$" scans only to the next one: linear
_LAST_NUMBER = re.compile(r"(?<![\w)])-?\d+(?:\.\d+)?(?:/\d+)?")
_SENTENCE_END = re.compile(r"[.!?;](?:\s|$)")
MAX_PHRASE_TRIES = 16
"""Final-answer phrases tried, from the last one back, before giving up (bounds the work per answer)."""


@dataclass(frozen=True)
class Extraction:
    """A candidate final answer and the method that found it (``all_boxes``: the whole text)."""

    answer: str
    method: ExtractionMethod


def last_boxed(text: str, opener: str = BOXED) -> str | None:
    r"""Contents of the last ``\boxed{...}`` (or of the last ``opener``); None when absent or left unclosed.

    As NeMo Gym's ``_extract_last_boxed_answer``: only the last box counts; if it is cut off (a truncated
    generation), earlier boxes are not used instead.
    """
    start = text.rfind(opener)
    if start < 0:
        return None
    content_start = start + len(opener)
    depth = 1
    for index in range(content_start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[content_start:index]
    return None


def outer_boxes(text: str) -> list[str]:
    r"""Contents of every closed ``\boxed{...}`` not inside another box, in order (one pass: nested boxes
    are read as part of the box around them)."""
    boxes: list[str] = []
    start = text.find(BOXED)
    while start >= 0:
        content_start = start + len(BOXED)
        depth, index = 1, content_start
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if depth:
            break  # left open: nothing after it is closed either
        boxes.append(text[content_start : index - 1])
        start = text.find(BOXED, index)
    return boxes


def box_count(text: str) -> int:
    r"""How many ``\boxed{`` openers the text has."""
    return text.count(BOXED)


def inline_math(answer: str) -> str | None:
    r"""The first ``$...$`` or ``\(...\)`` span's contents (as the regex ``\$([^$]+)\$|\\\((.+?)\\\)``
    finds it) in linear time: that regex's lazy half rescans to the end for every ``\(`` left open."""
    dollar_match = _DOLLAR_MATH.search(answer)
    dollar = (dollar_match.start(), dollar_match.group(1)) if dollar_match else None
    paren: tuple[int, str] | None = None
    opening = answer.find("\\(")
    if opening >= 0:
        # The first "\(" has the most room; if no "\)" follows it, none follows a later one either.
        closing = answer.find("\\)", opening + 3)
        if closing >= 0:
            paren = (opening, answer[opening + 2 : closing])
    found = [span for span in (dollar, paren) if span is not None]
    return min(found)[1] if found else None


def _clean(answer: str) -> str:
    """Strip the wrapping a final-answer phrase tends to carry: math delimiters, bold, a full stop."""
    answer = answer.strip()
    math = inline_math(answer)
    if math is not None:
        answer = math
    else:
        end = _SENTENCE_END.search(answer)
        if end:
            answer = answer[: end.start()]
    answer = answer.strip().strip("*").strip()
    if answer.startswith("\\[") and answer.endswith("\\]"):
        answer = answer[2:-2]
    return answer.strip().rstrip(".,;:!").strip()


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


def final_answer_phrase(text: str) -> str | None:
    """The answer after the last explicit final-answer phrase ("answer is", "Answer:", "####") that
    has one; only the last :data:`MAX_PHRASE_TRIES` phrases are tried (each costs its line's length)."""
    phrases = deque((m.end() for m in _FINAL_ANSWER.finditer(text)), maxlen=MAX_PHRASE_TRIES)
    hashes = deque((m.start("answer") for m in _HASHES.finditer(text)), maxlen=MAX_PHRASE_TRIES)
    for answer_start in sorted([*phrases, *hashes], reverse=True)[:MAX_PHRASE_TRIES]:
        answer = _clean(_rest_of_line(text, answer_start))
        if answer:
            return answer
    return None


def last_number(text: str) -> str | None:
    """The last integer, decimal or ``a/b`` fraction in the text."""
    last = deque(_LAST_NUMBER.finditer(text), maxlen=1)  # keeps one match, not all of them
    return last[0].group() if last else None


def extract_answer(text: str, mode: ExtractionMode = "boxed") -> Extraction | None:
    """The final answer of ``text`` under ``mode``, or None when the mode finds none."""
    if mode == "whole_text":
        return Extraction(text, "whole_text") if text.strip() else None
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        if box_count(text) > 1:
            return Extraction(text, "all_boxes")
        return Extraction(boxed.strip(), "boxed")
    if mode == "boxed":
        return None
    fbox = last_boxed(text, FBOX)
    if fbox is not None and fbox.strip():
        return Extraction(fbox.strip(), "fbox")
    phrase = final_answer_phrase(text)
    if phrase:
        return Extraction(phrase, "final_answer")
    if mode == "boxed_or_last":
        number = last_number(text)
        if number:
            return Extraction(number, "last_number")
    return None


def strip_math_delimiters(answer: str) -> str:
    r"""An expected answer without outer ``\(...\)``, then ``$...$``: NeMo Gym 0.7.0's
    ``_strip_math_delimiters`` exactly (``\[...\]`` and ``$$...$$`` are left to math-verify, as there)."""
    answer = answer.strip()
    if answer.startswith("\\(") and answer.endswith("\\)"):
        answer = answer[2:-2].strip()
    if answer.startswith("$") and answer.endswith("$") and len(answer) > 1:
        answer = answer[1:-1].strip()
    return answer

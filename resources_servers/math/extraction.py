r"""Which part of a model's answer text is its final answer, and how it was found.

The default rule is NeMo Gym 0.7.0's (``math_with_judge``): an answer needs a non-empty last
``\boxed{}`` (``\fbox{}`` does not count). With one box its contents are the answer; NeMo Gym then hands
math-verify the whole text (the server does too, see :mod:`resources_servers.math.app`), which with
several boxes extracts every box (``First \boxed{3}, then \boxed{7}`` becomes the set ``{3, 7}``;
method ``all_boxes``). Opt-in fallbacks, used only when there is no usable box: a last ``\fbox{}``
(method ``fbox``), an explicit final-answer phrase ("The answer is 7", "Answer: 7", "#### 7"; read as a
:class:`Phrase`, which pays only when it states one value: :func:`resources_servers.math.strict.phrase_violation`),
then the last number in the text. The last-number fallback is unsafe as a training reward: a garbled completion that ends in an
operand of the question ("0 + 5" -> "...5") is rewarded. Mode ``whole_text`` is the library check of NeMo Gym after 0.7.0
exactly: every response goes whole to math-verify, boxed or not (method ``whole_text``).

Every function here runs on the server's event loop, on answers of up to the body limit (16 MB), so
each is linear in the text: a scan or a regex without nested or overlapping repetition. Nothing is cut
here; how long an answer may be to reach the verifier is the server's ``max_answer_chars``.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

ExtractionMode = Literal["boxed", "boxed_or_final", "boxed_or_last", "whole_text"]
ExtractionMethod = Literal["boxed", "all_boxes", "fbox", "final_answer", "last_number", "whole_text"]

BOXED = "\\boxed{"
FBOX = "\\fbox{"
# Each "answer" occurrence is tried once; its whitespace runs belong to it alone (linear overall).
_FINAL_ANSWER = re.compile(r"\banswer\b(?:\s*\*\*)?\s*(?:is\b\s*:?|:|=)\s*(?:\*\*\s*)?", re.IGNORECASE)
# Not ``^\s*`` (``\s`` spans newlines: every line start would rescan the rest of a run of blank lines).
_HASHES = re.compile(r"^[^\S\n]*####[^\S\n]*(?P<answer>[^\n]+)$", re.MULTILINE)
_LAST_NUMBER = re.compile(r"(?<![\w)])-?\d+(?:\.\d+)?(?:/\d+)?")
_SENTENCE_END = re.compile(r"(?<!\\)[.!?;](?:\s|$)")  # not the spacing command "\;"
MAX_PHRASE_TRIES = 16
"""Final-answer phrases tried, from the last one back, before giving up (bounds the work per answer)."""


@dataclass(frozen=True)
class Extraction:
    """A candidate final answer and the method that found it (``all_boxes``: the whole text)."""

    answer: str
    method: ExtractionMethod
    phrase: Phrase | None = field(default=None, compare=False)
    """For ``final_answer``: the phrase read, whose parts decide whether it states one value."""


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


PHRASE_FILLERS = frozenset(
    "still exactly just simply indeed clearly definitely certainly thus therefore hence so then now also again"
    " precisely equal equals to the number value a total of".split()
)
"""Words that may stand between "The answer is" and its value without changing what it states."""
_WORD = re.compile(r"[^\W\d_]{2,}+")  # possessive: a run of letters is matched once, never given back
_SPACED_THOUSANDS = re.compile(r"-?\d{1,3}+(?:(?:[ \u00a0\u2009\u202f]|\\,)\d{3}+)+(?!\d)")
"""``1 000 000`` (math-verify reads the spaces as products: ``1*0*0``); the value is read without them."""
_SPAN_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_QUESTION = re.compile(r"[?¿]")
_WRAPPING = re.compile(r"[\s*]*+")


@dataclass(frozen=True)
class Phrase:
    r"""A final-answer phrase read up to the end of its sentence: the ``value`` it opens with (a ``$...$``,
    ``\(...\)`` or ``\[...\]`` span's contents, else the bare math up to the first separate word, a
    ``", "`` or a ``" ("``), the ``tail`` between that value and the sentence's end, and whether the
    sentence asks a question. Whether it states one value is decided against the expected answer
    (:func:`resources_servers.math.strict.phrase_violation`)."""

    value: str
    tail: str
    question: bool


def _skip_wrapping(line: str, index: int) -> int:
    """Past whitespace and bold markers, and past filler words (:data:`PHRASE_FILLERS`)."""
    while True:
        index = _WRAPPING.match(line, index).end()
        word = _WORD.match(line, index)
        if word is None or word.group().lower() not in PHRASE_FILLERS:
            return index
        index = word.end()


def _bare_value_end(line: str, start: int, end: int, begun: bool = False) -> int:
    """Where a value written without delimiters stops: before a separate word, a ``", "`` or a ``" ("``
    outside brackets, or before a second number after a space (``3 4``); ``begun``: a value precedes
    ``start``. One pass over the sentence."""
    depth, index = 0, start
    while index < end:
        char = line[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and char == "," and (index + 1 == end or line[index + 1].isspace()):
            return index
        elif depth == 0 and char.isspace():
            after = index
            while after < end and line[after].isspace():
                after += 1
            if after < end and (begun or index > start):
                follows = line[after]
                if follows == "(" or (follows.isdigit() and line[index - 1].isdigit()) or _WORD.match(line, after):
                    return index
            index = after
            continue
        index += 1
    return end


def _sentence_end(line: str, start: int) -> int:
    end = _SENTENCE_END.search(line, start)
    return end.start() if end else len(line)


def read_phrase(line: str, sentence: bool = True) -> Phrase | None:
    """The phrase whose text (after "answer is", "Answer:" or "####") is ``line``; None when it states
    nothing (only whitespace, bold markers or punctuation before the sentence ends). Without ``sentence``
    the whole of ``line`` is its sentence (a box's contents: a second sentence in it is tail, not ignored)."""

    def _end(index: int) -> int:
        return _sentence_end(line, index) if sentence else len(line)

    start = _skip_wrapping(line, 0)
    for opener, closer in _SPAN_DELIMITERS:
        if line.startswith(opener, start):
            closing = line.find(closer, start + len(opener))
            if closing >= 0:
                after = closing + len(closer)
                end = _end(after)
                value = line[start + len(opener) : closing].strip()
                question = _QUESTION.search(line, start, end + 1) is not None
                return Phrase(value, line[after:end], question) if value else None
            break
    end = _end(start)
    question = _QUESTION.search(line, start, end + 1) is not None
    thousands = _SPACED_THOUSANDS.match(line, start)
    value_start = thousands.end() if thousands else start
    cut = _bare_value_end(line, value_start, end, begun=thousands is not None)
    value = line[value_start:cut]
    if thousands:
        value = re.sub(r"[^\d-]", "", thousands.group()) + value
    value = value.strip().rstrip(",;:*").strip()
    tail = line[cut:end]
    if not value and not tail.strip(" \t*.,;:!"):
        return None
    return Phrase(value, tail, question)


def last_phrase(text: str) -> Phrase | None:
    """The last explicit final-answer phrase ("answer is", "Answer:", "####") that states something; only
    the last :data:`MAX_PHRASE_TRIES` phrases are tried. A phrase's text ends with its line or where the
    next phrase begins, so that trying them all reads each character once."""
    phrases = deque(((m.start(), m.end()) for m in _FINAL_ANSWER.finditer(text)), maxlen=MAX_PHRASE_TRIES)
    hashes = deque(((m.start(), m.start("answer")) for m in _HASHES.finditer(text)), maxlen=MAX_PHRASE_TRIES)
    found = sorted([*phrases, *hashes], key=lambda marker: marker[1])[-MAX_PHRASE_TRIES:]
    limit = len(text)  # where the phrase after the one being read begins
    for marker_start, answer_start in reversed(found):
        stop = max(answer_start, limit)
        line_end = text.find("\n", answer_start, stop)
        phrase = read_phrase(text[answer_start : stop if line_end < 0 else line_end])
        if phrase is not None:
            return phrase
        limit = marker_start
    return None


def final_answer_phrase(text: str) -> str | None:
    """The value of the last final-answer phrase (:func:`last_phrase`), or None."""
    phrase = last_phrase(text)
    return phrase.value if phrase is not None else None


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
    phrase = last_phrase(text)
    if phrase is not None:
        return Extraction(phrase.value, "final_answer", phrase)
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

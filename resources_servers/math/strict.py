r"""The ``strict`` answer rule: a final answer is a value, not a claim about one.

math-verify (and so NeMo Gym's default, which this server follows) reads ``\boxed{5 = 4}`` as 4 (the
right-hand side of an equation), ``\boxed{4 \approx 5}`` and ``\boxed{\neg 4}`` as 4, and drops the
prose of ``\boxed{4 \text{ is not the answer}}``: against 4, all four score 1. A policy can learn to
hedge that way. With ``strict`` on, an answer that asserts a relation (``=``, ``<``, ``\le``, ``\in``,
``\to``...), a negation (``\neg``, ``\not``), an approximation (``\approx``, ``\sim``...) or carries words
(``\text{...}`` or plain words) scores 0 with ``failure_kind: strict_rejected`` -- unless the expected
answer itself has the same kind of thing (an expected ``y = 2x + 1`` allows an equation, an expected
``\text{(B)}`` allows that text). Two allowances keep ordinary answers right: one variable named on the
left of a single ``=`` (``x = 4``), and words that are units (``4 \text{ cm}``).

Symbols are read as math-verify reads them: the answer is NFKC-normalised first (a fullwidth ``＝`` is
``=``), and a Unicode relation symbol (``≡``, ``≟``, ``≃``, ``⩵``... every symbol of the mathematical
operator and arrow blocks whose name says it relates two things) is a relation. A question mark is
refused too (``4 \text{?}``, which math-verify reads as 4). What no pattern can list, a command or symbol
math-verify cannot parse (``3 \lor 4``, ``3 \foo 4``), is refused by the worker
(:func:`resources_servers.math.worker.unreadable_answer`): math-verify would score the last number found
elsewhere in the response instead.

A final-answer phrase ("The answer is 4.", the opt-in ``boxed_or_final`` rule, this project's own) is held
to more, strict or not: :func:`phrase_violation` pays only a phrase that states one value. Under the same
opt-in rules a box that holds words is read the way a phrase is (:func:`box_violation`).

Runs on the server's event loop: one linear scan per answer.
"""

from __future__ import annotations

import re
import unicodedata

from resources_servers.math.extraction import Phrase, read_phrase

_APPROXIMATION = (
    r"\\(?:approx|thickapprox|approxeq|sim|simeq|thicksim|backsim|cong|doteq|fallingdotseq|risingdotseq"
    r"|propto)(?![A-Za-z])"
)
_NEGATION = r"\\(?:neg|lnot|not)(?![A-Za-z])|¬"
_RELATION = (
    r"\\(?:ne|neq|le|leq|leqq|leqslant|ge|geq|geqq|geqslant|lt|gt|ll|gg|equiv|in|ni|notin|subset|subseteq"
    r"|supset|supseteq|to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|iff|impliedby"
    r"|Leftrightarrow|leftrightarrow|mapsto|perp|parallel|mid|nmid|prec|succ|preceq|succeq)(?![A-Za-z])"
    r"|[<>≤≥≠≈∈∉⊂⊆⊃⊇→⇒⇔]|:=|="
)
_RELATION_NAMES = (
    "EQUAL", "EQUIVALENT", "IDENTICAL", "LESS-THAN", "GREATER-THAN", "TILDE", "ASYMPTOTIC", "PROPORTIONAL",
    "APPROACHES", "DIFFERENCE BETWEEN", "IMAGE OF", "PRECEDES", "SUCCEEDS", "ELEMENT OF", "CONTAINS AS MEMBER",
    "SUBSET", "SUPERSET", "DIVIDES", "PARALLEL", "ARROW", "NOT",
)  # fmt: skip
_OPERATOR_BLOCKS = ((0x2190, 0x2200), (0x2200, 0x2300), (0x27C0, 0x2800), (0x2900, 0x2B00))
"""Arrows, Mathematical Operators, Miscellaneous Mathematical Symbols-A and Supplemental Arrows-A,
Supplemental Arrows-B to Supplemental Mathematical Operators."""
_UNICODE_RELATIONS = "".join(
    sorted(
        chr(code)
        for first, end in _OPERATOR_BLOCKS
        for code in range(first, end)
        if any(word in unicodedata.name(chr(code), "") for word in _RELATION_NAMES)
    )
)
_KINDS = {
    "an approximation": re.compile(_APPROXIMATION),
    "a negation": re.compile(_NEGATION),
    "a relation": re.compile(f"{_RELATION}|[{re.escape(_UNICODE_RELATIONS)}]"),
    "a question mark": re.compile(r"[?¿]"),
}
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|texttt|mbox|hbox|mathrm)\s*\{([^{}]*)\}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[^\W\d_]{2,}")
_PROSE = re.compile(r"(?<![^\W\d_])[^\W\d_]{2,}+(?:\s+[^\W\d_]{2,}+)+")
"""Two or more words in a row outside text commands (one run of letters may be a product: ``2xy``).
A match starts only where a word does and never gives letters back: linear in the answer (without
that, every letter of a long word was a start scanned to the word's end, minutes for 100,000 letters)."""
_ASSIGNMENT = re.compile(r"\s*[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*(?:=(?!=)|\\in(?![A-Za-z]))")
"""``x =``, ``a_1 =``, ``x_{n} =``, ``x \\in`` at the start: the answer names its variable."""
UNITS = frozenset(
    """
    mm cm dm km m meter meters metre metres inch inches ft foot feet yd yard yards mile miles mi
    mg kg g gram grams kilogram kilograms lb lbs pound pounds oz ounce ounces ton tons
    ms sec secs second seconds min mins minute minutes hr hrs hour hours day days week weeks month months
    year years yr yrs l ml liter liters litre litres gal gallon gallons cup cups
    deg degree degrees rad radian radians celsius fahrenheit kelvin
    dollar dollars cent cents euro euros usd
    sq cu square cubic units unit per percent
    km/h mph kmh rpm hz khz mhz ghz mb gb kb tb byte bytes bit bits
    """.split()
)
"""Words an answer may carry without it being prose."""


def _text_words(text: str) -> set[str]:
    """Lower-cased words inside the text commands of ``text``, and plain words that form prose."""
    words = set()
    for inner in _TEXT_COMMAND.findall(text):
        words.update(_WORD.findall(inner))
    outer = _LATEX_COMMAND.sub(" ", _TEXT_COMMAND.sub(" ", text))
    for run in _PROSE.findall(outer):
        words.update(_WORD.findall(run))
    return {w.lower() for w in words}


def _all_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(_LATEX_COMMAND.sub(" ", text))}


def strict_violation(answer: str, expected: str) -> str | None:
    r"""Why ``answer`` is not a plain value under the strict rule (None when it is one): it asserts a
    relation, a negation or an approximation, asks a question, or has words (``\text{...}``, plain words)
    beyond units, where ``expected`` has no such thing itself."""
    answer, expected = unicodedata.normalize("NFKC", answer), unicodedata.normalize("NFKC", expected)
    for kind, pattern in _KINDS.items():
        if pattern.search(expected):
            continue
        body = answer
        if kind == "a relation":
            assignment = _ASSIGNMENT.match(body)
            if assignment is not None:
                body = body[assignment.end() :]
        found = pattern.search(body)
        if found is not None:
            return f"the answer has {kind} ({found.group()!r}), which the expected answer does not"
    extra = _text_words(answer) - _all_words(expected) - UNITS
    if extra:
        shown = ", ".join(sorted(extra)[:5])
        return f"the answer has words the expected answer does not ({shown}): an answer is a value, not prose"
    return None


MAX_PHRASE_TAIL_CHARS = 200
"""Longest text allowed between a phrase's value and the end of its sentence (units, "(forty-two)")."""
_LEADING_WORDS = re.compile(r"(?:[^\W\d_]{2,}+[^\S\n]*)+")
_TAIL_ALLOWED = re.compile(r"[^\W\d_]|[\s\-'’()*%°/²³]")
"""What may follow a phrase's value: words (units, "(forty-two)"), spaces, hyphens, brackets, bold, a
unit's ``/``, ``²`` or ``³``; not a digit, a numeral (``½``), math or a clause's punctuation."""
_TWO_VALUES = re.compile(r"\\(?:pm|mp)(?![A-Za-z])|[±∓]|\+-|-\+|\+/-")
HEDGE_WORDS = frozenset(
    """
    or nor and either neither not no never none except unless but than plus minus times over between
    maybe perhaps probably possibly likely unlikely approximately approx about around roughly nearly almost
    close guess guessing unsure uncertain sure wrong incorrect false wait actually instead otherwise
    alternatively because since if assuming given though although however whereas while which that so
    least most think believe suppose presumably hopefully might could may
    isn isnt aren doesn don wasn cannot couldn wouldn shouldn
    hundred hundreds thousand thousands million millions billion billions trillion trillions dozen dozens
    half halves quarter quarters third thirds fourths fifths sixths sevenths eighths ninths tenths
    hundredths thousandths squared cubed factorial power root recurring repeating negative point
    """.split()
)
"""Words after a phrase's value that hedge it, deny it, change it ("4 hundred", "2 squared") or open a
clause that may state another value."""


def phrase_violation(phrase: Phrase, expected: str) -> str | None:
    r"""Why a final-answer phrase does not state exactly one value (None when it does): it asks a question,
    has words before its value ("not", "either", "probably"), math or a clause after it ("or 5", ", 5",
    "(7 + 5)", "because ..."), a second value inside it (``\pm``), or a value the strict rule refuses
    (:func:`strict_violation`: a relation, a negation, prose). Words the expected answer has are allowed.
    A phrase is this project's extension (NeMo Gym 0.7.0 reads boxes only), so this holds always."""
    value, tail = phrase.value, phrase.tail
    expected_words = _all_words(expected)
    if phrase.question:
        return "the phrase asks a question: a final answer states one value"
    if not value:
        return f"the phrase states no value before {tail.strip()[:80]!r}"
    leading = _LEADING_WORDS.match(value)
    if leading is not None:
        words = {w.lower() for w in _WORD.findall(leading.group())} - expected_words
        if words:
            shown = ", ".join(sorted(words)[:5])
            return f"the phrase has words before its value ({shown}): a final answer states its value first"
    if len(tail) > MAX_PHRASE_TAIL_CHARS:
        return f"the phrase goes on for {len(tail)} characters after its value: a final answer states one value"
    extra = next((c for c in tail if not _TAIL_ALLOWED.match(c) or (c.isnumeric() and c not in "²³")), None)
    if extra is not None:
        return (
            f"the phrase goes on after its value {value[:80]!r} with {tail.strip()[:80]!r}: a final answer "
            "states one value (put any working before it)"
        )
    hedges = (_all_words(tail) & HEDGE_WORDS) - expected_words
    if hedges:
        shown = ", ".join(sorted(hedges)[:5])
        return f"the phrase hedges or qualifies its value ({shown}): a final answer states one value"
    if _TWO_VALUES.search(value) and not _TWO_VALUES.search(expected):
        return f"the phrase's value {value[:80]!r} is two values (plus or minus)"
    return strict_violation(value, expected)


def box_violation(content: str, expected: str) -> str | None:
    r"""Why a box's ``content`` does not state one value, under this project's opt-in rules (None when it
    does, or holds no words beyond units and the expected answer's): such a box is read whole as a
    final-answer phrase is (its ``\text{}`` pieces as plain words, one final full stop dropped) and held to
    :func:`phrase_violation`. Why: math-verify cannot parse ``\boxed{5 Both are 4.}`` and scores the last
    number it finds instead (4), so a box that names two values is paid for the one it names last.
    NeMo Gym 0.7.0's ``boxed`` rule pays it; this is not applied there."""
    if not _all_words(content) - UNITS - _all_words(expected):
        return None
    plain = _TEXT_COMMAND.sub(lambda m: f" {m.group(1)} ", content).strip()
    phrase = read_phrase(plain[:-1] if plain.endswith(".") else plain, sentence=False)
    reason = phrase_violation(phrase, expected) if phrase is not None else None
    if reason is None:
        return None
    return f"the box {content.strip()[:80]!r} is read as a final-answer phrase and refused: {reason}"

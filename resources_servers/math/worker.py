"""What runs inside a verifier worker process: math-verify's parse and verify on one answer pair.

math-verify's own timeouts use ``signal.alarm``, which only works in a process's main thread and has
whole-second granularity, so they are switched off here. Instead each check runs in the worker's main
thread under an interval timer (:func:`signal.setitimer`) that interrupts SymPy after the check's time
budget; the parent process additionally kills the worker if even that does not return control (a
long computation inside C code), see :mod:`resources_servers.math.pool`.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import signal
from functools import lru_cache
from typing import Any

import mpmath
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy import Basic, Expr, Float, MatrixBase, Number

from resources_servers.math.extraction import outer_boxes

MAX_EXTRACTED_CHARS = 1000
TOLERANCE = 1e-30
"""How close two constants must be for :func:`same_number` (absolute, relative below magnitude 1)."""
GUARD_DIGITS = 45
"""Significant digits evaluated beyond a number's magnitude (so errors stay far below the tolerance)."""
MAX_MAGNITUDE_DIGITS = 5000
"""Numbers with more integer digits than this are left to math-verify."""

_GOLD_CONFIG = (LatexExtractionConfig(),)
_PRED_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_TEXT_PRED_CONFIG = (ExprExtractionConfig(), LatexExtractionConfig())
"""NeMo Gym's prediction targets, in its order, for a whole response (``check(..., whole_text=True)``)."""


def _two_stage_latex_parsing() -> None:
    """Parse LaTeX with ANTLR's SLL prediction first, and with its full LL prediction only when SLL
    reports an error: ANTLR guarantees that an SLL parse without a syntax error is the tree LL would
    build, and SLL skips the full-context predictions that cost most of a check (sets and equations
    took 9-12 ms to parse, about 4x less this way). A failed SLL attempt is redone from scratch (a
    fresh lexer and parser) in LL mode, exactly as math-verify would have parsed it."""
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended import latex2sympy2

    converter = latex2sympy2._Latex2Sympy
    if getattr(converter, "_gym_bridge_two_stage", False):
        return
    create_parser = converter.create_parser

    @functools.wraps(create_parser)  # __wrapped__: the LL-only original, for tests
    def two_stage_create_parser(self: Any, latex_str: str) -> Any:
        parser = create_parser(self, latex_str)
        ll_math = type(parser).math

        def math() -> Any:
            parser._interp.predictionMode = PredictionMode.SLL
            try:
                return ll_math(parser)
            except Exception:  # a syntax error under SLL: LL decides (CheckTimeout is not an Exception)
                return ll_math(create_parser(self, latex_str))

        parser.math = math
        return parser

    converter.create_parser = two_stage_create_parser
    converter._gym_bridge_two_stage = True


_two_stage_latex_parsing()


class CheckTimeout(BaseException):
    """Raised by the interval timer; a BaseException so library ``except Exception`` blocks let it pass."""


@lru_cache(maxsize=4096)
def _parse_gold(expected: str) -> tuple[Any, ...]:
    # One task's expected answer is checked once per sample of its group: parse it once.
    return tuple(parse("\\boxed{" + expected + "}", list(_GOLD_CONFIG), parsing_timeout=None))


def check(expected: str, candidate: str, whole_text: bool = False, strict: bool = False) -> dict[str, Any]:
    """math-verify's verdict on ``candidate`` against ``expected`` (both without math delimiters).

    Returns ``{"correct": bool, "extracted": str | None, "failure_kind": str | None}``. As in NeMo Gym,
    the gold answer is parsed as the contents of ``\\boxed{}`` and ``extracted`` is SymPy's rendering of
    the prediction. ``candidate`` is an answer (parsed as the contents of a box), or with ``whole_text``
    a whole response, parsed as NeMo Gym's math_with_judge parses it (every box, phrases, expressions).
    With ``strict``, an answer math-verify cannot read on its own is wrong (``failure_kind:
    unreadable_answer``, ``extracted``: that answer; see :func:`unreadable_answer`).
    """
    if strict:
        unreadable = unreadable_answer(candidate, whole_text)
        if unreadable is not None:
            return {
                "correct": False,
                "extracted": unreadable[:MAX_EXTRACTED_CHARS],
                "failure_kind": "unreadable_answer",
            }
    gold = list(_parse_gold(expected))
    if whole_text:
        pred = parse(candidate, list(_TEXT_PRED_CONFIG), parsing_timeout=None)
    else:
        pred = parse("\\boxed{" + candidate + "}", list(_PRED_CONFIG), parsing_timeout=None)
    # math_metric's verdict as NeMo Gym computes it (float_rounding 6); same_number only settles in
    # milliseconds what math-verify would accept given the time (see its docstring).
    correct = bool(gold and pred) and (
        same_number(gold[0], pred[0]) or bool(verify(gold, pred, timeout_seconds=None))
    )
    failure_kind = None
    if not correct and not _has_math(gold):
        failure_kind = "unparsable_expected_answer"
    elif not correct and not _has_math(pred):
        failure_kind = "unparsable_answer"
    if pred:
        extracted: str | None = str(pred[0])[:MAX_EXTRACTED_CHARS]
    else:
        extracted = None if whole_text else candidate[:MAX_EXTRACTED_CHARS]
    return {"correct": correct, "extracted": extracted, "failure_kind": failure_kind}


def unreadable_answer(candidate: str, whole_text: bool = False) -> str | None:
    r"""The first answer of ``candidate`` (each ``\boxed{}`` of a whole response, else the answer itself)
    that math-verify's LaTeX parser cannot read on its own, or None.

    Why: when it cannot parse a box, math-verify goes on to score the last number it finds anywhere in
    the response, so against 4 ``\boxed{3 \lor 4}``, ``\boxed{3 | 4}``, ``\boxed{3 \foo 4}`` or
    ``\boxed{\approx 4}`` score 1 (the 4 after the symbol it could not read); a phrase's answer the same
    way. No list of symbols can cover every command it does not know; its own parser can. (The strict
    rule's; NeMo Gym scores them 1.)
    """
    answers = outer_boxes(candidate) if whole_text else [candidate]
    for answer in answers:
        if not _has_math(parse("\\boxed{" + answer + "}", list(_GOLD_CONFIG), parsing_timeout=None)):
            return answer
    return None


def _has_math(parsed: list[Any]) -> bool:
    """Whether math-verify's parse produced an expression (it falls back to the raw string otherwise)."""
    return any(isinstance(item, Basic | MatrixBase) for item in parsed)


def same_number(a: Any, b: Any) -> bool:
    """True when two constant expressions are equal to within 1e-30 (relative below magnitude 1).

    Why: math-verify's numeric test is ``(a - b).evalf(15) == 0``, which cannot tell equal huge numbers
    apart from unequal ones (two forms of ``(2+sqrt 3)^2016`` are ~1e1152), after which it falls back to
    ``simplify``, which can take tens of seconds on such expressions. Evaluating both sides with enough
    digits for their magnitude settles them in milliseconds. It only ever confirms equality; anything
    else is left to math-verify's own rules (e.g. its 6-decimal rounding of floats).

    Never looser than math-verify: a side that is a plain number (an integer, rational or float, such as
    ``4 + 10^{-31}``, which SymPy folds into one rational) is left to math-verify, which compares those
    exactly (or by its float rounding), in microseconds; between two other constants math-verify itself
    accepts a difference that ``evalf(15, chop=True)`` rounds to 0 (about 1e-15), far above 1e-30.
    """
    try:
        if not (isinstance(a, Expr) and isinstance(b, Expr) and a.is_number and b.is_number):
            return False
        if isinstance(a, Number) or isinstance(b, Number):
            return False
        rough_a, rough_b = a.evalf(15), b.evalf(15)
        if not (rough_a.is_finite and rough_b.is_finite):
            return False
        scale = max(abs(rough_a), abs(rough_b))
        if scale == 0:
            return True
        magnitude = max(0, int(mpmath.log10(mpmath.mpf(abs(Float(scale))._mpf_))) + 1)
        if magnitude > MAX_MAGNITUDE_DIGITS:
            return False
        digits = magnitude + GUARD_DIGITS
        difference = abs(a.evalf(digits) - b.evalf(digits))
        return bool(difference <= TOLERANCE * min(1, scale))
    except Exception:  # expressions evalf cannot reduce to numbers
        return False


# --------------------------------------------------------------------------- the worker process

_armed = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _armed:
        raise CheckTimeout


def _checked(
    expected: str, candidate: str, timeout_s: float, whole_text: bool = False, strict: bool = False
) -> dict[str, Any]:
    """Run :func:`check` under the interval timer; failures become results, never exceptions."""
    global _armed
    try:
        try:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            return {"status": "ok", **check(expected, candidate, whole_text, strict)}
        finally:
            _armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CheckTimeout:
        return {"status": "timeout"}
    except MemoryError:
        return {"status": "error", "detail": "out of memory (worker memory limit)"}
    except Exception as e:  # a parse or SymPy bug must not take the worker down
        return {"status": "error", "detail": f"{type(e).__name__}: {e}"[:500]}


def _limit_memory(memory_mb: int | None) -> None:
    if not memory_mb:
        return
    import resource

    limit = memory_mb * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass  # a platform without RLIMIT_AS: the parent's kill still bounds the time


def _warm() -> None:
    """One check at import, so that SymPy's and the LaTeX parser's caches are built once in the fork
    server (which imports this module) and every worker forked from it starts warm: a fresh worker then
    costs milliseconds, which is what lets the pool replace a slow check's worker at once."""
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    try:
        check("1", "\\frac{2}{2}")
        check("1", "\\boxed{\\frac{2}{2}}", whole_text=True)
    except Exception:  # noqa: BLE001  (a warm-up only: the worker's own start check reports problems)
        pass
    # Objects alive now are never collected: a forked worker's garbage collector then leaves them (and
    # the memory pages it shares with the fork server) untouched instead of copying them all.
    gc.freeze()


_warm()


def worker_main(conn: Any, memory_mb: int | None) -> None:
    """Serve checks over ``conn`` until it closes: receive ``(task_id, expected, candidate, timeout_s,
    whole_text, strict)``,
    send back ``(task_id, result)``. Sends ``("ready", pid)`` once warm."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server; it shuts workers down
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    _limit_memory(memory_mb)
    _checked("1", "\\frac{2}{2}", 30.0)  # warm SymPy's and the LaTeX parser's caches
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, expected, candidate, timeout_s, whole_text, strict = message
        result = _checked(expected, candidate, timeout_s, whole_text, strict)
        try:
            conn.send((task_id, result))
        except OSError:  # the server stopped this worker (or shut down) meanwhile
            return

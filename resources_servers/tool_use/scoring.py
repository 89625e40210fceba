"""How a tool-use rollout is scored: by outcome (final state) or by the calls' arguments.

* :func:`state_diff` lists where a final state differs from the expected one, path by path.
* :func:`compare_calls` matches the model's function calls against expected calls (order-free, so
  parallel calls count however they were emitted) and scores them ``strict`` (all and only the expected
  calls), ``fraction`` (matched / max(expected, made)) or ``f1`` (precision/recall over calls), with a
  reason for each mismatch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CallScore", "Call", "calls_from_output", "compare_calls", "normalise_arguments", "state_diff"]

MatchMode = Literal["strict", "fraction", "f1"]
_MAX_DIFFS = 20


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b  # exact, however large
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        try:
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        except OverflowError:  # an int too large for a float equals no float
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def state_diff(expected: Any, actual: Any, path: str = "state") -> list[str]:
    """Human-readable differences between two JSON states (empty when they agree)."""
    diffs: list[str] = []

    def walk(e: Any, a: Any, where: str) -> None:
        if len(diffs) >= _MAX_DIFFS:
            return
        if isinstance(e, dict) and isinstance(a, dict):
            for key in sorted(set(e) | set(a), key=str):
                sub = f"{where}.{key}"
                if key not in a:
                    diffs.append(f"{sub}: missing (expected {_show(e[key])})")
                elif key not in e:
                    diffs.append(f"{sub}: unexpected (got {_show(a[key])})")
                else:
                    walk(e[key], a[key], sub)
        elif not _same(e, a):
            diffs.append(f"{where}: expected {_show(e)}, got {_show(a)}")

    walk(expected, actual, path)
    return diffs


@dataclass
class Call:
    name: str
    arguments: dict[str, Any] | None
    """None when the model's arguments were not a JSON object."""
    raw: str = ""

    def show(self) -> str:
        args = (
            self.raw
            if self.arguments is None
            else ", ".join(f"{k}={v!r}" for k, v in sorted(self.arguments.items()))
        )
        return f"{self.name}({args})"


MAX_ARGUMENT_DEPTH = 64
"""Arguments nested deeper than this are unusable (scored as malformed): the comparisons recurse."""


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_ARGUMENT_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def normalise_arguments(arguments: Any) -> dict[str, Any] | None:
    """Arguments as a dict (JSON text parsed), with null-valued keys dropped (an omitted optional);
    None when they are not a JSON object or are nested past :data:`MAX_ARGUMENT_DEPTH`."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # a model may write JSON too deep for the parser
            return None
    if not isinstance(arguments, dict) or _depth(arguments) > MAX_ARGUMENT_DEPTH:
        return None
    return {k: v for k, v in arguments.items() if v is not None}


def calls_from_output(output: list[Any]) -> list[Call]:
    """The model's function calls, in order, from a response's ``output`` items."""
    calls = []
    for item in output:
        d = item if isinstance(item, dict) else item.model_dump()
        if d.get("type") == "function_call":
            raw = d.get("arguments", "")
            calls.append(
                Call(
                    name=str(d.get("name")),
                    arguments=normalise_arguments(raw),
                    raw=raw if isinstance(raw, str) else "",
                )
            )
    return calls


@dataclass
class CallScore:
    reward: float
    matched: int
    expected: int
    made: int
    reasons: list[str] = field(default_factory=list)


def _argument_mismatch(expected: Call, made: Call) -> str:
    if made.arguments is None:
        return f"{expected.name}: arguments are not a JSON object ({made.raw[:80]!r})"
    parts = []
    assert expected.arguments is not None
    for key in sorted(set(expected.arguments) | set(made.arguments)):
        if key not in made.arguments:
            parts.append(f"{key} missing (expected {expected.arguments[key]!r})")
        elif key not in expected.arguments:
            parts.append(f"{key} not expected (got {made.arguments[key]!r})")
        elif not _same(expected.arguments[key], made.arguments[key]):
            parts.append(f"{key} expected {expected.arguments[key]!r}, got {made.arguments[key]!r}")
    return f"{expected.name}: " + "; ".join(parts)


def compare_calls(made: list[Call], expected: list[Call], mode: MatchMode = "strict") -> CallScore:
    """Score the calls made against the expected ones (see the module docstring)."""
    unmatched_made = list(range(len(made)))
    unmatched_expected = []
    for exp in expected:
        hit = next(
            (
                i
                for i in unmatched_made
                if made[i].name == exp.name
                and made[i].arguments is not None
                and _same(made[i].arguments, exp.arguments)
            ),
            None,
        )
        if hit is None:
            unmatched_expected.append(exp)
        else:
            unmatched_made.remove(hit)
    matched = len(expected) - len(unmatched_expected)
    reasons = []
    for exp in unmatched_expected:
        near = next((i for i in unmatched_made if made[i].name == exp.name), None)
        if near is None:
            reasons.append(f"missing call {exp.show()}")
        else:
            unmatched_made.remove(near)
            reasons.append(_argument_mismatch(exp, made[near]))
    reasons += [f"unexpected call {made[i].show()}" for i in unmatched_made]
    if not expected and not made:
        reward = 1.0
    elif mode == "strict":
        reward = float(matched == len(expected) == len(made))
    elif mode == "fraction":
        reward = matched / max(len(expected), len(made), 1)
    else:
        precision = matched / len(made) if made else 0.0
        recall = matched / len(expected) if expected else 0.0
        reward = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return CallScore(reward=reward, matched=matched, expected=len(expected), made=len(made), reasons=reasons)

"""How a tool-use rollout is scored: by outcome (final state) or by the calls' arguments.

* :func:`state_diff` lists where a final state differs from the expected one, path by path.
* :func:`compare_calls` matches the model's function calls against expected calls (order-free, so
  parallel calls count however they were emitted) and scores them ``strict`` (all and only the expected
  calls), ``fraction`` (matched / max(expected, made)) or ``f1`` (precision/recall over calls), with a
  reason for each mismatch. Both sides are first validated with the tool's own request model, as the
  tool's route validates its body: a call the tool would refuse (``quantity: 2.0000000001``, an unknown
  key even when null, an unknown tool) never matches, and calls the tool reads alike match
  (``quantity: 2.0`` is ``2``; an optional key given as null is the key left out).

Extra reads are free. A made call to a tool that never changes the store (``ToolSpec.changes_state`` in
:mod:`~resources_servers.tool_use.store`) and that no expected call uses is reported in
:attr:`CallScore.extra_reads` and left out of the count in every mode: it cannot change the outcome, and the
shipped tasks' system prompt asks for such look-ups (``list_products`` first, "their ids are needed by the
other tools"), so charging for them scored a prompt-following ``add_to_cart`` task 0 and taught the policy to
ignore its instructions. Where the expected calls are themselves reads (``get_product`` for a look-up,
``list_products(category, max_price)`` for a filter), a call to that tool is free only when it is *broader* than an
expected one: each argument it gives is the expected call's value or left at the tool's default, so the bare
``list_products()`` the prompt asks for, ``list_products(category)`` before the filtered call, or a repeat of the
expected call. Such a call holds no guess the expected call does not, so it cannot fish; every other call to that
tool counts, so spraying it over ids, categories or prices still costs. Calls to state-changing tools and to
unknown tools count as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from gym_bridge.serving.answers import format_validation_errors
from resources_servers.tool_use.store import TOOLS

__all__ = [
    "STORE_READS",
    "STORE_TOOLS",
    "CallScore",
    "Call",
    "calls_from_output",
    "compare_calls",
    "normalise_arguments",
    "parse_arguments",
    "state_diff",
]

MatchMode = Literal["strict", "fraction", "f1"]
_MAX_DIFFS = 20
STORE_TOOLS: dict[str, type[BaseModel]] = {name: spec.args for name, spec in TOOLS.items()}
"""Each store tool's request model: what :func:`compare_calls` validates calls with by default."""
STORE_READS: frozenset[str] = frozenset(name for name, spec in TOOLS.items() if not spec.changes_state)
"""The store tools that never change it: free beside the expected calls when no expected call uses them."""
_MAX_SHOWN = 200
_MAX_LISTED = 50


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
    """None when the model's arguments were not a JSON object (null-valued keys dropped, for display)."""
    raw: str = ""
    given: dict[str, Any] | None = None
    """The JSON object as the model sent it, null-valued keys kept (what the tool's route would validate);
    None: ``arguments`` is it."""

    def show(self) -> str:
        args = (
            self.raw
            if self.arguments is None
            else ", ".join(f"{k}={v!r}" for k, v in sorted(self.arguments.items()))
        )
        text = f"{self.name}({args})"
        return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 4] + "...)"


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


def parse_arguments(arguments: Any) -> dict[str, Any] | None:
    """Arguments as a dict (JSON text parsed), as sent; None when they are not a JSON object or are nested
    past :data:`MAX_ARGUMENT_DEPTH`. Blank text is ``{}``: the agent loop calls the tool with ``{}`` for it
    (:func:`gym_bridge.rollout.agent._call_tool`), so the check reads the call the tool answered."""
    if isinstance(arguments, str) and not arguments.strip():
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # a model may write JSON too deep for the parser
            return None
    if not isinstance(arguments, dict) or _depth(arguments) > MAX_ARGUMENT_DEPTH:
        return None
    return arguments


def normalise_arguments(arguments: Any) -> dict[str, Any] | None:
    """:func:`parse_arguments` with null-valued keys dropped (an omitted optional)."""
    parsed = parse_arguments(arguments)
    return None if parsed is None else {k: v for k, v in parsed.items() if v is not None}


def calls_from_output(output: list[Any]) -> list[Call]:
    """The model's function calls, in order, from a response's ``output`` items."""
    calls = []
    for item in output:
        d = item if isinstance(item, dict) else item.model_dump()
        if d.get("type") == "function_call":
            raw = d.get("arguments", "")
            given = parse_arguments(raw)
            calls.append(
                Call(
                    name=str(d.get("name")),
                    arguments=None if given is None else {k: v for k, v in given.items() if v is not None},
                    raw=raw if isinstance(raw, str) else "",
                    given=given,
                )
            )
    return calls


@dataclass
class CallScore:
    reward: float
    matched: int
    expected: int
    made: int
    """Every call made, the free extra reads included."""
    reasons: list[str] = field(default_factory=list)
    extra_reads: list[str] = field(default_factory=list)
    """Calls to a read no expected call uses: reported, not counted (the module docstring)."""


def _validated(call: Call, tools: Mapping[str, type[BaseModel]]) -> tuple[dict[str, Any] | None, str | None]:
    """``(arguments as the tool reads them, None)``, or ``(None, why the tool would refuse the call)``."""
    model = tools.get(call.name)
    if model is None:
        return None, f"no tool is named {call.name!r}"
    given = call.given if call.given is not None else call.arguments
    if given is None:
        return None, f"arguments are not a JSON object ({call.raw[:80]!r})"
    try:
        return model.model_validate(given).model_dump(), None
    except ValidationError as e:
        return (
            None,
            f"the tool refuses these arguments ({format_validation_errors(e.errors(include_url=False))})",
        )
    except RecursionError:
        return None, "arguments nested too deeply"


def _broader(model: type[BaseModel], got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether ``got`` (validated) gives each argument as ``want`` does or leaves it at the tool's default."""
    fields = model.model_fields
    return all(
        k in fields
        and (got[k] == want.get(k) or (not fields[k].is_required() and got[k] == fields[k].get_default()))
        for k in got
    )


def _argument_mismatch(name: str, expected: dict[str, Any], made: dict[str, Any]) -> str:
    parts = [
        f"{key} expected {expected.get(key)!r}, got {made.get(key)!r}"
        for key in sorted(set(expected) | set(made))
        if expected.get(key) != made.get(key)
    ]  # fmt: skip
    return f"{name}: " + "; ".join(parts)


def compare_calls(
    made: list[Call],
    expected: list[Call],
    mode: MatchMode = "strict",
    tools: Mapping[str, type[BaseModel]] | None = None,
    reads: Collection[str] | None = None,
) -> CallScore:
    """Score the calls made against the expected ones (see the module docstring); ``tools``: each tool's
    request model (the store's by default); ``reads``: the tools that never change state (the store's by
    default; none when ``tools`` is given without them)."""
    if reads is None:
        reads = STORE_READS if tools is None else frozenset()
    tools = STORE_TOOLS if tools is None else tools
    made_args = [_validated(call, tools) for call in made]
    expected_args = [_validated(call, tools) for call in expected]
    unmatched_made = list(range(len(made)))
    unmatched_expected = []
    for j, exp in enumerate(expected):
        want = expected_args[j][0]
        hit = None
        if want is not None:
            hit = next(
                (i for i in unmatched_made if made[i].name == exp.name and made_args[i][0] == want), None
            )
        if hit is None:
            unmatched_expected.append(j)
        else:
            unmatched_made.remove(hit)
    matched = len(expected) - len(unmatched_expected)

    def broader(i: int) -> bool:
        """Whether made call ``i`` is a read that asks no more than an expected call of its tool (the module
        docstring): free, and never taken as an expected call's near miss."""
        got = made_args[i][0]
        return (
            got is not None
            and made[i].name in reads
            and any(
                exp.name == made[i].name and want is not None and _broader(tools[exp.name], got, want)
                for exp, (want, _) in zip(expected, expected_args, strict=True)
            )
        )

    reasons = []
    for j in unmatched_expected:
        exp, (want, refused) = expected[j], expected_args[j]
        if refused is not None:
            reasons.append(f"expected call {exp.show()} can never match: {refused} (the task is wrong)")
            continue
        near = next((i for i in unmatched_made if made[i].name == exp.name and not broader(i)), None)
        if near is None:
            reasons.append(f"missing call {exp.show()}")
            continue
        unmatched_made.remove(near)
        got, why = made_args[near]
        assert want is not None
        reasons.append(f"{exp.name}: {why}" if got is None else _argument_mismatch(exp.name, want, got))
    expected_tools = {exp.name for exp in expected}
    free = {
        i
        for i in unmatched_made
        if made[i].name in reads and (made[i].name not in expected_tools or broader(i))
    }
    reasons += [f"unexpected call {made[i].show()}" for i in unmatched_made if i not in free]
    counted = len(made) - len(free)
    if not expected and not counted:
        reward = 1.0
    elif mode == "strict":
        reward = float(matched == len(expected) == counted)
    elif mode == "fraction":
        reward = matched / max(len(expected), counted, 1)
    else:
        precision = matched / counted if counted else 0.0
        recall = matched / len(expected) if expected else 0.0
        reward = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return CallScore(
        reward=reward,
        matched=matched,
        expected=len(expected),
        made=len(made),
        reasons=_capped(reasons),
        extra_reads=_capped([made[i].show() for i in sorted(free)]),
    )


def _capped(lines: list[str]) -> list[str]:
    """The first :data:`_MAX_LISTED` lines and a count of the rest: a transcript of 100,000 calls would be
    answered with as many reasons (the request's size several times over)."""
    if len(lines) <= _MAX_LISTED:
        return lines
    return [*lines[:_MAX_LISTED], f"... and {len(lines) - _MAX_LISTED} more"]

"""Drive the in-sandbox harness for one task: start it, feed tests one by one, grade each on the host.

One sandbox per task keeps the start-up cost (tens of ms) per task rather than per test; tests run one
after another in it and, unless full results are asked for, stop at the first failure.
"""

from __future__ import annotations

import json
import marshal
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from gym_bridge.sandbox import RO_DIR, Sandbox, SandboxLimits
from resources_servers.code.grading import call_output_matches, stdout_matches

__all__ = ["CodeLimits", "CodeRunResult", "TestCase", "TestOutcome", "run_code_tests"]

HARNESS = Path(__file__).with_name("harness.py")
PROCTREE = Path(__file__).with_name("proctree.py")

_KIND_OF_STATUS = {
    "error": "runtime_error",
    "timeout": "timeout",
    "memory": "memory_limit",
    "output_limit": "output_limit",
}
_OUTCOME_OF_KIND = {
    "wrong_answer": "fail",
    "timeout": "timeout",
    "runtime_error": "error",
    "memory_limit": "error",
    "output_limit": "error",
}
_PREVIEW = 200


class CodeLimits(BaseModel):
    """Per-test and per-task limits of code verification."""

    timeout_s: float = Field(4.0, gt=0)
    """CPU time per test."""
    wall_timeout_s: float | None = Field(None, gt=0)
    """Wall clock per test; default 2 x timeout_s + 1, so that a loaded machine does not fail correct
    programs while sleepers and stuck children are still stopped."""
    task_timeout_s: float = Field(120.0, gt=0)
    """Wall clock for all of one task's tests, sandbox start included."""
    memory_mb: int = Field(512, ge=64)
    """Address space per process. Without cgroups a sandbox's worst case is memory_mb x max_procs."""
    max_procs: int = Field(16, ge=4)
    output_bytes: int = Field(1 << 20, ge=1024)
    """Stdout (or return value) one test may produce."""


class TestCase(BaseModel):
    input: Any
    expected: Any


class TestOutcome(BaseModel):
    index: int
    outcome: Literal["pass", "fail", "timeout", "error"]
    kind: str | None = None
    """Why it did not pass: wrong_answer, runtime_error, timeout, memory_limit or output_limit."""
    wall_s: float | None = None
    cpu_s: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    exception: str | None = None
    detail: str | None = None
    stderr_tail: str | None = None


class CodeRunResult(BaseModel):
    tests: list[TestOutcome]
    num_tests: int
    num_passed: int
    failure_kind: str | None = None
    failure_reason: str | None = None
    stderr_tail: str = ""

    @property
    def all_passed(self) -> bool:
        return self.failure_kind is None and self.num_passed == self.num_tests


def _preview(value: Any) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except (ValueError, RecursionError):  # an int too long for str(), nesting too deep
        text = f"<{type(value).__name__} too large to show>"
    return repr(text[:_PREVIEW] + ("..." if len(text) > _PREVIEW else ""))


def _grade(index: int, msg: dict[str, Any], case: TestCase, fn_name: str | None) -> TestOutcome:
    base = {
        "index": index,
        "wall_s": msg.get("wall_s"),
        "cpu_s": msg.get("cpu_s"),
        "exit_code": msg.get("exit_code"),
        "signal": msg.get("signal"),
        "exception": msg.get("exception"),
    }
    status = msg.get("status")
    if status != "ok":
        kind = _KIND_OF_STATUS.get(str(status), "runtime_error")
        detail = {
            "timeout": "time limit exceeded",
            "memory_limit": "memory limit exceeded",
            "output_limit": "output limit exceeded",
        }.get(kind) or (
            f"{msg.get('exception')}"
            if msg.get("exception")
            else f"exit code {msg.get('exit_code')}, signal {msg.get('signal')}"
        )
        return TestOutcome(
            **base,
            outcome=_OUTCOME_OF_KIND[kind],
            kind=kind,
            detail=detail,
            stderr_tail=msg.get("stderr_tail") or None,
        )
    if fn_name is None:
        got = msg.get("stdout", "")
        expected = case.expected if isinstance(case.expected, str) else "\n".join(map(str, case.expected))
        ok = stdout_matches(got, expected)
    else:
        got, expected = _return_value(msg.get("result")), case.expected
        try:
            ok = call_output_matches(got, expected)
        except RecursionError:  # nested deeper than the comparison can follow: not the expected value
            ok = False
    if ok:
        return TestOutcome(**base, outcome="pass")
    return TestOutcome(
        **base,
        outcome="fail",
        kind="wrong_answer",
        detail=f"expected {_preview(expected)}, got {_preview(got)}",
        stderr_tail=msg.get("stderr_tail") or None,
    )


def _return_value(text: Any) -> Any:
    """The program's return value from its JSON text; text that is not bounded JSON stays text.

    The program wrote this text: past Python's nesting limit (``RecursionError``) or with an integer too
    long to parse it is kept as the raw string, which equals no expected value but itself.
    """
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _frame(obj: Any) -> bytes:
    """A message for the harness: marshal data behind its 4-byte length."""
    body = marshal.dumps(obj, 4)
    return len(body).to_bytes(4, "big") + body


def _plain(value: Any) -> Any:
    """Test data as the marshal-able plain types (JSON gives nothing else, but callers may pass tuples)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def test_message(case_input: Any, fn_name: str | None) -> dict[str, Any]:
    """What the harness gets for one test: stdin text, or the call's arguments.

    A list is the argument list (APPS); a string holds one JSON value per line (LiveCodeBench); a string
    that is not JSON is passed as the single argument.
    """
    if fn_name is None:
        text = case_input if isinstance(case_input, str) else "\n".join(map(str, case_input))
        return {"stdin": text}
    if isinstance(case_input, list):
        return {"args": _plain(case_input)}
    if isinstance(case_input, str):
        try:
            return {"args": _plain([json.loads(line) for line in case_input.split("\n") if line.strip()])}
        except ValueError:
            return {"args": [case_input]}
    return {"args": [_plain(case_input)]}


def _sandbox_limits(limits: CodeLimits, tests: list[TestCase]) -> SandboxLimits:
    biggest_input = max((len(json.dumps(t.input)) for t in tests), default=0)
    file_mb = max(16, math.ceil(max(biggest_input, limits.output_bytes) / (1 << 20)) + 1)
    return SandboxLimits(
        wall_s=limits.task_timeout_s,
        cpu_s=max(1, math.ceil(limits.task_timeout_s)),
        memory_mb=limits.memory_mb,
        max_procs=limits.max_procs,
        file_size_mb=file_mb,
        tmp_size_mb=64 + 3 * file_mb,
        output_bytes=8 * limits.output_bytes + (1 << 20),
    )


async def run_code_tests(
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    fn_name: str | None = None,
    limits: CodeLimits | None = None,
    stop_at_first_failure: bool = True,
) -> CodeRunResult:
    """Run ``code`` against ``tests`` in one sandbox and grade every answer on the host."""
    limits = limits or CodeLimits()
    outcomes: list[TestOutcome] = []

    def finish(kind: str | None = None, reason: str | None = None, stderr: str = "") -> CodeRunResult:
        failed = next((o for o in outcomes if o.outcome != "pass"), None)
        if kind is None and failed is not None:
            kind = failed.kind
            reason = f"test {failed.index + 1} of {len(tests)}: {failed.kind}: {failed.detail}"
            stderr = stderr or failed.stderr_tail or ""
        return CodeRunResult(
            tests=outcomes,
            num_tests=len(tests),
            num_passed=sum(o.outcome == "pass" for o in outcomes),
            failure_kind=kind,
            failure_reason=reason,
            stderr_tail=stderr[-2000:],
        )

    sandbox_limits = _sandbox_limits(limits, tests)
    command = [sandbox.python, "-I", "-S", f"{RO_DIR}/harness.py"]
    wall_timeout = limits.wall_timeout_s or 2 * limits.timeout_s + 1
    config = {
        "code": code,
        "fn_name": fn_name,
        "timeout_s": limits.timeout_s,
        "wall_timeout_s": wall_timeout,
        "output_bytes": limits.output_bytes,
    }
    async with sandbox.open(
        command, sandbox_limits, ro_files={"harness.py": str(HARNESS), "proctree.py": str(PROCTREE)}
    ) as proc:
        await proc.send(_frame(config))
        try:
            line = await proc.readline(timeout=min(60.0, limits.task_timeout_s))
        except TimeoutError:
            proc.kill()
            line = None
        hello = _parse(line)
        if hello is None or hello.get("event") not in ("ready", "compile_error"):
            return finish("sandbox_error", "the sandboxed harness did not start", proc.stderr_tail)
        if hello["event"] == "compile_error":
            return finish("syntax_error", str(hello.get("error", "")))
        for index, case in enumerate(tests):
            sent = await proc.send(_frame(test_message(case.input, fn_name)))
            try:
                # the harness allows a test up to 2 x wall_timeout when it waited for a CPU
                line = await proc.readline(timeout=2 * wall_timeout + 5.0) if sent else None
            except TimeoutError:
                proc.kill()
                outcomes.append(
                    TestOutcome(index=index, outcome="timeout", kind="timeout", detail="no result in time")
                )
                break
            msg = _parse(line)
            if msg is None or msg.get("event") != "result":
                outcomes.append(_harness_lost(index, proc.timed_out, proc.output_exceeded, proc.returncode))
                return finish(stderr=proc.stderr_tail)
            outcome = _grade(index, msg, case, fn_name)
            outcomes.append(outcome)
            if outcome.outcome != "pass" and stop_at_first_failure:
                break
    return finish()


def _parse(line: bytes | None) -> dict[str, Any] | None:
    if line is None:
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _harness_lost(index: int, timed_out: bool, output_exceeded: bool, returncode: int | None) -> TestOutcome:
    """The harness vanished mid-test: the task's time ran out, output overflowed, or the program killed it."""
    if timed_out:
        return TestOutcome(index=index, outcome="timeout", kind="timeout", detail="task time limit exceeded")
    if output_exceeded:
        return TestOutcome(index=index, outcome="error", kind="output_limit", detail="output limit exceeded")
    return TestOutcome(
        index=index,
        outcome="error",
        kind="runtime_error",
        detail=f"the sandbox's harness ended during the test (exit status {returncode}); "
        "the program may have killed its parent",
    )

"""The code-execution environment: run the model's program against the task's unit tests, sandboxed.

Task rows use NeMo Gym's code format::

    {"responses_create_params": {...},
     "verifier_metadata": {"unit_tests": {"inputs": [...], "outputs": [...], "fn_name": null}}}

Without ``fn_name`` each test feeds ``inputs[i]`` on stdin and compares stdout with ``outputs[i]``;
with it, ``fn_name`` (a top-level function or a ``Solution`` method) is called with the parsed inputs
and its return value compared. Reward 1.0 when every test passes (or, in ``fraction`` mode, the share
that passes). The answer reports per-test outcomes, a ``failure_kind`` (no_code, syntax_error,
wrong_answer, runtime_error, timeout, memory_limit, output_limit, sandbox_error) and a stderr tail.

Requests may set ``full_results: true`` (run every test even after a failure) and ``reward_mode``
(``all`` or ``fraction``) beside the task fields; the server's config gives the defaults.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_bridge.records.schema import (
    VERDICT_FIELDS,
    TaskRow,
    VerifyRequest,
    VerifyResponse,
    assistant_text,
    dump,
)
from gym_bridge.sandbox import Sandbox
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session
from resources_servers.code.grading import extract_code
from resources_servers.code.runner import CodeLimits, CodeRunResult, TestCase, run_code_tests

__all__ = ["CodeConfig", "CodeServer", "CodeVerifyRequest", "UnitTests"]

DEFAULT_CONFIG = Path(__file__).with_name("config.yaml")


class CodeConfig(CodeLimits):
    """Settings of the code server (``config.yaml`` next to this file holds the defaults)."""

    model_config = ConfigDict(extra="forbid")

    sandbox: Literal["auto", "bwrap", "unshare"] = "auto"
    max_concurrency: int | None = Field(None, ge=1)
    """Tasks verified at once (each in its own sandbox); default: one per CPU core."""
    full_results: bool = False
    """Run every test even after one fails (fraction mode always does)."""
    reward_mode: Literal["all", "fraction"] = "all"

    @classmethod
    def from_yaml(cls, path: str | Path) -> CodeConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data.get("code", data))

    @property
    def limits(self) -> CodeLimits:
        return CodeLimits(**{k: getattr(self, k) for k in CodeLimits.model_fields})


class UnitTests(BaseModel):
    model_config = ConfigDict(extra="allow")

    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None = None

    @model_validator(mode="after")
    def _same_length(self) -> UnitTests:
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
        if not self.inputs:
            raise ValueError("no tests")
        if self.fn_name is None:  # stdin/stdout tests: text, or a list of lines
            for field, values in (("inputs", self.inputs), ("outputs", self.outputs)):
                for i, value in enumerate(values):
                    lines = value if isinstance(value, list) else [value]
                    if not all(isinstance(line, str) for line in lines):
                        raise ValueError(
                            f"{field}[{i}] must be text (or a list of lines) for a stdin/stdout test, "
                            f"got {type(value).__name__}; set fn_name for function-call tests"
                        )
        return self


class CodeVerifierMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    unit_tests: UnitTests


class CodeVerifyRequest(VerifyRequest):
    verifier_metadata: CodeVerifierMetadata
    full_results: bool | None = None
    reward_mode: Literal["all", "fraction"] | None = None


class CodeSeedRequest(TaskRow):
    """``/seed_session`` body: the task row, checked as ``/verify`` checks it (the task fields optional)."""

    verifier_metadata: CodeVerifierMetadata | None = None


class CodeServer(ResourcesServer):
    name = "code"
    reverify_mode = "stateless"  # /verify reads only the stored record
    verify_request_model = CodeVerifyRequest
    seed_request_model = CodeSeedRequest
    verdict_keys = VERDICT_FIELDS | {"extracted_code", "num_tests", "num_passed", "timeouts", "tests", "stderr_tail"}
    """The verdict and this server's diagnostics (:func:`_answer`): never echoed from the request."""
    workers_setting = "max_concurrency"
    """The config field a trainer's ``env.<name>.num_workers`` sets (sandboxes at once)."""

    def __init__(self, settings: ServerSettings | None = None, config: CodeConfig | None = None) -> None:
        super().__init__(settings)
        if config is None:
            config = CodeConfig.from_yaml(DEFAULT_CONFIG) if DEFAULT_CONFIG.exists() else CodeConfig()
        self.config = config
        self.sandbox = Sandbox(config.sandbox, max_concurrency=config.max_concurrency)

    async def startup(self) -> None:
        """Probe the sandbox before the first request and say which one is in force (stderr, always shown)."""
        await asyncio.to_thread(self.sandbox.start)
        print(f"code server: sandbox {self.sandbox.description}", file=sys.stderr, flush=True)
        worst_mb = self.config.memory_mb * self.config.max_procs * self.sandbox.max_concurrency
        total_mb = _total_memory_mb()
        if total_mb and worst_mb > 0.6 * total_mb:
            print(
                f"code server: warning: hostile programs could use up to {worst_mb} MB "
                f"(memory_mb x max_procs x concurrent sandboxes) of {total_mb} MB; lower them",
                file=sys.stderr,
                flush=True,
            )

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        assert isinstance(body, CodeVerifyRequest)
        tests_spec = body.verifier_metadata.unit_tests
        reward_mode = body.reward_mode or self.config.reward_mode
        full = bool(body.full_results if body.full_results is not None else self.config.full_results)
        code = extract_code(assistant_text(body.response.output, sep="\n"))
        if code is None:
            return _answer(
                body, 0.0, failure_kind="no_code", failure_reason="no fenced python code block in the answer"
            )
        tests = [
            TestCase(input=i, expected=o) for i, o in zip(tests_spec.inputs, tests_spec.outputs, strict=True)
        ]
        run = await run_code_tests(
            self.sandbox,
            code,
            tests,
            fn_name=tests_spec.fn_name,
            limits=self.config.limits,
            stop_at_first_failure=not (full or reward_mode == "fraction"),
        )
        fraction = run.num_passed / run.num_tests
        reward = fraction if reward_mode == "fraction" else float(run.all_passed)
        return _answer(
            body,
            reward,
            extracted_code=code,
            run=run,
            reward_components={"tests_passed_fraction": fraction}
            if len(run.tests) == run.num_tests
            else None,
        )


def _total_memory_mb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return None


def _answer(
    body: VerifyRequest,
    reward: float,
    *,
    failure_kind: str | None = None,
    failure_reason: str | None = None,
    extracted_code: str | None = None,
    run: CodeRunResult | None = None,
    reward_components: dict[str, float] | None = None,
) -> VerifyResponse:
    extras: dict[str, Any] = {"extracted_code": extracted_code}
    if run is not None:
        failure_kind, failure_reason = run.failure_kind, run.failure_reason
        extras.update(
            num_tests=run.num_tests,
            num_passed=run.num_passed,
            timeouts=sum(t.outcome == "timeout" for t in run.tests),
            tests=[t.model_dump(exclude_none=True) for t in run.tests],
            stderr_tail=run.stderr_tail,
        )
    fields: dict[str, Any] = {**dump(body), **extras, "reward": reward}
    if failure_kind is not None:
        fields["failure_kind"] = failure_kind
    if failure_reason is not None:
        fields["failure_reason"] = failure_reason
    if reward_components is not None:
        fields["reward_components"] = reward_components
    return VerifyResponse.model_validate(fields)

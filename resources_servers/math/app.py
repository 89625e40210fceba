"""The ``math`` resources server: rewards a response whose final answer equals ``expected_answer``.

NeMo Gym-compatible (``math_with_judge``; its LLM-judge fallback is :mod:`resources_servers.math.judge`): task rows carry ``expected_answer`` and the
problem as ``question`` (NeMo Gym) or ``problem`` (OpenMathInstruct-2); ``/verify`` answers with the
request echoed plus ``reward``, ``extracted_answer``, ``library_reward``, ``judge_evaluations: null``,
``mask_sample: false`` and, specific to gym-bridge, ``extraction_method`` and ``failure_kind`` /
``failure_reason`` (``null`` unless one applies).

How a response is checked: the final answer is extracted (by default NeMo Gym's rule, a non-empty last
``\\boxed{}``; see :mod:`resources_servers.math.extraction` for the opt-in phrase fallbacks, chosen by
the ``extraction`` setting or request field), plain integers and fractions are compared exactly in the
server process, and everything else goes to math-verify in a warm worker pool with a hard per-check
deadline (:mod:`resources_servers.math.pool`).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, field_validator

from gym_bridge.records.schema import TaskRow, VerifyRequest, VerifyResponse, assistant_text
from gym_bridge.rollout.judge import JudgeClient, judge_metrics
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session
from resources_servers.math.extraction import (
    ExtractionMethod,
    ExtractionMode,
    extract_answer,
    outer_boxes,
    strip_math_delimiters,
)
from resources_servers.math.fastpath import compare_boxed_plain, compare_plain
from resources_servers.math.judge import MathJudgeConfig, judge_fallback
from resources_servers.math.pool import VerifierPool
from resources_servers.math.strict import box_violation, phrase_violation, strict_violation

DEFAULT_CONFIG_PATH = Path(__file__).with_name("config.yaml")
_MAX_RAW_CHARS = 200
_THREAD_TEXT_CHARS = 64 * 1024
"""Longer answer texts are extracted in a thread, so the event loop keeps answering meanwhile."""


class MathConfig(MathJudgeConfig):
    """The math server's settings (``config.yaml`` next to this file holds the defaults; the judge keys are
    :class:`~resources_servers.math.judge.MathJudgeConfig`'s)."""

    model_config = ConfigDict(extra="forbid")

    extraction: ExtractionMode = "boxed"
    """``boxed``: only a non-empty last ``\\boxed{}`` (NeMo Gym's rule); ``boxed_or_final``: else "answer
    is X" / "Answer: X" / "#### X"; ``boxed_or_last``: else also the last number in the text (rewards
    garbage ending in an operand); ``whole_text``: every response whole to math-verify, boxed or not
    (NeMo Gym's library check exactly). A ``/verify`` request's own ``extraction`` field overrides it."""
    max_answer_chars: int = Field(100_000, ge=1)
    """Longest answer handed to math-verify (with several boxes: the whole response); a longer one
    gets reward 0 with ``failure_kind: answer_too_long``, never a cut answer."""
    timeout_s: float = Field(5.0, gt=0)
    """Time budget of one math-verify check; past it the reward is 0 with ``verifier_timeout``."""
    kill_grace_s: float = Field(1.0, ge=0)
    """How long after the budget a worker that has not interrupted itself is killed and replaced."""
    pool_size: int = Field(0, ge=0)
    """Verifier worker processes; 0 means one per CPU core available to the server."""
    fast_path: bool = True
    """Compare plain integers and fractions in the server process instead of the pool."""
    worker_memory_mb: int | None = Field(2048, ge=256)
    """Address-space limit of each worker (a runaway SymPy expression fails instead of swapping)."""
    cache_size: int = Field(100_000, ge=0)
    """Verdicts kept by (expected, answer); repeats skip the pool. 0 turns the cache off."""
    strict: bool = False
    """Reward 0 (``strict_rejected``) for an answer that asserts a relation, a negation or an
    approximation, or carries prose (:mod:`resources_servers.math.strict`); off: NeMo Gym's verdict."""
    slow_check_s: float = Field(0.25, gt=0)
    """A check that has computed this many CPU seconds leaves the pool's lane (a fresh worker takes its
    place), so plain answers do not queue behind answers that will run into ``timeout_s``."""
    slow_lane_workers: int = Field(8, ge=0)
    """How many such slow checks may run beside the lane at once; 0: none (every check waits its turn)."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> MathConfig:
        """Settings from a YAML mapping; unknown keys are an error that names them."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
        return cls.model_validate(data)

    def workers(self) -> int:
        if self.pool_size:
            return self.pool_size
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            return max(1, os.cpu_count() or 1)


def _integer_answers_are_text(value: Any) -> Any:
    """Datasets sometimes store integer answers as JSON numbers; they mean the same text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class MathVerifyRequest(VerifyRequest):
    """``/verify`` body of a math task: ``expected_answer`` is required, the problem text is optional;
    ``extraction`` chooses the answer rule for this request (the server's setting when absent)."""

    expected_answer: str
    question: str | None = None
    problem: str | None = None
    extraction: ExtractionMode | None = None
    strict: bool | None = None

    _answer_text = field_validator("expected_answer", mode="before")(_integer_answers_are_text)


class MathSeedRequest(TaskRow):
    """``/seed_session`` body: the task row, checked as ``/verify`` checks it (the task fields optional)."""

    expected_answer: str | None = None
    question: str | None = None
    problem: str | None = None
    extraction: ExtractionMode | None = None
    strict: bool | None = None

    _answer_text = field_validator("expected_answer", mode="before")(_integer_answers_are_text)


class MathVerifyResponse(VerifyResponse):
    """The request echoed with the verdict, as NeMo Gym's math server answers plus ``extraction_method``."""

    expected_answer: str
    extracted_answer: str | None = None
    extraction_method: ExtractionMethod | None = None
    library_reward: float = 0.0
    judge_evaluations: list[Any] | None = None


class MathServer(ResourcesServer):
    """Math answers checked with math-verify; see the module docstring."""

    name = "math"
    reverify_mode = "stateless"  # /verify reads only the stored record
    verify_request_model = MathVerifyRequest
    seed_request_model = MathSeedRequest
    workers_setting = "pool_size"
    """The config field a trainer's ``env.<name>.num_workers`` sets (verifier worker processes)."""

    def __init__(self, settings: ServerSettings | None = None, config: MathConfig | None = None) -> None:
        super().__init__(settings)
        self.config = config or MathConfig.from_yaml(DEFAULT_CONFIG_PATH)
        self.pool: VerifierPool | None = None
        self.judge: JudgeClient | None = None

    async def startup(self) -> None:
        cfg = self.config
        pool = VerifierPool(
            cfg.workers(),
            cfg.timeout_s,
            cfg.kill_grace_s,
            cfg.worker_memory_mb,
            cfg.cache_size,
            slow_after_s=cfg.slow_check_s,
            slow_workers=cfg.slow_lane_workers,
        )
        await pool.start()
        self.pool = pool
        self.judge = JudgeClient(cfg) if cfg.should_use_judge else None

    async def shutdown(self) -> None:
        if self.judge is not None:
            await self.judge.close()
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    def health(self) -> dict[str, Any]:
        info = super().health()
        info["extraction"] = self.config.extraction
        info["verifier_pool"] = self.pool.describe() if self.pool is not None else None
        info["judge"] = self.judge.describe() if self.judge is not None else None
        return info

    async def verify(self, body: VerifyRequest, session: Session) -> MathVerifyResponse:
        verdict = await self._library_verify(body)
        if self.judge is None or verdict.reward > 0.5:  # the judge only hears about wrong answers
            return verdict
        if verdict.failure_kind == "answer_too_long":  # the limit holds for the judge too (no cut answer)
            return verdict
        return await judge_fallback(self.judge, body, verdict, body.extraction or self.config.extraction)

    async def _library_verify(self, body: VerifyRequest) -> MathVerifyResponse:
        assert isinstance(body, MathVerifyRequest)
        expected = strip_math_delimiters(body.expected_answer)
        text = assistant_text(body.response.output, sep="")  # joined as NeMo Gym joins them
        if not text.strip():
            return _answer(body, failure=("no_answer", "the response has no assistant message text"))
        mode = body.extraction or self.config.extraction
        if len(text) > _THREAD_TEXT_CHARS:
            extraction = await asyncio.to_thread(extract_answer, text, mode)
        else:
            extraction = extract_answer(text, mode)
        if extraction is None:
            return _answer(body, failure=("no_answer", _no_answer_reason(mode)))
        method = extraction.method
        # A boxed response goes whole to math-verify, as NeMo Gym hands it over (it may read a phrase
        # before the box, a percent sign after it, or every box).
        whole_text = method in ("boxed", "all_boxes", "whole_text")
        candidate = text if whole_text else extraction.answer
        limit = self.config.max_answer_chars
        if len(candidate) > limit:
            what = "response (math-verify reads all of it)" if whole_text else "answer"
            reason = f"the {what} has {len(candidate)} characters, over max_answer_chars ({limit})"
            raw = extraction.answer[:_MAX_RAW_CHARS]
            return _answer(body, extracted=raw, method=method, failure=("answer_too_long", reason))
        strict = body.strict if body.strict is not None else self.config.strict
        if strict:
            answers = outer_boxes(text) if method in ("boxed", "all_boxes") else [extraction.answer]
            for answer in answers:
                reason = strict_violation(answer, expected)
                if reason is not None:
                    raw = answer[:_MAX_RAW_CHARS]
                    return _answer(body, extracted=raw, method=method, failure=("strict_rejected", reason))
        # A phrase states one value, strict or not (strict.phrase_violation; the phrase rule is this project's).
        if extraction.phrase is not None:
            reason = phrase_violation(extraction.phrase, expected)
            if reason is not None:
                raw = extraction.answer[:_MAX_RAW_CHARS]
                return _answer(body, extracted=raw, method=method, failure=("phrase_rejected", reason))
        # So does a box under the phrase modes (strict.box_violation); NeMo Gym's own rules keep its verdicts.
        own_rule = mode in ("boxed_or_final", "boxed_or_last")
        if own_rule and method in ("boxed", "all_boxes", "fbox"):
            for box in [extraction.answer] if method == "fbox" else outer_boxes(text):
                reason = box_violation(box, expected)
                if reason is not None:
                    raw = box[:_MAX_RAW_CHARS]
                    return _answer(body, extracted=raw, method=method, failure=("phrase_rejected", reason))

        if self.config.fast_path and method != "whole_text":
            if method == "boxed":
                plain = compare_boxed_plain(expected, text, extraction.answer)
            else:
                plain = None if whole_text else compare_plain(expected, extraction.answer)
            if plain is not None:
                correct, extracted = plain
                return _answer(body, reward=float(correct), extracted=extracted, method=method)

        if self.pool is None:
            raise RuntimeError("the math server's verifier pool is not running (was startup() called?)")
        # A phrase's value, and a box under the phrase modes, must be readable on its own too
        # (worker.unreadable_answer), strict or not: else math-verify scores a number found elsewhere.
        readable_alone = strict or extraction.phrase is not None or own_rule
        outcome = await self.pool.check(expected, candidate, whole_text, readable_alone)
        if outcome.status != "ok":
            kind = "verifier_timeout" if outcome.status == "timeout" else "verifier_error"
            raw = extraction.answer[:_MAX_RAW_CHARS]
            return _answer(body, extracted=raw, method=method, failure=(kind, outcome.detail or kind))
        if outcome.failure_kind == "unreadable_answer":  # strict or a phrase: see worker.unreadable_answer
            unreadable = (outcome.extracted or "")[:_MAX_RAW_CHARS]
            reason = (
                f"math-verify cannot read the answer {unreadable!r} on its own: it would score a number "
                "found elsewhere in the response instead"
            )
            kind = "strict_rejected" if strict else "phrase_rejected"
            return _answer(body, extracted=unreadable, method=method, failure=(kind, reason))
        failure = None
        if outcome.failure_kind == "unparsable_answer":
            failure = (
                "unparsable_answer",
                f"math-verify could not parse the answer {extraction.answer[:200]!r}",
            )
        elif outcome.failure_kind == "unparsable_expected_answer":
            failure = (
                "unparsable_expected_answer",
                f"math-verify could not parse expected_answer {expected[:200]!r}",
            )
        return _answer(
            body, reward=float(outcome.correct), extracted=outcome.extracted, method=method, failure=failure
        )

    def aggregate_metrics(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus how answers were extracted and how often the verifier gave up."""
        out = super().aggregate_metrics(records)
        if not records:
            return out
        n = len(records)
        kinds = Counter(r.get("failure_kind") for r in records)
        out["extraction_methods"] = dict(Counter(r.get("extraction_method") or "none" for r in records))
        out["verifier_timeout_rate"] = kinds["verifier_timeout"] / n
        out["no_answer_rate"] = kinds["no_answer"] / n
        library = [float(r["library_reward"]) for r in records if r.get("library_reward") is not None]
        if library:
            out["mean_library_reward"] = sum(library) / len(library)
        out.update(judge_metrics(records))
        return out


def _no_answer_reason(mode: ExtractionMode) -> str:
    looked_for = {
        "boxed": "non-empty last \\boxed{}",
        "boxed_or_final": "\\boxed{} answer nor final-answer phrase ('The answer is X', 'Answer: X', '#### X')",
        "boxed_or_last": "\\boxed{} answer, final-answer phrase nor number",
        "whole_text": "text",
    }[mode]
    return f"the response has no final answer: no {looked_for} (extraction mode '{mode}')"


def _answer(
    body: MathVerifyRequest,
    reward: float = 0.0,
    extracted: str | None = None,
    method: ExtractionMethod | None = None,
    failure: tuple[str, str] | None = None,
) -> MathVerifyResponse:
    """The response record: the request echoed, with any verdict fields it carried replaced."""
    kind, reason = failure if failure else (None, None)
    verdict = {
        "reward": reward,
        "extracted_answer": extracted,
        "extraction_method": method,
        "library_reward": reward,
        "judge_evaluations": None,
        "failure_kind": kind,
        "failure_reason": reason,
        "mask_sample": False,
    }
    # The request's own models (its task params and the response: most of the record) go in as they were
    # validated. Dumping them and validating the dump again gave the same record (the test of this file's
    # _answer compares both) for ~190k instructions a rollout, the most costly step of an in-process /verify.
    models = {name: getattr(body, name) for name in _VALIDATED_PARTS if name in body.model_fields_set}
    rest = body.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude=set(models))
    return MathVerifyResponse.model_validate({**models, **rest, **verdict})


_VALIDATED_PARTS = ("responses_create_params", "response", "agent_ref")
"""Fields of a verify request that are models of their own, the same types in the response record."""

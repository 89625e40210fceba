"""Reasoning Gym tasks (``reasoning-gym`` package) scored by that package's own per-family scorers.

A drop-in for NeMo Gym's ``reasoning_gym`` resources server: the same task rows (``question``, ``answer``,
``metadata`` with ``source_dataset`` naming the family, as ``reasoning_gym.create_dataset`` makes them),
the same answer extraction and the same verdict fields (``task_name``, ``score``, ``extracted_answer``).

Extraction, in NeMo Gym's order, on the assistant text (message parts joined without a separator):
the ``<answer>...</answer>`` tag (``reasoning_gym.utils.extract_answer``), else the first ``\\boxed{...}``,
else the whole text. ``extraction_method`` says which (``answer_tag | boxed | full_text``). The reward is
``reasoning_gym.get_score_answer_fn(family)(answer, entry)``; a scorer that raises gives reward 0 with
``failure_kind: scorer_error`` (NeMo Gym gives 0 too). An unknown family is a 422 naming
``metadata.source_dataset``, not a crash.

Scorers never run in the server process: some ``eval`` the answer or parse it with SymPy, so every check
runs in an unprivileged, time-limited worker process that evaluates no answer as code and is retired
after any check that evaluated text (:mod:`resources_servers.reasoning_gym.pool`); a check past
``timeout_s`` gives reward 0 with ``failure_kind: scorer_timeout``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import field_validator
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import extract_answer

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session
from resources_servers.reasoning_gym.pool import ReasoningGymConfig, ScorerPool

__all__ = ["ReasoningGymServer", "ReasoningGymVerifyRequest", "ReasoningGymVerifyResponse", "extract"]

_BOXED = re.compile(r"\\boxed\{([^}]+)\}")


class ReasoningGymVerifyRequest(VerifyRequest):
    question: str
    answer: str | None
    metadata: dict[str, Any]

    @field_validator("metadata")
    @classmethod
    def _known_family(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        family = metadata.get("source_dataset")
        if not isinstance(family, str) or not family:
            raise ValueError("source_dataset: the task family is required (e.g. 'basic_arithmetic')")
        if family not in DATASETS:
            raise ValueError(f"source_dataset: unknown reasoning-gym family {family!r}")
        return metadata


class ReasoningGymVerifyResponse(ReasoningGymVerifyRequest, VerifyResponse):
    task_name: str
    score: float
    extracted_answer: str | None
    extraction_method: str


def extract(text: str) -> tuple[str, str]:
    """``(answer, method)`` from the assistant text, in NeMo Gym's order: answer tag, boxed, whole text."""
    tagged = extract_answer(text, tag_name="answer")
    if tagged is not None:
        return tagged, "answer_tag"
    boxed = _BOXED.search(text)
    if boxed:
        return boxed.group(1).strip(), "boxed"
    return text.strip(), "full_text"


class ReasoningGymServer(ResourcesServer):
    name = "reasoning_gym"
    reverify_mode = "stateless"  # /verify reads only the stored record
    verify_request_model = ReasoningGymVerifyRequest
    workers_setting = "pool_size"
    """The config field a trainer's ``env.<name>.num_workers`` sets (scorer worker processes)."""

    def __init__(self, settings: ServerSettings | None = None, config: ReasoningGymConfig | None = None) -> None:
        super().__init__(settings)
        self.config = config or ReasoningGymConfig()
        self.pool: ScorerPool | None = None

    async def startup(self) -> None:
        cfg = self.config
        pool = ScorerPool(cfg.workers(), cfg.timeout_s, cfg.worker_memory_mb)
        await pool.start()
        self.pool = pool

    async def shutdown(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    def health(self) -> dict[str, Any]:
        return {**super().health(), "scorer_pool": self.pool.describe() if self.pool is not None else None}

    async def verify(self, body: VerifyRequest, session: Session) -> ReasoningGymVerifyResponse:
        assert isinstance(body, ReasoningGymVerifyRequest)
        family = body.metadata["source_dataset"]
        answer, method = extract(assistant_text(body.response.output, sep=""))
        entry = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
        failure: dict[str, Any] = {"failure_kind": None, "failure_reason": None}
        assert self.pool is not None, "the server was not started"
        outcome = await self.pool.score(family, answer, entry)  # in an isolated worker, never here
        score = outcome.score if outcome.status == "ok" else 0.0  # a scorer's bug, a timeout: reward 0
        reward = float(score >= 1.0) if self.config.all_or_nothing(family) else score
        if outcome.status != "ok":
            failure = {"failure_kind": f"scorer_{outcome.status}", "failure_reason": outcome.detail}
        elif outcome.refused:
            failure = {"failure_kind": "answer_refused", "failure_reason": outcome.refused}
        verdict = {
            "reward": reward,
            "task_name": family,
            "score": score,
            "extracted_answer": answer,
            "extraction_method": method,
            **failure,
        }
        return ReasoningGymVerifyResponse.model_validate({**dump(body), **verdict})

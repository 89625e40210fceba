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
"""

from __future__ import annotations

import asyncio
import re
from functools import cache
from typing import Any

import reasoning_gym
from pydantic import field_validator
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import extract_answer

from gym_bridge.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.server import ResourcesServer, Session

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


@cache
def _scorer(family: str) -> Any:
    return reasoning_gym.get_score_answer_fn(family)


class ReasoningGymServer(ResourcesServer):
    name = "reasoning_gym"
    reverify_mode = "stateless"  # /verify reads only the stored record
    verify_request_model = ReasoningGymVerifyRequest

    async def verify(self, body: VerifyRequest, session: Session) -> ReasoningGymVerifyResponse:
        assert isinstance(body, ReasoningGymVerifyRequest)
        family = body.metadata["source_dataset"]
        answer, method = extract(assistant_text(body.response.output, sep=""))
        entry = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
        failure: dict[str, Any] = {"failure_kind": None, "failure_reason": None}
        try:
            score = float(await asyncio.to_thread(_scorer(family), answer=answer, entry=entry))
        except Exception as e:  # a scorer's own bug must not fail the rollout (NeMo Gym: reward 0)
            score = 0.0
            failure = {"failure_kind": "scorer_error", "failure_reason": f"{type(e).__name__}: {e}"[:300]}
        verdict = {
            "reward": score,
            "task_name": family,
            "score": score,
            "extracted_answer": answer,
            "extraction_method": method,
            **failure,
        }
        return ReasoningGymVerifyResponse.model_validate({**dump(body), **verdict})

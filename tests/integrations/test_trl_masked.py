"""A ``/verify`` answer with ``mask_sample: true`` (a judge down: the verdict unknown) is no reward for TRL.

Before, :class:`GymReward` and the tool environment's ``get_reward`` returned such an answer's reward (0):
with the LLM judge unreachable, ``\\boxed{Paris}`` for the capital of France scored 0 and TRL's GRPOTrainer
learned it as a wrong answer. Now it is a failed rollout: ``None`` under ``on_verify_failure="mask"``
(TRL leaves it out of the group), counted toward ``max_failed_fraction``, and a batch masked whole raises.
Real servers: ``gym-bridge serve equivalence_judge`` in its own process with its judge URL a loopback port
nothing listens on, and a small env on loopback masking the rows that ask for it.
"""

from __future__ import annotations

import json
import socket
import sys

import pytest
from pydantic import BaseModel

from gym_bridge.integrations.trl import TASK_ROW_COLUMN, GymReward, gym_environment_factory
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.retry import RetryPolicy
from gym_bridge.serving.server import ResourcesServer, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.reliability.procs import kill9, start, wait_for_line

FAST = RetryPolicy(max_attempts=2, backoff_base=0.01)


def _columns(n: int, **extra: list) -> dict[str, list]:
    return {
        "responses_create_params": [{"input": [{"role": "user", "content": "Capital of France?"}]}] * n,
        "question": ["Capital of France?"] * n,
        "expected_answer": ["Paris"] * n,
        **extra,
    }


def test_a_judge_down_masks_every_answer_and_the_batch_raises_instead_of_scoring_0() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        judge = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    proc = start([sys.executable, "-m", "gym_bridge.cli", "serve", "equivalence_judge", "--port", "0",
                  "--judge-url", judge])  # fmt: skip
    try:
        url = next(w for w in wait_for_line(proc, "listening on", timeout=60).split() if w.startswith("http://"))
        reward = GymReward(url, retry=FAST)
        with pytest.raises(RuntimeError, match=r"every /verify of the batch failed \(4\).*mask_sample.*judge_error"):
            reward(["Capital of France?"] * 4, ["\\boxed{Paris}"] * 4, **_columns(4))  # before: [0.0] * 4
        assert all(a is not None and a["mask_sample"] is True for a in reward.last_answers)
    finally:
        kill9(proc)


class NoteArgs(BaseModel):
    text: str


class MaskOnRequest(ResourcesServer):
    """Reward 1, except rows with ``mask`` true: a judge that timed out (reward 0, ``mask_sample: true``)."""

    name = "mask_on_request"

    @tool
    async def note(self, args: NoteArgs, session: Session) -> dict[str, str]:
        """Keep a note."""
        return {"kept": args.text}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        if getattr(body, "mask", False):
            return VerifyResponse(**dump(body), reward=0.0, failure_kind="judge_timeout",
                                  failure_reason="the judge timed out", mask_sample=True)  # fmt: skip
        return VerifyResponse(**dump(body), reward=1.0)


def test_a_masked_answer_is_left_out_of_the_group_not_scored_0() -> None:
    with start_in_thread(MaskOnRequest().build_app()) as env:
        completions = ["\\boxed{Paris}"] * 4
        columns = _columns(4, mask=[False, True, False, False])
        assert GymReward(env.url, retry=FAST)(["q"] * 4, completions, **columns) == [1.0, None, 1.0, 1.0]
        zero = GymReward(env.url, retry=FAST, on_verify_failure="zero")  # the user's explicit choice
        assert zero(["q"] * 4, completions, **columns) == [1.0, 0.0, 1.0, 1.0]
        with pytest.raises(RuntimeError, match="3 of 4 rollouts of the batch failed.*mask_sample"):
            GymReward(env.url, retry=FAST)(["q"] * 4, completions, **_columns(4, mask=[True, True, True, False]))

        spec = [{"type": "function", "name": "note", "parameters": NoteArgs.model_json_schema()}]
        Env = gym_environment_factory(env.url, spec, retry=FAST)
        row = {"responses_create_params": {"input": "note milk"}}
        kept, masked = Env(), Env()
        kept.reset(**{TASK_ROW_COLUMN: json.dumps(row)})
        masked.reset(**{TASK_ROW_COLUMN: json.dumps({**row, "mask": True})})
        assert kept.get_reward() == 1.0
        assert masked.get_reward() is None  # before: 0.0
        assert masked.last_answer is not None and masked.last_answer["mask_sample"] is True

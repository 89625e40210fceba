"""The TRL bridge talks to resources servers through the agent's env steps, so it tries requests as collect does.

A real server on loopback whose first ``/verify`` and first tool call of each session answer 503 (a
restarting or overloaded server): the agent's retry policy sends them again, so the rollouts score what
the server says instead of 0 (before, the bridge made one attempt of its own). ``timeout_s`` and
``retry`` bound each request; a tool named after a protocol route is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gym_bridge.integrations.trl import TASK_ROW_COLUMN, GymReward, gym_environment_factory
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.retry import RetryPolicy
from gym_bridge.serving.server import ResourcesServer, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

FAST = RetryPolicy(max_attempts=3, backoff_base=0.01)


class NoteArgs(BaseModel):
    text: str


class FlakyEnv(ResourcesServer):
    """The first ``/verify`` and the first ``note`` call of each session answer 503; a row with
    ``slow_s`` makes ``/verify`` take that long. Reward: 1 once the session holds a note or ``tag``."""

    name = "flaky"

    def __init__(self) -> None:
        super().__init__()
        self.verifies = 0
        self.notes = 0

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["tag"] = body.get("tag")
        return {}

    @tool
    async def note(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Keep a note."""
        self.notes += 1
        if not session.state.get("noted_once"):
            session.state["noted_once"] = True
            raise HTTPException(503, "busy, try again")
        session.state["note"] = args.text
        return {"kept": args.text}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        self.verifies += 1
        if slow := getattr(body, "slow_s", None):
            await asyncio.sleep(slow)
        if not session.state.get("verified_once"):
            session.state["verified_once"] = True
            raise HTTPException(503, "busy, try again")
        seeded = session.state.get("tag") is not None and session.state.get("tag") == getattr(body, "tag", None)
        return VerifyResponse(**dump(body), reward=float(seeded or "note" in session.state))


@pytest.fixture()
def flaky() -> Iterator[tuple[FlakyEnv, str]]:
    env = FlakyEnv()
    with start_in_thread(env.build_app()) as running:
        yield env, running.url


def _columns(*rows: dict[str, Any]) -> dict[str, list[str]]:
    return {TASK_ROW_COLUMN: [json.dumps(r) for r in rows]}


def _row(**extra: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "hi"}, **extra}


def test_reward_retries_a_busy_verify_in_the_same_session(flaky: tuple[FlakyEnv, str]) -> None:
    env, url = flaky
    reward = GymReward(url, retry=FAST)
    got = reward(["p", "p"], ["x", "y"], **_columns(_row(tag="a"), _row(tag="b")))
    assert got == [1.0, 1.0]  # each retried /verify still found its own seeded session
    assert env.verifies == 4


def test_every_verify_busy_with_one_attempt_raises_naming_the_status(flaky: tuple[FlakyEnv, str]) -> None:
    _, url = flaky
    with pytest.raises(RuntimeError, match="every /verify of the batch failed.*env_http_error.*503"):
        GymReward(url, retry=RetryPolicy(max_attempts=1))(["p"], ["x"], **_columns(_row(tag="a")))


def test_timeout_s_bounds_each_attempt(flaky: tuple[FlakyEnv, str]) -> None:
    _, url = flaky
    reward = GymReward(url, timeout_s=0.3, retry=RetryPolicy(max_attempts=1))
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="env_timeout"):
        reward(["p"], ["x"], **_columns(_row(tag="a", slow_s=5.0)))
    assert time.perf_counter() - started < 3.0
    assert reward.retry.request_timeout == 0.3 and reward.retry.max_attempts == 1


def test_tool_environment_retries_a_busy_tool_and_verify(flaky: tuple[FlakyEnv, str]) -> None:
    env, url = flaky
    tools = [{"type": "function", "name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]  # fmt: skip
    Env = gym_environment_factory(url, tools, retry=FAST)
    rollout = Env()
    rollout.reset(**{TASK_ROW_COLUMN: json.dumps(_row())})
    assert json.loads(rollout.note(text="milk")) == {"kept": "milk"}  # the 503 was retried, not shown
    assert env.notes == 2
    assert rollout.get_reward() == 1.0 and env.verifies == 2
    assert rollout.last_answer is not None and rollout.last_answer["reward"] == 1.0


def test_a_tool_named_after_a_protocol_route_is_refused() -> None:
    with pytest.raises(ValueError, match="'verify': is a route of the protocol itself"):
        gym_environment_factory("http://127.0.0.1:9", [{"type": "function", "name": "verify", "parameters": {}}])

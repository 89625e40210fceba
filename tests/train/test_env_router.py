"""The agent loop over env replicas without Ray: sessions spread, stay on their replica, and move off a lost one.

Two tool_use servers on loopback stand for two replicas; the model is the policy server over
:class:`~tests.train.shopper.Shopper` (the right tool call, then "Done."), so a rollout scores 1 only
when its tool call and ``/verify`` reach the server that seeded its session.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.models.tokenizer import build_tokenizer
from gym_bridge.policy.server import build_policy_app
from gym_bridge.rollout.agent import AgentConfig, make_session, run_rollout
from gym_bridge.rollout.env_router import ReplicaEndpoints, SessionRouter
from gym_bridge.rollout.envs import env_app
from gym_bridge.serving.retry import RequestFailed, RetryPolicy
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.train.shopper import Shopper, write_shop_rows


def sessions(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        return int(json.loads(answer.read())["sessions"])


def test_new_sessions_go_to_the_least_busy_live_replica() -> None:
    router = SessionRouter("shop", ReplicaEndpoints(["http://a", "http://b", "http://c"]))
    first = [router.open_session().index for _ in range(4)]
    assert first == [0, 1, 2, 0]  # fewest open, then fewest opened, then the lowest index
    router.end_session(router.replicas[1])
    assert router.open_session().index == 1
    router.mark_lost(router.replicas[2], "refused")
    router.mark_lost(router.replicas[2], "again")  # the first reason stays
    assert [router.open_session().index for _ in range(4)] == [1, 0, 1, 0]  # 1 had a session fewer open
    assert router.alive == 2 and router.replicas[2].lost == "refused" and len(router.newly_lost) == 1
    router.mark_lost(router.replicas[0], "timed out")
    router.mark_lost(router.replicas[1], "refused")
    with pytest.raises(RequestFailed, match=r"no replica of env 'shop' is left \(replica 0 at http://a: timed out;"):
        router.open_session()



def _agent_config(policy_url: str) -> AgentConfig:
    """The scripted shopper's agent settings: two model turns, env calls retried once, fast."""
    return AgentConfig(model_url=f"{policy_url}/v1", max_steps=2, overrides={"model": "policy", "max_output_tokens": 64},
                       env_retry=RetryPolicy(max_attempts=2, request_timeout=5, backoff_base=0.05))  # fmt: skip


async def _run_all(rows: list[dict[str, Any]], router: SessionRouter, config: AgentConfig) -> list[Any]:
    """Every row's rollout at once through ``router``, on one client session."""
    session = make_session()
    try:
        return await asyncio.gather(*(run_rollout(session, row, router, config) for row in rows))
    finally:
        await session.close()

@pytest.mark.timeout(120)
def test_sessions_spread_stay_put_and_move_off_a_stopped_replica(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    rows = [json.loads(line) for line in write_shop_rows(tmp_path / "shop.jsonl", 8).read_text().splitlines()]
    servers = [start_in_thread(env_app("tool_use")) for _ in range(2)]
    policy = start_in_thread(build_policy_app(Shopper(tokenizer), model_name="policy", return_token_ids=True))
    router = SessionRouter("shop", ReplicaEndpoints([s.url for s in servers]))
    config = _agent_config(policy.url)

    async def rollouts() -> list[Any]:
        return await _run_all(rows, router, config)

    try:
        first = asyncio.run(rollouts())
        assert [r.record["reward"] for r in first] == [1.0] * 8, [r.failure for r in first]
        assert [sessions(s.url) for s in servers] == [4, 4]  # spread; no request opened a stray session
        assert all(r.open == 0 for r in router.replicas)

        servers[0].stop()  # a replica gone between batches: its new sessions open on the other one
        second = asyncio.run(rollouts())
        assert [r.record["reward"] for r in second] == [1.0] * 8, [r.failure for r in second]
        assert sessions(servers[1].url) == 12 and router.alive == 1
        assert router.replicas[0].lost is not None and "connect" in router.replicas[0].lost.lower()

        servers[1].stop()  # none left: every rollout fails at session set-up, naming the env
        third = asyncio.run(rollouts())
        assert all(r.failure is not None and r.failure.stage == "seed_session" for r in third)
        assert "no replica of env 'shop' is left" in third[0].failure.message
    finally:
        for server in [*servers, policy]:
            server.stop()


class StopsAReplica(Shopper):
    """The Shopper, which on its first call waits until all sessions are open, then stops ``server``."""

    def __init__(self, tokenizer: Any, server: Any, urls: list[str], sessions_open: int) -> None:
        super().__init__(tokenizer)
        self.server, self.urls, self.sessions_open = server, urls, sessions_open

    def generate(self, requests: list[Any]) -> list[Any]:
        if self.server is not None:
            deadline = time.monotonic() + 30
            while sum(sessions(url) for url in self.urls) < self.sessions_open and time.monotonic() < deadline:
                time.sleep(0.01)
            self.server.stop()
            self.server = None
        return super().generate(requests)


@pytest.mark.timeout(120)
def test_sessions_open_on_a_replica_that_dies_fail_and_the_others_verify(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    rows = [json.loads(line) for line in write_shop_rows(tmp_path / "shop.jsonl", 8).read_text().splitlines()]
    servers = [start_in_thread(env_app("tool_use")) for _ in range(2)]
    urls = [s.url for s in servers]
    model = StopsAReplica(tokenizer, servers[0], urls, sessions_open=8)
    policy = start_in_thread(build_policy_app(model, model_name="policy", return_token_ids=True))
    router = SessionRouter("shop", ReplicaEndpoints(urls))
    config = _agent_config(policy.url)

    async def rollouts() -> list[Any]:
        return await _run_all(rows, router, config)

    try:
        results = asyncio.run(rollouts())
    finally:
        for server in [*servers, policy]:
            server.stop()
    failed = [r.failure for r in results if r.failure is not None]
    assert len(failed) == 4 and [r.record["reward"] for r in results if r.ok] == [1.0] * 4
    assert {(f.stage, f.failure_class) for f in failed} == {("tool", "env_connection_error")}
    assert all(urls[0] in f.message for f in failed)  # the sessions of the stopped replica, no other
    assert router.replicas[0].lost is not None and router.alive == 1

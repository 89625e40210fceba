"""A busy client's pooled connections that the server closed while they sat idle cost no rollout.

Over real sockets: a uvicorn server that closes idle connections after 0.2 s, and one aiohttp session
(``make_session``, as collect uses it) whose event loop is blocked for 0.6 s between two bursts, as a
loop running thousands of rollouts on a loaded machine is. The second burst takes connections the
server has closed but the loop has not yet seen closing: aiohttp fails them with "Can not write request
body". The request never reached the server, so it is sent again at once on another connection, not
counted as an attempt: with one attempt allowed, every request still succeeds (before: all 32 failed
as ``env_connection_error``, and collect at c=65536 under load turned 5,385 rollouts into failures).
"""

from __future__ import annotations

import asyncio
import time

from gym_bridge.rollout.agent import make_session
from gym_bridge.serving.retry import RetryPolicy, post_json
from gym_bridge.serving.uvicorn_thread import start_in_thread

from .envs import ArithmeticEnv


async def _bursts(url: str, rounds: int, width: int) -> tuple[list[object], int]:
    policy = RetryPolicy(max_attempts=1, request_timeout=10)  # no retry: only an unsent request goes again
    results: list[object] = []
    attempts = 0
    async with make_session(max_connections=64) as session:

        async def add() -> object:
            return await post_json(session, url + "/add", {"a": 1, "b": 2}, target="env", policy=policy)

        for _ in range(rounds):
            await asyncio.gather(*(add() for _ in range(width)))  # fills the pool with idle connections
            time.sleep(0.6)  # the loop is busy: the server closes them meanwhile, unseen
            answers = await asyncio.gather(*(add() for _ in range(width)), return_exceptions=True)
            results += answers
            attempts += sum(a.attempts for a in answers if not isinstance(a, BaseException))
    return results, attempts


def test_a_request_on_a_connection_the_server_closed_idle_is_sent_again_not_failed():
    with start_in_thread(ArithmeticEnv().build_app(), keep_alive_s=0.2) as running:
        results, attempts = asyncio.run(_bursts(running.url, rounds=3, width=32))
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} of {len(results)} failed: {failed[0]}"
    assert [r.data for r in results] == [{"sum": 3}] * 96  # type: ignore[union-attr]
    assert attempts == 96  # an unsent request is not an attempt (nor a retry in collect's count)

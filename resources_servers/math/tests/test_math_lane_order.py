r"""A plain answer is never queued behind answers that will run into the check timeout (issue 33,
finding 8), over real HTTP. Each test asserts an order, not a speed: every plain answer is answered
before the first timeout-bound answer is, while those still hold every worker of the pool, and each
timeout-bound answer still gets ``verifier_timeout`` and reward 0.

``slow_check_s: 30`` (longer than any check may run) switches off the slow lane's CPU test, so that the
first two tests show the parts that do not wait for it: a check that arrives while every lane worker is
stuck gets a worker of its own, and an answer that ran into the budget before leaves the lane at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathConfig, MathServer
from resources_servers.math.tests.helpers import verify_body, wait_for_pool

TIMEOUT_S = 4.0
ATTACK_TIMEOUT_S = 8.0
"""The eight-answer case: their workers start on a machine busy with them (and, in CI, with more)."""
NO_CPU_TEST = {"slow_check_s": 30.0}


def _hostile(k: int) -> str:
    return f"\\boxed{{{k}^{{9^{{9^9}}}}}}"


async def _post(client: httpx.AsyncClient, text: str, expected: str) -> tuple[float, dict[str, Any]]:
    """The verdict and when it arrived (monotonic seconds)."""
    response = await client.post("/verify", json=verify_body(text, expected))
    assert response.status_code == 200, response.text
    return time.monotonic(), response.json()


async def _wait_until_sent(client: httpx.AsyncClient, checks: int) -> None:
    """Until the pool has sent ``checks`` checks to its workers."""
    while (await client.get("/health")).json()["verifier_pool"]["checks"] < checks:
        await asyncio.sleep(0.02)


async def _attack(url: str, hostile: list[str], plain: int, gap_s: float) -> dict[str, Any]:
    """Send the ``hostile`` answers at once, then (once they hold the workers) ``plain`` plain answers
    ``gap_s`` apart; every verdict with the time it arrived."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        checks = (await client.get("/health")).json()["verifier_pool"]["checks"]
        attack = [asyncio.create_task(_post(client, text, "5")) for text in hostile]
        await _wait_until_sent(client, checks + 1)
        await asyncio.sleep(0.5)  # the lane is stuck (see VerifierPool._lane_stuck)
        plains = []
        for i in range(plain):
            n = 1234 + i
            plains.append(asyncio.create_task(_post(client, f"\\boxed{{\\sqrt{{{n}^2}}}}", str(n))))
            await asyncio.sleep(gap_s)
        plain_results = await asyncio.gather(*plains)
        hostile_results = await asyncio.gather(*attack)
        pool = (await client.get("/health")).json()["verifier_pool"]
    return {"plain": plain_results, "hostile": hostile_results, "pool": pool}


def _run(config: MathConfig, *scenarios: tuple[list[str], int, float]) -> list[dict[str, Any]]:
    with start_in_thread(MathServer(config=config).build_app()) as running:
        wait_for_pool(running.url)
        return [asyncio.run(_attack(running.url, *scenario)) for scenario in scenarios]


def _assert_plain_first(result: dict[str, Any]) -> None:
    """Every plain answer is right and came before the first hostile one; every hostile one timed out."""
    for _, out in result["hostile"]:
        assert (out["reward"], out["failure_kind"]) == (0.0, "verifier_timeout"), out
    assert all(out["reward"] == 1.0 for _, out in result["plain"]), result["plain"]
    first_hostile = min(done for done, _ in result["hostile"])
    late = [done - first_hostile for done, _ in result["plain"] if done >= first_hostile]
    assert not late, f"plain answers came {late} s after the first hostile one: {result['pool']}"


def test_a_plain_answer_arriving_while_every_worker_is_stuck_gets_its_own() -> None:
    """Both lane workers hold an answer that will time out, and their CPU test is off: a plain answer
    sent now is answered before them (on the old pool it waited for one to time out)."""
    config = MathConfig(pool_size=2, timeout_s=TIMEOUT_S, kill_grace_s=1.0, **NO_CPU_TEST)
    (result,) = _run(config, ([_hostile(2), _hostile(3)], 3, 0.3))
    _assert_plain_first(result)
    assert result["pool"]["slow_checks"] == 0 and result["pool"]["lane_spawns"] >= 1, result["pool"]


def test_an_answer_that_timed_out_before_leaves_the_lane_at_once() -> None:
    """A repeat of an answer that ran into the budget takes no lane place: the plain answer sent after
    it is answered first, though the CPU test that would move it out is off."""
    config = MathConfig(pool_size=1, timeout_s=TIMEOUT_S, kill_grace_s=1.0, **NO_CPU_TEST)
    first, repeat = _run(config, ([_hostile(2)], 0, 0.0), ([_hostile(2)], 1, 0.0))
    assert first["pool"]["slow_checks"] == 0
    _assert_plain_first(repeat)
    assert repeat["pool"]["slow_checks"] == 1, repeat["pool"]


def test_plain_answers_are_answered_first_while_eight_answers_run_into_the_timeout() -> None:
    """The issue's case with the shipped lane settings: eight distinct answers that each run into the
    timeout, a plain answer every 0.3 s meanwhile; none of them waits for the eight."""
    config = MathConfig(pool_size=2, timeout_s=ATTACK_TIMEOUT_S, kill_grace_s=1.0)
    (result,) = _run(config, ([_hostile(k) for k in range(2, 10)], 6, 0.3))
    _assert_plain_first(result)
    assert result["pool"]["slow_checks"] >= 1, result["pool"]

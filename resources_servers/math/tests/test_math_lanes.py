r"""Slow checks leave the lane, over real HTTP (issue 33, finding 8): while answers that will run into the
check timeout occupy every worker, a plain answer is still answered at once, not after them; with
``slow_lane_workers: 0`` it waits its turn (the setting does what it says)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathConfig, MathServer
from resources_servers.math.tests.helpers import verify_body, wait_for_pool

# One worker: two hostile answers queue behind each other without the lane.
CONFIG = MathConfig(pool_size=1, timeout_s=4.0, kill_grace_s=1.0)


async def _attack(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def post(text: str, expected: str) -> tuple[float, dict[str, Any]]:
            response = await client.post("/verify", json=verify_body(text, expected))
            assert response.status_code == 200, response.text
            return time.monotonic(), response.json()

        hostile = [asyncio.create_task(post(f"\\boxed{{{k}^{{9^{{9^9}}}}}}", "5")) for k in (2, 3)]
        await asyncio.sleep(0.3)
        sent = time.monotonic()
        plain_done, plain = await post("\\boxed{\\sqrt{1234^2}}", "1234")
        hostile_results = await asyncio.gather(*hostile)
        pool = (await client.get("/health")).json()["verifier_pool"]
    return {
        "plain": plain,
        "plain_seconds": plain_done - sent,
        "plain_before_hostile": plain_done < min(done for done, _ in hostile_results),
        "hostile": [out for _, out in hostile_results],
        "pool": pool,
    }


def _run(config: MathConfig) -> dict[str, Any]:
    with start_in_thread(MathServer(config=config).build_app()) as running:
        wait_for_pool(running.url)
        return asyncio.run(_attack(running.url))


@pytest.mark.parametrize("lanes", [True, False], ids=["slow_lane", "one_lane"])
def test_a_plain_answer_does_not_wait_behind_answers_that_time_out(lanes: bool) -> None:
    config = CONFIG if lanes else CONFIG.model_copy(update={"slow_lane_workers": 0})
    result = _run(config)
    assert result["plain"]["reward"] == 1.0
    assert all(out["failure_kind"] == "verifier_timeout" for out in result["hostile"]), result["hostile"]
    if lanes:
        assert result["plain_before_hostile"], result
        assert result["pool"]["slow_checks"] >= 1 and result["pool"]["lane_spawns"] >= 1
    else:  # every check waits its turn: the plain answer comes after both hostile ones
        assert not result["plain_before_hostile"] and result["plain_seconds"] > 2 * CONFIG.timeout_s - 1
        assert result["pool"]["slow_checks"] == 0

"""Hostile answers: SymPy hangs are cut off, stuck or dead workers are replaced, other requests flow on."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathConfig, MathServer
from resources_servers.math.tests.helpers import verify_body, wait_for_pool

# Its own server: these tests stop and kill workers, and a 2 s budget leaves normal checks ample time
# even on a loaded machine.
CONFIG = MathConfig(timeout_s=2.0, kill_grace_s=1.0, pool_size=2)
POWER_TOWER = "\\boxed{9^{9^{9^9}}}"  # math-verify/SymPy runs for minutes on this


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[tuple[MathServer, str]]:
    server = MathServer(config=CONFIG)
    with start_in_thread(server.build_app()) as running:
        wait_for_pool(running.url)
        yield server, running.url


def _health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=30).json()["verifier_pool"]


def _wait_for_workers(url: str, restarts: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pool = _health(url)
        if pool["live_workers"] == CONFIG.pool_size and pool["restarts"] >= restarts:
            return pool
        time.sleep(0.05)
    raise AssertionError(f"workers were not replaced: {_health(url)}")


async def _post(client: httpx.AsyncClient, text: str, expected: str) -> dict[str, Any]:
    response = await client.post("/verify", json=verify_body(text, expected))
    assert response.status_code == 200, response.text
    return response.json()


def test_a_hanging_check_times_out_while_other_requests_are_answered(
    hostile_server: tuple[MathServer, str],
) -> None:
    server, url = hostile_server

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            hanging = asyncio.create_task(_post(client, POWER_TOWER, "5"))
            await asyncio.sleep(0.2)  # let it reach a worker
            pooled = await _post(client, "\\boxed{\\sqrt{2}}", "\\sqrt{2}")  # needs the other worker
            fast = await _post(client, "\\boxed{12}", "12")
            assert not hanging.done(), "the hostile check should still be running"
            assert pooled["reward"] == 1.0 and fast["reward"] == 1.0
            timed_out = await hanging
            assert timed_out["reward"] == 0.0 and timed_out["library_reward"] == 0.0
            assert timed_out["failure_kind"] == "verifier_timeout"
            assert "2 s" in timed_out["failure_reason"]
            assert (
                timed_out["extracted_answer"] == "9^{9^{9^9}}" and timed_out["extraction_method"] == "boxed"
            )
            after = await _post(client, "\\boxed{\\frac{\\pi}{2}}", "\\pi/2")
            assert after["reward"] == 1.0
            again = await _post(client, POWER_TOWER, "5")  # timeouts are not cached: it is tried again
            assert again["failure_kind"] == "verifier_timeout"

    asyncio.run(run())
    assert server.pool is not None and server.pool.stats.timeouts >= 2


def test_stuck_workers_are_killed_and_replaced(hostile_server: tuple[MathServer, str]) -> None:
    server, url = hostile_server
    _wait_for_workers(url, restarts=0)
    assert server.pool is not None
    stuck = server.pool.pids
    before = _health(url)
    for pid in stuck:  # a worker wedged in C code ignores its own timer; SIGSTOP is the same to the parent
        os.kill(pid, signal.SIGSTOP)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            wedged = [asyncio.create_task(_post(client, f"\\boxed{{\\sqrt{{{n}}}}}", "1")) for n in (2, 3)]
            await asyncio.sleep(0.2)
            fast = await _post(client, "\\boxed{3/4}", "\\frac{3}{4}")  # the fast path needs no worker
            assert fast["reward"] == 1.0
            assert not any(task.done() for task in wedged)
            for result in await asyncio.gather(*wedged):
                assert result["failure_kind"] == "verifier_timeout" and result["reward"] == 0.0
                assert "killed and replaced" in result["failure_reason"]

    asyncio.run(run())
    pool = _wait_for_workers(url, restarts=before["restarts"] + 2)
    assert pool["killed"] == before["killed"] + 2
    assert not set(server.pool.pids) & set(stuck)
    for pid in stuck:  # really gone (reaped), not merely forgotten
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    out = httpx.post(f"{url}/verify", json=verify_body("\\boxed{\\sqrt{4}}", "2"), timeout=30).json()
    assert out["reward"] == 1.0


def test_a_worker_that_dies_is_replaced(hostile_server: tuple[MathServer, str]) -> None:
    server, url = hostile_server
    before = _wait_for_workers(url, restarts=0)
    assert server.pool is not None
    victim = server.pool.pids[0]
    os.kill(victim, signal.SIGKILL)
    pool = _wait_for_workers(url, restarts=before["restarts"] + 1)
    assert victim not in server.pool.pids and pool["live_workers"] == 2
    checks_before = server.pool.stats.checks
    results = [
        httpx.post(
            f"{url}/verify", json=verify_body(f"\\boxed{{\\sqrt{{{n * n}}}}}", str(n)), timeout=30
        ).json()
        for n in range(11, 15)
    ]
    assert [r["reward"] for r in results] == [1.0] * 4
    assert server.pool.stats.checks == checks_before + 4  # answered by workers, not the cache

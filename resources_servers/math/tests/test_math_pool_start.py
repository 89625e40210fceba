"""The verifier workers start on demand: plain answers never start them, the first LaTeX answer does
(and waits for a warm one), a pool that cannot start says why, and a server stopped while its workers
warm up leaves none behind."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math import pool as pool_module
from resources_servers.math import worker_process
from resources_servers.math.app import MathConfig, MathServer
from resources_servers.math.pool import VerifierPool
from resources_servers.math.tests.helpers import verify_body, wait_for_pool


class HeldSpawns(threading.Event):
    """Set it to let the held worker starts go on; ``workers`` are the ones they then started (kept
    referenced here, so a worker left running is not ended by its pipe being garbage-collected)."""

    workers: list[Any]

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]


@pytest.fixture
def held_spawns(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldSpawns]:
    """Worker starts block until the returned event is set (then start for real)."""
    release = HeldSpawns()
    release.workers = []
    real_spawn = pool_module.spawn_worker

    def held(*args: Any) -> Any:
        if not release.wait(120):
            raise RuntimeError("the test never released the worker start")
        worker = real_spawn(*args)
        release.workers.append(worker)
        return worker

    monkeypatch.setattr(pool_module, "spawn_worker", held)
    yield release
    release.set()


def _health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=30).json()["verifier_pool"]


def _live_verifiers() -> set[int]:
    """Worker processes of this test process still running (``active_children`` also reaps the dead)."""
    return {p.pid for p in multiprocessing.active_children() if p.name == "math-verifier" and p.pid}


def test_workers_start_with_the_first_answer_that_needs_one(held_spawns: HeldSpawns) -> None:
    before = _live_verifiers()
    server = MathServer(config=MathConfig(pool_size=1))
    with start_in_thread(server.build_app()) as running, ThreadPoolExecutor(1) as background:
        url = running.url
        for n in range(5):  # plain answers: compared in the server, no worker started
            plain = httpx.post(f"{url}/verify", json=verify_body(f"\\boxed{{{n}}}", str(n)), timeout=30).json()
            assert plain["reward"] == 1.0 and plain["failure_kind"] is None
        pool = _health(url)
        assert (pool["started"], pool["starting"], pool["live_workers"]) == (False, False, 0)
        assert not _live_verifiers() - before
        latex = background.submit(
            httpx.post, f"{url}/verify", json=verify_body("\\boxed{\\sqrt{4}}", "2"), timeout=120
        )
        deadline = time.monotonic() + 30
        while not _health(url)["started"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _health(url)["starting"] is True and not latex.done(), "it waits for a warm worker"
        plain = httpx.post(f"{url}/verify", json=verify_body("\\boxed{7}", "7"), timeout=30).json()
        assert plain["reward"] == 1.0, "plain answers are still served meanwhile"
        held_spawns.set()
        answer = latex.result(timeout=120).json()
        assert answer["reward"] == 1.0 and answer["failure_kind"] is None
        pool = wait_for_pool(url)
        assert pool["live_workers"] == 1 and pool["start_failures"] == 0 and pool["checks"] >= 1


def test_a_pool_that_cannot_start_names_the_reason() -> None:
    async def run() -> None:
        pool = VerifierPool(2, timeout_s=1.0, start_method="no-such-start-method")
        await pool.start()
        with pytest.raises(RuntimeError, match="could not start any worker .*no-such-start-method"):
            await pool.check("2", "\\sqrt{4}")
        with pytest.raises(RuntimeError, match="could not start any worker"):
            await pool.wait_started()
        assert pool.stats.start_failures == 2 and pool.describe()["starting"] is False
        await pool.close()

    asyncio.run(run())


def test_workers_that_only_start_slowly_are_retried_not_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine a worker can miss its warm-up deadline: that is retried, not a broken pool."""
    real_spawn = pool_module.spawn_worker
    lock, starts = threading.Lock(), []

    def first_two_time_out(*args: Any) -> Any:
        with lock:
            starts.append(1)
            if len(starts) <= 2:  # the initial start of both workers: a deadline nothing can meet
                monkeypatch.setattr(worker_process, "STARTUP_TIMEOUT_S", 0.0)
            else:
                monkeypatch.setattr(worker_process, "STARTUP_TIMEOUT_S", 60.0)
            return real_spawn(*args)

    monkeypatch.setattr(pool_module, "spawn_worker", first_two_time_out)

    async def run() -> None:
        pool = VerifierPool(2, timeout_s=10.0)
        await pool.start()
        outcome = await pool.check("2", "\\sqrt{4}")
        assert (outcome.status, outcome.correct) == ("ok", True)
        await pool.wait_started()
        assert pool.stats.start_failures == 2 and pool.stats.restarts >= 1 and pool.pids
        await pool.close()

    asyncio.run(run())


def test_stopping_the_server_mid_start_leaves_no_worker_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    real_spawn = pool_module.spawn_worker

    def held_until_closed(start_method: str, memory_mb: Any, abandon: threading.Event | None = None) -> Any:
        """A worker start that stays 'starting' (its process alive) until the pool gives it up: warm
        workers start in a tenth of a second now, too fast to stop the server between the two."""
        worker = real_spawn(start_method, memory_mb, abandon)
        if abandon is not None and abandon.wait(30):
            worker.process.kill()
            worker.process.join(5)
            worker.conn.close()
            raise worker_process.StartAbandoned
        return worker

    monkeypatch.setattr(pool_module, "spawn_worker", held_until_closed)
    before = _live_verifiers()
    server = MathServer(config=MathConfig(pool_size=2))
    running = start_in_thread(server.build_app())
    body = verify_body("\\boxed{\\sqrt{9}}", "3")
    asker = threading.Thread(target=_post_ignoring_errors, args=(f"{running.url}/verify", body), daemon=True)
    asker.start()  # starts the workers, then waits for one
    deadline = time.monotonic() + 30
    while len(_live_verifiers() - before) < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
    warming = _live_verifiers() - before
    assert len(warming) == 2 and _health(running.url)["starting"] is True
    running.stop()
    deadline = time.monotonic() + 30
    while warming & _live_verifiers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not warming & _live_verifiers()
    asker.join(30)


def _post_ignoring_errors(url: str, body: dict[str, Any]) -> None:
    try:
        httpx.post(url, json=body, timeout=60)
    except httpx.HTTPError:
        pass  # the server went away: expected

"""The collector's HTTP client: connections to each host stay within the open-file budget, and are reused."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from gym_bridge.collect import ClientPool
from gym_bridge.serving.retry import RetryPolicy, post_json
from gym_bridge.serving.uvicorn_thread import start_in_thread


class ConnectionCounter:
    """An ASGI app answering ``{}`` after a short pause; records the client port of every request."""

    def __init__(self) -> None:
        self.ports: set[int] = set()
        self.requests = 0
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        while (await receive()).get("more_body"):
            pass
        with self._lock:
            self.ports.add(scope["client"][1])
            self.requests += 1
        await asyncio.sleep(0.01)  # keeps requests in flight together, so the pool must open several
        body = json.dumps({}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _post_all(urls: list[str], workers: int, requests: int, cap: int, hosts: int) -> None:
    async def run() -> None:
        pool = ClientPool(workers, cap, hosts)
        todo = iter(range(requests))

        async def worker(i: int) -> None:
            for n in todo:
                url = urls[n % len(urls)]
                await post_json(pool.for_worker(i), url + "/x", {"n": n}, target="env", policy=RetryPolicy())

        try:
            await asyncio.gather(*(worker(i) for i in range(workers)))
        finally:
            await pool.aclose()

    asyncio.run(run())


def test_connections_per_host_stay_within_the_budget_and_are_reused() -> None:
    counters = [ConnectionCounter(), ConnectionCounter()]
    with start_in_thread(counters[0]) as a, start_in_thread(counters[1]) as b:
        _post_all([a.url, b.url], workers=40, requests=400, cap=16, hosts=2)
    for counter in counters:
        assert counter.requests == 200
        assert 2 <= len(counter.ports) <= 8  # 16 connections shared by 2 hosts; kept alive, not redialled


def test_few_workers_get_a_connection_each() -> None:
    counter = ConnectionCounter()
    with start_in_thread(counter) as server:
        _post_all([server.url], workers=6, requests=60, cap=10_000, hosts=1)
    assert counter.requests == 60 and len(counter.ports) == 6

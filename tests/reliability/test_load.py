"""Load: 2,000 requests in flight at once against one resources server, every one answered correctly.

Each server runs in its own process (as in production) and the client holds 2,000 open connections
over loopback, so all requests really are concurrent. Correctness is checked per request, not just
status: the math verifier's reward for each answer, and for tool_use each session's own store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from .bodies import math_call
from .procs import cli, serving

REQUESTS = 2000
CLIENTS = 40
"""httpx's pool bookkeeping grows with the square of its connections: 40 clients of 50 each."""

Call = tuple[str, dict[str, Any], dict[str, str]]  # path, JSON body, headers


async def fire(url: str, calls: list[Call]) -> list[httpx.Response | BaseException]:
    """Send every call at the same moment (each waits until all are ready); answers in call order."""
    per_client = -(-len(calls) // CLIENTS)
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    clients = [
        httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0, verify=False) for _ in range(CLIENTS)
    ]
    started = asyncio.Event()
    ready = 0

    async def one(i: int, path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        nonlocal ready
        ready += 1
        if ready == len(calls):
            started.set()
        await started.wait()  # release all requests together
        return await clients[i % CLIENTS].post(path, json=body, headers=headers)

    try:
        return await asyncio.gather(*(one(i, *call) for i, call in enumerate(calls)), return_exceptions=True)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def failures(results: list[httpx.Response | BaseException]) -> list[str]:
    out = []
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            out.append(f"#{i}: {type(r).__name__}: {r}")
        elif r.status_code != 200:
            out.append(f"#{i}: HTTP {r.status_code} {r.text[:200]}")
    return out


def assert_all_ok(results: list[httpx.Response | BaseException]) -> list[dict[str, Any]]:
    bad = failures(results)
    assert not bad, f"{len(bad)} of {len(results)} failed: {bad[:5]}"
    return [r.json() for r in results]  # type: ignore[union-attr]


def test_math_verify_2000_concurrent():
    calls = [math_call(i) for i in range(REQUESTS)]
    with serving(cli("serve", "math", "--port", "0")) as url:
        results = asyncio.run(fire(url, [("/verify", body, {}) for body, _ in calls]))
        health = httpx.get(url + "/health", timeout=30)
    rewards = [answer["reward"] for answer in assert_all_ok(results)]
    assert rewards == [expected for _, expected in calls]
    assert health.status_code == 200 and health.json()["sessions"] == REQUESTS  # one session per client


def store(i: int) -> dict[str, Any]:
    """Session ``i``'s own store: product P0 with ``i`` in stock, and ``i % 5`` other products."""
    product = {"name": "Mug", "category": "kitchen", "price": 2.5, "stock": i}
    return {"products": {f"P{k}": {**product, "stock": i + k} for k in range(1 + i % 5)}}


def test_tool_use_2000_sessions_seeded_concurrently_each_keeps_its_own_store():
    """2,000 sessions seeded at once, each with its own store: every seeding is answered for its own
    store, and a sample of sessions afterwards sees exactly the store it was given."""
    # Made-up ids (which also keep the shared clients' jars out of it): the server must not adopt them.
    made_up = [{"cookie": f"gym_bridge_session=load-{i}"} for i in range(REQUESTS)]
    calls = [("/seed_session", {"initial_state": store(i)}, cookie) for i, cookie in enumerate(made_up)]
    with serving(cli("serve", "tool_use", "--port", "0")) as url:
        seeded = asyncio.run(fire(url, calls))
        answers = assert_all_ok(seeded)
        issued = [r.cookies["gym_bridge_session"] for r in seeded]  # type: ignore[union-attr]
        assert len(set(issued)) == REQUESTS and not any(c.startswith("load-") for c in issued)
        sample = range(0, REQUESTS, 97)
        with httpx.Client(base_url=url, timeout=30) as client:
            stocks = [
                client.post(
                    "/get_product", json={"product_id": "P0"}, headers={"cookie": f"gym_bridge_session={issued[i]}"}
                ).json()["stock"]
                for i in sample
            ]
            health = client.get("/health")
    assert [a["products"] for a in answers] == [1 + i % 5 for i in range(REQUESTS)]
    assert stocks == list(sample)
    assert health.status_code == 200 and health.json()["sessions"] == REQUESTS

"""NeMo Gym 0.7.0's typed Environment Server sessions against a hostile or unlucky client, over real HTTP.

The findings of round four, each failing on the code before its fix:

* a ``/close_session`` that arrived while the seed of its id was still running released the session's
  resources (:meth:`ResourcesServer.close_resources_session`) before the seed had made them; the seed then
  failed as closed and dropped the session, and what it made (a sandbox) was never released;
* two ``/close_session`` of one id at once (a retry, or a close racing the Environment Server's own) both
  released the session: a release that is not idempotent raised, and the idempotent close answered 500;
* a typed session the store dropped (idle past ``session_ttl_s``, pushed out past ``max_sessions``, also
  while its seed ran) was never released: only ``/close_session`` released, and its id no longer found it;
* a repeated seed of such an id got a fresh session under it (the state the rollout's calls made, gone
  without a word; ``/verify`` then scored the fresh store); it is now a 409 saying the state is lost;
* a seed whose body was on the way while cookie-less requests came had its fresh session pushed out
  before it ran: the seed answered 200 for a session no later call could find, and its bytes stayed
  counted against ``max_session_bytes`` for good (legacy and typed seeds alike).

The attacks that held are the cases at the end (``test_*_held``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.server.test_hostile_sessions import Stateless

TOOL_USE_DATA = Path(__file__).resolve().parents[2] / "resources_servers" / "tool_use" / "data" / "example.jsonl"


class NoArgs(BaseModel):
    pass


class Sandboxed(ResourcesServer):
    """Each seed starts a "sandbox" (0.3 s); ``/close_session`` releases it (0.2 s; a second release raises)."""

    name = "sandboxed"
    reverify_mode = "unsupported"
    seed_s = 0.3
    hold = 0
    """Seeds wait (up to 10 s) until this many have started: seeds that overlap however slow the machine."""

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(settings)
        self.live: set[str] = set()
        self.releases = 0
        self.started = threading.Event()
        self.seeds = 0

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        self.seeds += 1
        self.started.set()
        for _ in range(1000):
            if self.seeds >= self.hold:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(self.seed_s)
        box = uuid.uuid4().hex
        self.live.add(box)
        session.state.update(box=box, steps=0)
        return {}

    async def close_resources_session(self, session: Session) -> None:
        await asyncio.sleep(0.2)
        self.releases += 1
        if "box" in session.state:
            self.live.remove(session.state["box"])  # KeyError when it was released already

    @tool
    async def step(self, args: NoArgs, session: Session) -> dict[str, Any]:
        """One step of work in the sandbox."""
        if "box" not in session.state:
            raise HTTPException(409, "no sandbox in this session: seed it first")
        session.state["steps"] += 1
        return {"steps": session.state["steps"]}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": float(session.state.get("steps", 0) >= 3)})


@pytest.fixture
def sandboxed() -> Iterator[tuple[Sandboxed, str]]:
    server = Sandboxed(ServerSettings(max_sessions=20))
    with start_in_thread(server.build_app()) as running:
        yield server, running.url


def typed_seed(rid: str | None = None) -> dict[str, Any]:
    return {"resources_session_id": rid or f"rs-{uuid.uuid4().hex}", "episode_id": {"rollout_id": uuid.uuid4().hex},
            "task_id": {"taskset": "t", "task_id": "0"}, "task_data": {}}  # fmt: skip


def close_body(seed: dict[str, Any]) -> dict[str, Any]:
    return {"resources_session_id": seed["resources_session_id"], "episode_id": seed["episode_id"]}


def typed_verify(seed: dict[str, Any]) -> dict[str, Any]:
    flat = {"responses_create_params": {"input": "q"}, "response": {"output": []}}
    return {"episode_id": seed["episode_id"], "task_id": seed["task_id"], "verification_input": flat}


# --------------------------------------------------------------------------- findings


def test_a_close_during_its_seed_releases_what_the_seed_made(sandboxed) -> None:
    server, url = sandboxed

    async def race() -> tuple[httpx.Response, httpx.Response]:
        seed = typed_seed()
        async with httpx.AsyncClient(base_url=url, timeout=30) as env:
            seeding = asyncio.ensure_future(env.post("/seed_session", json=seed))
            assert await asyncio.to_thread(server.started.wait, 10)  # the seed is starting its sandbox
            closed = await env.post("/close_session", json=close_body(seed))
            return closed, await seeding

    closed, seeded = asyncio.run(race())
    assert closed.status_code == 200, closed.text
    assert seeded.status_code == 409 and "closed" in seeded.json()["detail"], seeded.text
    assert server.live == set() and server.releases == 1  # the sandbox the seed started is released
    assert len(server.sessions) == 0 and server.health()["resources_sessions"] == 0


def test_two_closes_at_once_release_the_session_once_and_both_answer_200(sandboxed) -> None:
    server, url = sandboxed

    async def twice() -> list[httpx.Response]:
        seed = typed_seed()
        async with httpx.AsyncClient(base_url=url, timeout=30) as env:
            assert (await env.post("/seed_session", json=seed)).status_code == 200
            return list(await asyncio.gather(*(env.post("/close_session", json=close_body(seed)) for _ in range(3))))

    answers = asyncio.run(twice())
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert server.live == set() and server.releases == 1


def test_a_session_pushed_out_while_it_seeds_is_released_when_the_seed_ends() -> None:
    """Four seeds at once on a server with room for two: the two pushed out answer 409 (their session is
    gone; they answered 200 for it before), and what their seeds made is released once they end."""
    server = Sandboxed(ServerSettings(max_sessions=2))
    server.hold = 4

    async def burst(url: str) -> list[httpx.Response]:
        async def one() -> httpx.Response:
            async with httpx.AsyncClient(base_url=url, timeout=30) as env:
                return await env.post("/seed_session", json=typed_seed())

        return list(await asyncio.gather(*(one() for _ in range(4))))  # 4 seeding at once, room for 2

    with start_in_thread(server.build_app()) as running:
        answers = asyncio.run(burst(running.url))
        assert sorted(a.status_code for a in answers) == [200, 200, 409, 409], [a.text for a in answers]
        assert all("lost" in a.json()["detail"] for a in answers if a.status_code == 409)
        deadline = time.monotonic() + 10
        while server.releases < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.sessions) == 2 and len(server.live) == 2 and server.releases == 2
        assert server.sessions.nbytes == sum(s.nbytes for s in server.sessions._sessions.values())


def drop_the_first(url: str, how: str) -> None:
    """Make the store drop the one session seeded so far: wait past its TTL (1 s), or seed two more (max 2)."""
    if how == "expired":
        time.sleep(1.3)
    else:
        for _ in range(2):
            assert httpx.post(url + "/seed_session", json=typed_seed()).status_code == 200


@pytest.mark.parametrize("how", ["expired", "pushed out"])
def test_a_repeated_seed_of_a_dropped_session_is_refused_not_answered_with_a_fresh_one(how: str) -> None:
    """"A repeated seed finds the session it made": once the store dropped it, the repeat (a retry, an
    Environment Server resuming the episode) got a new session under the same id, its store as the task
    starts: the work done was gone without a word, and /verify scored the fresh store."""
    settings = ServerSettings(session_ttl_s=1.0) if how == "expired" else ServerSettings(max_sessions=2)
    server = Sandboxed(settings)
    server.seed_s = 0.0
    seed = typed_seed()
    with start_in_thread(server.build_app()) as running, httpx.Client(base_url=running.url, timeout=30) as env:
        assert env.post("/seed_session", json=seed).status_code == 200
        for _ in range(3):
            assert env.post("/step", json={}).status_code == 200
        drop_the_first(running.url, how)
        env.cookies.clear()
        again = env.post("/seed_session", json=seed)
        assert again.status_code == 409 and "lost" in again.json()["detail"], again.text
        assert env.post("/close_session", json=close_body(seed)).status_code == 200  # still closes (idempotent)
        stateless = Stateless(settings)  # a session that held nothing loses nothing: its repeat is served
        with start_in_thread(stateless.build_app()) as plain, httpx.Client(base_url=plain.url, timeout=30) as math:
            seed = typed_seed()
            assert math.post("/seed_session", json=seed).status_code == 200
            drop_the_first(plain.url, how)
            math.cookies.clear()
            assert math.post("/seed_session", json=seed).status_code == 200


@pytest.mark.parametrize("kind", ["legacy", "typed"])
def test_a_seed_in_flight_is_not_pushed_out_by_cookieless_requests(kind: str) -> None:
    """Every cookie-less request opens a fresh session before its body is read. Three seeds whose bodies were
    on the way while twenty cookie-less requests came (max_sessions=4) had their sessions pushed out of the
    fresh tier: each seed answered 200 for a session no later call could find (its next call: 409, its
    work: lost), and its state's bytes stayed counted against max_session_bytes for good."""
    from gym_bridge.rollout.envs import load_server_class

    server = load_server_class("tool_use")(ServerSettings(max_sessions=4))
    row = json.loads(TOOL_USE_DATA.read_text().splitlines()[0])

    async def run(url: str) -> list[tuple[int, int]]:
        async def seed(started: asyncio.Event) -> tuple[int, int]:
            body = json.dumps(row if kind == "legacy" else {**typed_seed(), "task_data": row}).encode()

            async def late_body() -> Any:  # the head now, the body once the other requests came
                started.set()
                await asyncio.sleep(1.0)
                yield body

            async with httpx.AsyncClient(base_url=url, timeout=30) as rollout:
                headers = {"content-type": "application/json", "content-length": str(len(body))}
                seeded = await rollout.post("/seed_session", content=late_body(), headers=headers)
                cart = await rollout.post("/view_cart", json={})
                return seeded.status_code, cart.status_code

        events = [asyncio.Event() for _ in range(3)]
        seeds = [asyncio.ensure_future(seed(e)) for e in events]
        for e in events:
            await e.wait()
        await asyncio.sleep(0.1)  # the seeds' heads are in: their fresh sessions are open
        async with httpx.AsyncClient(base_url=url, timeout=30) as stranger:
            for i in range(20):
                stranger.cookies.clear()
                await stranger.post("/verify", json={"junk": i})
        return list(await asyncio.gather(*seeds))

    with start_in_thread(server.build_app()) as running:
        outcomes = asyncio.run(run(running.url))
    assert outcomes == [(200, 200)] * 3, outcomes
    live = list(server.sessions._sessions.values()) + list(server.sessions._fresh.values())
    assert server.sessions.nbytes == sum(s.nbytes for s in live), (server.sessions.nbytes, len(live))


# --------------------------------------------------------------------------- attacks that held


def test_concurrent_retries_of_one_seed_make_one_session_held(sandboxed) -> None:
    """Ten cookie-less seeds of one id at once (an Environment Server retrying): one sandbox, one cookie."""
    server, url = sandboxed
    seed = typed_seed()

    async def burst() -> list[httpx.Response]:
        async def one() -> httpx.Response:
            async with httpx.AsyncClient(base_url=url, timeout=30) as fresh:
                return await fresh.post("/seed_session", json=seed)

        return list(await asyncio.gather(*(one() for _ in range(10))))

    answers = asyncio.run(burst())
    assert {a.status_code for a in answers} == {200}
    assert len({a.cookies[SESSION_COOKIE] for a in answers}) == 1
    assert len(server.live) == 1 and len(server.sessions) == 1


def test_a_closed_sessions_cookie_scores_nothing_and_changes_nothing_held(sandboxed) -> None:
    server, url = sandboxed
    seed = typed_seed()
    with httpx.Client(base_url=url, timeout=30) as env:
        assert env.post("/seed_session", json=seed).status_code == 200
        for _ in range(3):
            assert env.post("/step", json={}).status_code == 200
        assert env.post("/verify", json=typed_verify(seed)).json()["reward"] == 1.0
        assert env.post("/close_session", json=close_body(seed)).status_code == 200
        after = env.post("/verify", json=typed_verify(seed))  # the cookie now names nothing
        assert after.status_code == 409 and "no Environment Server session" in after.json()["detail"], after.text
        again = env.post("/seed_session", json=seed)
        assert again.status_code == 409 and "closed" in again.json()["detail"]
        assert env.post("/close_session", json=close_body(seed)).status_code == 200  # idempotent


@pytest.mark.parametrize(
    "cookie",
    ["", "x" * 22, "A" * 4096, "../../etc", "\u00e9" * 10],
    ids=["empty", "guessed", "huge", "path", "latin-1"],
)
def test_a_forged_cookie_reaches_no_typed_session_held(sandboxed, cookie: str) -> None:
    server, url = sandboxed
    seed = typed_seed()
    with httpx.Client(base_url=url, timeout=30) as env:
        assert env.post("/seed_session", json=seed).status_code == 200
        for _ in range(3):
            env.post("/step", json={})
    header = f"{SESSION_COOKIE}={cookie}".encode("latin-1", "replace")
    forged = httpx.post(url + "/verify", json=typed_verify(seed), headers={"cookie": header})
    assert forged.status_code == 409, forged.text  # never the seeded session's reward 1
    step = httpx.post(url + "/step", json={}, headers={"cookie": header})
    assert step.status_code == 409, step.text
    assert server.sessions.get(env.cookies[SESSION_COOKIE]).state["steps"] == 3  # type: ignore[union-attr]


def test_sessions_the_store_drops_have_their_resources_released(sandboxed) -> None:
    """Sixty seeds on a server of max_sessions=20: the forty sessions pushed out of the store can never be
    reached again, and their sandboxes were never released (only /close_session released)."""
    server, url = sandboxed
    server.seed_s = 0.0
    with httpx.Client(base_url=url, timeout=30) as env:
        for _ in range(60):
            env.cookies.clear()
            assert env.post("/seed_session", json=typed_seed()).status_code == 200
        health = env.get("/health").json()
    assert health["sessions"] <= 20 and health["resources_sessions"] <= 20, health  # the id map follows the store
    deadline = time.monotonic() + 10
    while len(server.live) > 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(server.live) == 20 and server.releases == 40


@pytest.mark.parametrize(
    "rid",
    ["nul\x00id", "\U0001f600 emoji", "  spaces  ", "../../close_session", "x" * 100_000, "\u202eright-to-left"],
    ids=["nul", "emoji", "spaces", "path", "100k", "bidi"],
)
def test_odd_ids_are_kept_exactly_and_closed_for_good_held(sandboxed, rid: str) -> None:
    server, url = sandboxed
    server.seed_s = 0.0
    seed = typed_seed(rid)
    with httpx.Client(base_url=url, timeout=30) as env:
        seeded = env.post("/seed_session", json=seed)
        assert seeded.status_code == 200 and seeded.json()["resources_session_id"] == rid, seeded.text[:200]
        near = typed_seed(rid + " ")  # a different id, however alike: a session of its own
        env.cookies.clear()
        assert env.post("/seed_session", json=near).status_code == 200
        assert env.post("/close_session", json=close_body(seed)).status_code == 200
        assert env.post("/seed_session", json=seed).status_code == 409
        env.cookies.clear()
        assert env.post("/seed_session", json=near).status_code == 200  # its repeat still finds it
    assert len(server.live) == 1 and server.releases == 1

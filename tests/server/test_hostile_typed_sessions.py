"""NeMo Gym 0.7.0's typed Environment Server sessions against a hostile or unlucky client, over real HTTP.

The findings of round four, each failing on the code before its fix:

* a ``/close_session`` that arrived while the seed of its id was still running released the session's
  resources (:meth:`ResourcesServer.close_resources_session`) before the seed had made them; the seed then
  failed as closed and dropped the session, and what it made (a sandbox) was never released;
* two ``/close_session`` of one id at once (a retry, or a close racing the Environment Server's own) both
  released the session: a release that is not idempotent raised, and the idempotent close answered 500;
* a typed session the store dropped (idle past ``session_ttl_s``, pushed out past ``max_sessions``, also
  while its seed ran) was never released: only ``/close_session`` released, and its id no longer found it.

The attacks that held are the cases at the end (``test_*_held``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread


class NoArgs(BaseModel):
    pass


class Sandboxed(ResourcesServer):
    """Each seed starts a "sandbox" (0.3 s); ``/close_session`` releases it (0.2 s; a second release raises)."""

    name = "sandboxed"
    reverify_mode = "unsupported"
    seed_s = 0.3

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(settings)
        self.live: set[str] = set()
        self.releases = 0

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
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
            await asyncio.sleep(0.1)  # the seed is starting its sandbox
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
    server = Sandboxed(ServerSettings(max_sessions=2))

    async def burst(url: str) -> list[httpx.Response]:
        async def one() -> httpx.Response:
            async with httpx.AsyncClient(base_url=url, timeout=30) as env:
                return await env.post("/seed_session", json=typed_seed())

        return list(await asyncio.gather(*(one() for _ in range(4))))  # 4 seeding at once, room for 2

    with start_in_thread(server.build_app()) as running:
        answers = asyncio.run(burst(running.url))
        assert {a.status_code for a in answers} == {200}
        deadline = time.monotonic() + 10
        while server.releases < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.sessions) == 2 and len(server.live) == 2 and server.releases == 2


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

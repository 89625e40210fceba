"""A hostile client or policy against the session machinery and the protocol layer, over real HTTP.

Each test is a finding of a red-team round that failed on the code before its fix:

* a function call named ``seed_session`` (NeMo Gym's ``simple_agent`` posts every call the model makes to
  ``/<name>`` with the rollout's cookie, and adopts any cookie the answer sets) replaced the seeded state the
  reward is read from, with a legacy body, or with a typed body opened a session of the model's making that
  the rollout then moved into: reward 1 for a cart the model never filled;
* requests without a cookie (each opens a session) pushed live rollouts' sessions out of the store;
* a surrogate written as UTF-8 bytes (``\\xed\\xa0\\x80``; the ``\\ud800`` escape was refused already) was
  a 500 on ``/verify``, ``/seed_session`` and the tools;
* forged ``/aggregate_metrics`` records (an integer too large for a float, numbers whose sum overflows,
  ``usage`` or ``failure_kind`` of the wrong type) were 500s;
* caller-assigned ids of any length were kept whole: closed ids outside every bound, typed sessions' ids
  outside ``max_session_bytes``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gym_bridge.audit.envs.tool_use import BY_OUTCOME, STATE
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.rollout.envs import load_server_class
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

JSON = {"content-type": "application/json"}


def done(text: str = "Done: 2 x P125 are in your cart.") -> dict[str, Any]:
    message = {"id": "msg_0", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return {"id": "resp_0", "created_at": 0.0, "model": "m", "object": "response", "output": [message]}


def typed_seed(task_data: dict[str, Any], rid: str | None = None) -> dict[str, Any]:
    return {
        "resources_session_id": rid or f"resources-session-{uuid.uuid4().hex}",
        "episode_id": {"rollout_id": f"rollout_{uuid.uuid4().hex[:12]}", "attempt": 0},
        "task_id": {"taskset": "gym-bridge:test", "task_id": "0"},
        "task_data": task_data,
    }


class NoArgs(BaseModel):
    pass


class Stateless(ResourcesServer):
    """Keeps nothing per session (as math): its typed sessions hold only their binding."""

    name = "stateless"

    async def verify(self, body: VerifyRequest, session: Any) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": 0.0})


@pytest.fixture
def stateless() -> Iterator[tuple[Stateless, str]]:
    server = Stateless(ServerSettings(max_sessions=20, max_session_bytes=4 * 1024 * 1024))
    with start_in_thread(server.build_app()) as running:
        yield server, running.url


# --------------------------------------------------------------------------- the reward


def test_a_tool_call_named_seed_session_cannot_replace_the_state_the_reward_reads(builtin_url) -> None:
    """The audit's ``call_seed_as_tool``, as NeMo Gym's simple_agent sends it (our agent refuses the name)."""
    url = builtin_url("tool_use")
    forged = {"initial_state": {**STATE, "cart": {"P125": 2}}}  # the cart the task asks for, written directly
    with httpx.Client(base_url=url, timeout=60) as rollout:
        assert rollout.post("/seed_session", json=BY_OUTCOME).status_code == 200
        reseeded = rollout.post("/seed_session", json=forged)
        assert reseeded.status_code == 409 and "already seeded" in reseeded.json()["detail"], reseeded.text
        assert rollout.post("/view_cart", json={}).json()["cart"]["items"] == []
        verdict = rollout.post("/verify", json={**BY_OUTCOME, "response": done()})
        assert verdict.status_code == 200 and verdict.json()["reward"] == 0.0, verdict.text

        # the honest rollout in the same session still pays
        assert rollout.post("/add_to_cart", json={"product_id": "P125", "quantity": 2}).status_code == 200
        assert rollout.post("/verify", json={**BY_OUTCOME, "response": done()}).json()["reward"] == 1.0

    with httpx.Client(base_url=url, timeout=60) as rollout:  # the same call with a typed body: a session of its own
        assert rollout.post("/seed_session", json=BY_OUTCOME).status_code == 200
        side_door = rollout.post("/seed_session", json=typed_seed(forged))  # its answer's cookie would be adopted
        assert side_door.status_code == 409 and "cookie of a session in use" in side_door.json()["detail"]
        assert rollout.post("/verify", json={**BY_OUTCOME, "response": done()}).json()["reward"] == 0.0

    seed = typed_seed({k: v for k, v in BY_OUTCOME.items() if k != "responses_create_params"})
    with httpx.Client(base_url=url, timeout=60) as episode:  # a typed session is not re-seeded by a legacy body either
        assert episode.post("/seed_session", json=seed).status_code == 200
        assert episode.post("/seed_session", json=forged).status_code == 409
        assert episode.post("/view_cart", json={}).json()["cart"]["items"] == []
        assert episode.post("/seed_session", json=seed).status_code == 200  # its own repeat is still idempotent


def test_requests_without_a_cookie_do_not_push_live_sessions_out() -> None:
    """Each cookie-less request opens a session; 50 of them used to evict the rollout's (max_sessions=20)."""
    server = load_server_class("tool_use")(ServerSettings(max_sessions=20))
    with start_in_thread(server.build_app()) as running, httpx.Client(base_url=running.url, timeout=60) as rollout:
        assert rollout.post("/seed_session", json=BY_OUTCOME).status_code == 200
        assert rollout.post("/add_to_cart", json={"product_id": "P125", "quantity": 2}).status_code == 200
        for i in range(50):  # a re-verify of a run, a client that keeps no cookies, or a hostile one
            path, body = ("/verify", {"junk": i}) if i % 2 else ("/view_cart", {})
            assert httpx.post(running.url + path, json=body).status_code in (409, 422)
        cart = rollout.post("/view_cart", json={})
        assert cart.status_code == 200 and cart.json()["cart"]["items"][0]["quantity"] == 2, cart.text
        assert rollout.post("/verify", json={**BY_OUTCOME, "response": done()}).json()["reward"] == 1.0
        assert httpx.get(running.url + "/health").json()["sessions"] <= 2 * 20


def test_a_typed_session_that_keeps_no_state_survives_cookieless_requests(stateless) -> None:
    server, url = stateless
    seed = typed_seed({"x": 1})
    first = httpx.post(url + "/seed_session", json=seed)
    assert first.status_code == 200
    for i in range(50):
        httpx.post(url + "/verify", json={"junk": i})
    again = httpx.post(url + "/seed_session", json=seed)  # no cookie: found by its id, as a retried seed
    assert again.status_code == 200 and again.cookies[SESSION_COOKIE] == first.cookies[SESSION_COOKIE]


class SlowSeed(ResourcesServer):
    """Seeds take 0.4 s (a sandbox starting); the first seed of a task marked ``fail_first`` fails."""

    name = "slow_seed"

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(settings)
        self.failed: set[str] = set()

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        await asyncio.sleep(0.4)
        if body.get("fail_first") and body["fail_first"] not in self.failed:
            self.failed.add(body["fail_first"])
            raise HTTPException(503, "the sandbox did not start")
        session.state["ready"] = True
        return {}

    @tool
    async def peek(self, args: NoArgs, session: Session) -> dict[str, Any]:
        """The session's state."""
        return dict(session.state)

    async def verify(self, body: VerifyRequest, session: Any) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": float(session.state.get("ready", False))})


@pytest.mark.parametrize("first_fails", [False, True])
def test_a_retried_typed_seed_waits_for_the_seed_in_progress(first_fails: bool) -> None:
    """NeMo Gym's Environment Server retries a seed whose answer it lost; the retry came back 200 at once with
    the cookie of a session still seeding (its tools found no state), and 200 for a session whose seed then
    failed and was dropped. It now answers once that seed is done, or seeds anew when that seed failed."""

    async def race(url: str) -> tuple[httpx.Response, httpx.Response, dict[str, Any]]:
        seed = typed_seed({"fail_first": uuid.uuid4().hex} if first_fails else {})
        async with httpx.AsyncClient(base_url=url, timeout=30) as first, httpx.AsyncClient(base_url=url, timeout=30) as retry:
            pending = asyncio.ensure_future(first.post("/seed_session", json=seed))
            await asyncio.sleep(0.1)  # the first seed is in progress
            retried = await retry.post("/seed_session", json=seed)
            state = (await retry.post("/peek", json={})).json()
            return await pending, retried, state

    with start_in_thread(SlowSeed().build_app()) as running:
        original, retried, state = asyncio.run(race(running.url))
    assert original.status_code == (503 if first_fails else 200), original.text
    assert retried.status_code == 200, retried.text
    assert state == {"ready": True}  # the retry's cookie names a seeded session


# --------------------------------------------------------------------------- bodies


SURROGATE_BYTES = b"\xed\xa0\x80"  # U+D800 as UTF-8 would write it, were it allowed


@pytest.mark.parametrize("where", ["math /verify", "tool_use /seed_session", "tool_use tool"])
def test_a_surrogate_encoded_as_bytes_is_a_400_not_a_500(builtin_url, where: str) -> None:
    name, _, path = where.partition(" ")
    with httpx.Client(base_url=builtin_url(name), timeout=60) as client:
        if name == "math":
            body = json.dumps({"responses_create_params": {"input": "q"}, "response": done("\\boxed{4}"),
                               "expected_answer": "4", "note": "@@"}).encode()  # fmt: skip
        elif path == "/seed_session":
            body = json.dumps({**BY_OUTCOME, "note": "@@"}).encode()
        else:
            assert client.post("/seed_session", json=BY_OUTCOME).status_code == 200
            path, body = "/list_products", b'{"category": "@@"}'
        answer = client.post(path, content=body.replace(b"@@", b"x" + SURROGATE_BYTES), headers=JSON)
        assert answer.status_code == 400 and "surrogate" in answer.json()["detail"], answer.text
        assert client.post(path, content=body.replace(b"@@", "é".encode()), headers=JSON).status_code == 200


def test_a_body_of_millions_of_tiny_containers_is_refused_before_it_is_parsed(builtin_url, stateless) -> None:
    """16 MB of ``[[],[],...]`` held every other request to the server for 16 s while it was parsed (its event
    loop); 4 MB of them (1.4 million lists) took seconds here, and now is refused before the parse."""
    url = builtin_url("math")
    items = 1_400_000
    tiny = b'{"responses_create_params": {"input": "q"}, "response": {"output": [' + b"[]," * items + b"[]]}}"
    started = time.perf_counter()
    refused = httpx.post(url + "/verify", content=tiny, headers=JSON, timeout=120)
    assert refused.status_code == 400 and "arrays and objects" in refused.json()["detail"], refused.text[:300]
    assert time.perf_counter() - started < 5
    # a body with more than the base allowance, at the tens of bytes each real ones spend, is read and scored
    rows = b",".join(b'{"id": "row-%06d", "v": 1}' % i for i in range(150_000))  # 27 bytes each
    real = b'{"responses_create_params": {"input": "q"}, "response": {"output": []}, "rows": [' + rows + b"]}"
    scored = httpx.post(stateless[1] + "/verify", content=real, headers=JSON, timeout=120)
    assert scored.status_code == 200 and scored.json()["reward"] == 0.0, scored.text[:300]


# --------------------------------------------------------------------------- /aggregate_metrics


BIG = "1" + "0" * 400  # a JSON integer Python reads whole, which no float holds


@pytest.mark.parametrize(
    ("records", "status", "detail"),
    [
        (f'[{{"reward": {BIG}}}]', 422, "verify_responses.0.reward: expected a finite number"),
        (f'[{{"reward": 1, "reward_components": {{"a": {BIG}}}}}]', 422,
         "verify_responses.0.reward_components: a: expected a finite number"),
        ('[{"reward": 1.7e308}, {"reward": 1.7e308}]', 422, "verify_responses: numbers too large to aggregate"),
        ('[{"reward": 1, "x": 1.7e308}, {"reward": 1, "x": 1.7e308}]', 422, "numbers too large to aggregate"),
        (f'[{{"reward": 1, "response": {{"usage": {{"input_tokens": {BIG}}}}}}}]', 422,
         "verify_responses.0.response.usage.input_tokens: expected a non-negative integer"),
        ('[{"reward": 1, "response": {"usage": {"output_tokens": "many"}}}]', 422, "usage.output_tokens"),
        ('[{"reward": 1, "response": {"usage": {"input_tokens": NaN}}}]', 422, "usage.input_tokens"),
        ('[{"reward": 1, "response": {"usage": "lots"}}]', 422, "verify_responses.0.response.usage: expected an object"),
        ('[{"reward": 1, "failure_kind": ["x"]}]', 422, "verify_responses.0.failure_kind: expected a string"),
        (f'[{{"reward": 1, "x": {BIG}}}, {{"reward": 0, "x": 2}}]', 200, '"mean/x":2.0'),  # left out, as a NaN
        ('[{"reward": 1, "response": {"usage": {"input_tokens": 3, "output_tokens": 4}}}]', 200, '"num_rollouts":1'),
    ],
)  # fmt: skip
def test_forged_aggregate_records_are_422s_naming_the_field(stateless, records: str, status: int, detail: str) -> None:
    _, url = stateless
    answer = httpx.post(url + "/aggregate_metrics", content=records.encode(), headers=JSON)
    assert answer.status_code == status and detail in answer.text, answer.text[:300]


# --------------------------------------------------------------------------- caller-assigned ids


def test_closed_ids_of_any_length_are_remembered_in_bounded_memory(stateless) -> None:
    server, url = stateless
    long_id = "x" * 1_000_000
    with httpx.Client(base_url=url, timeout=60) as client:
        client.post("/close_session", json={"resources_session_id": "warm-up", "episode_id": {"rollout_id": "r"}})
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(30):
                closed = client.post("/close_session", json={"resources_session_id": f"{i}{long_id}",
                                                             "episode_id": {"rollout_id": "r"}})  # fmt: skip
                assert closed.status_code == 200
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert kept < 3_000_000, f"{kept} bytes kept for 30 closed 1 MB ids"
        late = client.post("/seed_session", json=typed_seed({}, rid=f"29{long_id}"))
        assert late.status_code == 409 and "closed" in late.json()["detail"]  # still remembered as closed
    assert server.health()["closed_resources_sessions"] == 20  # max_sessions of them


def test_typed_sessions_ids_count_against_max_session_bytes(stateless) -> None:
    server, url = stateless
    for i in range(10):  # 10 x 1 MB of ids; the bound is 4 MiB
        seeded = httpx.post(url + "/seed_session", json=typed_seed({}, rid=f"{i}" + "x" * 1_000_000))
        assert seeded.status_code == 200, seeded.text[:200]
    health = server.health()
    assert 3_000_000 < health["session_bytes"] <= 4 * 1024 * 1024, health
    assert health["resources_sessions"] <= 4


# --------------------------------------------------------------------------- attacks that held (regression cases)


def test_methods_other_than_post_on_post_routes_are_405s(stateless) -> None:
    _, url = stateless
    with httpx.Client(base_url=url, timeout=30) as client:
        for path in ("/verify", "/seed_session", "/close_session", "/aggregate_metrics"):
            for method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"):
                answer = client.request(method, path)
                assert answer.status_code == 405 and answer.headers["allow"] == "POST", (method, path)
        assert client.head("/health").status_code == 200


def raw_exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a connection of its own; everything the server answers until it closes it."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",  # CL.TE smuggling
        b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
        b"Content-Length: -1\r\n\r\n{}",
        b"Content-Length: +2\r\n\r\n{}",
    ],
)
def test_ambiguous_body_framing_is_a_400_and_smuggles_no_request(stateless, framing: bytes) -> None:
    server, url = stateless
    sessions = len(server.sessions)
    head = b"POST /seed_session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    smuggled = b"POST /seed_session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    answer = raw_exchange(url, head + framing + smuggled)
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1 ") == 1, answer[:300]
    assert len(server.sessions) == sessions  # neither request reached a route


def test_a_replayed_verify_pays_what_the_first_did_and_changes_nothing(builtin_url) -> None:
    url = builtin_url("tool_use")
    with httpx.Client(base_url=url, timeout=60) as rollout:
        assert rollout.post("/seed_session", json=BY_OUTCOME).status_code == 200
        assert rollout.post("/add_to_cart", json={"product_id": "P125", "quantity": 2}).status_code == 200
        body = {**BY_OUTCOME, "response": done()}
        first, again = (rollout.post("/verify", json=body).json() for _ in range(2))
        assert first["reward"] == again["reward"] == 1.0 and first == again
        assert rollout.post("/view_cart", json={}).json()["cart"]["items"][0]["quantity"] == 2

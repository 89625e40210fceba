"""A large body is validated, and its answer converted, off the event loop on every route, not only ``/verify``.

Finding: commit b12a063 moved ``/verify``'s validation of bodies of ``THREAD_BODY_BYTES`` and more to a worker
thread; ``/seed_session`` (both protocols' task rows), the tool routes (``POST /<tool>``), ``/aggregate_metrics``
and ``/mcp`` (its ``tools/call`` check, the tool's arguments and its answer) still did that work on the event
loop, so one large body held every other session's requests for as long as it took. Now every route goes
through the one helper (:func:`gym_bridge.serving.json_http.off_loop`). As
``tests/server/test_large_verify_bodies.py``: validation is held open until a ``/health`` answer has arrived;
on the event loop ``/health`` could not be answered until validation ended. Ordering, not timing. Over real
HTTP against a server in a thread (uvicorn); the 4xx answers and limits are as before.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, field_validator
from test_large_verify_bodies import Gate

import gym_bridge.serving.server as server_module
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.answers import Answer, ErrorStyle
from gym_bridge.serving.json_body import MAX_JSON_DEPTH
from gym_bridge.serving.json_http import THREAD_BODY_BYTES, JsonApp, Route
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

BIG = THREAD_BODY_BYTES * 2
RPC_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


GATE: Gate | None = None


def _held(value: str) -> str:
    if GATE is not None and value == "hold":
        GATE.hold()
    return value


class Row(BaseModel):
    """A task row (the seed's body): ``key`` "hold" holds validation."""

    key: str
    padding: str = ""

    _hold = field_validator("key")(classmethod(lambda cls, value: _held(value)))


class NoteArgs(BaseModel):
    text: str
    padding: str = ""

    _hold = field_validator("text")(classmethod(lambda cls, value: _held(value)))


class Big(ResourcesServer):
    """Keeps its seed row and each note; a note's answer echoes it (a large answer)."""

    name = "big"
    seed_request_model = Row

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["row"] = len(body.get("padding", ""))
        return {"kept": session.state["row"]}

    @tool
    async def note(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Keep a note; answer with it."""
        return {"text": args.text, "padding": args.padding}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": 1.0})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = ServerSettings(max_body_bytes=4 * 1024 * 1024, expose_tools_over_mcp=True)
    with start_in_thread(Big(settings).build_app()) as running:
        yield running.url


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    global GATE
    GATE = Gate()
    parse = server_module.parse_aggregate_request

    def held_parse(body: Any) -> Any:  # /aggregate_metrics checks its records itself: hold that check
        if isinstance(body, dict) and body.get("hold"):
            assert GATE is not None
            GATE.hold()
        return parse(body)

    monkeypatch.setattr(server_module, "parse_aggregate_request", held_parse)
    try:
        yield GATE
    finally:
        GATE.health_answered.set()  # never leave a validation waiting
        GATE = None


def typed_seed(task_data: dict[str, Any]) -> dict[str, Any]:
    return {"resources_session_id": f"rs-{uuid.uuid4().hex}", "episode_id": {"rollout_id": uuid.uuid4().hex},
            "task_id": {"taskset": "t", "task_id": "0"}, "task_data": task_data}  # fmt: skip


def mcp_headers(url: str) -> dict[str, str]:
    answer = httpx.post(f"{url}/seed_session", json=typed_seed({"key": "k"}), timeout=30)
    assert answer.status_code == 200, answer.text
    return {**RPC_HEADERS, **answer.json()["resources_tools"]["headers"]}


def mcp_call(arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "note", "arguments": arguments}}


def legacy_seed(url: str, key: str, size: int) -> httpx.Response:
    return httpx.post(f"{url}/seed_session", json={"key": key, "padding": "x" * size}, timeout=60)


def resources_seed(url: str, key: str, size: int) -> httpx.Response:
    return httpx.post(f"{url}/seed_session", json=typed_seed({"key": key, "padding": "x" * size}), timeout=60)


def tool_call(url: str, key: str, size: int) -> httpx.Response:
    return httpx.post(f"{url}/note", json={"text": key, "padding": "x" * size}, timeout=60)


def aggregate(url: str, key: str, size: int) -> httpx.Response:
    records = [{"reward": 1.0, "response": {"note": "x" * size}}]
    return httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": records, "hold": key == "hold"}, timeout=60)


def over_mcp(url: str, key: str, size: int) -> httpx.Response:
    headers = mcp_headers(url)
    return httpx.post(f"{url}/mcp", json=mcp_call({"text": key, "padding": "x" * size}), headers=headers, timeout=60)


ROUTES: dict[str, Callable[[str, str, int], httpx.Response]] = {
    "seed_session (legacy)": legacy_seed,
    "seed_session (typed)": resources_seed,
    "tool": tool_call,
    "aggregate_metrics": aggregate,
    "mcp tools/call": over_mcp,
}


def check_answer(route: str, reply: httpx.Response, key: str, size: int) -> None:
    assert reply.status_code == 200, reply.text
    content = reply.json()
    if route.startswith("seed_session (legacy)"):
        assert content["kept"] == size
    elif route == "tool":
        assert content == {"text": key, "padding": "x" * size}
    elif route == "aggregate_metrics":
        assert content["agent_metrics"]["mean/reward"] == 1.0, content
    elif route == "mcp tools/call":
        assert len(content["result"]["structuredContent"]["padding"]) == size, str(content)[:300]


@pytest.mark.parametrize("route", list(ROUTES))
def test_health_is_answered_while_a_large_body_is_validated(url: str, gate: Gate, route: str) -> None:
    answers: dict[str, httpx.Response] = {}

    def post() -> None:
        answers["big"] = ROUTES[route](url, "hold", BIG)

    poster = threading.Thread(target=post)
    poster.start()
    try:
        assert gate.health_while_held(url).status_code == 200
        assert "big" not in answers  # the big request is still being validated
    finally:
        poster.join(60)
    assert gate.seen_during_validation is True, f"/health waited for the large {route} body's validation"
    check_answer(route, answers["big"], "hold", BIG)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("size", [10, BIG])
def test_small_and_large_bodies_are_answered_alike(url: str, route: str, size: int) -> None:
    check_answer(route, ROUTES[route](url, "fine", size), "fine", size)


@pytest.mark.parametrize("size", [0, BIG])
def test_a_bad_field_is_still_a_422_naming_it_small_or_large(url: str, size: int) -> None:
    padding = "x" * size
    reply = httpx.post(f"{url}/seed_session", json={"key": 1, "padding": padding}, timeout=60)
    assert reply.status_code == 422 and reply.json()["errors"][0]["loc"] == ["body", "key"], reply.text
    reply = httpx.post(f"{url}/seed_session", json=typed_seed({"key": 1, "padding": padding}), timeout=60)
    assert reply.status_code == 422 and reply.json()["errors"][0]["loc"] == ["body", "task_data", "key"], reply.text
    reply = httpx.post(f"{url}/note", json={"text": 1, "padding": padding}, timeout=60)
    assert reply.status_code == 422 and reply.json()["errors"][0]["loc"] == ["body", "text"], reply.text
    records = [{"reward": "1", "response": {"note": padding}}]
    reply = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": records}, timeout=60)
    assert reply.status_code == 422 and "verify_responses.0.reward" in reply.text, reply.text
    reply = httpx.post(f"{url}/mcp", json=mcp_call({"text": 1, "padding": padding}), headers=mcp_headers(url), timeout=60)
    assert reply.status_code == 200 and reply.json()["result"]["isError"] is True, reply.text
    assert "HTTP 422 from POST /note" in reply.text and "text" in reply.text, reply.text
    reply = httpx.post(f"{url}/mcp", json=mcp_call(["not", "an", "object", padding]), headers=mcp_headers(url), timeout=60)
    assert reply.json()["error"]["message"].startswith("tools/call: params.arguments"), reply.text


def test_a_body_over_the_limit_is_still_a_413(url: str) -> None:
    for route in ("seed_session", "note", "mcp"):
        reply = httpx.post(f"{url}/{route}", json={"text": "x" * (5 * 1024 * 1024)}, headers=RPC_HEADERS, timeout=60)
        assert reply.status_code == 413, (route, reply.text)


def test_a_typed_seeds_repeat_with_a_large_row_is_the_same_session(url: str) -> None:
    """The task row is checked before the seed's lookups (in a worker thread when large): a repeat still finds
    the session of its id, and a new id with a bad row is a 422 that binds nothing."""
    seed = typed_seed({"key": "k", "padding": "x" * BIG})
    first = httpx.post(f"{url}/seed_session", json=seed, timeout=60)
    again = httpx.post(f"{url}/seed_session", json=seed, timeout=60)
    assert first.status_code == again.status_code == 200, again.text
    assert first.cookies["gym_bridge_session"] == again.cookies["gym_bridge_session"]
    bad = {**seed, "resources_session_id": f"rs-{uuid.uuid4().hex}", "task_data": {"key": 1, "padding": "x" * BIG}}
    assert httpx.post(f"{url}/seed_session", json=bad, timeout=60).status_code == 422
    bad["task_data"] = {"key": "k"}
    assert httpx.post(f"{url}/seed_session", json=bad, timeout=60).status_code == 200  # the 422 bound nothing


def test_a_large_bodys_refusal_is_answered_while_its_validation_fails(url: str, gate: Gate) -> None:
    """A large tool call that fails validation (a validator raising after a held look) is a 422 naming the
    field, and ``/health`` is answered meanwhile (the errors of a large body are rendered off the loop too)."""
    answers: dict[str, httpx.Response] = {}
    stray = {f"stray_{i}": i for i in range(20_000)}  # extra keys are kept: no error each, one bad field

    def post() -> None:
        answers["big"] = httpx.post(f"{url}/note", json={"text": "hold", "padding": 7, **stray}, timeout=60)

    poster = threading.Thread(target=post)
    poster.start()
    try:
        assert gate.started.wait(30), "validation never started"
        assert httpx.get(f"{url}/health", timeout=60).status_code == 200
        gate.health_answered.set()
    finally:
        poster.join(60)
    assert gate.seen_during_validation is True
    reply = answers["big"]
    assert reply.status_code == 422 and reply.json()["errors"][0]["loc"] == ["body", "padding"], reply.text[:300]


@pytest.mark.parametrize(
    ("tail", "status", "detail"),
    [
        ('"\\ud800"}', 400, "lone UTF-16 surrogate"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "}", 400, "nested deeper"),
        ('"x"', 422, "JSON decode error"),  # unfinished
    ],
)
def test_a_large_bodys_parse_refusals_are_as_a_small_ones(url: str, tail: str, status: int, detail: str) -> None:
    """Parsing a large body (in a worker thread) refuses what it refused on the event loop, as it did."""
    raw = ('{"padding": "' + "x" * BIG + '", "text": ' + tail).encode()
    for route in ("note", "seed_session", "verify", "aggregate_metrics"):
        reply = httpx.post(f"{url}/{route}", content=raw, headers={"content-type": "application/json"}, timeout=60)
        assert reply.status_code == status and detail in reply.text, (route, reply.text[:300])


class HeldErrors(ErrorStyle):
    """Renders a 422 only once a ``/health`` answer has arrived (while the gate holds)."""

    def invalid(self, errors: list[dict[str, Any]], body: Any = None) -> Answer:
        if GATE is not None and isinstance(body, dict) and body.get("text") == "render":
            GATE.hold()
        return super().invalid(errors, body)


def test_health_is_answered_while_a_large_bodys_422_is_rendered(gate: Gate) -> None:
    """A 422 of a large body lists as many errors as it holds faults (500,000 stray keys took 8 s to render on
    the event loop): it is rendered in the worker thread too."""

    async def health(_: None, __: Any) -> dict[str, Any]:
        return {"status": "ok"}

    async def note(args: NoteArgs, _: Any) -> dict[str, Any]:
        return {"text": args.text}

    routes = [Route("GET", "/health", health, open=True), Route("POST", "/note", note, body=NoteArgs)]
    answers: dict[str, httpx.Response] = {}
    with start_in_thread(JsonApp(routes, title="held", errors=HeldErrors())) as running:

        def post() -> None:
            answers["big"] = httpx.post(f"{running.url}/note", json={"text": "render", "padding": ["x" * BIG]}, timeout=60)

        poster = threading.Thread(target=post)
        poster.start()
        try:
            assert gate.started.wait(30), "the 422 was never rendered"
            assert httpx.get(f"{running.url}/health", timeout=60).status_code == 200
            gate.health_answered.set()
        finally:
            poster.join(60)
    assert gate.seen_during_validation is True, "/health waited for the large body's 422"
    assert answers["big"].status_code == 422 and answers["big"].json()["errors"][0]["loc"] == ["body", "padding"]

"""The hot routes served by the server's front answer byte for byte as FastAPI answers them.

Two copies of one environment run on loopback: one as shipped (``build_app()``: ``/seed_session``,
``/verify`` and the tools served by ``gym_bridge.server._Front``), one with every route through FastAPI
(``build_app(fast_routes=False)``). Each request below, good or bad, goes to both; status, body bytes,
content type and the headers an environment sets must be the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import HTTPException
from pydantic import BaseModel

from gym_bridge.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.server import SESSION_COOKIE, ResourcesServer, ServerSettings, Session, start_in_thread, tool

TOKEN = "fast-token"


class StepArgs(BaseModel):
    step: int


class Note(BaseModel):
    text: str
    score: float = 0.5


class TargetVerifyRequest(VerifyRequest):
    target: int


class EdgeServer(ResourcesServer):
    """Tools and a verifier with every kind of answer a route can give (values, models, errors, crashes)."""

    name = "edge"
    verify_request_model = TargetVerifyRequest

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["count"] = int(body.get("start", 0))
        return {"count": session.state["count"], "échos": body.get("echo")}

    @tool
    async def add(self, args: StepArgs, session: Session) -> dict[str, Any]:
        session.state["count"] = session.state.get("count", 0) + args.step
        return {"count": session.state["count"]}

    @tool
    async def note(self, args: StepArgs, session: Session) -> Any:
        if args.step == 0:
            return Note(text="zero")
        if args.step == 1:
            return [Note(text="one", score=math.nan), {"x": (1, 2)}]
        if args.step == 2:
            return "plain text ünïcode"
        if args.step == 3:
            raise HTTPException(418, "a teapot", headers={"X-Why": "because"})
        if args.step == 4:
            return {"unserializable": object()}
        if args.step == 5:
            Note.model_validate({"text": 5})  # a pydantic error inside the tool: answered 422
        return None

    @tool
    async def explode(self, args: StepArgs, session: Session) -> dict[str, Any]:
        raise ZeroDivisionError("the tool divided by zero")

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        assert isinstance(body, TargetVerifyRequest)
        if body.target == 99:
            return VerifyResponse.model_validate({**dump(body), "reward": math.inf})
        reward = float(session.state.get("count") == body.target)
        return VerifyResponse.model_validate({**dump(body), "reward": reward})


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    settings = ServerSettings(auth_token=TOKEN, max_body_bytes=4096)
    fast, reference = EdgeServer(settings), EdgeServer(settings)
    with start_in_thread(fast.build_app()) as a, start_in_thread(reference.build_app(fast_routes=False)) as b:
        yield a.url, b.url


def verify_body(**extra: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "count"}, "response": {"output": []}, "target": 3, **extra}


def encoded(obj: Any) -> bytes:
    return json.dumps(obj).encode()


REQUESTS: list[tuple[str, bytes, dict[str, str]]] = [
    ("/seed_session", b"", {}),
    ("/seed_session", b"null", {}),
    ("/seed_session", b"{}", {}),
    ("/seed_session", encoded({"start": 2, "echo": "ü\u2028"}), {}),
    ("/seed_session", b"[1, 2]", {}),
    ("/seed_session", b'"text"', {}),
    ("/seed_session", b'{"start": NaN}', {}),
    ("/seed_session", b"{bad", {}),
    ("/seed_session", b'{\n  "start": 1\n  "x": 2}', {}),
    ("/seed_session", b"\xff\xfe\x00garbage", {}),
    ("/seed_session", json.dumps({"start": 1}).encode("utf-16"), {}),
    ("/seed_session", b"start=1", {"content-type": "application/x-www-form-urlencoded"}),
    ("/add", encoded({"step": 2}), {}),
    ("/add", encoded({"step": 1, "extra": True}), {"content-type": "text/plain"}),
    ("/add", encoded({"step": [1]}), {}),
    ("/add", encoded({"step": "1"}), {}),
    ("/add", b"", {}),
    ("/add", b"null", {}),
    ("/add", b"[]", {}),
    ("/add", b"7", {}),
    *[("/note", encoded({"step": i}), {}) for i in range(7)],
    ("/explode", encoded({"step": 1}), {}),
    ("/verify", encoded(verify_body()), {}),
    ("/verify", encoded(verify_body(target=3, big=10**30, small=1e-7, text="日本 \u2028")), {}),
    ("/verify", encoded(verify_body(target="three")), {}),
    ("/verify", encoded(verify_body(target=99)), {}),
    ("/verify", encoded({"responses_create_params": {"input": "x"}, "target": 1}), {}),
    ("/verify", encoded(verify_body(response={"output": "not a list"})), {}),
    ("/verify", encoded(verify_body(responses_create_params={"input": 5, "temperature": "hot"})), {}),
    ("/verify", encoded({k: v for k, v in verify_body().items() if k != "target"}), {}),
    ("/verify", b"", {}),
    ("/verify", b"[1, 2]", {}),
    ("/verify", b'{"target": 3,,}', {}),
    ("/verify", b'{"a": "\\ud800"}', {}),
    ("/verify", encoded(verify_body(padding="x" * 5000)), {}),
    ("/unknown_tool", encoded({"step": 1}), {}),
    ("/verify/", encoded(verify_body()), {}),
]


def exchange(url: str, path: str, body: bytes, headers: dict[str, str], cookie: str | None) -> httpx.Response:
    sent = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json", **headers}
    if cookie:
        sent["cookie"] = f"{SESSION_COOKIE}={cookie}"
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as client:
        return client.post(path, content=body, headers=sent)


@pytest.mark.parametrize(("path", "body", "headers"), REQUESTS, ids=[f"{i}:{r[0]}" for i, r in enumerate(REQUESTS)])
def test_hot_routes_answer_as_fastapi_does(
    urls: tuple[str, str], path: str, body: bytes, headers: dict[str, str]
) -> None:
    fast_url, reference_url = urls
    for cookie in ("fixed-session", None):
        fast = exchange(fast_url, path, body, headers, cookie)
        reference = exchange(reference_url, path, body, headers, cookie)
        assert (fast.status_code, fast.content) == (reference.status_code, reference.content)
        for header in ("content-type", "x-why"):
            assert fast.headers.get(header) == reference.headers.get(header), header
        assert fast.headers.get("location", "").replace(fast_url, "") == reference.headers.get(
            "location", ""
        ).replace(reference_url, "")
        new_session = cookie is None and fast.status_code != 413  # too big: refused before any session
        assert ("set-cookie" in fast.headers) == ("set-cookie" in reference.headers) == new_session


def test_the_comparison_covers_successes_and_every_kind_of_refusal(urls: tuple[str, str]) -> None:
    statuses = {exchange(urls[0], path, body, headers, "s").status_code for path, body, headers in REQUESTS}
    assert {200, 400, 404, 413, 418, 422, 500} <= statuses


def test_session_state_flows_through_the_fast_routes(urls: tuple[str, str]) -> None:
    fast_url = urls[0]
    seeded = exchange(fast_url, "/seed_session", encoded({"start": 1}), {}, None)
    cookie = seeded.cookies[SESSION_COOKIE]
    assert exchange(fast_url, "/add", encoded({"step": 2}), {}, cookie).json() == {"count": 3}
    verified = exchange(fast_url, "/verify", encoded(verify_body(target=3)), {}, cookie)
    assert verified.status_code == 200 and verified.json()["reward"] == 1.0
    wrong = exchange(fast_url, "/verify", encoded(verify_body(target=3)), {"authorization": "Bearer nope"}, cookie)
    assert wrong.status_code == 401

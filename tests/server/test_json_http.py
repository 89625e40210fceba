"""Every route of a resources server, through its one request path (``gym_bridge.serving.json_http.JsonApp``).

Each request below, good or bad, is sent over loopback; the status, the start of ``detail`` (or of the
body) and the session cookie are checked. The OpenAPI document is checked to describe the same routes.
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

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

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
def url() -> Iterator[str]:
    settings = ServerSettings(auth_token=TOKEN, max_body_bytes=4096)
    with start_in_thread(EdgeServer(settings).build_app()) as server:
        yield server.url


def verify_body(**extra: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "count"}, "response": {"output": []}, "target": 3, **extra}


def encoded(obj: Any) -> bytes:
    return json.dumps(obj).encode()


NOT_A_DICT = "request body must be a JSON object, not "
JSON_AT = "invalid JSON at line "

# (path, body, extra headers, status, what the answer starts with: ``detail`` for errors, else the body)
REQUESTS: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("/seed_session", b"", {}, 200, '{"count":0,"échos":null}'),
    ("/seed_session", b"null", {}, 422, NOT_A_DICT + "NoneType"),
    ("/seed_session", b"{}", {}, 200, '{"count":0'),
    ("/seed_session", encoded({"start": 2, "echo": "ü\u2028"}), {}, 200, '{"count":2,"échos":"ü\u2028"}'),
    ("/seed_session", b"[1, 2]", {}, 422, NOT_A_DICT + "list"),
    ("/seed_session", b'"text"', {}, 422, NOT_A_DICT + "str"),
    ("/seed_session", b'{"start": NaN}', {}, 500, "internal error on /seed_session: ValueError"),
    ("/seed_session", b"{bad", {}, 422, JSON_AT + "1 column 2 (char 1): Expecting property name"),
    ("/seed_session", b'{\n  "start": 1\n  "x": 2}', {}, 422, JSON_AT + "3 column 3 (char 17): Expecting ','"),
    ("/seed_session", b"\xff\xfe\x00garbage", {}, 422, JSON_AT + "1 column 1 (char 0): Expecting value"),
    ("/seed_session", json.dumps({"start": 1}).encode("utf-16"), {}, 200, '{"count":1'),
    ("/seed_session", b"start=1", {"content-type": "application/x-www-form-urlencoded"}, 415,
     "Content-Type 'application/x-www-form-urlencoded': this server reads JSON"),  # what a web page can send
    ("/add", encoded({"step": 2}), {}, 200, '{"count":2}'),
    ("/add", encoded({"step": 1, "extra": True}), {"content-type": "text/plain"}, 415, "Content-Type 'text/plain'"),
    ("/add", encoded({"step": 1}), {"content-type": "application/json; charset=utf-8"}, 200, '{"count":1}'),
    ("/add", encoded({"step": [1]}), {}, 422, "step: Input should be a valid integer"),
    ("/add", encoded({"step": "1"}), {}, 200, '{"count":1}'),
    ("/add", b"", {}, 422, "request body is empty: expected a JSON object"),
    ("/add", b"null", {}, 422, NOT_A_DICT + "NoneType"),
    ("/add", b"[]", {}, 422, NOT_A_DICT + "list"),
    ("/add", b"7", {}, 422, NOT_A_DICT + "int"),
    ("/note", encoded({"step": 0}), {}, 200, '{"text":"zero","score":0.5}'),
    ("/note", encoded({"step": 1}), {}, 200, '[{"text":"one","score":null},{"x":[1,2]}]'),
    ("/note", encoded({"step": 2}), {}, 200, '"plain text ünïcode"'),
    ("/note", encoded({"step": 3}), {}, 418, "a teapot"),
    ("/note", encoded({"step": 4}), {}, 500, "internal error on /note: "),
    ("/note", encoded({"step": 5}), {}, 422, "text: Input should be a valid string"),
    ("/note", encoded({"step": 6}), {}, 200, "null"),
    ("/explode", encoded({"step": 1}), {}, 500, "internal error on /explode: ZeroDivisionError: the tool divided"),
    ("/verify", encoded(verify_body()), {}, 200, '{"responses_create_params":{"input":"count"},"response":{"output":[]},"reward":0.0'),
    ("/verify", encoded(verify_body(big=10**30, small=1e-7, text="日本 \u2028")), {}, 200,
     '{"responses_create_params":{"input":"count"},"response":{"output":[]},"reward":0.0,"target":3,'
     '"big":1000000000000000000000000000000,"small":1e-07,"text":"日本 \u2028"}'),
    ("/verify", encoded(verify_body(target="three")), {}, 422, "target: Input should be a valid integer"),
    ("/verify", encoded(verify_body(target=99)), {}, 500, "internal error on /verify: ValueError: Out of range float"),
    ("/verify", encoded({"responses_create_params": {"input": "x"}, "target": 1}), {}, 422, "response: Field required"),
    ("/verify", encoded(verify_body(response={"output": "not a list"})), {}, 422, "response.output: Input should be a valid list"),
    ("/verify", encoded(verify_body(responses_create_params={"input": 5, "temperature": "hot"})), {}, 422,
     "responses_create_params.input.str: Input should be a valid string"),
    ("/verify", encoded({k: v for k, v in verify_body().items() if k != "target"}), {}, 422, "target: Field required"),
    ("/verify", b"", {}, 422, "request body is empty"),
    ("/verify", b"[1, 2]", {}, 422, NOT_A_DICT + "list"),
    ("/verify", b'{"target": 3,,}', {}, 422, JSON_AT + "1 column 14 (char 13)"),
    ("/verify", b'{"a": "\\ud800"}', {}, 400, "body holds a lone UTF-16 surrogate escape"),
    ("/verify", b'{"a": "\xed\xa0\x80"}', {}, 400, "body holds a lone UTF-16 surrogate escape"),  # as bytes
    ("/verify", b"\xef\xbb\xbf" + encoded(verify_body()), {}, 200, '{"responses_create_params"'),  # a BOM is read past
    # duplicate keys: the last wins, for validation and the verifier alike (one parse)
    ("/verify", b'{"target": "three", ' + encoded(verify_body())[1:], {}, 200, '{"responses_create_params"'),
    ("/verify", encoded(verify_body())[:-1] + b', "target": "three"}', {}, 422, "target: Input should be a valid integer"),
    ("/VERIFY", encoded(verify_body()), {}, 404, "unknown tool 'VERIFY'"),
    ("/..%2fverify", encoded(verify_body()), {}, 404, "Not Found"),
    ("/add%2f..%2fverify", encoded(verify_body()), {}, 404, "Not Found"),
    ("/verify", encoded(verify_body(padding="x" * 5000)), {}, 413, "request body larger than the limit of 4096 bytes"),
    ("/unknown_tool", encoded({"step": 1}), {}, 404, "unknown tool 'unknown_tool' (this server's tools: add, explode, note)"),
    ("/verify/", encoded(verify_body()), {}, 200, '{"responses_create_params"'),
    ("/a/b", b"{}", {}, 404, "Not Found"),
    ("/health", b"{}", {}, 405, "Method Not Allowed"),
]  # fmt: skip


def exchange(url: str, path: str, body: bytes, headers: dict[str, str], cookie: str | None) -> httpx.Response:
    sent = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json", **headers}
    if cookie:
        sent["cookie"] = f"{SESSION_COOKIE}={cookie}"
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as client:
        return client.post(path, content=body, headers=sent)


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "start"), REQUESTS, ids=[f"{i}:{r[0]}" for i, r in enumerate(REQUESTS)]
)
def test_each_route_answers_good_and_bad_input(
    url: str, path: str, body: bytes, headers: dict[str, str], status: int, start: str
) -> None:
    answer = exchange(url, path, body, headers, None)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    shown = answer.json()["detail"] if status >= 400 else answer.content.decode()
    assert shown.startswith(start), shown
    if status == 418:
        assert answer.headers["x-why"] == "because"
    if status == 422:
        assert answer.json()["errors"], "422 lists the errors"
    reached_a_route = status not in (404, 405, 413, 415)
    assert ("set-cookie" in answer.headers) == reached_a_route


def test_session_state_flows_through_the_routes(url: str) -> None:
    seeded = exchange(url, "/seed_session", encoded({"start": 1}), {}, None)
    cookie = seeded.cookies[SESSION_COOKIE]
    assert exchange(url, "/add", encoded({"step": 2}), {}, cookie).json() == {"count": 3}
    verified = exchange(url, "/verify", encoded(verify_body(target=3)), {}, cookie)
    assert verified.status_code == 200 and verified.json()["reward"] == 1.0
    wrong = exchange(url, "/verify", encoded(verify_body(target=3)), {"authorization": "Bearer nope"}, cookie)
    assert wrong.status_code == 401


def test_openapi_documents_the_same_routes_with_their_body_types(url: str) -> None:
    spec = httpx.get(f"{url}/openapi.json", headers={"authorization": f"Bearer {TOKEN}"}).json()
    assert set(spec["paths"]) == {
        "/health", "/seed_session", "/verify", "/close_session", "/aggregate_metrics", "/reverify_mode", "/add",
        "/note", "/explode",
    }  # fmt: skip
    add_body = spec["paths"]["/add"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert spec["components"]["schemas"][add_body["$ref"].rsplit("/", 1)[-1]]["required"] == ["step"]
    # /verify takes the flat body or NeMo Gym 0.7.0's ResourcesVerifyRequest
    verify_schema = spec["paths"]["/verify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    verify_bodies = [spec["components"]["schemas"][one["$ref"].rsplit("/", 1)[-1]] for one in verify_schema["anyOf"]]
    assert any("target" in body["properties"] for body in verify_bodies)
    assert any("verification_input" in body["properties"] for body in verify_bodies)
    docs = httpx.get(f"{url}/docs", headers={"authorization": f"Bearer {TOKEN}"})
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert httpx.get(f"{url}/openapi.json").status_code == 401  # behind the token like every route but /health


def test_the_nesting_limit_is_exact_for_arrays_objects_and_wide_bodies() -> None:
    """``MAX_JSON_DEPTH`` levels parse, one more is a 400, wherever the deep branch sits among shallow ones."""
    from gym_bridge.serving.answers import ErrorStyle
    from gym_bridge.serving.json_body import MAX_JSON_DEPTH, BodyRefused, parse_body

    def mixed(depth: int) -> str:  # arrays and objects alternating, ``depth`` containers deep
        return "".join('{"k":' if i % 2 else "[" for i in range(depth)) + "1" + "".join(
            "}" if i % 2 else "]" for i in reversed(range(depth)))  # fmt: skip

    shallow = ",".join(['{"a":[1,{"b":[]}]}'] * 200)  # 800 brackets, 3 deep
    for depth in (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1):
        for body in (mixed(depth), f"[{shallow},{mixed(depth - 1)},{shallow}]", '{"x":' + mixed(depth - 1) + "}"):
            if depth <= MAX_JSON_DEPTH:
                assert parse_body(body.encode(), ErrorStyle()) == json.loads(body)
            else:
                with pytest.raises(BodyRefused) as refused:
                    parse_body(body.encode(), ErrorStyle())
                assert refused.value.answer.status == 400
    assert parse_body(f"[{shallow}]".encode(), ErrorStyle()) == json.loads(f"[{shallow}]")
    # the shortest bodies of each depth (the check looks only at bodies long enough to be too deep)
    assert parse_body(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, ErrorStyle())
    with pytest.raises(BodyRefused):
        parse_body(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), ErrorStyle())


def test_the_nesting_limit_counts_brackets_only_as_a_bound() -> None:
    """The bracket count that spares most bodies the walk never lets a deep one through: a deep branch
    after the first counted chunk or across two chunks, UTF-16 bodies, brackets inside strings."""
    from gym_bridge.serving.answers import ErrorStyle
    from gym_bridge.serving.json_body import _COUNT_CHUNK, MAX_JSON_DEPTH, BodyRefused, _too_deep, parse_body

    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH  # inside the outer array: one level too many
    limit = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    for inner, too_deep in ((deep, True), (limit, False)):
        bodies = (
            '["' + "x" * (_COUNT_CHUNK + 100) + '",' + inner + "]",  # the deep branch after the first chunk
            '["' + "x" * (_COUNT_CHUNK - 150) + '",' + inner + "]",  # its brackets across two chunks
            "[" + " " * (_COUNT_CHUNK - 100) + inner + "]",
        )
        for body in bodies:
            value = json.loads(body)
            assert _too_deep(value, body.encode()) is too_deep
            assert _too_deep(value, body.encode("utf-16")) is too_deep
            if too_deep:
                with pytest.raises(BodyRefused):
                    parse_body(body.encode(), ErrorStyle())
            else:
                assert parse_body(body.encode(), ErrorStyle()) == value
    # brackets inside a string are counted, then the walk finds the body flat
    text = {"text": "[{" * MAX_JSON_DEPTH}
    assert _too_deep(text, json.dumps(text).encode()) is False
    # few brackets in a long body: not too deep, whatever its length
    assert _too_deep([[1, 2, 3]], b"[" + b" " * (3 * _COUNT_CHUNK) + b"[1,2,3]]") is False

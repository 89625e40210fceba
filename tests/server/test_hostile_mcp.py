"""A hostile client against a resources server's ``/mcp`` (NeMo Gym 0.7.0's ``expose_tools_over_mcp``), over real HTTP.

The findings of round four, each failing on the code before its fix:

* ``/mcp`` was handed to the ``mcp`` SDK as it came, past the checks every JSON route's body gets: a body
  that never finished held its connection for good (the routes answer 408 after ``body_timeout_s``), a
  chunked body was read whole up to the SDK's own bound (none at all in mcp 1.28, the oldest release the
  project takes) whatever ``max_body_bytes`` said, and outside ``max_held_body_bytes``; a lone surrogate ran
  the tool (a server that keeps its argument then answered 500 to every later call and ``/verify``, and
  tool_use counted the call) before the answer failed as a 500, and JSON nested past the depth limit was
  a 500 (RecursionError);
* ``max_body_bytes`` was not /mcp's bound: the SDK refused any body past its own 4 MiB (a 5 MiB argument
  HTTP takes was a plain-text 413 over MCP);
* ``GET /mcp`` opened a server-sent-events stream, with no token needed, that a stateless server never
  writes to and never ends: one connection and ~100 KB held for good per request;
* tool arguments of the wrong JSON type (``"arguments": [...]``) were the SDK's ``Invalid request
  parameters`` with no word of which field, and a NaN or Infinity among them reached the tool as null (the
  SDK dumps params as JSON): another call than the one sent, where HTTP answers 422;
* a session token carried the session's cookie value in clear (signed, not encrypted): its holder reached
  every HTTP route as that session;
* a legacy seed's token was narrowed (``mcp_allowed_tools_for_session``) by ``{}`` instead of the task row
  on a server that checks its seed body without reading it: every tool was allowed;
* ``/verify``'s echo restored MCP-namespaced names by ``call_id``: two calls sharing one id (a hostile or
  broken client's record) came back both named as the first (NeMo Gym 0.7.0's ``_wrap_verify`` does the same).

The attacks that held are the parametrized cases at the end.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.mcp_tools import TOKEN_HEADER
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer

RPC_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
ONE_MIB = 1024 * 1024
TOOL_USE_DATA = Path(__file__).resolve().parents[2] / "resources_servers" / "tool_use" / "data" / "example.jsonl"


class NoteArgs(BaseModel):
    text: str


class Notes(ResourcesServer):
    """Keeps each note a tool call makes; ``/verify`` echoes them (as a server that reads its state does)."""

    name = "notes"

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["notes"] = []
        return {}

    @tool
    async def note(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Keep a note."""
        session.state["notes"].append(args.text)
        return {"kept": len(session.state["notes"])}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": 0.0, "notes": session.state.get("notes")})


@pytest.fixture(scope="module")
def notes() -> Iterator[str]:
    settings = ServerSettings(expose_tools_over_mcp=True, body_timeout_s=1.0, max_body_bytes=ONE_MIB)
    with start_in_thread(Notes(settings).build_app()) as running:
        yield running.url


def seeded(url: str) -> tuple[httpx.Client, dict[str, str]]:
    """A client holding a fresh typed session's cookie, and that session's MCP headers."""
    client = httpx.Client(base_url=url, timeout=30)
    seed = {"resources_session_id": f"rs-{uuid.uuid4().hex}", "episode_id": {"rollout_id": uuid.uuid4().hex},
            "task_id": {"taskset": "t", "task_id": "0"}, "task_data": {}}  # fmt: skip
    answer = client.post("/seed_session", json=seed)
    assert answer.status_code == 200, answer.text
    return client, {**RPC_HEADERS, **answer.json()["resources_tools"]["headers"]}


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def verify_body() -> dict[str, Any]:
    return {"responses_create_params": {"input": "q"}, "response": {"output": []}}


# --------------------------------------------------------------------------- the body, as every route's


def test_an_unfinished_mcp_body_is_a_408_after_body_timeout_s(notes: str) -> None:
    host, port = notes.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        head = ("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
        conn.sendall(head.encode())
        started = time.perf_counter()
        try:
            answer = conn.recv(200)
        except TimeoutError:
            answer = b"(nothing in 10 s)"
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.perf_counter() - started < 5


def test_a_chunked_mcp_body_past_max_body_bytes_is_a_413(notes: str) -> None:
    _, headers = seeded(notes)
    body = json.dumps(call("note", {"text": "x" * (2 * ONE_MIB)})).encode()  # 2 MiB: under the SDK's 4 MiB

    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is known only as it is read
        for i in range(0, len(body), 64 * 1024):
            yield body[i : i + 64 * 1024]

    answer = httpx.post(notes + "/mcp", content=chunks(), headers=headers, timeout=30)
    assert answer.status_code == 413 and f"limit of {ONE_MIB} bytes" in answer.text, answer.text[:300]


def test_max_body_bytes_is_mcps_bound_too() -> None:
    """A 5 MiB argument is a body ``max_body_bytes`` (16 MiB) takes over HTTP; over MCP the SDK's own 4 MiB
    bound refused it (a plain-text 413), whatever the setting said."""
    with start_in_thread(Notes(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        client, headers = seeded(running.url)
        with closing(client):
            text = "x" * (5 * ONE_MIB)
            assert client.post("/note", json={"text": text}).status_code == 200
            over_mcp = httpx.post(running.url + "/mcp", json=call("note", {"text": text}), headers=headers, timeout=60)
            assert over_mcp.status_code == 200, over_mcp.text[:300]
            assert over_mcp.json()["result"]["structuredContent"] == {"kept": 2}


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (json.dumps(call("note", {"text": "a\\ud800b"})).replace("\\\\", "\\").encode(), "surrogate"),
        (json.dumps(call("note", {"text": "a@@b"})).encode().replace(b"@@", b"\xed\xa0\x80"), "surrogate"),
        (json.dumps(call("note", {"text": "a"})).encode().replace(b'"a"', b"[" * 5000 + b"]" * 5000), "nested deeper"),
    ],
    ids=["surrogate escape", "surrogate as bytes", "deep nesting"],
)
def test_an_mcp_body_that_no_route_would_take_is_a_400_and_runs_no_tool(notes: str, body: bytes, detail: str) -> None:
    client, headers = seeded(notes)
    with closing(client):
        refused = httpx.post(notes + "/mcp", content=body, headers=headers, timeout=30)
        assert refused.status_code == 400 and detail in refused.json()["detail"], refused.text[:300]
        kept = httpx.post(notes + "/mcp", json=call("note", {"text": "é"}), headers=headers, timeout=30)
        assert kept.status_code == 200 and kept.json()["result"]["structuredContent"] == {"kept": 1}, kept.text
        verdict = client.post("/verify", json=verify_body())  # the session still answers: only the honest note
        assert verdict.status_code == 200 and verdict.json()["notes"] == ["é"], verdict.text[:300]


def test_tool_use_counts_no_call_for_a_refused_mcp_body() -> None:
    with start_in_thread(ToolUseServer(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        url = running.url
        rows = TOOL_USE_DATA.read_text().splitlines()
        row = next(r for r in map(json.loads, rows) if "reference_calls" in r["verifier_metadata"])
        with httpx.Client(base_url=url, timeout=30) as client:
            headers = {**RPC_HEADERS, **client.post("/seed_session", json=row).json()["mcp"]["headers"]}
            forged = json.dumps(call("get_product", {"product_id": "P1@@"})).encode().replace(b"@@", b"\\ud800")
            refused = httpx.post(url + "/mcp", content=forged, headers=headers, timeout=30)
            assert refused.status_code == 400, refused.text[:300]
            verdict = client.post("/verify", json={**row, "response": {"output": []}})
            assert verdict.status_code == 200 and verdict.json()["tool_calls_made"] == 0, verdict.text[:300]


# --------------------------------------------------------------------------- GET, and the arguments' type


def test_get_on_mcp_is_a_405_not_a_stream_that_never_ends(notes: str) -> None:
    """A stateless MCP server sends nothing unasked: the spec's answer to GET is then 405."""
    for headers in ({"accept": "text/event-stream"}, {}):  # a stream that never ends: a ReadTimeout here
        answer = httpx.get(notes + "/mcp", headers=headers, timeout=5)
        assert answer.status_code == 405 and answer.headers["allow"] == "POST", answer.text[:300]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [([1, 2], "params.arguments"), ("quantity=2", "params.arguments"), (3, "params.arguments"),
     (True, "params.arguments"), ({"text": "x", "n": float("nan")}, "params.arguments.n: Input should be a finite"),
     ({"text": "x", "deep": [1, {"n": float("-inf")}]}, "params.arguments.deep.1.n")],
)  # fmt: skip
def test_arguments_of_the_wrong_shape_are_a_jsonrpc_error_naming_the_field(notes: str, arguments: Any, field: str) -> None:
    client, headers = seeded(notes)
    with closing(client):
        body = json.dumps(call("note", arguments)).encode()  # NaN and Infinity as Python writes them
        answer = httpx.post(notes + "/mcp", content=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text[:300]
        error = answer.json()["error"]
        assert error["code"] == -32602 and field in error["message"], error
        assert client.post("/verify", json=verify_body()).json()["notes"] == []  # no tool ran


def test_a_nan_argument_is_refused_over_mcp_as_over_http_not_run_as_null() -> None:
    """tool_use's ``max_price: NaN`` is a 422 over HTTP; over MCP the SDK made it null: the whole catalogue."""
    with start_in_thread(ToolUseServer(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        row = json.loads(TOOL_USE_DATA.read_text().splitlines()[0])
        with httpx.Client(base_url=running.url, timeout=30) as client:
            headers = {**RPC_HEADERS, **client.post("/seed_session", json=row).json()["mcp"]["headers"]}
            arguments = b'{"category": null, "max_price": NaN}'
            over_http = client.post("/list_products", content=arguments, headers={"content-type": "application/json"})
            assert over_http.status_code == 422 and "max_price" in over_http.text, over_http.text
            body = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "list_products", "arguments": '
            over_mcp = httpx.post(running.url + "/mcp", content=body + arguments + b"}}", headers=headers, timeout=30)
            assert "params.arguments.max_price" in over_mcp.json()["error"]["message"], over_mcp.text[:300]


# --------------------------------------------------------------------------- the token


def test_a_token_does_not_give_away_its_sessions_cookie(notes: str) -> None:
    """A token is signed, not encrypted, and held where a policy can read it (an MCP-native agent's config in
    its sandbox). Its ``sid`` was the session cookie's value: the token's holder reached every HTTP route as
    that session (tools a task's allow-list narrowed away, ``/verify`` on its state), not only MCP's tools."""
    from itsdangerous import URLSafeSerializer

    client, headers = seeded(notes)
    with closing(client):
        assert client.post("/note", json={"text": "private"}).status_code == 200
        _, claims = URLSafeSerializer("any key").loads_unsafe(headers[TOKEN_HEADER])
        cookie = client.cookies[SESSION_COOKIE]
        assert cookie not in json.dumps(claims), claims
        for value in claims.values():
            if isinstance(value, str):
                borrowed = httpx.post(notes + "/verify", json=verify_body(), cookies={SESSION_COOKIE: value})
                assert borrowed.json().get("notes") != ["private"], borrowed.text
        kept = httpx.post(notes + "/mcp", json=call("note", {"text": "via token"}), headers=headers, timeout=30)
        assert kept.json()["result"]["structuredContent"] == {"kept": 2}, kept.text  # the token still works


class Narrowed(ResourcesServer):
    """Each task names the tools its token may call (``allowed``); the seed body is checked, not read."""

    name = "narrowed"

    class Seed(BaseModel):
        allowed: list[str]

    seed_request_model = Seed

    @tool
    async def look(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Look."""
        return {"looked": args.text}

    @tool
    async def change(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Change."""
        return {"changed": args.text}

    def mcp_allowed_tools_for_session(self, task_row: dict[str, Any]) -> list[str] | None:
        return task_row.get("allowed")

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": 0.0})


def test_a_legacy_seeds_token_is_narrowed_by_its_task_row() -> None:
    """A server that checks its seed body (``seed_request_model``) but does not read it had its allow-list
    hook called with ``{}``: the token of a task that allows ``look`` only could call every tool."""
    with start_in_thread(Narrowed(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        seeded = httpx.post(running.url + "/seed_session", json={"allowed": ["look"]}, timeout=30)
        headers = {**RPC_HEADERS, **seeded.json()["mcp"]["headers"]}
        listing = httpx.post(running.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                             headers=headers, timeout=30)  # fmt: skip
        assert [t["name"] for t in listing.json()["result"]["tools"]] == ["look"], listing.text[:300]
        refused = httpx.post(running.url + "/mcp", json=call("change", {"text": "x"}), headers=headers, timeout=30)
        assert refused.json()["result"]["isError"], refused.text[:300]


# --------------------------------------------------------------------------- /verify's echo


def test_verify_echoes_each_calls_emitted_name_even_when_call_ids_repeat() -> None:
    with start_in_thread(ToolUseServer(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        calls = [
            {"type": "function_call", "call_id": "call_1", "name": "mcp__tool_use__view_cart", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_1", "name": "list_orders", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_2", "name": "mcp__tool_use__list_orders", "arguments": "{}"},
        ]
        row = next(r for r in map(json.loads, TOOL_USE_DATA.read_text().splitlines())
                   if "expected_calls" in r["verifier_metadata"])  # fmt: skip
        verdict = httpx.post(running.url + "/verify", json={**row, "response": {"output": calls}}, timeout=30)
        assert verdict.status_code == 200, verdict.text
        assert [c["name"] for c in verdict.json()["response"]["output"]] == [c["name"] for c in calls]


# --------------------------------------------------------------------------- attacks that held


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("seed_session", {}, "Unknown tool"),  # a protocol route is no tool over MCP either
        ("verify", {"responses_create_params": {"input": "q"}}, "Unknown tool"),
        ("close_session", {}, "Unknown tool"),
        ("mcp__notes__note", {"text": "x"}, "Unknown tool"),  # tools/call takes the bare name only
        ("note", {}, "HTTP 422 from POST /note: text: Field required"),
        ("note", {"text": 5}, "HTTP 422 from POST /note: text"),
        ("note", {"text": "x", "extra": 1}, None),  # as the HTTP route: extra fields are ignored
    ],
)
def test_tool_calls_that_held(notes: str, name: str, arguments: Any, expected: str | None) -> None:
    client, headers = seeded(notes)
    with closing(client):
        answer = httpx.post(notes + "/mcp", json=call(name, arguments), headers=headers, timeout=30)
        result = answer.json()["result"]
        text = " ".join(part.get("text", "") for part in result["content"])
        if expected is None:
            assert not result.get("isError"), text
            over_http = client.post(f"/{name}", json=arguments)
            assert over_http.status_code == 200 and over_http.json() == {"kept": 2}, over_http.text
        else:
            assert result["isError"] and expected in text, text
            assert client.post("/verify", json=verify_body()).json()["notes"] == []  # nothing kept


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ([call("note", {"text": "x"}), call("note", {"text": "y"})], 400),  # a batch (gone from MCP since 2025-06-18)
        ({"jsonrpc": "2.0", "id": 1}, 400),  # no method
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, 202),
    ],
    ids=["batch", "no method", "notification"],
)
def test_odd_jsonrpc_shapes_run_no_tool(notes: str, body: Any, status: int) -> None:
    client, headers = seeded(notes)
    with closing(client):
        answer = httpx.post(notes + "/mcp", json=body, headers=headers, timeout=30)
        assert answer.status_code == status, answer.text[:300]
        assert client.post("/verify", json=verify_body()).json()["notes"] == []


@pytest.mark.parametrize(
    ("header", "status"),
    [({"mcp-session-id": "forged"}, 200),  # stateless: the token names the session, never this header
     ({"mcp-protocol-version": "1999-01-01"}, 400), ({"last-event-id": "0"}, 200)],
)  # fmt: skip
def test_transport_headers_name_no_session_held(notes: str, header: dict[str, str], status: int) -> None:
    client, headers = seeded(notes)
    with closing(client):
        answer = httpx.post(notes + "/mcp", json=call("note", {"text": "x"}), headers={**headers, **header}, timeout=30)
        assert answer.status_code == status, answer.text[:300]
        assert client.post("/verify", json=verify_body()).json()["notes"] == (["x"] if status == 200 else [])


def test_a_flood_of_notifications_opens_no_session_and_the_session_keeps_working(notes: str) -> None:
    client, headers = seeded(notes)
    sessions = httpx.get(notes + "/health").json()["sessions"]

    async def flood() -> None:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as http:
            notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            for _ in range(4):
                answers = await asyncio.gather(*(http.post(notes + "/mcp", json=notification, headers=headers)
                                                 for _ in range(50)))  # fmt: skip
                assert {a.status_code for a in answers} == {202}

    asyncio.run(flood())
    with closing(client):
        kept = httpx.post(notes + "/mcp", json=call("note", {"text": "after"}), headers=headers, timeout=30)
        assert kept.json()["result"]["structuredContent"] == {"kept": 1}, kept.text
    assert httpx.get(notes + "/health").json()["sessions"] == sessions  # an MCP request opens no session


def test_mcp_is_behind_the_bearer_token_and_the_host_check_held() -> None:
    settings = ServerSettings(expose_tools_over_mcp=True, auth_token="s3cret")
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with start_in_thread(Notes(settings).build_app()) as running:
        bare = httpx.post(running.url + "/mcp", json=listing, headers=RPC_HEADERS, timeout=30)
        assert bare.status_code == 401, bare.text
        bearer = {**RPC_HEADERS, "authorization": "Bearer s3cret"}
        listed = httpx.post(running.url + "/mcp", json=listing, headers=bearer, timeout=30)
        assert listed.status_code == 200 and listed.json()["result"]["tools"][0]["name"] == "note", listed.text
        rebound = httpx.post(running.url + "/mcp", json=listing, headers={**bearer, "host": "evil.example"}, timeout=30)
        assert rebound.status_code == 421, rebound.text  # a DNS-rebinding page's Host


async def test_mcp_and_http_calls_on_one_session_interleave_into_one_state(notes: str) -> None:
    """50 calls over MCP and 50 over HTTP at once on one session: every one kept, in one list."""
    client, headers = seeded(notes)
    cookies = dict(client.cookies)
    client.close()
    async with httpx.AsyncClient(base_url=notes, timeout=30, cookies=cookies) as http:
        async with httpx.AsyncClient(headers={TOKEN_HEADER: headers[TOKEN_HEADER]}, timeout=30) as transport:
            async with streamable_http_client(f"{notes}/mcp", http_client=transport) as (read, write, _):
                async with ClientSession(read, write) as mcp:
                    await mcp.initialize()
                    over_mcp = [mcp.call_tool("note", {"text": f"m{i}"}) for i in range(50)]
                    over_http = [http.post("/note", json={"text": f"h{i}"}) for i in range(50)]
                    results = await asyncio.gather(*over_mcp, *over_http)
        assert all(not r.isError for r in results[:50]) and all(r.status_code == 200 for r in results[50:])
        kept = (await http.post("/verify", json=verify_body())).json()["notes"]
    assert sorted(kept) == sorted([f"m{i}" for i in range(50)] + [f"h{i}" for i in range(50)])

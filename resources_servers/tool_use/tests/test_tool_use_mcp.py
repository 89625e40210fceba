"""tool_use over MCP (NeMo Gym 0.7.0's ``expose_tools_over_mcp``), driven by the ``mcp`` SDK's streamable-HTTP
client against a running server: list the tools, call them on a session, see its store change over HTTP,
verify; a session's token reaches only its session, on this server only."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gym_bridge.rollout.nemo_gym_entry import build_server, plan_server
from gym_bridge.serving.mcp_tools import TOKEN_HEADER, normalize_tool_name
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.store import TOOLS, NoArgs

DATA = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"


def task(verified_by: str) -> dict[str, Any]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    return next(r for r in rows if verified_by in r["verifier_metadata"])


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_in_thread(ToolUseServer(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        yield running.url


@pytest.fixture(scope="module")
def other_url() -> Iterator[str]:
    """A second tool_use server: its tokens are signed with its own secret."""
    with start_in_thread(ToolUseServer(ServerSettings(expose_tools_over_mcp=True)).build_app()) as running:
        yield running.url


def typed_seed(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "resources_session_id": f"resources-session-{uuid.uuid4().hex}",
        "episode_id": {"rollout_id": f"rollout_{uuid.uuid4().hex[:12]}"},
        "task_id": {"taskset": "tool_use:example", "task_id": "0"},
        "task_data": {k: v for k, v in row.items() if k != "responses_create_params"},
    }


@asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def text_of(result: Any) -> str:
    return " ".join(getattr(part, "text", "") for part in result.content)


async def test_tools_listed_called_and_verified_over_mcp(url: str) -> None:
    row = task("reference_calls")
    seed = typed_seed(row)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        seeded = (await http.post("/seed_session", json=seed)).json()
        tools = seeded["resources_tools"]
        assert tools["server_name"] == "tool_use" and tools["url_path"] == "/mcp" and tools["transport"] == "http"
        assert set(tools["headers"]) == {TOKEN_HEADER}

        async with mcp_session(url, tools["headers"]) as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            assert set(listed) == set(TOOLS)
            assert listed["add_to_cart"].inputSchema["required"] == ["product_id", "quantity"]
            assert listed["add_to_cart"].description and "cart" in listed["add_to_cart"].description
            for call in row["verifier_metadata"]["reference_calls"]:  # the task's calls, over MCP
                result = await mcp.call_tool(call["name"], call["arguments"])
                assert not result.isError, text_of(result)
                assert "error" not in (result.structuredContent or {}), result.structuredContent
            orders_over_mcp = (await mcp.call_tool("list_orders", {})).structuredContent
        orders = (await http.post("/list_orders", json={})).json()  # the same session, over HTTP
        assert orders == orders_over_mcp and len(orders["orders"]) == len(row["initial_state"]["orders"]) + 1

        verify = {"episode_id": seed["episode_id"], "task_id": seed["task_id"], "verification_input": {
            **seed["task_data"], "responses_create_params": row["responses_create_params"],
            "response": {"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}]}}}  # fmt: skip
        verdict = await http.post("/verify", json=verify)
        assert verdict.status_code == 200 and verdict.json()["reward"] == 1.0, verdict.text


async def test_a_token_reaches_only_its_own_session_on_its_own_server(url: str, other_url: str) -> None:
    row = task("reference_calls")
    pid = sorted(row["initial_state"]["products"])[0]
    async with httpx.AsyncClient(base_url=url, timeout=30) as a, httpx.AsyncClient(base_url=url, timeout=30) as b:
        token_a = (await a.post("/seed_session", json=typed_seed(row))).json()["resources_tools"]["headers"]
        token_b = (await b.post("/seed_session", json=row)).json()["mcp"]["headers"]  # the legacy seed gets one too
        async with mcp_session(url, token_b) as mcp_b:
            added = await mcp_b.call_tool("add_to_cart", {"product_id": pid, "quantity": 1})
            assert not added.isError, text_of(added)
        assert [i["product_id"] for i in (await b.post("/view_cart", json={})).json()["cart"]["items"]] == [pid]
        assert (await a.post("/view_cart", json={})).json()["cart"]["items"] == []  # a's store: untouched

        async with mcp_session(url, token_a) as mcp_a:
            cart = (await mcp_a.call_tool("view_cart", {})).structuredContent
            assert cart["cart"]["items"] == []  # a's token sees a's store, not b's

        value = token_a[TOKEN_HEADER]
        forged = {TOKEN_HEADER: value[:-2] + ("AA" if not value.endswith("AA") else "BB")}
        async with httpx.AsyncClient(base_url=other_url, timeout=30) as elsewhere:
            foreign = (await elsewhere.post("/seed_session", json=typed_seed(row))).json()["resources_tools"]["headers"]
        for headers, expected in ((forged, "Invalid"), (foreign, "Invalid"), ({}, "Missing")):
            async with mcp_session(url, headers) as mcp:
                refused = await mcp.call_tool("add_to_cart", {"product_id": pid, "quantity": 1})
                assert refused.isError and expected in text_of(refused) and TOKEN_HEADER in text_of(refused)
                assert len((await mcp.list_tools()).tools) == len(TOOLS)  # listing needs no token
        assert (await a.post("/view_cart", json={})).json()["cart"]["items"] == []  # none of them reached a

        async with mcp_session(url, token_a) as mcp_a:
            unknown = await mcp_a.call_tool("buy_everything", {})
            assert unknown.isError and "Unknown tool" in text_of(unknown)
            bad = await mcp_a.call_tool("add_to_cart", {"product_id": pid, "quantity": 0})
            assert bad.isError and "HTTP 422" in text_of(bad) and "quantity" in text_of(bad)


async def test_a_closed_sessions_token_is_refused(url: str) -> None:
    row = task("reference_calls")
    seed = typed_seed(row)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        headers = (await http.post("/seed_session", json=seed)).json()["resources_tools"]["headers"]
        close = {"resources_session_id": seed["resources_session_id"], "episode_id": seed["episode_id"]}
        assert (await http.post("/close_session", json=close)).status_code == 200
    async with mcp_session(url, headers) as mcp:
        refused = await mcp.call_tool("view_cart", {})
        assert refused.isError and "closed or expired" in text_of(refused)


async def test_verify_scores_mcp_namespaced_tool_names_as_bare_ones(url: str) -> None:
    """An MCP-native agent records ``mcp__tool_use__<tool>``; scoring reads the bare name, the echo keeps the emitted."""
    row = task("expected_calls")
    (expected,) = row["verifier_metadata"]["expected_calls"]
    call = {"type": "function_call", "call_id": "call_1", "name": f"mcp__tool_use__{expected['name']}",
            "arguments": json.dumps(expected["arguments"])}  # fmt: skip
    body = {**row, "response": {"output": [call]}}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await http.post("/seed_session", json=row)
        verdict = (await http.post("/verify", json=body)).json()
        assert verdict["reward"] == 1.0 and verdict["response"]["output"][0]["name"] == call["name"], verdict
        other_server = {**call, "name": f"mcp__another__{expected['name']}"}
        verdict = (await http.post("/verify", json={**row, "response": {"output": [other_server]}})).json()
        assert verdict["reward"] == 0.0  # only this server's namespace is taken off


def test_normalize_tool_name_follows_nemo_gym() -> None:
    assert normalize_tool_name("mcp__tool_use__add_to_cart") == "add_to_cart"
    assert normalize_tool_name("mcp__tool_use__add_to_cart", "tool_use") == "add_to_cart"
    assert normalize_tool_name("mcp__other__add_to_cart", "tool_use") == "mcp__other__add_to_cart"
    assert normalize_tool_name("mcp__tool_use__x__y", "tool_use") == "x__y"
    assert normalize_tool_name("mcp__nodelimiter") == "mcp__nodelimiter"
    assert normalize_tool_name("add_to_cart") == "add_to_cart"


def test_reserved_and_unservable_tool_names_are_refused() -> None:
    class Reserved(ResourcesServer):
        name = "reserved"

        @tool(name="close_session")
        async def close_it(self, args: NoArgs, session: Session) -> dict[str, Any]:
            return {}

    class Dotted(ResourcesServer):
        name = "dotted"

        @tool(name="shop.add")
        async def add(self, args: NoArgs, session: Session) -> dict[str, Any]:
            return {}

    with pytest.raises(ValueError, match="close_session.*reserved"):
        Reserved()
    Dotted()  # an HTTP route may be named so ...
    with pytest.raises(ValueError, match="expose_tools_over_mcp"):
        Dotted(ServerSettings(expose_tools_over_mcp=True))  # ... but MCP clients reject the name


def test_mcp_is_off_unless_the_config_key_says_so() -> None:
    """NeMo Gym's entry key ``expose_tools_over_mcp`` turns /mcp on; without it there is none."""
    entry = {"entrypoint": "nemo_gym_app.py", "host": "127.0.0.1", "port": 1}
    for key, served in ((False, False), (True, True), (None, False)):
        config = {"tool_use": {"resources_servers": {"tool_use": {**entry, **({} if key is None else {"expose_tools_over_mcp": key})}}}}
        server = build_server(plan_server(config, "tool_use", "tool_use"))
        with start_in_thread(server.build_app()) as running, httpx.Client(base_url=running.url, timeout=30) as http:
            seeded = http.post("/seed_session", json=task("reference_calls")).json()
            probe = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              headers={"accept": "application/json, text/event-stream"})  # fmt: skip
            assert ("mcp" in seeded) is served and (probe.status_code == 200) is served, probe.text
            if served:
                assert len(probe.json()["result"]["tools"]) == len(TOOLS)
    bad = {"tool_use": {"resources_servers": {"tool_use": {**entry, "expose_tools_over_mcp": "yes"}}}}
    with pytest.raises(ValueError, match="expose_tools_over_mcp"):
        plan_server(bad, "tool_use", "tool_use")

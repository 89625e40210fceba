"""The tool-use server over HTTP: sessions, tool calls, bad calls, both verification modes, isolation."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.records.schema import VerifyResponse
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.server import ServerSettings
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseConfig, ToolUseServer
from resources_servers.tool_use.generate import generate
from resources_servers.tool_use.store import new_state

EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "example.jsonl"


def store_row(**meta: Any) -> dict[str, Any]:
    state = new_state(
        {
            "P1": {"name": "Mug", "category": "kitchen", "price": 4.5, "stock": 5},
            "P2": {"name": "Lamp", "category": "office", "price": 20.0, "stock": 2},
        },
        orders={"O1": {"items": {"P1": 1}, "total": 4.5, "status": "placed"}},
        next_order=2,
    )
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "shop"}]},
        "initial_state": state,
        "verifier_metadata": meta
        or {
            "reference_calls": [
                {"name": "add_to_cart", "arguments": {"product_id": "P1", "quantity": 2}},
                {"name": "place_order", "arguments": {}},
            ]
        },
    }


def final_message(text: str = "Done.") -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def function_call(name: str, arguments: Any, call_id: str = "c1") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_in_thread(ToolUseServer().build_app()) as running:
        yield running.url


@contextmanager
def session(url: str, row: dict[str, Any]) -> Iterator[httpx.Client]:
    """A client with its own cookie jar, i.e. its own session, seeded with ``row``."""
    with httpx.Client(base_url=url, timeout=30) as client:
        seeded = client.post("/seed_session", json=row)
        assert seeded.status_code == 200, seeded.text
        yield client


def verify(client: httpx.Client, row: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    response = client.post("/verify", json={**row, "response": {"output": output}})
    assert response.status_code == 200, response.text
    VerifyResponse.model_validate(response.json())
    return response.json()


def test_solving_by_tools_earns_reward_one(url: str) -> None:
    row = store_row()
    with session(url, row) as client:
        products = client.post("/list_products", json={}).json()["products"]
        assert [p["name"] for p in products] == ["Mug", "Lamp"]
        assert (
            client.post("/add_to_cart", json={"product_id": "P1", "quantity": 2}).json()["cart"]["total"]
            == 9.0
        )
        assert client.post("/place_order", json={}).json()["order_id"] == "O2"
        out = verify(client, row, [final_message()])
    assert out["reward"] == 1.0 and out["verify_mode"] == "outcome" and out["state_diff"] == []
    assert out["tool_calls_made"] == 3 and out["tool_errors"] == 0
    assert out["initial_state"] == row["initial_state"]


def test_wrong_outcome_is_zero_with_a_diff(url: str) -> None:
    row = store_row()
    with session(url, row) as client:
        client.post("/add_to_cart", json={"product_id": "P1", "quantity": 3})
        client.post("/place_order", json={})
        out = verify(client, row, [final_message()])
    assert out["reward"] == 0.0 and out["failure_kind"] == "wrong_outcome"
    assert "state.products.P1.stock: expected 3, got 2" in out["state_diff"]
    assert "state.orders.O2.total: expected 9.0, got 13.5" in out["failure_reason"]


def test_doing_nothing_is_verified_against_the_initial_state(url: str) -> None:
    row = store_row()
    with httpx.Client(base_url=url) as fresh:  # no seed_session at all
        out = verify(fresh, row, [final_message("I cannot help")])
    assert out["reward"] == 0.0 and out["tool_calls_made"] == 0
    assert any("O2: missing" in d for d in out["state_diff"])


def test_bad_calls_are_4xx_with_detail_and_domain_errors_are_200(url: str) -> None:
    with session(url, store_row()) as client:
        unknown = client.post("/teleport", json={})
        assert (
            unknown.status_code == 404
            and "teleport" in unknown.json()["detail"]
            and "add_to_cart" in unknown.json()["detail"]
        )
        missing = client.post("/add_to_cart", json={"product_id": "P1"})
        assert missing.status_code == 422 and "quantity" in missing.json()["detail"]
        mistyped = client.post("/add_to_cart", json={"product_id": "P1", "quantity": "lots"})
        assert mistyped.status_code == 422 and "quantity" in mistyped.json()["detail"]
        out_of_range = client.post("/add_to_cart", json={"product_id": "P1", "quantity": 0})
        assert out_of_range.status_code == 422
        extra = client.post("/get_product", json={"product_id": "P1", "colour": "red"})
        assert extra.status_code == 422 and "colour" in extra.json()["detail"]
        broken = client.post(
            "/get_product", content=b'{"product_id": ', headers={"content-type": "application/json"}
        )
        assert broken.status_code == 422 and broken.json()["detail"]
        domain = client.post("/get_product", json={"product_id": "P404"})
        assert domain.status_code == 200 and "unknown product" in domain.json()["error"]
        stock = client.post("/add_to_cart", json={"product_id": "P2", "quantity": 5})
        assert stock.status_code == 200 and "only 2" in stock.json()["error"]
        assert client.post("/view_cart", json={}).json()["cart"]["items"] == []
        assert client.get("/health").json()["status"] == "ok"


def test_tools_before_seeding_and_bad_rows(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        early = client.post("/list_products", json={})
        assert early.status_code == 409 and "seed_session" in early.json()["detail"]
        no_state = client.post("/seed_session", json={"responses_create_params": {"input": "x"}})
        assert no_state.status_code == 422 and "initial_state" in no_state.json()["detail"]
        bad_state = store_row()
        bad_state["initial_state"]["cart"] = {"P9": 1}
        response = client.post("/seed_session", json=bad_state)
        assert response.status_code == 422 and "P9" in response.json()["detail"]
        no_mode = {**store_row(), "verifier_metadata": {"task_kind": "x"}, "response": {"output": []}}
        response = client.post("/verify", json=no_mode)
        assert response.status_code == 422 and "reference_calls" in response.json()["detail"]
        bad_reference = {
            **store_row(reference_calls=[{"name": "add_to_cart", "arguments": {"product_id": "P1"}}])
        }
        response = client.post("/verify", json={**bad_reference, "response": {"output": []}})
        assert response.status_code == 422 and "reference_calls.1" in response.json()["detail"]


@pytest.mark.parametrize("word", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_prices_are_422_naming_the_field(url: str, word: str) -> None:
    """Python's JSON reads these bare words; a price of Infinity would be answered as null and a
    max_price of NaN would match nothing, so both are refused up front."""
    json_body = {"content-type": "application/json"}
    with session(url, store_row()) as client:
        response = client.post("/list_products", content=f'{{"max_price": {word}}}', headers=json_body)
        assert response.status_code == 422, response.text
        assert "max_price" in response.json()["detail"]
        assert len(client.post("/list_products", json={"max_price": 5}).json()["products"]) == 1
    row = json.dumps(store_row()).replace('"price": 20.0', f'"price": {word}')
    order = json.dumps(store_row()).replace('"total": 4.5', f'"total": {word}')
    with httpx.Client(base_url=url, timeout=30) as client:
        for body, field in (
            (row, "initial_state.products.P2.price"),
            (order, "initial_state.orders.O1.total"),
        ):
            response = client.post("/seed_session", content=body, headers=json_body)
            assert response.status_code == 422, response.text
            assert field in response.json()["detail"]


@pytest.mark.parametrize(("match", "reward"), [("strict", 0.0), ("fraction", 0.5), ("f1", 0.5)])
def test_argument_mode_scores_and_explains(url: str, match: str, reward: float) -> None:
    expected = [
        {"name": "get_product", "arguments": {"product_id": "P1"}},
        {"name": "get_product", "arguments": {"product_id": "P2"}},
    ]
    row = store_row(expected_calls=expected, match=match)
    output = [
        function_call("get_product", {"product_id": "P2"}, "a"),
        function_call("get_product", {"product_id": "P3"}, "b"),
        final_message(),
    ]
    with session(url, row) as client:
        out = verify(client, row, output)
    assert out["reward"] == pytest.approx(reward)
    assert out["verify_mode"] == f"arguments:{match}" and out["calls_matched"] == 1
    assert out["call_mismatches"] == ["get_product: product_id expected 'P1', got 'P3'"]
    assert out["failure_kind"] == "wrong_calls"


def test_argument_mode_accepts_parallel_calls_in_any_order(url: str) -> None:
    expected = [{"name": "get_product", "arguments": {"product_id": p}} for p in ("P1", "P2")]
    row = store_row(expected_calls=expected)
    output = [
        function_call("get_product", {"product_id": "P2"}, "a"),
        function_call("get_product", '{"product_id":"P1"}', "b"),
    ]
    with session(url, row) as client:
        assert verify(client, row, output)["reward"] == 1.0


class _NoCookies(CookieJar):
    """A shared client's jar that keeps nothing: each session sends its own cookie explicitly."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


def test_hundred_concurrent_sessions_stay_isolated(url: str) -> None:
    async def one(client: httpx.AsyncClient, index: int) -> tuple[float, dict[str, Any]]:
        qty = index % 4 + 1
        row = store_row(
            reference_calls=[
                {"name": "add_to_cart", "arguments": {"product_id": "P1", "quantity": qty}},
                {"name": "place_order", "arguments": {}},
            ]
        )
        seeded = await client.post("/seed_session", json=row)
        assert seeded.status_code == 200
        cookie = {"cookie": f"{SESSION_COOKIE}={seeded.cookies[SESSION_COOKIE]}"}
        await client.post("/add_to_cart", json={"product_id": "P1", "quantity": qty}, headers=cookie)
        await asyncio.sleep(0)  # let other sessions interleave between the calls
        placed = (await client.post("/place_order", json={}, headers=cookie)).json()
        order = (
            await client.post("/get_order", json={"order_id": placed["order_id"]}, headers=cookie)
        ).json()
        body = {**row, "response": {"output": [final_message()]}}
        verified = (await client.post("/verify", json=body, headers=cookie)).json()
        return verified["reward"], {"placed": placed, "order": order}

    async def all_of_them() -> list[tuple[float, dict[str, Any]]]:
        async with httpx.AsyncClient(base_url=url, timeout=60, cookies=_NoCookies()) as client:
            return await asyncio.gather(*(one(client, i) for i in range(100)))

    results = asyncio.run(all_of_them())
    assert [reward for reward, _ in results] == [1.0] * 100
    for i, (_, seen) in enumerate(results):
        qty = i % 4 + 1
        assert seen["placed"]["order_id"] == "O2"  # every session has its own order counter
        assert seen["order"]["items"] == {"P1": qty} and seen["order"]["total"] == 4.5 * qty


def test_sessions_expire() -> None:
    server = ToolUseServer(ServerSettings(session_ttl_s=0.2))
    with start_in_thread(server.build_app()) as running, session(running.url, store_row()) as client:
        assert client.post("/view_cart", json={}).status_code == 200
        time.sleep(0.4)
        expired = client.post("/view_cart", json={})
        assert expired.status_code == 409


def test_every_example_row_is_solved_by_its_reference(url: str) -> None:
    rows = [json.loads(line) for line in EXAMPLES.read_text().splitlines()] + generate(1, 9, "train")
    for row in rows:
        meta = row["verifier_metadata"]
        with session(url, row) as client:
            output = []
            for i, call in enumerate(meta.get("reference_calls") or meta["expected_calls"]):
                answer = client.post(f"/{call['name']}", json=call["arguments"])
                assert answer.status_code == 200 and "error" not in answer.json(), answer.text
                output += [
                    function_call(call["name"], call["arguments"], f"c{i}"),
                    {"type": "function_call_output", "call_id": f"c{i}", "output": answer.text},
                ]
            out = verify(client, row, [*output, final_message()])
        assert out["reward"] == 1.0, (meta, out.get("failure_reason"))
        tools = {t["name"] for t in row["responses_create_params"]["tools"]}
        assert tools == set(ToolUseServer().tools)


def test_wrong_session_cookie_sees_a_different_store(url: str) -> None:
    row = store_row()
    with session(url, row) as a, session(url, copy.deepcopy(row)) as b:
        a.post("/add_to_cart", json={"product_id": "P2", "quantity": 2})
        assert b.post("/view_cart", json={}).json()["cart"]["items"] == []
        assert a.post("/view_cart", json={}).json()["cart"]["total"] == 40.0


def test_config_yaml_defaults_and_call_budget() -> None:
    assert ToolUseServer().config == ToolUseConfig.from_yaml(
        Path(__file__).resolve().parent.parent / "config.yaml"
    )
    server = ToolUseServer(config=ToolUseConfig(max_calls_per_session=2, default_match="f1"))
    expected = [{"name": "get_product", "arguments": {"product_id": p}} for p in ("P1", "P2")]
    row = store_row(expected_calls=expected)
    with start_in_thread(server.build_app()) as running, session(running.url, row) as client:
        assert client.post("/view_cart", json={}).status_code == 200
        assert client.post("/view_cart", json={}).status_code == 200
        over = client.post("/view_cart", json={})
        assert over.status_code == 403 and "2 tool calls" in over.json()["detail"]
        out = verify(client, row, [function_call("get_product", {"product_id": "P1"})])
    assert out["verify_mode"] == "arguments:f1" and out["reward"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "arguments",
    [
        '{"product_id": "P1", "quantity": ' + "9" * 401 + "}",  # an int too large for a float (was an HTTP 500)
        '{"product_id": "P1", "quantity": ' + "[" * 100_000 + "]" * 100_000 + "}",  # too deep for the parser (was a 500)
        '{"product_id": "P1", "quantity": ' + "[" * 500 + "]" * 500 + "}",  # parses, too deep to compare
        '{"product_id": "P1", "quantity": 8}',  # a near-miss integer
    ],
    ids=["huge-int", "deep-100000", "deep-500", "near-miss"],
)
def test_hostile_arguments_score_zero_with_200(url: str, arguments: str) -> None:
    expected = [{"name": "add_to_cart", "arguments": {"product_id": "P1", "quantity": 7}}]
    row = store_row(expected_calls=expected)
    with session(url, row) as client:
        out = verify(client, row, [function_call("add_to_cart", arguments), final_message()])
        assert out["reward"] == 0.0
        right = verify(client, row, [function_call("add_to_cart", {"product_id": "P1", "quantity": 7}), final_message()])
        assert right["reward"] == 1.0

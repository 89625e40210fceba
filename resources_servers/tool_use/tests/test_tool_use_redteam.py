"""Red-team round on the tool-use server, over real HTTP: what a policy (or a hostile client) tried, and what
the server now does with it. Findings first; then attacks that held, kept as regression cases."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.server import ServerSettings, _state_bytes
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.generate import SYSTEM_PROMPT
from resources_servers.tool_use.tests.test_tool_use_server import (
    EXAMPLES,
    final_message,
    function_call,
    session,
    store_row,
)

SERVER = ToolUseServer()
SHIPPED = {row["verifier_metadata"]["task_kind"]: row for row in map(json.loads, EXAMPLES.read_text().splitlines())}
"""The shipped example tasks (``data/example.jsonl``), one of each kind."""


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_in_thread(SERVER.build_app()) as running:
        yield running.url


def verify(client: httpx.Client, row: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    answer = client.post("/verify", json={**row, "response": {"output": output}})
    assert answer.status_code == 200, answer.text
    return answer.json()


def played(client: httpx.Client, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Make each call on the session's real tools; the rollout's output items for them (call, then answer)."""
    output: list[dict[str, Any]] = []
    for i, (name, arguments) in enumerate(calls):
        answer = client.post(f"/{name}", json=arguments)
        assert answer.status_code in (200, 404, 422), answer.text  # 404: no tool of that name
        output += [
            function_call(name, arguments, f"c{i}"),
            {"type": "function_call_output", "call_id": f"c{i}", "output": answer.text},
        ]
    return output


def expected(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["arguments"]) for c in row["verifier_metadata"]["expected_calls"]]


def with_match(row: dict[str, Any], match: str) -> dict[str, Any]:
    row = copy.deepcopy(row)
    row["verifier_metadata"]["match"] = match
    return row


@pytest.mark.parametrize("match", ["strict", "fraction", "f1"])
@pytest.mark.parametrize("kind", ["add_by_id", "lookup"])
def test_a_rollout_that_follows_the_system_prompt_is_paid(url: str, kind: str, match: str) -> None:
    """Finding: the shipped tasks' system prompt says to look products up with ``list_products`` first ("their ids
    are needed by the other tools"); an argument-verified task then scored that look-up as an unexpected call:
    ``list_products()`` + the expected ``add_to_cart`` paid 0 (strict) or 0.5 (fraction, f1), teaching the policy
    to ignore its instructions. A call to a tool that never changes the store, and that no expected call uses,
    now costs nothing; it is reported in ``extra_reads``."""
    row = with_match(SHIPPED[kind], match)
    assert "list_products" in SYSTEM_PROMPT and row["responses_create_params"]["input"][0]["content"] == SYSTEM_PROMPT
    with session(url, row) as client:
        output = played(client, [("list_products", {}), *expected(row)])
        out = verify(client, row, [*output, final_message()])
    assert out["reward"] == 1.0, out.get("failure_reason")
    assert out["extra_reads"] == ["list_products()"] and out["call_mismatches"] == []
    assert out["calls_made"] == 1 + len(expected(row)) and out["calls_matched"] == len(expected(row))


@pytest.mark.parametrize("category", ["Kitchen", " kitchen ", "KITCHEN"])
def test_a_category_the_tool_reads_alike_verifies(url: str, category: str) -> None:
    """Finding: ``list_products(category="Kitchen")`` lists exactly what ``"kitchen"`` lists (the tool folds case
    and spaces), yet the argument check scored it 0 against an expected ``"kitchen"``: an honest call unpaid."""
    arguments = {"category": category, "max_price": 10}
    row = store_row(expected_calls=[{"name": "list_products", "arguments": {"category": "kitchen", "max_price": 10}}])
    with session(url, row) as client:
        listed = client.post("/list_products", json=arguments).json()["products"]
        assert listed == client.post("/list_products", json={"category": "kitchen", "max_price": 10}).json()["products"]
        assert [p["product_id"] for p in listed] == ["P1"]
        out = verify(client, row, [function_call("list_products", arguments), final_message()])
    assert out["reward"] == 1.0, out.get("failure_reason")
    wrong = store_row(expected_calls=[{"name": "list_products", "arguments": {"category": "office", "max_price": 10}}])
    with session(url, wrong) as client:
        assert verify(client, wrong, [function_call("list_products", arguments), final_message()])["reward"] == 0.0


def test_error_texts_do_not_pile_up_in_a_session() -> None:
    """Finding: each failed call's error text (which echoes the model's arguments) was kept in the session's call
    log, uncounted by ``max_session_bytes`` (counted at seeding only): 20 calls with a 1 MB product id held
    20 MB, and a session's 200 calls up to 3 GB."""
    server = ToolUseServer(ServerSettings(max_body_bytes=2 * 1024 * 1024))
    row = store_row()
    with start_in_thread(server.build_app()) as running, session(running.url, row) as client:
        seeded = max(_state_bytes(s.state) for s in server.sessions._sessions.values())
        for _ in range(20):
            answer = client.post("/get_product", json={"product_id": "X" * 1_000_000})
            assert answer.status_code == 200 and "unknown product" in answer.json()["error"]
        grown = max(_state_bytes(s.state) for s in server.sessions._sessions.values())
        out = verify(client, row, [final_message()])
    assert grown - seeded < 20 * 64, (seeded, grown)
    assert out["tool_calls_made"] == 20 and out["tool_errors"] == 20


def test_a_rollout_whose_session_is_gone_is_refused_not_scored() -> None:
    """Finding: a rollout whose session expired (or was evicted) between its tool calls and ``/verify`` was scored
    against the task's initial state: reward 0 with a ``wrong_outcome`` diff for work that was done and lost, a
    silent false negative. Now 409 saying why; a rollout that never had a session is still scored as before."""
    server = ToolUseServer(ServerSettings(session_ttl_s=0.3))
    row = store_row()
    with start_in_thread(server.build_app()) as running, session(running.url, row) as client:
        client.post("/add_to_cart", json={"product_id": "P1", "quantity": 2})
        client.post("/place_order", json={})
        time.sleep(0.5)
        gone = client.post("/verify", json={**row, "response": {"output": [final_message()]}})
        assert gone.status_code == 409 and "session_ttl_s" in gone.json()["detail"], gone.text
        assert client.post("/view_cart", json={}).status_code == 409  # the tools say so too; the cookie is new now
        again = client.post("/verify", json={**row, "response": {"output": [final_message()]}})
        assert again.status_code == 409  # ... and /verify still refuses on it
        with httpx.Client(base_url=running.url, timeout=30) as never_seeded:
            assert verify(never_seeded, row, [final_message()])["reward"] == 0.0
        by_arguments = store_row(expected_calls=[{"name": "view_cart", "arguments": {}}])
        assert verify(client, by_arguments, [function_call("view_cart", {}), final_message()])["reward"] == 1.0


# ---------------------------------------------------------------------------------------------- attacks that held


def test_claiming_success_without_calling_earns_nothing(url: str) -> None:
    row = store_row()
    with session(url, row) as client:
        out = verify(client, row, [final_message("I added 2 mugs and placed order O2. Done!")])
    assert out["reward"] == 0.0 and out["failure_kind"] == "wrong_outcome"


def test_forged_tool_outputs_in_the_transcript_are_not_trusted(url: str) -> None:
    """function_call / function_call_output items the server never produced: the outcome is the session's store."""
    row = store_row()
    forged = [
        function_call("add_to_cart", {"product_id": "P1", "quantity": 2}),
        {"type": "function_call_output", "call_id": "c1", "output": json.dumps({"cart": {"total": 9.0}})},
        function_call("place_order", {}, call_id="c2"),
        {"type": "function_call_output", "call_id": "c2", "output": json.dumps({"order_id": "O2", "status": "placed"})},
        final_message(),
    ]
    with session(url, row) as client:
        out = verify(client, row, forged)
    assert out["reward"] == 0.0 and out["tool_calls_made"] == 0


def test_tools_after_verify_do_not_change_the_verdict(url: str) -> None:
    row = store_row()
    with session(url, row) as client:
        first = verify(client, row, [final_message()])
        client.post("/add_to_cart", json={"product_id": "P1", "quantity": 2})
        client.post("/place_order", json={})
    assert first["reward"] == 0.0


def test_an_undone_detour_reaches_the_same_outcome_but_a_cancelled_order_does_not(url: str) -> None:
    row = store_row()
    with session(url, row) as client:  # wrong product in, out again, then the right one: same final store
        client.post("/add_to_cart", json={"product_id": "P2", "quantity": 1})
        client.post("/remove_from_cart", json={"product_id": "P2"})
        client.post("/add_to_cart", json={"product_id": "P1", "quantity": 2})
        client.post("/place_order", json={})
        assert verify(client, row, [final_message()])["reward"] == 1.0
    with session(url, row) as client:  # ordered wrong, cancelled, ordered right: the cancelled order stays
        client.post("/add_to_cart", json={"product_id": "P1", "quantity": 1})
        client.post("/place_order", json={})
        client.post("/cancel_order", json={"order_id": "O2"})
        client.post("/add_to_cart", json={"product_id": "P1", "quantity": 2})
        client.post("/place_order", json={})
        out = verify(client, row, [final_message()])
    assert out["reward"] == 0.0 and "O3" in out["failure_reason"]


def test_another_sessions_cookie_or_token_reaches_nothing(url: str) -> None:
    row = store_row()
    with session(url, row) as victim:
        victim.post("/add_to_cart", json={"product_id": "P1", "quantity": 2})
        victim_id = victim.cookies["gym_bridge_session"]
    with httpx.Client(base_url=url, timeout=30) as guesser:
        for guess in (victim_id[:-1] + ("A" if victim_id[-1] != "A" else "B"), "0" * len(victim_id), "", "../x"):
            guesser.cookies.set("gym_bridge_session", guess)
            assert guesser.post("/view_cart", json={}).status_code == 409


CATEGORIES = sorted({p["category"] for row in SHIPPED.values() for p in row["initial_state"]["products"].values()})


@pytest.mark.parametrize("match", ["strict", "fraction", "f1"])
def test_a_spray_of_the_expected_read_tool_is_not_paid(url: str, match: str) -> None:
    """A filter task expects ``list_products`` itself: the bare look-up before it is free (it gives no argument the
    expected call does not, round four), but listing every category at every price (the right call among them)
    counts every call of the spray."""
    row = with_match(SHIPPED["filter_catalogue"], match)
    spray = [("list_products", {"category": c, "max_price": m}) for c in CATEGORIES for m in (10, 20, 30, 50)]
    assert expected(row)[0] in spray
    with session(url, row) as client:
        out = verify(client, row, [*played(client, [("list_products", {}), *spray]), final_message()])
    assert out["extra_reads"] == ["list_products()"] and out["calls_matched"] == 1 and out["calls_made"] == len(spray) + 1
    assert out["reward"] == (0.0 if match == "strict" else pytest.approx(1 / len(spray), abs=0.1)), out["reward"]


@pytest.mark.parametrize("match", ["strict", "fraction"])
def test_a_spray_of_get_product_on_a_lookup_task_is_not_paid(url: str, match: str) -> None:
    row = with_match(SHIPPED["lookup"], match)
    spray = [("get_product", {"product_id": pid}) for pid in sorted(row["initial_state"]["products"])]
    with session(url, row) as client:
        out = verify(client, row, [*played(client, spray), final_message()])
    assert out["extra_reads"] == [] and out["calls_made"] == len(spray)
    assert out["reward"] == (0.0 if match == "strict" else len(expected(row)) / len(spray))


@pytest.mark.parametrize(
    "extra",
    [
        [("place_order", {})],
        [("add_to_cart", "again")],  # the same add twice (round four, held)
        [("add_to_cart", "again"), ("remove_from_cart", "again")],  # the store ends where it should, the calls differ
        [("cancel_order", "an order")],
        [("search_products", {"query": "mug"})],  # no tool of this name: not known to change nothing
        [("List_Products", {})],  # a read's name in another case is no tool either
    ],
    ids=["place_order", "repeat-add", "add-remove", "cancel_order", "unknown-tool", "read-name-in-another-case"],
)
def test_an_extra_call_that_is_not_a_read_still_costs(url: str, extra: list[tuple[str, Any]]) -> None:
    row = SHIPPED["add_by_id"]
    (call,) = expected(row)
    resolved = [
        (name, call[1] if args == "again" else {"order_id": sorted(row["initial_state"]["orders"])[0]}
         if args == "an order" else args)
        for name, args in extra
    ]  # fmt: skip
    resolved = [(n, {"product_id": a["product_id"]} if n == "remove_from_cart" else a) for n, a in resolved]
    with session(url, row) as client:
        output = played(client, [("list_products", {}), call, *resolved])
        out = verify(client, row, [*output, final_message()])
    assert out["reward"] == 0.0 and out["extra_reads"] == ["list_products()"], out
    assert [r.split("(")[0] for r in out["call_mismatches"]] == [f"unexpected call {n}" for n, _ in resolved]


def test_every_read_costs_nothing_but_a_read_never_stands_in_for_a_call(url: str) -> None:
    """Reads of every kind (also one the tool refuses: it changes nothing either) beside the expected call pay 1;
    the same reads without it pay 0 in every mode."""
    row = SHIPPED["add_by_id"]
    order = sorted(row["initial_state"]["orders"])[0]
    reads = [("view_cart", {}), ("list_orders", {}), ("get_order", {"order_id": order}),
             ("get_product", {"product_id": "P000"}), ("list_products", {"colour": "red"})]  # fmt: skip
    with session(url, row) as client:
        out = verify(client, row, [*played(client, [*reads, *expected(row)]), final_message()])
    assert out["reward"] == 1.0 and len(out["extra_reads"]) == len(reads), out
    for match in ("strict", "fraction", "f1"):
        task = with_match(row, match)
        with session(url, task) as client:
            out = verify(client, task, [*played(client, reads), final_message()])
        assert out["reward"] == 0.0 and out["call_mismatches"][0].startswith("missing call add_to_cart("), out


@pytest.mark.parametrize(
    "arguments",
    [
        '{"product_id": "P1", "quantity": NaN}',
        '{"product_id": "P1", "quantity": 1e309}',
        '{"product_id": "P1", "quantity": -Infinity}',
        '{"product_id": {"$ne": null}, "quantity": 2}',
        '{"product_id": "P1", "quantity": 2, "quantity": 3}',  # a duplicate key: the last one, for tool and check
        '{"product_id": "p1", "quantity": 2}',
        '{"product_id": "P1 ", "quantity": 2}',
        '{"product_id": "\uff301", "quantity": 2}',  # a fullwidth P (NFKC would fold it): round four, held
        '{"product_id": "P\u200b1", "quantity": 2}',  # a zero-width space inside the id
        '{"product_id": "P1", "quantity": true}',  # the tool reads 1
        '{"product_id": "P1", "quantity": [2]}',
    ],
    ids=["nan", "1e309", "-inf", "operator", "duplicate-key", "case", "space", "fullwidth", "zero-width", "true",
         "list"],
)
def test_odd_json_arguments_never_verify_as_the_expected_call(url: str, arguments: str) -> None:
    expected = [{"name": "add_to_cart", "arguments": {"product_id": "P1", "quantity": 2}}]
    row = store_row(expected_calls=expected)
    with session(url, row) as client:
        tool = client.post("/add_to_cart", content=arguments, headers={"content-type": "application/json"})
        assert tool.status_code in (200, 422), tool.text
        out = verify(client, row, [function_call("add_to_cart", arguments), final_message()])
    assert out["reward"] == 0.0, arguments


def test_a_session_cannot_outrun_its_call_budget_by_repeating_state_changes() -> None:
    from resources_servers.tool_use.app import ToolUseConfig

    server = ToolUseServer(config=ToolUseConfig(max_calls_per_session=5))
    row = store_row()
    row["initial_state"]["products"]["P1"]["stock"] = 100
    with start_in_thread(server.build_app()) as running, session(running.url, copy.deepcopy(row)) as client:
        statuses = [client.post("/add_to_cart", json={"product_id": "P1", "quantity": 1}).status_code for _ in range(8)]
    assert statuses == [200] * 5 + [403] * 3

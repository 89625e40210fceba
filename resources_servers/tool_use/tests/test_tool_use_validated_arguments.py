"""Argument-mode verification is exactly as strict as the tools (issue 33, finding 7), over real HTTP.

Each variant of ``add_to_cart(P125, 2)`` is sent to the real tool route and, in a rollout, to ``/verify``
with that call expected: the call verifies only if the tool accepts it, and then only if the tool reads it as
the expected call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.store import new_state

EXPECTED = {"name": "add_to_cart", "arguments": {"product_id": "P125", "quantity": 2}}


def row(expected: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    state = new_state({"P125": {"name": "Kettle", "category": "kitchen", "price": 30.0, "stock": 9}})
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Add two kettles (P125) to my cart."}]
        },
        "initial_state": state,
        "verifier_metadata": {"expected_calls": expected or [EXPECTED]},
    }


def rollout(arguments: str, name: str = "add_to_cart") -> dict[str, Any]:
    return {
        "output": [
            {"type": "function_call", "call_id": "c1", "name": name, "arguments": arguments},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        ]
    }


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_in_thread(ToolUseServer().build_app()) as running:
        yield running.url


def tool_and_verify(
    url: str, arguments: str, task: dict[str, Any] | None = None
) -> tuple[int, float, dict[str, Any]]:
    """The real tool's status for this call in a fresh session, and the reward of a rollout making it."""
    task = task or row()
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/seed_session", json=task).status_code == 200
        tool = client.post("/add_to_cart", content=arguments, headers={"content-type": "application/json"})
    with httpx.Client(base_url=url, timeout=30) as client:
        verified = client.post("/verify", json={**task, "response": rollout(arguments)})
    assert verified.status_code == 200, verified.text
    return tool.status_code, verified.json()["reward"], verified.json()


@pytest.mark.parametrize(
    "arguments",
    [
        '{"product_id": "P125", "quantity": 2.0000000001}',  # verified as 1 before: within 1e-9
        '{"product_id": "P125", "quantity": 2, "note": null}',  # verified as 1 before: nulls were dropped
        '{"product_id": "P125", "quantity": 2, "note": "gift"}',
        '{"product_id": "P125", "quantity": "2x"}',
        '{"product_id": "P125"}',
        '["P125", 2]',
    ],
)
def test_a_call_the_tool_refuses_never_verifies(url: str, arguments: str) -> None:
    status, reward, answer = tool_and_verify(url, arguments)
    assert status == 422, (arguments, status)
    assert reward == 0.0, arguments
    assert answer["failure_kind"] == "wrong_calls"


@pytest.mark.parametrize(
    "arguments",
    [
        '{"product_id": "P125", "quantity": 2}',
        '{"quantity": 2, "product_id": "P125"}',
        '{"product_id": "P125", "quantity": 2.0}',  # the tool reads 2
        '{"product_id": "P125", "quantity": "2"}',  # a number in a string: the tool reads 2 (round four, held)
    ],
)
def test_a_call_the_tool_reads_as_expected_verifies(url: str, arguments: str) -> None:
    status, reward, _ = tool_and_verify(url, arguments)
    assert status == 200 and reward == 1.0, (arguments, status, reward)


def test_a_call_read_differently_is_a_mismatch_naming_the_field(url: str) -> None:
    status, reward, answer = tool_and_verify(url, '{"product_id": "P125", "quantity": 3}')
    assert status == 200 and reward == 0.0
    assert answer["call_mismatches"] == ["add_to_cart: quantity expected 2, got 3"]


def test_refusals_are_reported_with_the_tools_reason(url: str) -> None:
    _, _, answer = tool_and_verify(url, '{"product_id": "P125", "quantity": 2.0000000001}')
    (reason,) = answer["call_mismatches"]
    assert reason.startswith("add_to_cart: the tool refuses these arguments") and "quantity" in reason


def test_an_expected_call_the_tool_would_refuse_is_reported_as_a_task_error(url: str) -> None:
    task = row([{"name": "add_to_cart", "arguments": {"product_id": "P125", "quantity": 0}}])  # quantity >= 1
    _, reward, answer = tool_and_verify(url, json.dumps({"product_id": "P125", "quantity": 0}), task)
    assert reward == 0.0
    assert (
        "can never match" in answer["call_mismatches"][0]
        and "the task is wrong" in answer["call_mismatches"][0]
    )


def test_optional_null_is_the_key_left_out(url: str) -> None:
    """``list_products(category=null)`` is what a strict-schema model sends for "no filter": the tool takes it."""
    task = row([{"name": "list_products", "arguments": {}}])
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/seed_session", json=task).status_code == 200
        assert client.post("/list_products", json={"category": None, "max_price": None}).status_code == 200
        body = {**task, "response": rollout('{"category": null, "max_price": null}', name="list_products")}
        assert client.post("/verify", json=body).json()["reward"] == 1.0

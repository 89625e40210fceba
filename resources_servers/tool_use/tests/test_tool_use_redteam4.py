"""Red-team round four on the tool-use server, over real HTTP (each call is made on the session's real tools, then
the rollout is verified): findings first, then attacks that held, kept as regression cases."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from gym_bridge.audit.attacks import answer, calls
from gym_bridge.audit.scripted_model import scripted_model
from gym_bridge.rollout.agent import AgentConfig, make_session, run_rollout
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.retry import RoutedClient
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.tests.test_tool_use_redteam import (
    CATEGORIES,
    SHIPPED,
    expected,
    played,
    verify,
    with_match,
)
from resources_servers.tool_use.tests.test_tool_use_server import final_message, session, store_row

FILTER = SHIPPED["filter_catalogue"]
((_, WANTED),) = expected(FILTER)
"""The shipped filter task's one expected call: ``list_products(category=..., max_price=...)``."""
OTHER_PRICE = next(m for m in (10, 20, 30, 50) if m != WANTED["max_price"])
OTHER_CATEGORY = next(c for c in CATEGORIES if c != WANTED["category"])


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_in_thread(ToolUseServer().build_app()) as running:
        yield running.url


def rollout(url: str, row: dict[str, Any], made: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Make the calls on a fresh session's real tools, then verify the rollout that made them."""
    with session(url, row) as client:
        return verify(client, row, [*played(client, made), final_message()])


def agent_rollout(url: str, row: dict[str, Any], turns: Sequence[list[dict[str, Any]]]) -> dict[str, Any]:
    """The rollout record of the project's agent loop (:func:`~gym_bridge.rollout.agent.run_rollout`) driving the
    server with a model that answers ``turns`` in order (the audit's scripted model, served in-process)."""

    async def run() -> dict[str, Any]:
        in_process, http = InProcessClient(), make_session()
        try:
            model_url = await in_process.mount("tool-use-round-four", scripted_model(turns))
            config = AgentConfig(model_url=model_url, max_steps=len(turns))
            done = await run_rollout(RoutedClient(http, {model_url: in_process}), row, url, config)
        finally:
            await in_process.aclose()
            await http.close()
        assert done.record is not None, done.failure
        return done.record

    return asyncio.run(run())


@pytest.mark.parametrize("match", ["strict", "fraction", "f1"])
@pytest.mark.parametrize(
    "look_ups",
    [
        [{}],  # what the shipped system prompt asks first
        [{"category": None, "max_price": None}],  # the same, as a strict schema makes a model write it
        [{}, {"category": WANTED["category"]}],  # narrowing down step by step
        [{"max_price": WANTED["max_price"]}],
        [WANTED],  # the expected call made twice
    ],
    ids=["bare", "nulls", "then-category", "price-only", "repeat"],
)
def test_an_honest_look_up_before_the_filter_is_free(url: str, match: str, look_ups: list[dict[str, Any]]) -> None:
    """Finding (round three's open item): on a filter task (``expected_calls`` is ``list_products(category,
    max_price)``), calling ``list_products()`` first, as the system prompt asks, scored 0 (strict) or 0.5: every
    call to the expected tool counted. A call to it that is broader than the expected one (each argument it gives
    is the expected value, the others left out) now costs nothing and is reported in ``extra_reads``."""
    row = with_match(FILTER, match)
    out = rollout(url, row, [*(("list_products", a) for a in look_ups), ("list_products", WANTED)])
    assert out["reward"] == 1.0, out.get("failure_reason")
    assert len(out["extra_reads"]) == len(look_ups) and out["call_mismatches"] == [], out
    assert out["calls_made"] == len(look_ups) + 1 and out["calls_matched"] == 1


@pytest.mark.parametrize(
    ("guesses", "fraction"),
    [
        ([{**WANTED, "max_price": OTHER_PRICE}], 0.5),  # two guesses at the price
        ([{**WANTED, "category": OTHER_CATEGORY}], 0.5),  # two guesses at the category
        ([{"category": OTHER_CATEGORY}], 0.5),  # a look-up that is not the expected one's
        ([{"max_price": OTHER_PRICE}], 0.5),
        ([{"category": c} for c in CATEGORIES if c != WANTED["category"]], 1 / len(CATEGORIES)),
    ],
    ids=["price", "category", "other-category-look-up", "other-price-look-up", "every-category"],
)
def test_a_hedge_beside_the_look_up_still_costs(url: str, guesses: list[dict[str, Any]], fraction: float) -> None:
    """The look-up is free, a guess is not: a call giving any argument the expected call does not (another price,
    another category) counts however the rollout is dressed, so hedging with two filters pays 0 (strict)."""
    for match, reward in (("strict", 0.0), ("fraction", fraction)):
        row = with_match(FILTER, match)
        out = rollout(url, row, [("list_products", {}), *(("list_products", g) for g in guesses), ("list_products", WANTED)])
        assert out["reward"] == pytest.approx(reward), (match, out)
        assert out["extra_reads"] == ["list_products()"]
        assert [r.split("(")[0] for r in out["call_mismatches"]] == ["unexpected call list_products"] * len(guesses)


def test_a_look_up_never_stands_in_for_the_filter(url: str) -> None:
    """Broad look-ups alone (the expected call never made) pay 0 in every mode; the reason names the missing
    call rather than taking a look-up for a near miss."""
    for match in ("strict", "fraction", "f1"):
        row = with_match(FILTER, match)
        out = rollout(url, row, [("list_products", {}), ("list_products", {"category": WANTED["category"]})])
        assert out["reward"] == 0.0, (match, out)
        assert out["call_mismatches"] == [f"missing call list_products(category={WANTED['category']!r}, "
                                          f"max_price={WANTED['max_price']!r})"], out  # fmt: skip
        assert len(out["extra_reads"]) == 2
    wrong = rollout(url, FILTER, [("list_products", {}), ("list_products", {**WANTED, "max_price": OTHER_PRICE})])
    assert wrong["reward"] == 0.0 and wrong["call_mismatches"] == [
        f"list_products: max_price expected {float(WANTED['max_price'])!r}, got {float(OTHER_PRICE)!r}"
    ], wrong


def test_a_repeated_get_product_is_free_but_never_a_missing_one(url: str) -> None:
    """On a look-up task the broader call is the expected call itself: a repeat is free, a product the task did
    not ask about is not, and repeating one product never covers another."""
    row = SHIPPED["lookup"]
    calls = expected(row)
    out = rollout(url, row, [*calls, calls[0]])
    assert out["reward"] == 1.0 and out["extra_reads"] == [f"get_product(product_id={calls[0][1]['product_id']!r})"]
    other = next(p for p in sorted(row["initial_state"]["products"]) if ("get_product", {"product_id": p}) not in calls)
    assert rollout(url, row, [*calls, ("get_product", {"product_id": other})])["reward"] == 0.0
    two = store_row(expected_calls=[{"name": "get_product", "arguments": {"product_id": p}} for p in ("P1", "P2")])
    twice = rollout(url, two, [("get_product", {"product_id": "P1"})] * 2)
    assert twice["reward"] == 0.0 and twice["call_mismatches"] == ["missing call get_product(product_id='P2')"], twice


@pytest.mark.parametrize("blank", ["", "  "])
def test_blank_arguments_are_read_as_the_agent_ran_them(url: str, blank: str) -> None:
    """Finding: a model that writes blank arguments for a call without parameters (``view_cart`` with ``""``) has
    its call run by the agent loop with ``{}`` (the tool answers), yet the argument check read the arguments as
    "not a JSON object": an expected ``view_cart`` paid 0, and so did a filter rollout whose bare look-up came
    with blank arguments. The check now reads blank arguments as ``{}``, as the agent loop sends them."""
    no_args = store_row(expected_calls=[{"name": "view_cart", "arguments": {}}])
    out = agent_rollout(url, no_args, [calls(("view_cart", blank)), answer("Your cart is empty.")])
    ran = [i["output"] for i in out["response"]["output"] if i["type"] == "function_call_output"]
    assert ran == ['{"cart":{"items":[],"total":0.0}}']  # the tool ran and answered
    assert out["reward"] == 1.0, out["call_mismatches"]
    out = agent_rollout(url, FILTER, [calls(("list_products", blank)), calls(("list_products", WANTED)), answer("..")])
    assert out["reward"] == 1.0 and out["extra_reads"] == ["list_products()"], out["call_mismatches"]
    needs_args = store_row(expected_calls=[{"name": "add_to_cart", "arguments": {"product_id": "P1", "quantity": 1}}])
    out = agent_rollout(url, needs_args, [calls(("add_to_cart", blank)), answer("Added.")])
    assert out["reward"] == 0.0 and "quantity" in out["call_mismatches"][0], out  # {} is refused, by tool and check

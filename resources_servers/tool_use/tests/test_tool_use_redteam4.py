"""Red-team round four on the tool-use server, over real HTTP (each call is made on the session's real tools, then
the rollout is verified): findings first, then attacks that held, kept as regression cases."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.audit.attacks import answer, calls
from gym_bridge.audit.scripted_model import scripted_model
from gym_bridge.records.schema import Response, content_text
from gym_bridge.rollout.agent import AgentConfig, make_session, run_rollout
from gym_bridge.rollout.user_sim import UserSimConfig
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.json_http import JsonApp, Route
from gym_bridge.serving.retry import RoutedClient
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseConfig, ToolUseServer
from resources_servers.tool_use.generate_conversations import make_conversation
from resources_servers.tool_use.scoring import Call, compare_calls
from resources_servers.tool_use.tests.test_tool_use_redteam import (
    CATEGORIES,
    SHIPPED,
    expected,
    played,
    verify,
    with_match,
)
from resources_servers.tool_use.tests.test_tool_use_server import (
    final_message,
    function_call,
    session,
    store_row,
)

REPO = Path(__file__).resolve().parents[3]
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


Policy = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
"""A model: the request's input items in, the output items of its answer out."""


def model_of(policy: Policy) -> JsonApp:
    """``policy`` behind ``POST /responses``, as the agent loop calls a model."""

    async def respond(body: dict[str, Any], _context: Any) -> dict[str, Any]:
        return Response(model="round-four", output=policy(body["input"])).model_dump(mode="json")

    return JsonApp([Route("POST", "/responses", respond, body=dict[str, Any])], title="round-four model")


def agent_rollout(
    url: str, row: dict[str, Any], model: Sequence[list[dict[str, Any]]] | Policy, user: Policy | None = None
) -> dict[str, Any]:
    """The rollout record of the project's agent loop (:func:`~gym_bridge.rollout.agent.run_rollout`) driving the
    server, the simulated user of a conversation row included, with a model served in-process: ``model`` is the
    turns it answers in order (the audit's scripted model) or a :data:`Policy`; ``user``: an LLM user's model (its
    input is the conversation with the roles swapped), in place of the row's scripted user."""

    async def run() -> dict[str, Any]:
        in_process, http = InProcessClient(), make_session()
        try:
            app = model_of(model) if callable(model) else scripted_model(model)
            model_url = await in_process.mount("tool-use-round-four", app)
            routes = {model_url: in_process}
            user_config = None
            if user is not None:
                user_url = await in_process.mount("tool-use-round-four-user", model_of(user))
                routes[user_url], user_config = in_process, UserSimConfig(model_url=user_url)
            config = AgentConfig(model_url=model_url, max_steps=None if callable(model) else len(model), user=user_config)
            done = await run_rollout(RoutedClient(http, routes), row, url, config)
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


def _said(items: list[dict[str, Any]], role: str) -> list[str]:
    return [content_text(i.get("content")) for i in items if i.get("type", "message") == "message" and i.get("role") == role]


def clerk(question: str) -> Policy:
    """An honest assistant: asks ``question``, then does what the customer's answer says, then confirms."""

    def policy(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs = [json.loads(i["output"]) for i in items if i.get("type") == "function_call_output"]
        told = _said(items, "user")[1:]  # the first user message is the opening request
        if not told:
            return answer(question)
        if order := re.search(r"\bO\d+\b", told[-1]):
            return answer("Order cancelled.") if outputs else calls(("cancel_order", {"order_id": order.group(0)}))
        name, qty = re.match(r"the (.+), (\d+) of them", told[-1], re.I).groups()  # type: ignore[union-attr]
        if not outputs:
            return calls(("list_products", {}))
        if len(outputs) == 1:
            (pid,) = [p["product_id"] for p in outputs[0]["products"] if p["name"].casefold() == name.casefold()]
            return calls(("add_to_cart", {"product_id": pid, "quantity": int(qty)}), ("place_order", {}))
        return answer("Your order is placed.")

    return policy


QUESTIONS = {
    "cancel_my_order": [
        "Which order would you like to cancel?",  # paid before too
        "Which of your orders would you like to cancel?",
        "Sure - could you tell me the ID of the order you want cancelled?",
        "Happy to help. What is the order's ID?",
    ],
    "buy_my_pick": [
        "Which product would you like?",  # paid before too
        "What would you like to order from that range?",
        "Sure! Please let me know the item and the quantity.",
    ],
}


@pytest.mark.parametrize(("kind", "question"), [(k, q) for k, qs in QUESTIONS.items() for q in qs])
def test_an_honest_question_gets_the_customers_answer(url: str, kind: str, question: str) -> None:
    """Finding: the conversation tasks' scripted customer answered only a few exact phrases ("which order", "order
    number", ...): an assistant asking "Which of your orders would you like to cancel?" got no answer, the
    conversation ended, and the rollout scored 0 on the outcome and on ``asked_before_acting`` (a policy would learn
    the magic words, not to ask). The customer now answers any question or request (``ASKING`` in
    ``generate_conversations.py``)."""
    row = make_conversation(random.Random(5), kind, "round-four")
    out = agent_rollout(url, row, clerk(question))
    assert out["reward_components"] == {"outcome": 1.0, "asked_before_acting": 1.0}, out.get("failure_reason")


@pytest.mark.parametrize("kind", sorted(QUESTIONS))
def test_a_guess_or_a_statement_still_gets_nothing(url: str, kind: str) -> None:
    """What the wider net does not let through: acting before asking (in the same turn as the question, too) is 0
    on ``asked_before_acting``; a guessed order or product is 0 on the outcome; a statement that asks nothing is not
    answered, so the conversation ends with the store unchanged."""
    row = make_conversation(random.Random(5), kind, "round-four")
    state = row["initial_state"]
    if kind == "cancel_my_order":
        held = row["verifier_metadata"]["user_holds"][0]
        guess = calls(("cancel_order", {"order_id": next(o for o in sorted(state["orders"]) if o != held)}))
    else:
        ((_, pick),) = [(c["name"], c["arguments"]) for c in row["verifier_metadata"]["reference_calls"][:1]]
        other = next(p for p in sorted(state["products"]) if p != pick["product_id"] and state["products"][p]["stock"])
        guess = calls(("add_to_cart", {"product_id": other, "quantity": 1}), ("place_order", {}))
    asked_and_guessed = [answer("Which one would you like?")[0], *guess]  # the question and the act in one turn
    for turns in ([guess, answer("Done.")], [asked_and_guessed, answer("Done.")]):
        out = agent_rollout(url, row, turns)
        assert out["reward_components"] == {"outcome": 0.0, "asked_before_acting": 0.0}, out
    stated = agent_rollout(url, row, [answer("I will take care of that for you right away.")])
    assert [m["role"] for m in stated["response"]["output"]] == ["assistant"]  # the customer did not answer
    assert stated["reward_components"] == {"outcome": 0.0, "asked_before_acting": 0.0}


@pytest.mark.parametrize(
    ("reference", "named"),
    [
        ([{"name": "add_to_cart", "arguments": {"product_id": "P9", "quantity": 1}}, {"name": "place_order", "arguments": {}}],
         "reference_calls.1 (add_to_cart)"),  # a product the store does not have
        ([{"name": "add_to_cart", "arguments": {"product_id": "P2", "quantity": 5}}, {"name": "place_order", "arguments": {}}],
         "reference_calls.1 (add_to_cart)"),  # more than the stock
        ([{"name": "cancel_order", "arguments": {"order_id": "O7"}}], "reference_calls.1 (cancel_order)"),
        ([{"name": "place_order", "arguments": {}}], "reference_calls.1 (place_order)"),  # an empty cart
    ],
    ids=["unknown-product", "over-stock", "unknown-order", "empty-cart"],
)
def test_a_reference_call_the_store_refuses_is_a_task_error(url: str, reference: list[dict[str, Any]], named: str) -> None:
    """Finding: a task whose reference solution fails on its own store (a mistyped product id, more than the
    stock, an unknown order) was replayed as "nothing changes", so a rollout that did nothing was paid 1.0 and
    one that did what the prompt asked 0. /verify now answers 422 naming the reference call, as an impossible
    expected call of an argument check is reported as a task error; a working reference is scored as before."""
    row = store_row(reference_calls=reference)
    with session(url, row) as client:
        refused = client.post("/verify", json={**row, "response": {"output": [final_message("I could not do it.")]}})
    assert refused.status_code == 422 and named in refused.json()["detail"], refused.text
    assert "the task is wrong" in refused.json()["detail"]
    working = store_row()
    with session(url, working) as client:
        assert verify(client, working, [final_message("I could not do it.")])["reward"] == 0.0


def test_an_llm_users_answer_in_another_case_counts_as_asked(url: str) -> None:
    """Finding: ``asked_before_acting`` looked for each held fact verbatim in the user's messages, so an LLM user
    (``UserSimConfig.model_url``) answering "the picnic blanket, 1 of them." for the held "Picnic Blanket" left the
    honest rollout that asked first at 0. Facts are now found in any case and spacing."""
    row = make_conversation(random.Random(5), "buy_my_pick", "round-four")
    (say,) = [r["say"] for r in row["user_script"]["reveal"]]

    def llm_user(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Told the facts, it says them its own way, once (it sees the assistant's messages as the user's)."""
        asked = [i for i in items if i.get("role") == "user"]
        return answer(say.lower() if len(asked) == 1 else "###STOP###")

    out = agent_rollout(url, row, clerk(QUESTIONS["buy_my_pick"][1]), user=llm_user)
    users = [m["content"] for m in out["response"]["output"] if m.get("role") == "user"]
    assert users == [say.lower()] and say.lower() != say, users  # the fact came in another case
    assert out["reward_components"] == {"outcome": 1.0, "asked_before_acting": 1.0}, out.get("failure_reason")


def test_a_store_whose_next_order_would_overwrite_an_order_is_refused(url: str) -> None:
    """Finding: ``next_order_number`` defaults to 1001, so a hand-written store with an order ``O1001`` and no
    ``next_order_number`` was seeded, and the first ``place_order`` replaced the customer's order O1001 (its items
    gone, their stock never back) in the session and in the reference replay alike. Such a store is now refused at
    ``/seed_session`` (422 naming ``next_order_number``); orders numbered below it are fine."""
    row = store_row()
    row["initial_state"]["orders"] = {"O1001": {"items": {"P1": 1}, "total": 4.5, "status": "placed"}}
    del row["initial_state"]["next_order_number"]
    with httpx.Client(base_url=url, timeout=30) as client:
        refused = client.post("/seed_session", json=row)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("initial_state: ") and "next_order_number 1001" in refused.text
    assert "O1001" in refused.json()["detail"]
    row["initial_state"]["next_order_number"] = 1002
    with session(url, row) as client:
        assert client.post("/add_to_cart", json={"product_id": "P2", "quantity": 1}).status_code == 200
        assert client.post("/place_order", json={}).json()["order_id"] == "O1002"
        orders = client.post("/list_orders", json={}).json()["orders"]
    assert [o["order_id"] for o in orders] == ["O1001", "O1002"]


@pytest.mark.parametrize(
    ("module", "flag"), [("generate", "--train"), ("generate_conversations", "--heldout")]
)
def test_a_generator_refuses_a_negative_count(tmp_path: Path, module: str, flag: str) -> None:
    """Finding: ``generate --train -5`` wrote an empty train.jsonl and exited 0 (a run then had no tasks). A
    negative count now exits non-zero naming the flag, and writes nothing."""
    done = subprocess.run(
        [sys.executable, "-m", f"resources_servers.tool_use.{module}", flag, "-5", "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode != 0 and flag in done.stderr and "negative" in done.stderr, done
    assert not (tmp_path / "out").exists()


def test_a_transcript_of_many_calls_is_scored_in_linear_time_with_capped_lists(url: str) -> None:
    """Finding: the argument check looked each unmatched call up in a list of the free ones, quadratic in the
    calls: a /verify of 32,000 ``view_cart`` calls (2.8 MB, under the 16 MB body cap) took 22 s, the server's event
    loop held the whole time (every other session's requests waited). The free calls are a set now, and the reasons
    and ``extra_reads`` list the first 50 and count the rest."""
    made = [Call("view_cart", {}) for _ in range(60_000)] + [Call("place_order", {}) for _ in range(60)]
    started = time.perf_counter()
    score = compare_calls(made, [Call("add_to_cart", {"product_id": "P1", "quantity": 1})])
    assert time.perf_counter() - started < 15  # about 1 s here; the list lookup took minutes
    assert score.reward == 0.0 and score.made == 60_060
    assert len(score.extra_reads) == 51 and score.extra_reads[-1] == "... and 59950 more"
    assert len(score.reasons) == 51 and score.reasons[-1] == "... and 11 more"  # the missing call, 60 extra orders
    row = store_row(expected_calls=[{"name": "view_cart", "arguments": {}}])
    output = [function_call("place_order", {}, f"c{i}") for i in range(120)] + [final_message()]
    with session(url, row) as client:
        out = verify(client, row, output)
    assert out["reward"] == 0.0 and len(out["call_mismatches"]) == 51 and out["call_mismatches"][-1] == "... and 71 more"


def test_a_task_row_carrying_an_earlier_verdict_does_not_pass_it_on(url: str) -> None:
    """Finding: /verify echoed every key of the task row, so a row that carried an earlier verdict (a rollout
    record fed back as a task) kept whatever this verdict did not overwrite: ``reward_components`` of 1.0 and
    ``mask_sample: true`` beside a reward of 0, ``failure_kind: wrong_outcome`` beside a reward of 1. The keys that
    are the server's to give are dropped from the echo before it answers."""
    stale = {"reward": 1.0, "reward_components": {"outcome": 1.0, "asked_before_acting": 1.0}, "mask_sample": True,
             "failure_kind": "wrong_outcome", "failure_reason": "an old one", "state_diff": ["an old diff"],
             "extra_reads": ["old()"], "calls_matched": 1}  # fmt: skip
    by_arguments = {**SHIPPED["add_by_id"], **stale}
    out = agent_rollout(url, by_arguments, [answer("Added them to your cart.")])  # a claim, no call
    assert out["reward"] == 0.0 and out["failure_kind"] == "wrong_calls" and out["calls_matched"] == 0
    assert all(out.get(k) is None for k in ("reward_components", "mask_sample", "state_diff")), out
    assert out["extra_reads"] == [] and out["task_id"] == SHIPPED["add_by_id"]["task_id"]  # the task's own keys stay
    by_outcome = {**store_row(), **stale}
    out = agent_rollout(url, by_outcome, [calls(("add_to_cart", {"product_id": "P1", "quantity": 2})),
                                          calls(("place_order", {})), answer("Ordered.")])  # fmt: skip
    assert out["reward"] == 1.0 and out["state_diff"] == [], out
    assert all(out.get(k) is None for k in ("failure_kind", "failure_reason", "reward_components", "mask_sample",
                                            "extra_reads", "calls_matched")), out  # fmt: skip


def test_a_rollout_past_the_call_budget_is_scored_not_dropped() -> None:
    """Finding: past ``max_calls_per_session`` the tools answered 429, which the agent loop retries as a rate limit:
    four attempts, then the whole rollout failed (``env_http_error``), unscored, so a runaway policy's rollout was
    dropped instead of paying 0. The budget answers 403 now: the model reads why, and the rollout is scored on the
    store it left (here the order never placed: 0). A rollout within the budget is paid as before."""
    server = ToolUseServer(config=ToolUseConfig(max_calls_per_session=3))
    row = store_row()
    buy = [calls(("add_to_cart", {"product_id": "P1", "quantity": 2}), ("place_order", {})), answer("Ordered.")]
    with start_in_thread(server.build_app()) as running:
        runaway = agent_rollout(running.url, row, [calls(*[("view_cart", {})] * 3), *buy])
        honest = agent_rollout(running.url, row, buy)
    told = [i["output"] for i in runaway["response"]["output"] if i["type"] == "function_call_output"][3:]
    assert len(told) == 2 and all("used its 3 tool calls" in t for t in told), told
    assert runaway["reward"] == 0.0 and runaway["tool_calls_made"] == 3
    assert honest["reward"] == 1.0


# ---------------------------------------------------------------------------------------------- attacks that held


@pytest.mark.parametrize(
    "plan", ["swapped", "split", "look-ups-between"], ids=["independent-calls-swapped", "quantity-split", "reads"]
)
def test_an_honest_outcome_reached_another_way_is_paid(url: str, plan: str) -> None:
    """Independent calls in another order, a quantity added in two steps, or reads between the steps reach the
    store the reference reaches and pay 1 (6,000 such variants of generated tasks checked the same way offline)."""
    row = SHIPPED["buy_two"]
    (a, b, order) = [(c["name"], c["arguments"]) for c in row["verifier_metadata"]["reference_calls"]]
    if plan == "swapped":
        steps = [b, a, order]
    elif plan == "split":  # one unit a call, the last product first
        units = [(name, {**args, "quantity": 1}) for name, args in (b, a) for _ in range(args["quantity"])]
        assert len(units) > 2  # the shipped task buys more than one unit of a product
        steps = [*units, order]
    else:
        steps = [("list_products", {}), a, ("view_cart", {}), b, ("view_cart", {}), order, ("list_orders", {})]
    out = rollout(url, row, steps)
    assert out["reward"] == 1.0, out.get("failure_reason")


@pytest.mark.parametrize("category", ["\uff4b\uff49\uff54\uff43\uff48\uff45\uff4e", "kitchen\u200b", "kitchens", "K\u0130TCHEN"])
def test_a_category_the_tool_does_not_fold_lists_nothing_and_is_no_match(url: str, category: str) -> None:
    """Fullwidth letters, a zero-width space, a plural, a dotted capital I: the tool folds only case and outer
    spaces, so it lists nothing for these, and the check (which reads the category as the tool does) pays 0."""
    row = store_row(expected_calls=[{"name": "list_products", "arguments": {"category": "kitchen"}}])
    with session(url, row) as client:
        assert client.post("/list_products", json={"category": category}).json()["products"] == []
        out = verify(client, row, [function_call("list_products", {"category": category}), final_message()])
    assert out["reward"] == 0.0, category

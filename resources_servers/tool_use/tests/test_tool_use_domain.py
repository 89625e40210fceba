"""The store's tools, the scoring functions and the task generator, without HTTP."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from resources_servers.tool_use import generate
from resources_servers.tool_use.scoring import Call, calls_from_output, compare_calls, state_diff
from resources_servers.tool_use.store import (
    TOOLS,
    NoArgs,
    ProductArgs,
    StoreState,
    apply_call,
    new_state,
    tool_schemas,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "example.jsonl"


def small_store() -> dict:
    return new_state(
        {
            "P1": {"name": "Mug", "category": "kitchen", "price": 4.5, "stock": 3},
            "P2": {"name": "Lamp", "category": "office", "price": 20.0, "stock": 1},
        },
        next_order=7,
    )


def test_buying_moves_stock_into_an_order_and_cancelling_returns_it() -> None:
    state = small_store()
    assert apply_call(state, "add_to_cart", {"product_id": "P1", "quantity": 2})["cart"]["total"] == 9.0
    placed = apply_call(state, "place_order", {})
    assert placed == {"order_id": "O7", "total": 9.0, "status": "placed"}
    assert state["products"]["P1"]["stock"] == 1 and state["cart"] == {} and state["next_order_number"] == 8
    assert apply_call(state, "cancel_order", {"order_id": "O7"})["status"] == "cancelled"
    assert state["products"]["P1"]["stock"] == 3
    assert "already cancelled" in apply_call(state, "cancel_order", {"order_id": "O7"})["error"]


def test_domain_errors_are_answers_and_leave_the_state_alone() -> None:
    state = small_store()
    before = copy.deepcopy(state)
    assert "unknown product" in apply_call(state, "get_product", {"product_id": "P9"})["error"]
    assert "only 1" in apply_call(state, "add_to_cart", {"product_id": "P2", "quantity": 2})["error"]
    assert "empty" in apply_call(state, "place_order", {})["error"]
    assert "unknown order" in apply_call(state, "get_order", {"order_id": "O1"})["error"]
    assert "not in the cart" in apply_call(state, "remove_from_cart", {"product_id": "P1"})["error"]
    assert state == before


def test_list_products_filters() -> None:
    state = small_store()
    assert [p["product_id"] for p in apply_call(state, "list_products", {})["products"]] == ["P1", "P2"]
    assert [
        p["product_id"] for p in apply_call(state, "list_products", {"category": "Office"})["products"]
    ] == ["P2"]
    assert apply_call(state, "list_products", {"max_price": 5})["products"][0]["name"] == "Mug"


def test_tool_schemas_are_strict_responses_function_tools() -> None:
    schemas = tool_schemas()
    assert [s["name"] for s in schemas] == list(TOOLS)
    for schema in schemas:
        assert schema["type"] == "function" and schema["strict"] is True and schema["description"]
        params = schema["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert sorted(params["required"]) == sorted(params["properties"])
    add = next(s for s in schemas if s["name"] == "add_to_cart")["parameters"]["properties"]
    assert add["quantity"]["type"] == "integer" and add["quantity"]["minimum"] == 1
    listing = next(s for s in schemas if s["name"] == "list_products")["parameters"]["properties"]
    assert listing["category"]["type"] == ["string", "null"]


def test_state_diff_names_each_difference() -> None:
    expected = {"products": {"P1": {"stock": 1}}, "orders": {"O7": {"status": "placed"}}, "cart": {}}
    actual = {"products": {"P1": {"stock": 3}}, "orders": {}, "cart": {"P2": 1}}
    diffs = state_diff(expected, actual)
    assert "state.products.P1.stock: expected 1, got 3" in diffs
    assert any(d.startswith("state.orders.O7: missing") for d in diffs)
    assert "state.cart.P2: unexpected (got 1)" in diffs
    assert state_diff(expected, copy.deepcopy(expected)) == []
    assert state_diff({"x": 2}, {"x": 2.0}) == []


def calls(*specs: tuple[str, dict]) -> list[Call]:
    return [Call(name, args) for name, args in specs]


def test_compare_calls_strict_fraction_f1_with_reasons() -> None:
    expected = calls(("get_product", {"product_id": "P1"}), ("get_product", {"product_id": "P2"}))
    parallel_reordered = calls(("get_product", {"product_id": "P2"}), ("get_product", {"product_id": "P1"}))
    assert compare_calls(parallel_reordered, expected, "strict").reward == 1.0

    one_wrong = calls(("get_product", {"product_id": "P1"}), ("get_product", {"product_id": "P3"}))
    strict = compare_calls(one_wrong, expected, "strict")
    assert strict.reward == 0.0 and strict.matched == 1
    assert strict.reasons == ["get_product: product_id expected 'P2', got 'P3'"]
    assert compare_calls(one_wrong, expected, "fraction").reward == 0.5
    assert compare_calls(one_wrong, expected, "f1").reward == 0.5

    extra = calls(*[(c.name, c.arguments) for c in expected], ("place_order", {}))
    assert compare_calls(extra, expected, "strict").reward == 0.0
    assert compare_calls(extra, expected, "fraction").reward == pytest.approx(2 / 3)
    assert compare_calls(extra, expected, "f1").reward == pytest.approx(0.8)
    assert compare_calls(extra, expected).reasons == ["unexpected call place_order()"]
    assert compare_calls(extra, expected).extra_reads == []

    # A read of a tool no expected call uses is free in every mode, and reported; one of an expected tool is not.
    read = calls(("view_cart", {}), *[(c.name, c.arguments) for c in expected], ("list_products", {}))
    for mode in ("strict", "fraction", "f1"):
        score = compare_calls(read, expected, mode)  # type: ignore[arg-type]
        assert score.reward == 1.0 and score.made == 4 and score.reasons == []
        assert score.extra_reads == ["view_cart()", "list_products()"]
    same_tool = calls(*[(c.name, c.arguments) for c in expected], ("get_product", {"product_id": "P9"}))
    assert compare_calls(same_tool, expected, "strict").reward == 0.0
    assert compare_calls(same_tool, expected, "fraction").reward == pytest.approx(2 / 3)
    # Other tools' models: no tool is known to be a read unless named.
    models = {"get_product": ProductArgs, "view_cart": NoArgs}
    assert compare_calls(read[:3], expected, "strict", tools=models).reward == 0.0
    assert compare_calls(read[:3], expected, "strict", tools=models, reads={"view_cart"}).reward == 1.0

    missing = compare_calls([], expected, "f1")
    assert missing.reward == 0.0 and missing.reasons[0].startswith("missing call get_product(")


def test_calls_from_output_parses_arguments_and_flags_bad_json() -> None:
    output = [
        {
            "type": "function_call",
            "call_id": "a",
            "name": "add_to_cart",
            "arguments": '{"product_id": "P1", "quantity": 2}',
        },
        {"type": "function_call_output", "call_id": "a", "output": "{}"},
        {"type": "function_call", "call_id": "b", "name": "list_products", "arguments": '{"category": null}'},
        {"type": "function_call", "call_id": "c", "name": "get_product", "arguments": "{not json"},
        {"type": "message", "role": "assistant", "content": []},
    ]
    made = calls_from_output(output)
    assert [(c.name, c.arguments) for c in made] == [
        ("add_to_cart", {"product_id": "P1", "quantity": 2}),
        ("list_products", {}),  # null means "not given"
        ("get_product", None),
    ]
    score = compare_calls(made[2:], calls(("get_product", {"product_id": "P1"})))
    assert "not a JSON object" in score.reasons[0]


def test_generator_is_deterministic_and_every_reference_solution_replays(tmp_path: Path) -> None:
    generate.main(["--seed", "3", "--out-dir", str(tmp_path / "a"), "--train", "45", "--validation", "9"])
    generate.main(["--seed", "3", "--out-dir", str(tmp_path / "b"), "--train", "45", "--validation", "9"])
    for split in ("example", "train", "validation"):
        assert (tmp_path / "a" / f"{split}.jsonl").read_bytes() == (
            tmp_path / "b" / f"{split}.jsonl"
        ).read_bytes()
    rows = [json.loads(line) for line in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 45 and {r["verifier_metadata"]["task_kind"] for r in rows} == set(generate.KINDS)
    assert len({r["task_id"] for r in rows}) == 45
    other_seed = generate.generate(4, 5, "train")
    assert [r["initial_state"] for r in other_seed] != [r["initial_state"] for r in rows[:5]]
    for row in rows:
        StoreState.model_validate(row["initial_state"])
        meta = row["verifier_metadata"]
        state = copy.deepcopy(row["initial_state"])
        for call in meta.get("reference_calls") or meta["expected_calls"]:
            assert "error" not in apply_call(state, call["name"], call["arguments"]), (meta, call)
        if "reference_calls" in meta:
            assert state_diff(row["initial_state"], state), "an outcome task must change the store"


def test_committed_examples_match_the_generator() -> None:
    committed = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    assert committed == generate.generate(0, len(committed), "example")


def test_each_tool_changes_the_store_only_if_it_says_so() -> None:
    """``ToolSpec.changes_state`` decides which calls the argument check leaves free: every read is run with
    every id, category and price of 30 generated stores (in every cart/order state the store's own calls
    reach) and never changes one; every state-changing tool changes some store."""
    changed: set[str] = set()
    for row in generate.generate(5, 30, "train"):
        state = row["initial_state"]
        ids = sorted(state["products"]) + ["P000"]
        orders = sorted(state["orders"]) + ["O0"]
        probes = {
            "list_products": [{}] + [{"category": c, "max_price": m} for c in ("kitchen", " Office", "x")
                                     for m in (None, 0, 30, 1e9)],
            "get_product": [{"product_id": i} for i in ids],
            "view_cart": [{}], "list_orders": [{}], "place_order": [{}],
            "get_order": [{"order_id": o} for o in orders], "cancel_order": [{"order_id": o} for o in orders],
            "add_to_cart": [{"product_id": i, "quantity": q} for i in ids for q in (1, 100)],
            "remove_from_cart": [{"product_id": i} for i in ids],
        }  # fmt: skip
        assert set(probes) == set(TOOLS)
        meta = row["verifier_metadata"]
        for call in [{"name": "list_products", "arguments": {}}, *(meta.get("reference_calls") or meta["expected_calls"])]:
            for name, spec in TOOLS.items():
                for arguments in probes[name]:
                    after = copy.deepcopy(state)
                    apply_call(after, name, arguments)
                    if after != state:
                        assert spec.changes_state, (name, arguments)
                        changed.add(name)
            apply_call(state, call["name"], call["arguments"])
    assert changed == {name for name, spec in TOOLS.items() if spec.changes_state}

"""Generate tool-use tasks with reference solutions, deterministically from a seed.

    python -m resources_servers.tool_use.generate --seed 0 --out-dir resources_servers/tool_use/data

writes ``example.jsonl`` (a few of each kind), ``train.jsonl`` and ``validation.jsonl``. Every task gets
its own random store; multi-step tasks (buy, buy two, cheapest in a category, cancel, cancel and
re-order, buy within a budget) carry ``reference_calls`` and are verified by outcome, single-step tasks
(look up products, possibly in parallel; add to cart; filter the catalogue) carry ``expected_calls``
and are verified by arguments.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resources_servers.tool_use.store import apply_call, new_state, tool_schemas

CATALOGUE = {
    "kitchen": ["Ceramic Mug", "Chef Knife", "Cutting Board", "Tea Kettle", "Salad Bowl", "Spice Rack"],
    "office": ["Gel Pen Set", "Notebook", "Desk Lamp", "Stapler", "Sticky Notes", "Paper Tray"],
    "outdoor": ["Water Bottle", "Camping Lantern", "Hiking Socks", "Sun Hat", "Picnic Blanket", "Trail Map"],
    "electronics": ["USB-C Cable", "Wireless Mouse", "Phone Stand", "Power Bank", "Earbuds", "Webcam Cover"],
}
SYSTEM_PROMPT = (
    "You are the assistant of an online store. Act on the customer's request with the tools: look products "
    "up with list_products (their ids are needed by the other tools), then change the cart and orders as "
    "asked. Do only what the customer asks. When done, reply with a short confirmation."
)
AGENT = "tool_use_simple_agent"

Task = tuple[str, list[dict[str, Any]], str]  # prompt, calls, "outcome" | "arguments"


def _store(rng: random.Random) -> dict[str, Any]:
    products = {}
    ids = rng.sample(range(100, 1000), 10)
    names = rng.sample([(cat, name) for cat, names in CATALOGUE.items() for name in names], 10)
    for pid, (category, name) in zip(ids, names, strict=True):
        price = rng.randint(2, 80) + rng.choice([0.0, 0.5, 0.99, 0.25])
        products[f"P{pid}"] = {"name": name, "category": category, "price": price, "stock": rng.randint(3, 9)}
    state = new_state(products, next_order=rng.randint(1000, 9000))
    for _ in range(rng.randint(1, 2)):  # the customer's earlier orders
        pid = rng.choice(sorted(products))
        apply_call(state, "add_to_cart", {"product_id": pid, "quantity": 1})
        apply_call(state, "place_order", {})
    return state


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _in_stock(state: dict[str, Any], rng: random.Random, n: int = 1) -> list[str]:
    return rng.sample([pid for pid, p in sorted(state["products"].items()) if p["stock"] >= 2], n)


def _buy(state: dict[str, Any], rng: random.Random) -> Task:
    (pid,) = _in_stock(state, rng)
    p = state["products"][pid]
    qty = rng.randint(1, min(3, p["stock"]))
    prompt = f"Please order {qty} {p['name']}{'s' if qty > 1 else ''} for me."
    return prompt, [_call("add_to_cart", product_id=pid, quantity=qty), _call("place_order")], "outcome"


def _buy_two(state: dict[str, Any], rng: random.Random) -> Task:
    a, b = _in_stock(state, rng, 2)
    qa, qb = rng.randint(1, 2), rng.randint(1, 2)
    pa, pb = state["products"][a], state["products"][b]
    prompt = f"I'd like {qa} x {pa['name']} and {qb} x {pb['name']}, in one order please."
    calls = [_call("add_to_cart", product_id=a, quantity=qa), _call("add_to_cart", product_id=b, quantity=qb)]
    return prompt, calls + [_call("place_order")], "outcome"


def _cheapest(state: dict[str, Any], rng: random.Random) -> Task:
    by_cat: dict[str, list[str]] = {}
    for pid, p in sorted(state["products"].items()):
        by_cat.setdefault(p["category"], []).append(pid)
    cats = [
        c
        for c, pids in sorted(by_cat.items())
        if len({state["products"][x]["price"] for x in pids}) == len(pids)
    ]
    category = rng.choice(cats)
    pid = min(by_cat[category], key=lambda x: state["products"][x]["price"])
    prompt = f"Buy me one unit of the cheapest {category} product you have."
    return prompt, [_call("add_to_cart", product_id=pid, quantity=1), _call("place_order")], "outcome"


def _cancel(state: dict[str, Any], rng: random.Random) -> Task:
    oid = rng.choice(sorted(state["orders"]))
    return f"Cancel my order {oid}, please.", [_call("cancel_order", order_id=oid)], "outcome"


def _cancel_and_reorder(state: dict[str, Any], rng: random.Random) -> Task:
    oid = rng.choice(sorted(state["orders"]))
    (pid,) = _in_stock(state, rng)
    p = state["products"][pid]
    prompt = f"Cancel order {oid} and order 2 {p['name']} instead."
    calls = [
        _call("cancel_order", order_id=oid),
        _call("add_to_cart", product_id=pid, quantity=2),
        _call("place_order"),
    ]
    return prompt, calls, "outcome"


def _budget(state: dict[str, Any], rng: random.Random) -> Task:
    (pid,) = _in_stock(state, rng)
    p = state["products"][pid]
    qty = rng.randint(1, p["stock"])
    budget = int(p["price"] * qty) + 1  # buys exactly qty: prices are at least 2
    prompt = f"Order as many {p['name']} as ${budget} buys, in one order (you may not exceed the stock)."
    return prompt, [_call("add_to_cart", product_id=pid, quantity=qty), _call("place_order")], "outcome"


def _lookup(state: dict[str, Any], rng: random.Random) -> Task:
    pids = sorted(rng.sample(sorted(state["products"]), rng.randint(1, 3)))
    listed = ", ".join(pids[:-1]) + (" and " if len(pids) > 1 else "") + pids[-1]
    noun = "product" if len(pids) == 1 else "products"
    return (
        f"Show me the details of {noun} {listed}.",
        [_call("get_product", product_id=x) for x in pids],
        "arguments",
    )


def _add_by_id(state: dict[str, Any], rng: random.Random) -> Task:
    (pid,) = _in_stock(state, rng)
    qty = rng.randint(1, 2)
    return (
        f"Add {qty} of product {pid} to my cart.",
        [_call("add_to_cart", product_id=pid, quantity=qty)],
        "arguments",
    )


def _filter(state: dict[str, Any], rng: random.Random) -> Task:
    category = rng.choice(sorted({p["category"] for p in state["products"].values()}))
    limit = rng.choice([10, 20, 30, 50])
    prompt = f"Which {category} products cost at most ${limit}?"
    return prompt, [_call("list_products", category=category, max_price=limit)], "arguments"


KINDS: dict[str, Callable[[dict[str, Any], random.Random], Task]] = {
    "buy": _buy,
    "buy_two": _buy_two,
    "cheapest_in_category": _cheapest,
    "cancel": _cancel,
    "cancel_and_reorder": _cancel_and_reorder,
    "buy_within_budget": _budget,
    "lookup": _lookup,
    "add_by_id": _add_by_id,
    "filter_catalogue": _filter,
}


def make_task(rng: random.Random, kind: str, task_id: str) -> dict[str, Any]:
    """One task row of the given kind, with its own store and reference solution."""
    while True:  # a store too small for this kind (e.g. too little stock) is drawn again
        state = _store(rng)
        try:
            prompt, calls, mode = KINDS[kind](state, rng)
            break
        except (ValueError, IndexError):
            continue
    meta: dict[str, Any] = {"task_kind": kind}
    if mode == "outcome":
        meta["reference_calls"] = calls
    else:
        meta.update(expected_calls=calls, match="strict")
    return task_row(SYSTEM_PROMPT, prompt, state, meta, task_id)


def task_row(
    system: str, prompt: str, state: dict[str, Any], meta: dict[str, Any], task_id: str
) -> dict[str, Any]:
    """A tool_use task row: the system prompt and the customer's message, every store tool, its store."""
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": system, "type": "message"},
                {"role": "user", "content": prompt, "type": "message"},
            ],
            "tools": tool_schemas(),
            "parallel_tool_calls": True,
        },
        "agent_ref": {"name": AGENT},
        "task_id": task_id,
        "initial_state": state,
        "verifier_metadata": meta,
    }


def generate(seed: int, n: int, split: str) -> list[dict[str, Any]]:
    rng = random.Random(f"{seed}:{split}")
    kinds = sorted(KINDS)
    return [make_task(rng, kinds[i % len(kinds)], f"tool_use-{seed}-{split}-{i}") for i in range(n)]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    tmp.replace(path)


def count(text: str) -> int:
    """An argparse type: a number of rows, refused when negative (``--train -5`` wrote an empty file, exit 0)."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; give a number of rows (0 or more)")
    return n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).with_name("data"))
    parser.add_argument(
        "--examples", type=count, default=9, help="rows in example.jsonl (one of each kind first)"
    )
    parser.add_argument("--train", type=count, default=900)
    parser.add_argument("--validation", type=count, default=90)
    args = parser.parse_args(argv)
    for split, n in (("example", args.examples), ("train", args.train), ("validation", args.validation)):
        rows = generate(args.seed, n, split)
        write_jsonl(args.out_dir / f"{split}.jsonl", rows)
        print(f"{args.out_dir / f'{split}.jsonl'}: {len(rows)} tasks")


if __name__ == "__main__":
    main()

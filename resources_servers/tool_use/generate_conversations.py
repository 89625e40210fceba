"""Generate multi-turn tool-use tasks: the customer holds what the assistant needs and says it when asked.

    python -m resources_servers.tool_use.generate_conversations --seed 0

writes ``conversations_example.jsonl`` (4 rows, committed), ``conversations_train.jsonl`` and
``conversations_heldout.jsonl`` (different stores and orders: each split is drawn from its own random
stream). Each row opens with a request that lacks one
fact, carries a ``user_script`` (:mod:`gym_bridge.rollout.user_sim`) that gives the fact only when the assistant
asks for it, ``reference_calls`` (verified by the final store) and ``user_holds`` (the shaped
``asked_before_acting`` component). Kinds:

* ``cancel_my_order``: cancel one of several orders; the customer knows which (its number).
* ``buy_my_pick``: buy something of a category for which the store has several products; the customer
  knows which one and how many.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resources_servers.tool_use.generate import _call, _store, count, task_row, write_jsonl
from resources_servers.tool_use.store import apply_call

SYSTEM_PROMPT = (
    "You are the assistant of an online store. Act on the customer's request with the tools. If you need "
    "something only the customer knows (which order, which product, how many), ask them first and wait "
    "for the answer; do not guess. When done, reply with a short confirmation."
)

Conversation = tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[str]]
"""Opening message, reference calls, the script's reveal entries, the facts the user holds."""
ASKING = ["?", "which", "tell me", "let me know", "provide", "specify", "share", "give me"]
"""What makes the scripted customer answer, besides each kind's own phrases: any question or request. The customer
holds one fact, so whatever the assistant asks, that fact is the answer. Only a few exact phrases did before, so an
honest "Which of your orders would you like to cancel?" ended the conversation: outcome 0, asked_before_acting 0,
teaching a policy to say the magic words rather than to ask."""


def _cancel_my_order(state: dict[str, Any], rng: random.Random) -> Conversation:
    while len(state["orders"]) < 3:  # enough orders that guessing is a poor bet
        apply_call(state, "add_to_cart", {"product_id": rng.choice(sorted(state["products"])), "quantity": 1})
        apply_call(state, "place_order", {})
    oid = rng.choice(sorted(state["orders"]))
    reveal = [{"when": [*ASKING, "order number", "order id", "order's number"], "say": f"It is order {oid}."}]
    return "Hi, I'd like to cancel one of my orders.", [_call("cancel_order", order_id=oid)], reveal, [oid]


def _buy_my_pick(state: dict[str, Any], rng: random.Random) -> Conversation:
    by_cat: dict[str, list[str]] = {}
    for pid, p in sorted(state["products"].items()):
        if p["stock"] >= 2:
            by_cat.setdefault(p["category"], []).append(pid)
    category = rng.choice([c for c, pids in sorted(by_cat.items()) if len(pids) >= 2])
    pid = rng.choice(by_cat[category])
    name, qty = state["products"][pid]["name"], rng.randint(1, 2)
    reveal = [
        {"when": [*ASKING, "what product", "what item", "prefer", "how many"], "say": f"The {name}, {qty} of them."}
    ]
    calls = [_call("add_to_cart", product_id=pid, quantity=qty), _call("place_order")]
    return f"Hello! I want to order something from your {category} range.", calls, reveal, [name]


KINDS: dict[str, Callable[[dict[str, Any], random.Random], Conversation]] = {
    "cancel_my_order": _cancel_my_order,
    "buy_my_pick": _buy_my_pick,
}


def make_conversation(rng: random.Random, kind: str, task_id: str, max_turns: int = 3) -> dict[str, Any]:
    """One multi-turn task row of the given kind, with its own store, script and reference solution."""
    while True:  # a store that cannot pose this kind (one product per category) is drawn again
        state = _store(rng)
        try:
            opening, calls, reveal, holds = KINDS[kind](state, rng)
            break
        except (ValueError, IndexError):
            continue
    meta = {"task_kind": kind, "reference_calls": calls, "user_holds": holds}
    row = task_row(SYSTEM_PROMPT, opening, state, meta, task_id)
    row["user_script"] = {"reveal": reveal, "max_turns": max_turns}
    return row


def generate(seed: int, n: int, split: str) -> list[dict[str, Any]]:
    """``n`` rows of ``split``, the kinds taken in turn; the same seed and split give the same rows."""
    rng = random.Random(f"conversations:{seed}:{split}")
    kinds = sorted(KINDS)
    return [make_conversation(rng, kinds[i % len(kinds)], f"tool_use-conv-{seed}-{split}-{i}") for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).with_name("data"))
    parser.add_argument("--examples", type=count, default=4)
    parser.add_argument("--train", type=count, default=200)
    parser.add_argument("--heldout", type=count, default=40)
    args = parser.parse_args(argv)
    for split, n in (("example", args.examples), ("train", args.train), ("heldout", args.heldout)):
        path = args.out_dir / f"conversations_{split}.jsonl"
        write_jsonl(path, generate(args.seed, n, split))
        print(f"{path}: {n} tasks")


if __name__ == "__main__":
    main()

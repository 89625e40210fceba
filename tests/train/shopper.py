"""A scripted policy that shops correctly in the tool_use store, and short task rows for it.

Why: a random tiny model never makes a well-formed tool call, so it cannot show that a session's state
(the tool_use server keeps each rollout's store in its session) survives from ``/seed_session`` through
the tool call to ``/verify``. :class:`Shopper` answers the first turn with the right ``add_to_cart``
call and the second with a short confirmation; :func:`write_shop_rows` writes rows verified by outcome
(the session's final store must hold the call's effect), so a rollout scores 1 only when all of its
requests reached the replica holding its session.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gym_bridge.generation.backend import GenerationBackend, GenerationRequest, GenerationResult

__all__ = ["Shopper", "write_shop_rows"]

_ASK = re.compile(r"Add (\d+) of (P\d+)")

_ADD_TO_CART = {
    "type": "function",
    "name": "add_to_cart",
    "description": "Put units of a product in the cart.",
    "parameters": {
        "type": "object",
        "properties": {"product_id": {"type": "string"}, "quantity": {"type": "integer"}},
        "required": ["product_id", "quantity"],
    },
}


def write_shop_rows(path: Path, n: int) -> Path:
    """``n`` tool_use rows: "Add q of Pk." with a one-product store each, verified by outcome."""
    rows = []
    for i in range(n):
        product, quantity = f"P{i}", 1 + i % 3
        rows.append({
            "responses_create_params": {
                "input": [{"role": "user", "content": f"Add {quantity} of {product}."}],
                "tools": [_ADD_TO_CART],
            },
            "initial_state": {"products": {product: {"name": "Mug", "category": "kitchen", "price": 5.0, "stock": 9}}},
            "verifier_metadata": {"reference_calls": [
                {"name": "add_to_cart", "arguments": {"product_id": product, "quantity": quantity}}
            ]},
        })  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class Shopper(GenerationBackend):
    """Turn 1: the ``add_to_cart`` call the user asked for; once a tool answer is in the prompt: "Done."."""

    def __init__(self, tokenizer: Any, max_context: int = 512) -> None:
        self.tokenizer = tokenizer
        self.model_name = "policy"
        self.max_context = max_context
        self.vocab_size = len(tokenizer)
        self.eos_token_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self._tool_response = tokenizer.convert_tokens_to_ids("<tool_response>")

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(request.prompt_token_ids)
        if self._tool_response in request.prompt_token_ids:
            text = "Done."
        else:
            quantity, product = _ASK.findall(prompt)[-1]
            call = {"name": "add_to_cart", "arguments": {"product_id": product, "quantity": int(quantity)}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), *self.eos_token_ids]
        return GenerationResult(list(request.prompt_token_ids), ids, [-0.1] * len(ids), "stop", text)

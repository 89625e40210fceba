"""A scripted policy for multi-turn conversations in the tool_use store (the ``cancel_my_order`` rows).

Why: a random tiny model never asks the customer anything nor makes a well-formed tool call, so it
cannot show a conversation (assistant, user, tool turns) going through the embedded policy server and
into training. :class:`Clerk` is a generation backend behind the real policy server, so its turns carry
the server's real token ids. Its rollouts whose ``seed`` is even are *polite* (ask which order, cancel
the one the user names, confirm: reward 1); odd seeds are *hasty* (cancel a guessed order at once:
reward 0), so a GRPO group has rewards that differ and a gradient.
"""

from __future__ import annotations

import json
import re

from gym_bridge.generation.backend import GenerationRequest, GenerationResult
from tests.train.shopper import Shopper

__all__ = ["ASK", "Clerk"]

ASK = "Which order would you like to cancel? Please give me the order number."
_ORDER = re.compile(r"\bO\d+\b")
_USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


class Clerk(Shopper):
    """:class:`~tests.train.shopper.Shopper`'s backend plumbing, with the clerk's answers."""

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(request.prompt_token_ids)
        users = [u for u in _USER_TURN.findall(prompt) if "<tool_response>" not in u]
        hasty = (request.params.seed or 0) % 2 == 1
        if self._tool_response in request.prompt_token_ids:
            text = "Your order is cancelled."
        elif hasty:
            text = _call("O1")
        elif len(users) >= 2 and (found := _ORDER.search(users[-1])):
            text = _call(found.group(0))
        else:
            text = ASK
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), *self.eos_token_ids]
        return GenerationResult(list(request.prompt_token_ids), ids, [-0.1] * len(ids), "stop", text)


def _call(order_id: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'cancel_order', 'arguments': {'order_id': order_id}})}\n</tool_call>"

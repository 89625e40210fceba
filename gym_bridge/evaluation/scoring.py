"""A model as a ranking scorer: each response's length-normalised log-probability given the prompt.

The prompt goes through the model's chat template with :func:`gym_bridge.records.chat.render_prompt` (what the
policy server generates from), the response's tokens follow it as the assistant's reply, and the score
is the mean log-probability of those response tokens (a sum would favour short responses). An empty
response has no tokens to average and scores ``-inf`` (last). Sequences longer than the model's
context keep their end: the prompt is cut from the left, so every response token that fits is scored.

The model comes from the caller: ``gym-bridge eval`` loads what ``--model`` names with
:func:`gym_bridge.train.bookkeeping.checkpoint.load_model_or_checkpoint` (a trainer checkpoint included), the
trainer's ranked validation passes its policy. So this package needs nothing of the trainer's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gym_bridge.records.chat import items_to_messages, render_prompt
from gym_bridge.records.schema import content_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["ModelScorer", "prompt_messages", "response_text"]


def prompt_messages(prompt: str | list[Any]) -> list[dict[str, Any]]:
    """A ranked group's prompt as chat messages: text is one user turn, a list is chat messages."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return items_to_messages(prompt)


def response_text(response: str | list[Any]) -> str:
    """A response's text: as is, or its assistant messages' text joined (as ``ranked_to_grpo`` does)."""
    if isinstance(response, str):
        return response
    return " ".join(
        content_text(m.get("content")) for m in response if isinstance(m, dict) and m.get("role") == "assistant"
    )


class ModelScorer:
    """``scorer(prompt, responses)``: each response's mean token log-probability under ``model``."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 8) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = max(1, batch_size)
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.truncated = 0  # sequences whose prompt was cut to fit the context

    def __call__(self, prompt: str | list[Any], responses: Sequence[Any]) -> list[float]:
        import torch

        prompt_ids = render_prompt(self.tokenizer, prompt_messages(prompt))
        response_ids = [
            self.tokenizer(response_text(r), add_special_tokens=False)["input_ids"] for r in responses
        ]
        scores = [-math.inf] * len(responses)
        todo = [i for i, ids in enumerate(response_ids) if ids]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(todo), self.batch_size):
                    chunk = todo[start : start + self.batch_size]
                    for i, score in zip(chunk, self._score(prompt_ids, [response_ids[i] for i in chunk]), strict=True):
                        scores[i] = score
        finally:
            self.model.train(was_training)
        return scores

    def _score(self, prompt_ids: list[int], responses: list[list[int]]) -> list[float]:
        import torch

        from gym_bridge.models.logprobs import gather_logprobs

        rows, starts = [], []
        for ids in responses:
            seq = prompt_ids + ids
            if self.max_length is not None and len(seq) > self.max_length:
                seq = seq[-self.max_length :]
                self.truncated += 1
            rows.append(seq)
            starts.append(max(1, len(seq) - len(ids)))  # the first scored position (token 0 has no context)
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = self.model.device
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        attention = torch.zeros_like(input_ids)
        mask = torch.zeros((len(rows), width - 1), dtype=torch.float32, device=device)
        for n, (seq, start) in enumerate(zip(rows, starts, strict=True)):
            input_ids[n, : len(seq)] = torch.tensor(seq, device=device)
            attention[n, : len(seq)] = 1
            mask[n, start - 1 : len(seq) - 1] = 1.0  # logits at t predict token t + 1
        logits = self.model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits[:, :-1].float()
        logprobs = gather_logprobs(logits, input_ids[:, 1:]) * mask
        return (logprobs.sum(-1) / mask.sum(-1)).tolist()

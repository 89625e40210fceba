"""A model as a ranking scorer: each response's length-normalised log-probability given the prompt.

The prompt goes through the model's chat template with :func:`gym_bridge.chat.render_prompt` (what the
policy server generates from), the response's tokens follow it as the assistant's reply, and the score
is the mean log-probability of those response tokens (a sum would favour short responses). An empty
response has no tokens to average and scores ``-inf`` (last). Sequences longer than the model's
context keep their end: the prompt is cut from the left, so every response token that fits is scored.

:func:`load_scoring_model` takes what ``--model`` takes: a built-in name, a directory or hub id (through
the one loader, :func:`gym_bridge.models.registry.load_model_and_tokenizer`), or a trainer checkpoint
(``step_<n>/``, or a checkpoint directory, whose latest step is used).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_bridge.chat import items_to_messages, render_prompt
from gym_bridge.schema import content_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["ModelScorer", "checkpoint_of", "load_scoring_model", "prompt_messages", "response_text"]


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

        from gym_bridge.train.logprobs import gather_logprobs

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


def checkpoint_of(path: Path) -> Path | None:
    """The trainer checkpoint at ``path``: ``path`` itself (``step_<n>/``), or the latest ``step_<n>``
    of a checkpoint directory; None when ``path`` is not one."""
    if (path / "policy").is_dir():
        return path
    from gym_bridge.train.checkpoint import CheckpointManager

    latest = CheckpointManager(path).latest()
    return latest.path if latest is not None else None


def _base_model_name(checkpoint: Path) -> str:
    """The model a LoRA checkpoint's adapter sits on: ``policy.model_name`` of its saved config."""
    import yaml

    config = yaml.safe_load((checkpoint / "config.yaml").read_text()) or {}
    name = (config.get("policy") or {}).get("model_name")
    if not isinstance(name, str):
        raise ValueError(f"{checkpoint}/config.yaml names no policy.model_name for the adapter's base model")
    return name


def load_scoring_model(name: str, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer ``--model name`` means, a trainer checkpoint included (full weights,
    the merged model, or base model + LoRA adapter, merged here)."""
    path = Path(name).expanduser()
    checkpoint = checkpoint_of(path) if path.is_dir() else None
    if checkpoint is None:
        from gym_bridge.models.registry import load_model_and_tokenizer

        return load_model_and_tokenizer(name, device=device)
    return _load_checkpoint(checkpoint, device)


def _load_checkpoint(checkpoint: Path, device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from gym_bridge.models.registry import load_model_and_tokenizer

    policy = checkpoint / "policy"
    tokenizer_dir = policy / "tokenizer"
    tokenizer_name = str(tokenizer_dir) if tokenizer_dir.is_dir() else None
    for whole in (policy / "weights", policy / "merged"):
        if whole.is_dir():
            return load_model_and_tokenizer(str(whole), device=device, tokenizer_name=tokenizer_name)
    adapter = policy / "adapter"
    if not adapter.is_dir():
        raise ValueError(f"{checkpoint} has neither policy/weights, policy/merged nor policy/adapter")
    from peft import PeftModel

    from gym_bridge.train.lora import without_peft_deprecation_warnings

    model, tokenizer = load_model_and_tokenizer(_base_model_name(checkpoint), device=device, tokenizer_name=tokenizer_name)
    with without_peft_deprecation_warnings():
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return merged.eval(), tokenizer

"""Log-probabilities of chosen tokens: the one gather every sampler and trainer pass goes through.

``log p(token) = logit[token] - logsumexp(logits)``: a gather minus a logsumexp rather than a full
``log_softmax``, so memory stays at one copy of the logits. The trainer's passes project only the
positions it trains on through the output layer (on RL batches most positions are prompt or
padding, and the vocabulary projection is the costliest part of small models).

With ``policy.logprob_chunk_size`` those positions go through the output layer ``chunk_size`` at a
time, so at most one chunk's (chunk, vocabulary) logits exist at once instead of (positions,
vocabulary): in a pass with gradients each chunk is checkpointed (its logits are recomputed in the
backward pass, one chunk at a time, rather than kept for it), which costs one more output-layer
matmul per position. Same values and gradients, up to float rounding.

``temperature``: the trainer's log-probs are those of the distribution the sampler drew from,
``log_softmax(logits / T)`` with T = ``policy.generation.temperature`` (NeMo RL's and TRL's trainers
divide the logits the same way). With raw log-probs at T < 1 the gradient pushes the raw
distribution towards tokens drawn from a sharper one, which over-sharpens the likely tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from gym_bridge.models.gqa_attention import grouped_query_attention

__all__ = ["gather_logprobs", "hidden_logprobs", "projects_hidden_states_plainly", "scaled_logits", "token_logprobs"]


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., target]`` for logits (..., V) and targets (...), in the logits' dtype."""
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _projected_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return gather_logprobs(scaled_logits(head(hidden).float(), temperature), targets)


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` (the sampled distribution's logits); the logits themselves at 1 or 0 (greedy)."""
    return logits if temperature in (0.0, 1.0) else logits / temperature


def hidden_logprobs(
    model: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Float32 log-probs of ``targets`` (n,) from last hidden states (n, H) through the output layer at
    ``temperature``, ``chunk_size`` positions at a time when given (see the module docstring), else all
    at once."""
    head = model.get_output_embeddings()
    if chunk_size is None or hidden.shape[0] <= chunk_size:
        return _projected_logprobs(head, hidden, targets, temperature)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if recompute:  # keep only the chunk's inputs for backward, not its (chunk, V) logits
            parts.append(checkpoint(_projected_logprobs, head, h, t, temperature, use_reentrant=False))
        else:
            parts.append(_projected_logprobs(head, h, t, temperature))
    return torch.cat(parts)


def projects_hidden_states_plainly(model: Any) -> bool:
    """Whether logits are just ``lm_head(hidden)`` (no soft-capping or scaling after it), so that only
    the positions that are trained on need to go through the output layer."""
    config = model.config
    return all(
        getattr(config, key, None) in (None, 1.0)
        for key in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(b, T-1) log-probs at ``temperature`` of tokens 1..T-1 where ``token_mask`` (b, T-1) is set, 0 elsewhere.

    Packed rows (:mod:`gym_bridge.train.batches.packing`) pass ``position_ids`` and no attention mask.
    ``chunk_size``: :func:`hidden_logprobs`' (a model whose logits are not plainly ``lm_head(hidden)``
    gets its full logits from its own forward pass, unchunked). Grouped key/value heads are read in
    place, not repeated per query head (:mod:`gym_bridge.models.gqa_attention`).
    """
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    if not projects_hidden_states_plainly(model):
        with grouped_query_attention(model):
            logits = model(**inputs).logits[:, :-1].float()
        return gather_logprobs(scaled_logits(logits, temperature), input_ids[:, 1:]) * token_mask
    with grouped_query_attention(model):
        hidden = model.base_model(**inputs).last_hidden_state[:, :-1]
    where = token_mask.bool()
    picked = hidden_logprobs(model, hidden[where], input_ids[:, 1:][where], chunk_size, temperature)
    out = torch.zeros(token_mask.shape, dtype=picked.dtype, device=picked.device)
    out[where] = picked
    return out

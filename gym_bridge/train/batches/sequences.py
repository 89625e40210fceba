"""A step's samples as padded micro-batches, and their log-probs under a model.

Micro-batches are length-sorted index groups: fixed-size (``policy.train_micro_batch_size`` /
``logprob_batch_size``), token-budgeted (dynamic batching), or, with ``policy.share_prompt_prefix``,
fixed-size groups that keep each prompt's rows together so each distinct prompt runs once
(:mod:`gym_bridge.models.shared_prefix`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from gym_bridge.models.logprobs import token_logprobs
from gym_bridge.models.shared_prefix import (
    CommonStart,
    PrefixPlan,
    plan_prefixes,
    prefix_micro_batches,
    shared_prefix_logprobs,
    shares_prefixes,
)
from gym_bridge.train.batches.batching import dynamic_micro_batches, pad_and_stack
from gym_bridge.train.batches.packing import PackedRows, pack_rows, packed_micro_batches
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.config import MasterConfig

__all__ = [
    "MicroBatch",
    "make_micro_batch",
    "micro_batch_logprobs",
    "micro_batches",
    "packing_layout",
    "pad_rows",
    "per_sample_logprobs",
    "shares_prompts",
]


@dataclass
class MicroBatch:
    """Padded tensors of a few samples; ``token_mask`` etc. are shifted to next-token positions."""

    index: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_mask: torch.Tensor
    generation_logprobs: torch.Tensor | None
    prefixes: PrefixPlan | None = None
    """Set when the rows' prompts run once each (:mod:`gym_bridge.models.shared_prefix`)."""
    token_ids: list[list[int]] = field(default_factory=list)
    packed: PackedRows | None = None
    """Set when the forward pass runs the samples packed into rows
    (:mod:`gym_bridge.train.batches.packing`)."""

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with every tensor on ``device`` (built on the host, moved whole)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return dataclasses.replace(
            self,
            input_ids=move(self.input_ids),
            attention_mask=move(self.attention_mask),
            token_mask=move(self.token_mask),
            generation_logprobs=move(self.generation_logprobs),
            packed=None if self.packed is None else self.packed.to(device),
        )


def make_micro_batch(
    samples: list[Sample],
    index: list[int],
    pad_token_id: int,
    *,
    share_prompts: bool = False,
    packing: tuple[int, int] | None = None,
) -> MicroBatch:
    """``packing``: (row tokens, length rounding) to run the samples packed into rows."""
    chosen = [samples[i] for i in index]
    plan = (
        plan_prefixes([s.token_ids for s in chosen], [s.loss_mask for s in chosen]) if share_prompts else None
    )
    has_gen = all(s.generation_logprobs is not None for s in chosen)
    padded = pad_and_stack(
        [s.token_ids for s in chosen],
        pad_token_id=pad_token_id,
        loss_masks=[s.loss_mask for s in chosen],
        values={"gen": [s.generation_logprobs for s in chosen]} if has_gen else None,
    )
    return MicroBatch(
        index=list(index),
        input_ids=padded.input_ids,
        attention_mask=padded.attention_mask,
        token_mask=padded.loss_mask[:, 1:],
        generation_logprobs=padded.values["gen"][:, 1:] if has_gen else None,
        prefixes=plan if plan is not None and plan.repeats else None,
        token_ids=[s.token_ids for s in chosen],
        packed=(
            pack_rows([s.token_ids for s in chosen], packing[0], pad_token_id=pad_token_id, round_to=packing[1])
            if packing is not None
            else None
        ),
    )


def micro_batch_logprobs(
    model: Any,
    mb: MicroBatch,
    pad_token_id: int,
    chunk_size: int | None = None,
    start: CommonStart | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(b, T-1) next-token log-probs of a micro-batch at ``temperature`` (``policy.generation.temperature``:
    :mod:`gym_bridge.models.logprobs`), one prompt pass per distinct prompt if planned;
    ``chunk_size``: ``policy.logprob_chunk_size`` (:func:`gym_bridge.models.logprobs.hidden_logprobs`);
    ``start``: the common start of the step's prompts, already run (:func:`~gym_bridge.models.shared_prefix.common_start`)."""
    if mb.prefixes is not None:
        return shared_prefix_logprobs(
            model, mb.token_ids, mb.token_mask, mb.prefixes, pad_token_id, chunk_size, start, temperature
        )
    if mb.packed is not None:
        packed = token_logprobs(
            model,
            mb.packed.input_ids,
            None,
            mb.packed.pack(mb.token_mask),
            mb.packed.position_ids,
            chunk_size,
            temperature,
        )
        return mb.packed.unpack(packed, mb.token_mask.shape[1])
    return token_logprobs(
        model, mb.input_ids, mb.attention_mask, mb.token_mask, chunk_size=chunk_size, temperature=temperature
    )


def packing_layout(cfg: MasterConfig) -> tuple[int, int] | None:
    """(row tokens, length rounding) of packed rows when ``policy.sequence_packing`` is on, else None."""
    packing = cfg.policy.sequence_packing
    if not packing.enabled:
        return None
    return cfg.policy.max_total_sequence_length, packing.sequence_length_round


def shares_prompts(cfg: MasterConfig, model: Any) -> bool:
    """Whether micro-batches run each distinct prompt once (fixed-size micro-batches, capable model)."""
    policy = cfg.policy
    fixed = not (policy.dynamic_batching.enabled or policy.sequence_packing.enabled)
    return policy.share_prompt_prefix and fixed and shares_prefixes(model)


def micro_batches(
    cfg: MasterConfig,
    samples: list[Sample],
    index: list[int],
    *,
    for_logprobs: bool,
    share_prompts: bool = False,
) -> list[list[int]]:
    """Index groups for forward passes: rows of packed sequences (sequence packing), token-budget
    (dynamic batching) or fixed-size, all length-sorted; with ``share_prompts``, fixed-size groups that
    keep each prompt's rows together."""
    policy = cfg.policy
    size = policy.logprob_batch_size if for_logprobs else policy.train_micro_batch_size
    layout = packing_layout(cfg)
    if layout is not None:  # rows of packed sequences, as many rows as fit the token budget
        budget = policy.logprob_mb_tokens if for_logprobs else policy.train_mb_tokens
        lengths = [len(samples[i].token_ids) for i in index]
        groups = packed_micro_batches(lengths, layout[0], budget, round_to=layout[1])
        return [[index[j] for j in group] for group in groups]
    if share_prompts:
        return prefix_micro_batches([s.token_ids for s in samples], [s.loss_mask for s in samples], index, size)
    lengths = [len(samples[i].token_ids) for i in index]
    if policy.dynamic_batching.enabled:
        budget = policy.logprob_mb_tokens if for_logprobs else policy.train_mb_tokens
        groups = dynamic_micro_batches(
            lengths, budget, max_batch_size=None, round_to=policy.dynamic_batching.sequence_length_round
        )
    else:  # fixed sizes, but similar lengths together (same number of passes, less padding)
        groups = dynamic_micro_batches(lengths, 1 << 62, max_batch_size=size, round_to=1)
    return [[index[j] for j in group] for group in groups]


def per_sample_logprobs(
    cfg: MasterConfig, model: Any, samples: list[Sample], pad_token_id: int, autocast: Any = None
) -> list[torch.Tensor]:
    """Each sample's (len-1,) next-token log-probs under ``model`` (no grad, batched passes), on the
    model's device; ``autocast``: a context factory the forward passes run in (float16's autocast)."""
    out: list[torch.Tensor | None] = [None] * len(samples)
    device = next(model.parameters()).device
    was_training = model.training
    share = shares_prompts(cfg, model)
    model.eval()
    with torch.inference_mode():
        index = list(range(len(samples)))
        for group in micro_batches(cfg, samples, index, for_logprobs=True, share_prompts=share):
            mb = make_micro_batch(samples, group, pad_token_id, share_prompts=share, packing=packing_layout(cfg))
            with autocast() if autocast is not None else contextlib.nullcontext():
                logprobs = micro_batch_logprobs(
                    model,
                    mb.to(device),
                    pad_token_id,
                    cfg.policy.logprob_chunk_size,
                    temperature=cfg.policy.generation.temperature,
                )
            for row, i in enumerate(group):
                out[i] = logprobs[row, : len(samples[i].token_ids) - 1].clone()
    model.train(was_training)
    return out  # type: ignore[return-value]


def pad_rows(rows: list[torch.Tensor], width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-sample vectors as one (len(rows), width) float32 tensor on ``device``, zero-padded on the right."""
    out = torch.zeros((len(rows), width), dtype=torch.float32, device=device)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row[:width]
    return out

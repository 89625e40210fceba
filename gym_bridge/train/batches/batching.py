"""Micro-batches with little padding, and padding sequences into tensors.

RL completions vary a lot in length; fixed-size micro-batches in arrival order pad every sequence
to the longest of its batch. Two ways to waste less (NeMo RL's dynamic batching and sequence
packing), both returning *index groups* into the caller's list of samples, each index exactly once:

- :func:`dynamic_micro_batches`: sort by length, cut into consecutive groups whose padded size
  (``len(group) * longest``) fits a token budget. Similar lengths share a micro-batch.
- :func:`pack_sequences`: first-fit decreasing bin packing of whole sequences into rows of at most
  ``max_tokens`` tokens, for a trainer that feeds packed rows (position ids restart per sequence).

Because the loss divides by global token/sequence counts (see ``loss.py``), any grouping gives
the same summed loss and gradient; grouping only changes speed and memory.

:func:`pad_and_stack` turns token lists into ``input_ids``, ``attention_mask`` and a per-token
``loss_mask`` marking the generated part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

__all__ = [
    "PaddedBatch",
    "dynamic_micro_batches",
    "fixed_micro_batches",
    "pack_sequences",
    "pad_and_stack",
    "padded_tokens",
]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def fixed_micro_batches(num_samples: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size`` indices in order (the naive batching)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [
        list(range(i, min(i + micro_batch_size, num_samples)))
        for i in range(0, num_samples, micro_batch_size)
    ]


def dynamic_micro_batches(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    max_batch_size: int | None = None,
    round_to: int = 1,
) -> list[list[int]]:
    """Index groups of length-sorted samples whose padded size fits ``max_tokens``.

    A group of n samples costs ``n * round_up(longest, round_to)`` tokens once padded. Samples are
    taken longest first and a new group starts when the next would exceed the budget (or
    ``max_batch_size``). A sample longer than the budget on its own gets a group of its own.
    Groups come out longest first; indices inside a group are in descending length order.
    """
    if max_tokens < 1 or round_to < 1:
        raise ValueError(f"max_tokens and round_to must be >= 1, got {max_tokens} and {round_to}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    width = 0
    for index in order:
        candidate_width = max(width, _round_up(max(lengths[index], 1), round_to))
        too_many = max_batch_size is not None and len(current) >= max_batch_size
        if current and (too_many or (len(current) + 1) * candidate_width > max_tokens):
            groups.append(current)
            current, candidate_width = [], _round_up(max(lengths[index], 1), round_to)
        current.append(index)
        width = candidate_width
    if current:
        groups.append(current)
    return groups


def pack_sequences(lengths: Sequence[int], max_tokens: int, *, round_to: int = 1) -> list[list[int]]:
    """First-fit decreasing: index groups whose summed (rounded) lengths fit ``max_tokens`` per row.

    A sequence longer than ``max_tokens`` gets a row of its own.
    """
    if max_tokens < 1 or round_to < 1:
        raise ValueError(f"max_tokens and round_to must be >= 1, got {max_tokens} and {round_to}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for index in order:
        size = _round_up(max(lengths[index], 1), round_to)
        for b, room in enumerate(free):
            if size <= room:
                bins[b].append(index)
                free[b] -= size
                break
        else:
            bins.append([index])
            free.append(max_tokens - size)
    return bins


def padded_tokens(groups: Sequence[Sequence[int]], lengths: Sequence[int], *, round_to: int = 1) -> int:
    """Padding tokens a grouping costs when each group is padded to its longest (rounded) member."""
    total = 0
    for group in groups:
        width = _round_up(max((lengths[i] for i in group), default=0), round_to)
        total += len(group) * width - sum(lengths[i] for i in group)
    return total


@dataclass
class PaddedBatch:
    """Sequences padded into tensors. ``loss_mask`` marks generated tokens at their input positions;
    for next-token log-probs (which predict positions 1..T-1) use ``loss_mask[:, 1:]``."""

    input_ids: torch.Tensor
    """(b, T) token ids, padded with pad_token_id."""
    attention_mask: torch.Tensor
    """(b, T) 1 for real tokens, 0 for padding."""
    loss_mask: torch.Tensor
    """(b, T) float, 1 for tokens the loss trains on (the generated part), else 0."""
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    """(b, T) float tensors of per-token values given to :func:`pad_and_stack` (0 at padding)."""

    @property
    def lengths(self) -> torch.Tensor:
        """(b,) real tokens per sequence."""
        return self.attention_mask.sum(dim=1)


def pad_and_stack(
    token_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    prompt_lengths: Sequence[int] | None = None,
    loss_masks: Sequence[Sequence[int | float]] | None = None,
    values: Mapping[str, Sequence[Sequence[float]]] | None = None,
    padding_side: Literal["right", "left"] = "right",
    pad_to_multiple_of: int = 1,
) -> PaddedBatch:
    """Pad token lists (prompt + completion each) into a :class:`PaddedBatch`.

    The loss mask is 1 from ``prompt_lengths[i]`` to the end of sequence i, or given explicitly as
    ``loss_masks`` (e.g. multi-turn rollouts where tool outputs between turns are not trained on).
    ``values`` holds per-token floats aligned with ``token_ids`` (e.g. generation log-probs with 0
    at prompt positions) and comes back padded the same way.
    """
    if (prompt_lengths is None) == (loss_masks is None):
        raise ValueError("give exactly one of prompt_lengths and loss_masks")
    batch = len(token_ids)
    width = _round_up(max((len(t) for t in token_ids), default=0), pad_to_multiple_of)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width), dtype=torch.float32)
    padded_values = {name: torch.zeros((batch, width), dtype=torch.float32) for name in values or {}}
    for i, tokens in enumerate(token_ids):
        n = len(tokens)
        start = 0 if padding_side == "right" else width - n
        span = slice(start, start + n)
        input_ids[i, span] = torch.as_tensor(list(tokens), dtype=torch.long)
        attention_mask[i, span] = 1
        if loss_masks is not None:
            if len(loss_masks[i]) != n:
                raise ValueError(f"loss_masks[{i}] has {len(loss_masks[i])} entries for {n} tokens")
            loss_mask[i, span] = torch.as_tensor(list(loss_masks[i]), dtype=torch.float32)
        else:
            prompt = prompt_lengths[i]  # type: ignore[index]
            if not 0 <= prompt <= n:
                raise ValueError(f"prompt_lengths[{i}] = {prompt} is outside 0..{n}")
            loss_mask[i, start + prompt : start + n] = 1.0
        for name, rows in (values or {}).items():
            if len(rows[i]) != n:
                raise ValueError(f"values[{name!r}][{i}] has {len(rows[i])} entries for {n} tokens")
            padded_values[name][i, span] = torch.as_tensor(list(rows[i]), dtype=torch.float32)
    return PaddedBatch(input_ids, attention_mask, loss_mask, padded_values)

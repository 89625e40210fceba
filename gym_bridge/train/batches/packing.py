"""Sequence packing: several sequences per row, each with its own positions, none seeing another.

Padded micro-batches pay for ``rows x longest`` tokens; RL completions vary in length, so much of
that is padding. Packing lays whole sequences end to end in rows of at most ``row_tokens`` tokens
(first-fit decreasing, :func:`gym_bridge.train.batches.batching.pack_sequences`) and gives each sequence
position ids that restart at 0. The attention mask is then block-diagonal, causal within each
sequence: transformers builds it from the position ids when the forward pass gets
``attention_mask=None`` and no KV cache (``masking_utils.find_packed_sequence_indices``; eager, sdpa
and flash-attention all honour it), so one sequence's tokens never attend to another's.

Log-probs come out per sequence exactly as the padded pass gives them (up to float rounding), and so
do gradients: the loss reads them through :meth:`PackedRows.unpack`, an index copy. A model whose
attention ignores the restarts would silently mix sequences; :func:`keeps_sequences_apart` checks a
model once at start-up so such a run is refused instead.

Layout of one sequence of length ``L`` in its row: a slot of ``round_up(L, round_to)`` tokens at
``start``; the slot's tail is padding that continues the sequence's positions (causal attention
keeps the real tokens from seeing it). A row's unused tail is a padding "sequence" of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gym_bridge.train.batches.batching import _round_up, pack_sequences

__all__ = [
    "PackedRows",
    "keeps_sequences_apart",
    "pack_rows",
    "packed_micro_batches",
    "padding_report",
    "require_packing_support",
]


def packed_micro_batches(
    lengths: Sequence[int], row_tokens: int, mb_tokens: int, *, round_to: int = 1
) -> list[list[int]]:
    """Index groups, one per micro-batch: sequences packed into rows of ``row_tokens`` (first-fit
    decreasing), then consecutive rows while ``rows x widest row`` fits ``mb_tokens`` (at least one row).

    Each micro-batch's indices are listed row by row, so :func:`pack_rows` of them rebuilds its rows.
    """
    rows = pack_sequences(lengths, row_tokens, round_to=round_to)
    used = [sum(_round_up(max(lengths[i], 1), round_to) for i in row) for row in rows]
    order = sorted(range(len(rows)), key=lambda r: -used[r])  # similar widths share a micro-batch
    groups: list[list[int]] = []
    current: list[int] = []
    count = width = 0
    for r in order:
        if current and (count + 1) * max(width, used[r]) > mb_tokens:
            groups.append(current)
            current, count, width = [], 0, 0
        current.extend(rows[r])
        count += 1
        width = max(width, used[r])
    if current:
        groups.append(current)
    return groups


@dataclass
class PackedRows:
    """Sequences packed into rows: the model's inputs and where each sequence sits."""

    input_ids: torch.Tensor
    """(r, W) token ids, padding where no sequence is."""
    position_ids: torch.Tensor
    """(r, W) each sequence's own positions 0..L-1 (the mask is derived from their restarts)."""
    rows: list[int]
    """Row of each sequence, in the order the sequences were given."""
    starts: list[int]
    """Column where each sequence starts."""
    lengths: list[int]
    """Real tokens of each sequence."""

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding_tokens(self) -> int:
        """Positions of the packed tensor that hold no sequence's token."""
        return self.input_ids.numel() - self.real_tokens

    def to(self, device: torch.device) -> PackedRows:
        """The same rows with their tensors on ``device``."""
        ids, positions = self.input_ids, self.position_ids
        return dataclasses.replace(
            self, input_ids=ids.to(device, non_blocking=True), position_ids=positions.to(device, non_blocking=True)
        )

    def _index(
        self, width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sample, column) in the per-sequence layout and (row, column) in the packed one, for every
        next-token position j < min(L - 1, width) of every sequence."""
        sample, column, row, packed = [], [], [], []
        for i, (r, start, n) in enumerate(zip(self.rows, self.starts, self.lengths, strict=True)):
            span = max(0, min(n - 1, width))
            sample += [i] * span
            column += range(span)
            row += [r] * span
            packed += range(start, start + span)
        as_long = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
        return as_long(sample), as_long(column), as_long(row), as_long(packed)

    def pack(self, values: torch.Tensor) -> torch.Tensor:
        """(b, T-1) per-sequence next-token values -> (r, W-1) at their packed positions (0 elsewhere)."""
        sample, column, row, packed = self._index(values.shape[1], values.device)
        out = values.new_zeros((self.input_ids.shape[0], self.input_ids.shape[1] - 1))
        out[row, packed] = values[sample, column]
        return out

    def unpack(self, packed_values: torch.Tensor, width: int) -> torch.Tensor:
        """(r, W-1) packed next-token values -> (b, width) per sequence; differentiable (an index copy)."""
        sample, column, row, packed = self._index(width, packed_values.device)
        out = packed_values.new_zeros((len(self.lengths), width))
        out[sample, column] = packed_values[row, packed]
        return out


def pack_rows(
    token_ids: Sequence[Sequence[int]], row_tokens: int, *, pad_token_id: int, round_to: int = 1
) -> PackedRows:
    """Pack ``token_ids`` into rows of at most ``row_tokens`` (first-fit decreasing; a longer sequence
    gets a row of its own). Rows are as wide as the fullest one."""
    lengths = [len(t) for t in token_ids]
    if any(n == 0 for n in lengths):
        raise ValueError("cannot pack an empty sequence")
    bins = pack_sequences(lengths, row_tokens, round_to=round_to)
    rows, starts = [0] * len(lengths), [0] * len(lengths)
    fill = []
    for r, members in enumerate(bins):
        offset = 0
        for i in members:
            rows[i], starts[i] = r, offset
            offset += _round_up(lengths[i], round_to)
        fill.append(offset)
    width = max(fill, default=0)
    input_ids = torch.full((len(bins), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(bins), width), dtype=torch.long)
    for i, tokens in enumerate(token_ids):
        r, start, slot = rows[i], starts[i], _round_up(lengths[i], round_to)
        input_ids[r, start : start + lengths[i]] = torch.as_tensor(list(tokens), dtype=torch.long)
        position_ids[r, start : start + slot] = torch.arange(slot)
    for r, used in enumerate(fill):
        position_ids[r, used:] = torch.arange(width - used)
    return PackedRows(input_ids, position_ids, rows, starts, lengths)


def keeps_sequences_apart(model: Any) -> bool:
    """Whether ``model`` gives two packed sequences the logits each gets alone (its attention builds
    the block-diagonal mask from restarting position ids). A forward pass over 9 tokens."""
    vocab = int(model.get_input_embeddings().num_embeddings)
    first = [t % vocab for t in (3, 1, 4, 1, 5)]
    second = [t % vocab for t in (9, 2, 6, 5)]
    packed = pack_rows([first, second], len(first) + len(second), pad_token_id=0)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            together = model(
                input_ids=packed.input_ids.to(device),
                position_ids=packed.position_ids.to(device),
                use_cache=False,
            ).logits.float()
            alone = [
                model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits.float()
                for ids in (first, second)
            ]
    finally:
        model.train(was_training)
    tolerance = 1e-3 * max(1.0, float(alone[1].abs().max()))
    parts = (together[0, : len(first)], together[0, len(first) : len(first) + len(second)])
    return all(float((p - a[0]).abs().max()) <= tolerance for p, a in zip(parts, alone, strict=True))


def require_packing_support(model: Any, model_name: str) -> None:
    """Refuse ``policy.sequence_packing.enabled`` (a :class:`ConfigError` naming it) for a model whose
    attention would let packed sequences see each other."""
    from gym_bridge.train.config import ConfigError

    if not keeps_sequences_apart(model):
        raise ConfigError(
            [
                f"policy.sequence_packing.enabled: model {model_name!r} does not keep packed sequences "
                "apart (its attention ignores restarting position ids); use "
                "policy.dynamic_batching.enabled=true instead"
            ]
        )


def padding_report(lengths: Sequence[int], groups: Sequence[Sequence[int]], row_tokens: int | None) -> dict:
    """Tokens computed and padding of a grouping: padded micro-batches (``row_tokens`` None) or packed
    rows of ``row_tokens`` (each group packed by :func:`pack_rows`)."""
    computed = 0
    for group in groups:
        if row_tokens is None:
            computed += len(group) * max(lengths[i] for i in group)
        else:
            packed = pack_rows([[1] * lengths[i] for i in group], row_tokens, pad_token_id=0)
            computed += packed.input_ids.numel()
    real = sum(lengths)
    return {"tokens_computed": computed, "padding_tokens": computed - real, "real_tokens": real}

"""Micro-batching: every sample exactly once, budgets respected, less padding than naive batches."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gym_bridge.train.algorithm.loss import ClippedPGLossFn, global_normalizers
from gym_bridge.train.batches.batching import (
    dynamic_micro_batches,
    fixed_micro_batches,
    pack_sequences,
    pad_and_stack,
    padded_tokens,
)
from gym_bridge.train.config import ClippedPGLossConfig


def skewed_lengths(n: int = 200, seed: int = 0) -> list[int]:
    """Mostly short completions with a few long ones, in random order (typical RL rollouts)."""
    rng = random.Random(seed)
    return [rng.randint(100, 128) if rng.random() < 0.1 else rng.randint(4, 16) for _ in range(n)]


def assert_partition(groups: list[list[int]], n: int) -> None:
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(n)), "every sample exactly once"
    assert all(groups), "no empty group"


@pytest.mark.parametrize("seed", range(5))
def test_dynamic_micro_batches_partition_and_fit_the_budget(seed: int) -> None:
    lengths = skewed_lengths(seed=seed) + [300]  # one sample over the budget on its own
    groups = dynamic_micro_batches(lengths, max_tokens=256)
    assert_partition(groups, len(lengths))
    for group in groups:
        cost = len(group) * max(lengths[i] for i in group)
        assert cost <= 256 or len(group) == 1
    assert [300 in [lengths[i] for i in g] for g in groups].count(True) == 1
    assert any(len(g) == 1 and lengths[g[0]] == 300 for g in groups)


def test_dynamic_batching_pads_less_than_naive_batching_on_skewed_lengths() -> None:
    lengths = skewed_lengths()
    naive = fixed_micro_batches(len(lengths), 8)
    budget = 8 * max(lengths)  # the same worst-case memory as the naive micro-batch of 8
    dynamic = dynamic_micro_batches(lengths, budget)
    assert_partition(naive, len(lengths))
    naive_pad, dynamic_pad = padded_tokens(naive, lengths), padded_tokens(dynamic, lengths)
    assert dynamic_pad < naive_pad / 5, (dynamic_pad, naive_pad)
    assert len(dynamic) < len(naive)  # and fewer forward passes


def test_dynamic_batching_honours_max_batch_size_and_rounding() -> None:
    lengths = [5] * 10
    groups = dynamic_micro_batches(lengths, max_tokens=1000, max_batch_size=3)
    assert [len(g) for g in groups] == [3, 3, 3, 1]
    # Rounded to 8, five 5-token samples cost 40 tokens: a budget of 39 fits four.
    rounded = dynamic_micro_batches([5] * 5, max_tokens=39, round_to=8)
    assert [len(g) for g in rounded] == [4, 1]
    assert padded_tokens(rounded, [5] * 5, round_to=8) == 5 * 3


def test_dynamic_batches_group_similar_lengths() -> None:
    lengths = [3, 50, 4, 51, 5, 52]
    groups = dynamic_micro_batches(lengths, max_tokens=156)
    assert [sorted(lengths[i] for i in g) for g in groups] == [[50, 51, 52], [3, 4, 5]]


def test_fixed_micro_batches() -> None:
    assert fixed_micro_batches(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert fixed_micro_batches(0, 3) == []
    with pytest.raises(ValueError):
        fixed_micro_batches(3, 0)


@pytest.mark.parametrize("seed", range(5))
def test_packing_partitions_and_fills_rows(seed: int) -> None:
    lengths = skewed_lengths(seed=seed)
    rows = pack_sequences(lengths, max_tokens=256)
    assert_partition(rows, len(lengths))
    assert all(sum(lengths[i] for i in row) <= 256 for row in rows)
    # First-fit decreasing uses at most 11/9 OPT + 6/9 bins, and OPT >= total / capacity.
    assert len(rows) <= math.ceil(11 / 9 * math.ceil(sum(lengths) / 256) + 6 / 9)


def test_packing_gives_an_oversized_sequence_its_own_row() -> None:
    rows = pack_sequences([10, 500, 20], max_tokens=100)
    assert_partition(rows, 3)
    assert [1] in rows and any(sorted(r) == [0, 2] for r in rows)


def test_pad_and_stack_right_padding_and_loss_mask_from_prompt_lengths() -> None:
    batch = pad_and_stack([[1, 2, 3, 4], [5, 6]], pad_token_id=0, prompt_lengths=[2, 1])
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert batch.lengths.tolist() == [4, 2]
    assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.float32


def test_pad_and_stack_left_padding_multiple_and_values() -> None:
    batch = pad_and_stack(
        [[1, 2, 3], [4]],
        pad_token_id=9,
        prompt_lengths=[1, 0],
        padding_side="left",
        pad_to_multiple_of=4,
        values={"generation_logprobs": [[0.0, -0.5, -0.25], [-2.0]]},
    )
    assert batch.input_ids.tolist() == [[9, 1, 2, 3], [9, 9, 9, 4]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 1]]
    assert batch.values["generation_logprobs"].tolist() == [[0, 0, -0.5, -0.25], [0, 0, 0, -2.0]]


def test_pad_and_stack_explicit_loss_masks_for_multi_turn() -> None:
    batch = pad_and_stack([[1, 2, 3, 4, 5]], pad_token_id=0, loss_masks=[[0, 1, 0, 0, 1]])
    assert batch.loss_mask.tolist() == [[0, 1, 0, 0, 1]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_lengths": [1], "loss_masks": [[0, 1]]}, "exactly one"),
        ({}, "exactly one"),
        ({"prompt_lengths": [3]}, "outside"),
        ({"loss_masks": [[1]]}, "entries for 2 tokens"),
        ({"prompt_lengths": [0], "values": {"x": [[1.0]]}}, "entries for 2 tokens"),
    ],
)
def test_pad_and_stack_rejects_inconsistent_inputs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pad_and_stack([[1, 2]], pad_token_id=0, **kwargs)


def test_loss_over_dynamic_micro_batches_equals_the_full_padded_batch() -> None:
    """Batching composes with the loss: regrouping samples does not change the summed loss."""
    rng = random.Random(5)
    prompts = [rng.randint(2, 6) for _ in range(12)]
    completions = [rng.choice([1, 2, 3, 20, 24]) for _ in range(12)]
    sequences = [
        [rng.randint(1, 50) for _ in range(p + c)] for p, c in zip(prompts, completions, strict=True)
    ]
    per_token = {
        name: [[rng.uniform(-3, -0.1) for _ in seq] for seq in sequences]
        for name in ("curr", "prev_logprobs", "generation_logprobs")
    }
    advantages = torch.tensor([rng.uniform(-1, 1) for _ in sequences], dtype=torch.float64)
    fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))

    def loss_of(rows: list[int], toks: float | None, seqs: float | None) -> float:
        batch = pad_and_stack(
            [sequences[i] for i in rows],
            pad_token_id=0,
            prompt_lengths=[prompts[i] for i in rows],
            values={k: [v[i] for i in rows] for k, v in per_token.items()},
        )
        v = {k: t.double() for k, t in batch.values.items()}
        loss, _ = fn(
            v["curr"],
            prev_logprobs=v["prev_logprobs"],
            generation_logprobs=v["generation_logprobs"],
            advantages=advantages[rows],
            token_mask=batch.loss_mask,
            global_valid_toks=toks,
            global_valid_seqs=seqs,
        )
        return loss.item()

    everything = list(range(len(sequences)))
    full = loss_of(everything, None, None)
    whole = pad_and_stack(sequences, pad_token_id=0, prompt_lengths=prompts)
    toks, seqs = global_normalizers(whole.loss_mask)
    groups = dynamic_micro_batches([len(s) for s in sequences], max_tokens=60)
    assert len(groups) > 2
    assert sum(loss_of(g, toks, seqs) for g in groups) == pytest.approx(full, rel=1e-9)

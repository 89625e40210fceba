"""Sequence packing: several sequences per row, the unpacked pass's log-probs and gradients, and the
trainer's ``policy.sequence_packing`` keys doing what they say."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.models.logprobs import token_logprobs  # noqa: E402
from gym_bridge.train.batches.batching import pad_and_stack  # noqa: E402
from gym_bridge.train.batches.packing import (  # noqa: E402
    keeps_sequences_apart,
    pack_rows,
    packed_micro_batches,
    require_packing_support,
)
from gym_bridge.train.batches.rollouts import Sample  # noqa: E402
from gym_bridge.train.batches.sequences import (  # noqa: E402
    make_micro_batch,
    micro_batch_logprobs,
    micro_batches,
    per_sample_logprobs,
)
from gym_bridge.train.config import ConfigError, load_config  # noqa: E402
from gym_bridge.train.learner.update import Learner, StepBatch, update_policy  # noqa: E402

PAD = 0


def tiny_llama(attn: str, seed: int = 3) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config).float()


def batch(seed: int, n: int = 10) -> tuple[list[list[int]], list[list[int]]]:
    """Sequences of 5..40 tokens, a prompt then a completion (trained on), one multi-turn."""
    rng = random.Random(seed)
    token_ids, masks = [], []
    for _ in range(n):
        prompt, completion = rng.randint(3, 20), rng.randint(1, 20)
        token_ids.append([rng.randrange(1, 300) for _ in range(prompt + completion)])
        masks.append([0] * prompt + [1] * completion)
    masks[0] = masks[0][:-3] + [0, 0, 1]  # a tool output between two trained turns
    return token_ids, masks


def test_rows_hold_several_sequences_with_their_own_positions() -> None:
    token_ids = [[1] * 7, [2] * 5, [3] * 3, [4] * 9, [5] * 2]
    packed = pack_rows(token_ids, 12, pad_token_id=PAD)
    assert packed.input_ids.shape[0] == 3  # 26 tokens in rows of 12: first-fit decreasing needs 3
    assert packed.real_tokens == 26
    per_row: dict[int, int] = {}
    for i, (r, start, n) in enumerate(zip(packed.rows, packed.starts, packed.lengths, strict=True)):
        per_row[r] = per_row.get(r, 0) + 1
        assert packed.input_ids[r, start : start + n].tolist() == token_ids[i]
        assert packed.position_ids[r, start : start + n].tolist() == list(range(n))
        assert start + n <= 12
    assert max(per_row.values()) >= 2


def test_rounding_aligns_each_slot() -> None:
    packed = pack_rows([[1] * 5, [2] * 3, [3] * 6], 16, pad_token_id=PAD, round_to=4)
    assert all(start % 4 == 0 for start in packed.starts)
    # a slot's padding continues its sequence's positions, so it stays one sequence
    r, start = packed.rows[1], packed.starts[1]
    assert packed.position_ids[r, start : start + 4].tolist() == [0, 1, 2, 3]


def test_pack_and_unpack_are_inverse() -> None:
    token_ids, masks = batch(0)
    padded = pad_and_stack(token_ids, pad_token_id=PAD, loss_masks=masks)
    values = torch.randn(padded.input_ids.shape[0], padded.input_ids.shape[1] - 1) * padded.loss_mask[:, 1:]
    packed = pack_rows(token_ids, 48, pad_token_id=PAD)
    assert torch.equal(packed.unpack(packed.pack(values), values.shape[1]), values)


def test_micro_batches_cover_every_sequence_once_within_the_budget() -> None:
    rng = random.Random(5)
    lengths = [rng.randint(1, 64) for _ in range(200)]
    groups = packed_micro_batches(lengths, 64, 256, round_to=1)
    assert sorted(i for g in groups for i in g) == list(range(200))
    for group in groups:
        packed = pack_rows([[1] * lengths[i] for i in group], 64, pad_token_id=PAD)
        assert packed.input_ids.shape[1] <= 64
        assert packed.input_ids.numel() <= 256 or packed.input_ids.shape[0] == 1
    padded_cost = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    packed_cost = sum(pack_rows([[1] * lengths[i] for i in g], 64, pad_token_id=PAD).input_ids.numel() for g in groups)
    assert packed_cost < padded_cost


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("round_to", [1, 8])
def test_log_probs_and_gradients_equal_the_unpacked_pass(attn: str, round_to: int) -> None:
    model = tiny_llama(attn)
    token_ids, masks = batch(1)
    padded = pad_and_stack(token_ids, pad_token_id=PAD, loss_masks=masks)
    token_mask = padded.loss_mask[:, 1:]
    weights = torch.linspace(0.5, 1.5, token_mask.shape[1])

    model.zero_grad()
    plain = token_logprobs(model, padded.input_ids, padded.attention_mask, token_mask)
    (plain * weights).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    packed = pack_rows(token_ids, 64, pad_token_id=PAD, round_to=round_to)
    assert packed.input_ids.shape[0] < len(token_ids)  # several sequences per row
    rows = token_logprobs(model, packed.input_ids, None, packed.pack(token_mask), packed.position_ids)
    unpacked = packed.unpack(rows, token_mask.shape[1])
    (unpacked * weights).sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]

    assert torch.allclose(unpacked, plain, atol=1e-5)
    assert float(plain.detach().abs().sum()) > 0
    for a, b in zip(plain_grads, packed_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_a_model_that_mixes_packed_sequences_is_refused() -> None:
    model = tiny_llama("sdpa")
    assert keeps_sequences_apart(model)

    class PlainMask(torch.nn.Module):
        """Passes an all-ones attention mask: position restarts no longer split the row."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def get_input_embeddings(self) -> Any:
            return self.inner.get_input_embeddings()

        def forward(self, input_ids: Any, **kwargs: Any) -> Any:
            kwargs["attention_mask"] = torch.ones_like(input_ids)
            return self.inner(input_ids=input_ids, **kwargs)

    mixing = PlainMask(model)
    assert not keeps_sequences_apart(mixing)
    with pytest.raises(ConfigError, match=r"policy\.sequence_packing\.enabled: model 'mixer'"):
        require_packing_support(mixing, "mixer")


def samples_of(token_ids: list[list[int]], masks: list[list[int]]) -> list[Sample]:
    rng = random.Random(9)
    return [
        Sample(
            group=i // 4,
            token_ids=list(t),
            loss_mask=list(m),
            reward=float(rng.random() > 0.5),
            generation_logprobs=[-1.0 * x for x in m],
        )
        for i, (t, m) in enumerate(zip(token_ids, masks, strict=True))
    ]


def config(packing: bool, extra: tuple[str, ...] = ()) -> Any:
    return load_config(
        None,
        [
            "data.train.data_path=x.jsonl",
            "grpo.mode=offline",
            "grpo.num_prompts_per_step=3",
            "grpo.num_generations_per_prompt=4",
            "policy.train_global_batch_size=12",
            "policy.train_micro_batch_size=4",
            "policy.logprob_batch_size=4",
            "policy.max_total_sequence_length=64",
            "policy.generation.max_new_tokens=16",
            "policy.share_prompt_prefix=false",
            "loss_fn.reference_policy_kl_penalty=0.0",
            f"policy.sequence_packing.enabled={str(packing).lower()}",
            *extra,
        ],
    )


def test_the_trainer_packs_when_the_key_is_on_and_its_update_is_the_unpacked_one() -> None:
    from gym_bridge.train.algorithm.loss import ClippedPGLossFn
    from gym_bridge.train.config import ClippedPGLossConfig

    token_ids, masks = batch(2, n=12)
    results = {}
    for packing in (False, True):
        cfg = config(packing, ("policy.sequence_packing.train_mb_tokens=128",))
        model = tiny_llama("sdpa", seed=4)
        samples = samples_of(token_ids, masks)
        groups = micro_batches(cfg, samples, list(range(12)), for_logprobs=False)
        mb = make_micro_batch(
            samples, groups[0], PAD, packing=(64, 1) if packing else None
        )
        if packing:
            assert mb.packed is not None and mb.packed.input_ids.shape[0] < len(groups[0])
            assert mb.packed.input_ids.numel() <= 128
        else:
            assert mb.packed is None
        logprobs = per_sample_logprobs(cfg, model, samples, PAD)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        advantages = torch.tensor([s.reward - 0.5 for s in samples])
        loss_fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))
        learner = Learner(model, None, optimizer, scheduler, loss_fn, None, PAD)
        metrics = update_policy(cfg, learner, StepBatch(samples, advantages, torch.ones(12)))
        results[packing] = (logprobs, metrics, [p.detach().clone() for p in model.parameters()], groups)
    plain, packed = results[False], results[True]
    assert max(len(g) for g in packed[3]) > 4  # a micro-batch holds more than train_micro_batch_size
    for a, b in zip(plain[0], packed[0], strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert packed[1]["loss"] == pytest.approx(plain[1]["loss"], abs=1e-5)
    assert packed[1]["grad_norm"] == pytest.approx(plain[1]["grad_norm"], rel=1e-4)
    for a, b in zip(plain[2], packed[2], strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_token_budget_sets_how_many_rows_a_micro_batch_has() -> None:
    token_ids, masks = batch(3, n=24)
    samples = samples_of(token_ids, masks)
    few = micro_batches(config(True, ("policy.sequence_packing.train_mb_tokens=64",)), samples, list(range(24)), for_logprobs=False)
    many = micro_batches(config(True, ("policy.sequence_packing.train_mb_tokens=512",)), samples, list(range(24)), for_logprobs=False)
    assert len(few) > len(many)
    for group in few:  # one row of at most 64 tokens each
        assert sum(len(token_ids[i]) for i in group) <= 64
    mb = make_micro_batch(samples, many[0], PAD, packing=(64, 1))
    assert mb.packed is not None and mb.packed.input_ids.numel() <= 512
    assert mb.packed.input_ids.shape[0] > 1
    logprobs = micro_batch_logprobs(tiny_llama("sdpa"), mb, PAD)
    assert logprobs.shape == mb.token_mask.shape

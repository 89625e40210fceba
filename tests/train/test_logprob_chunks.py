"""``policy.logprob_chunk_size``: the output layer sees at most a chunk of positions at once, with the
unchunked pass's log-probs and gradients (plain, shared-prompt and through the trainer's update)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.models.logprobs import hidden_logprobs, token_logprobs  # noqa: E402
from gym_bridge.models.shared_prefix import plan_prefixes, shared_prefix_logprobs  # noqa: E402
from gym_bridge.train.config import ConfigError, load_config  # noqa: E402
from tests.train.helpers import random_grpo_batch  # noqa: E402

PAD = 0


@pytest.fixture(scope="module")
def model() -> Any:
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return new_tiny_model(build_tokenizer(), recipe, seed=5).float()


def batch(seed: int) -> tuple[list[list[int]], list[list[int]], Any, Any, Any]:
    """3 prompts x 4 completions of different lengths, padded (ids, attention, next-token mask)."""
    return random_grpo_batch(seed, prompts=3, prompt_len=(4, 10), pad=PAD)


class HeadWidths:
    """Records the number of positions of every output-layer call (forward and recomputation)."""

    def __init__(self, model: Any) -> None:
        self.rows: list[int] = []
        self.handle = model.get_output_embeddings().register_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        self.rows.append(int(output.reshape(-1, output.shape[-1]).shape[0]))

    def close(self) -> None:
        self.handle.remove()


def values_and_grads(model: Any, run: Any) -> tuple[Any, list[Any], list[int]]:
    model.zero_grad()
    widths = HeadWidths(model)
    try:
        out = run()
        (out * torch.linspace(0.5, 1.5, out.shape[-1])).sum().backward()
    finally:
        widths.close()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], widths.rows


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_plain_pass_matches_and_never_projects_more_than_a_chunk(model: Any, chunk: int) -> None:
    _, _, ids, attention, token_mask = batch(0)
    trained = int(token_mask.sum())
    whole, whole_grads, whole_rows = values_and_grads(model, lambda: token_logprobs(model, ids, attention, token_mask))
    chunked, grads, rows = values_and_grads(
        model, lambda: token_logprobs(model, ids, attention, token_mask, chunk_size=chunk)
    )
    assert whole_rows == [trained]  # unchunked: every trained position at once
    assert max(rows) == chunk and sum(rows) == 2 * trained  # each chunk, then its recomputation in backward
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(whole_grads) > 0
    for got, want in zip(grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_chunked_shared_prompt_pass_matches_the_unchunked_one(model: Any) -> None:
    token_ids, loss_masks, _, _, token_mask = batch(1)
    plan = plan_prefixes(token_ids, loss_masks)
    whole, whole_grads, _ = values_and_grads(
        model, lambda: shared_prefix_logprobs(model, token_ids, token_mask, plan, PAD)
    )
    chunked, grads, rows = values_and_grads(
        model, lambda: shared_prefix_logprobs(model, token_ids, token_mask, plan, PAD, chunk_size=7)
    )
    assert max(rows) == 7
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_without_gradients_chunks_are_not_recomputed(model: Any) -> None:
    hidden = torch.randn(23, model.config.hidden_size)
    targets = torch.randint(0, model.config.vocab_size, (23,))
    widths = HeadWidths(model)
    try:
        with torch.no_grad():
            chunked = hidden_logprobs(model, hidden, targets, chunk_size=10)
            whole = hidden_logprobs(model, hidden, targets)
    finally:
        widths.close()
    assert widths.rows == [10, 10, 3, 23]
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)


def test_the_key_reaches_the_training_pass_with_the_same_update(model: Any) -> None:
    """An update with ``policy.logprob_chunk_size`` gives the unchunked update's loss and weights, and
    its output-layer calls never exceed the chunk."""
    import copy

    from gym_bridge.train.algorithm.loss import ClippedPGLossFn
    from gym_bridge.train.batches.rollouts import Sample
    from gym_bridge.train.learner.update import Learner, StepBatch, update_policy
    from gym_bridge.train.setup import build_optimizer

    token_ids, loss_masks, _, _, _ = batch(2)
    samples = [
        Sample(group=i // 4, token_ids=list(t), loss_mask=list(m), reward=float(i % 2))
        for i, (t, m) in enumerate(zip(token_ids, loss_masks, strict=True))
    ]
    results = {}
    for chunk in (None, 4):
        overrides = [
            "data.train.data_path=a.jsonl",
            "grpo.mode=offline",
            "policy.train_global_batch_size=12",
            "policy.train_micro_batch_size=4",
            "loss_fn.reference_policy_kl_penalty=0.0",
            f"policy.logprob_chunk_size={'null' if chunk is None else chunk}",
        ]
        cfg = load_config(None, overrides)
        assert cfg.policy.logprob_chunk_size == chunk
        trained = copy.deepcopy(model)
        optimizer, scheduler = build_optimizer(cfg, trained, 1)
        learner = Learner(trained, None, optimizer, scheduler, ClippedPGLossFn(cfg.loss_fn), None, PAD)
        widths = HeadWidths(trained)
        try:
            metrics = update_policy(cfg, learner, StepBatch.from_samples(cfg.grpo, samples))
        finally:
            widths.close()
        results[chunk] = (metrics, [p.detach().clone() for p in trained.parameters()], max(widths.rows))
    (plain, plain_weights, plain_rows), (chunked, chunked_weights, chunked_rows) = results[None], results[4]
    assert chunked_rows == 4 < plain_rows
    assert chunked["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
    assert chunked["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    for got, want in zip(chunked_weights, plain_weights, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_chunk_size_below_one_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="logprob_chunk_size"):
        load_config(None, ["data.train.data_path=a.jsonl", "grpo.mode=offline", f"policy.logprob_chunk_size={value}"])

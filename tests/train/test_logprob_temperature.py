"""The trainer's log-probs are the sampled distribution's: ``log_softmax(logits / T)`` with
T = ``policy.generation.temperature`` (as NeMo RL and TRL compute them), in every pass: plain, chunked,
shared-prompt, the step-start pass and the update's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.models.logprobs import token_logprobs  # noqa: E402
from gym_bridge.models.shared_prefix import plan_prefixes, shared_prefix_logprobs  # noqa: E402
from gym_bridge.train.batches.sequences import per_sample_logprobs  # noqa: E402
from gym_bridge.train.learner.update import StepBatch, update_policy  # noqa: E402
from gym_bridge.train.setup import build_learner  # noqa: E402
from tests.train.helpers import offline_step_config, random_grpo_batch, save_random_tiny, step_sample  # noqa: E402

PAD = 0


@pytest.fixture(scope="module")
def model() -> Any:
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return new_tiny_model(build_tokenizer(), recipe, seed=7).float().eval()


def by_formula(model: Any, ids: Any, attention: Any, token_mask: Any, temperature: float) -> Any:
    """log_softmax(logits / T) of each next token, 0 outside ``token_mask``: the published definition."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logprobs * token_mask


@pytest.mark.parametrize("temperature", [0.5, 0.7, 1.3])
def test_plain_and_chunked_passes_give_the_scaled_distribution_s_logprobs(model: Any, temperature: float) -> None:
    _, _, ids, attention, token_mask = random_grpo_batch(0, prompts=3, prompt_len=(4, 10), pad=PAD)
    want = by_formula(model, ids, attention, token_mask, temperature)
    with torch.no_grad():
        plain = token_logprobs(model, ids, attention, token_mask, temperature=temperature)
        chunked = token_logprobs(model, ids, attention, token_mask, chunk_size=3, temperature=temperature)
        raw = token_logprobs(model, ids, attention, token_mask)
    torch.testing.assert_close(plain, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked, want, rtol=1e-5, atol=1e-5)
    assert (raw - plain).abs().max() > 1e-2  # the temperature changes the values


def test_shared_prompt_pass_gives_the_same_scaled_logprobs_as_the_plain_pass(model: Any) -> None:
    token_ids, loss_masks, ids, attention, token_mask = random_grpo_batch(1, prompts=3, prompt_len=(4, 10), pad=PAD)
    plan = plan_prefixes(token_ids, loss_masks)
    with torch.no_grad():
        shared = shared_prefix_logprobs(model, token_ids, token_mask, plan, PAD, temperature=0.6)
    torch.testing.assert_close(shared, by_formula(model, ids, attention, token_mask, 0.6), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_temperature"), seed=3, num_layers=1)


def config(model_dir: Path, temperature: float) -> Any:
    return offline_step_config(
        model_dir, "policy.train_micro_batch_size=4", f"policy.generation.temperature={temperature}"
    )


def test_step_start_logprobs_and_the_update_use_the_generation_temperature(model_dir: Path) -> None:
    samples = [step_sample(i, float(i % 3 == 0)) for i in range(8)]
    cfg = config(model_dir, 0.5)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    start = per_sample_logprobs(cfg, learner.model, samples, learner.pad_token_id)
    raw = per_sample_logprobs(config(model_dir, 1.0), learner.model, samples, learner.pad_token_id)

    # The step-start pass: the published formula at T = 0.5, on every generated token.
    for sample, got, plain in zip(samples, start, raw, strict=True):
        ids = torch.tensor([sample.token_ids])
        mask = torch.tensor([sample.loss_mask[1:]], dtype=torch.float32)
        want = by_formula(learner.model, ids, torch.ones_like(ids), mask, 0.5)[0]
        trained = mask[0].bool()
        torch.testing.assert_close(got[trained], want[trained], rtol=1e-5, atol=1e-5)
        assert (got[trained] - plain[trained]).abs().max() > 1e-2

    # The update's own pass agrees with the step-start one: every ratio is exactly 1 before the step.
    batch = StepBatch.from_samples(cfg.grpo, samples)
    batch.prev_logprobs = start
    metrics = update_policy(cfg, learner, batch)
    assert metrics["probs_ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["probs_ratio_max"] == pytest.approx(1.0, abs=1e-5)

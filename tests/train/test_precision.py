"""``policy.precision``: a bfloat16 step runs on CPU and its loss is within bf16 rounding of float32's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gym_bridge.train.config import load_config
from tests.train.helpers import save_random_tiny
from tests.train.test_lora import samples


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_precision"), seed=5)


def two_steps(tmp: Path, model_dir: Path, precision: str, *extra: str) -> tuple[dict[str, float], Any, Any]:
    """Two GRPO updates on the same samples (the second has a KL term: the first moved the policy);
    the second's metrics, the learner and its config."""
    from gym_bridge.train.batches.sequences import per_sample_logprobs
    from gym_bridge.train.learner.update import StepBatch, update_policy
    from gym_bridge.train.setup import build_learner

    cfg = load_config(
        None,
        [
            "grpo.mode=offline",
            "data.train.data_path=unused.jsonl",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=4",
            "loss_fn.reference_policy_kl_penalty=0.5",
            f"policy.model_name={model_dir}",
            f"policy.precision={precision}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "policy.max_total_sequence_length=32",
            "policy.generation.max_new_tokens=8",
            "policy.optimizer.kwargs.lr=1e-2",
            f"checkpointing.checkpoint_dir={tmp / 'ckpt'}",
            *extra,
        ],
    )
    learner, _ = build_learner(cfg, None, rollout_process=False)
    metrics: dict[str, float] = {}
    for _ in range(2):
        batch = StepBatch.from_samples(cfg.grpo, samples())
        with learner.reference_policy() as reference:
            batch.reference_logprobs = per_sample_logprobs(
                cfg, reference, batch.samples, learner.pad_token_id
            )
        metrics = update_policy(cfg, learner, batch)
    return metrics, learner, cfg


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_bfloat16_step_runs_and_its_loss_is_close_to_float32s(
    tmp_path: Path, model_dir: Path, lora: bool
) -> None:
    from gym_bridge.train.batches.sequences import per_sample_logprobs

    extra = ["policy.dtensor_cfg.lora_cfg.enabled=true"] if lora else []
    full, full_learner, cfg = two_steps(tmp_path, model_dir, "float32", *extra)
    half, half_learner, _ = two_steps(tmp_path, model_dir, "bfloat16", *extra)
    assert next(full_learner.model.parameters()).dtype == torch.float32
    assert next(half_learner.model.parameters()).dtype == torch.bfloat16
    assert (
        half["optimizer_steps"] == 1 and torch.isfinite(torch.tensor([half["loss"], half["grad_norm"]])).all()
    )
    # the second step's loss carries a KL term that depends on the log-probs: bf16 (8 bits of mantissa)
    # moves it, but only within rounding (measured: 0.5-1% on loss and KL, 0.5% on grad norm)
    assert full["kl_penalty"] > 1e-4
    assert half["loss"] == pytest.approx(full["loss"], rel=0.03, abs=1e-4)
    assert half["kl_penalty"] == pytest.approx(full["kl_penalty"], rel=0.05)
    assert half["approx_entropy"] == pytest.approx(full["approx_entropy"], rel=0.02)
    assert half["grad_norm"] == pytest.approx(full["grad_norm"], rel=0.03)
    batch = samples(seed=3)
    exact = torch.cat(per_sample_logprobs(cfg, full_learner.model, batch, full_learner.pad_token_id))
    rounded = torch.cat(per_sample_logprobs(cfg, half_learner.model, batch, half_learner.pad_token_id))
    assert not torch.equal(rounded, exact)  # bf16 is really in effect
    torch.testing.assert_close(rounded, exact, rtol=0.02, atol=0.05)
    if lora:  # the adapters train in float32 on the bf16 base (peft's autocast), as NeMo RL does
        adapter = next(p for n, p in half_learner.model.named_parameters() if ".lora_A." in n)
        assert adapter.dtype == torch.float32

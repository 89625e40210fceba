"""Synchronous GRPO samples from the model it trains: generation and the update must never overlap.

A request whose rollout the agent loop gave up on (a timeout under load) can still be generating when
the step's update starts; with LoRA its merge switched the adapters off under the training pass
("element 0 of tensors does not require grad"), and without LoRA it would read half-updated weights.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.train.helpers import save_random_tiny, step_sample


def _cfg(model_dir: Path, *overrides: str):
    from gym_bridge.train.config import load_config

    return load_config(None, [
        "data.train.data_path=unused.jsonl", "grpo.mode=offline", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4",
        "loss_fn.reference_policy_kl_penalty=0.0", f"policy.model_name={model_dir}",
        "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8",
        "policy.max_total_sequence_length=32", "policy.generation.max_new_tokens=8",
        "checkpointing.enabled=false", *overrides,
    ])  # fmt: skip


@pytest.mark.parametrize("lora", [False, True])
def test_the_update_holds_the_generation_lock_of_a_shared_model(tmp_path: Path, monkeypatch, lora: bool) -> None:
    from gym_bridge.train.learner import update
    from gym_bridge.train.learner.update import StepBatch, update_policy
    from gym_bridge.train.setup import _generation_backend, build_learner

    extra = ["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.dim=4"] if lora else []
    cfg = _cfg(save_random_tiny(tmp_path / "tiny"), "grpo.async_grpo.enabled=false", *extra)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    with ExitStack() as stack:
        backend = _generation_backend(cfg, stack, learner)
    assert backend.model is learner.model and learner.model_lock is backend.lock

    taken_elsewhere: list[bool] = []
    real_steps = update.optimizer_steps

    def steps_while_probing(*args, **kwargs):
        # another thread (the policy server's generation) cannot take the lock during the update
        probe = threading.Thread(target=lambda: taken_elsewhere.append(backend.lock.acquire(blocking=False)))
        probe.start()
        probe.join()
        return real_steps(*args, **kwargs)

    monkeypatch.setattr(update, "optimizer_steps", steps_while_probing)
    batch = StepBatch.from_samples(cfg.grpo, [step_sample(i, float(i % 2)) for i in range(8)])
    update_policy(cfg, learner, batch)
    assert taken_elsewhere == [False]
    assert backend.lock.acquire(blocking=False)  # released afterwards
    backend.lock.release()


def test_async_grpo_samples_from_its_own_copy_and_needs_no_lock(tmp_path: Path) -> None:
    from gym_bridge.train.setup import _generation_backend, build_learner

    cfg = _cfg(save_random_tiny(tmp_path / "tiny"))
    learner, _ = build_learner(cfg, None, rollout_process=False)
    cfg.grpo.mode, cfg.grpo.async_grpo.enabled = "online", True  # what the sampler is built for
    with ExitStack() as stack:
        backend = _generation_backend(cfg, stack, learner)
    assert backend.model is not learner.model and learner.model_lock is not backend.lock

"""The async GRPO pipeline: which weights sample which step, errors, the end of data, shutdown."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gym_bridge.train.samplers.async_rollouts import RolloutPipeline


class FakeSampler:
    """Records which weights each produced step was sampled with."""

    def __init__(self, fail_at: int | None = None, last: int | None = None, delay: float = 0.01) -> None:
        self.weights: Any = None
        self.delay = delay
        self.sampled_with: dict[int, Any] = {}
        self.fail_at, self.last = fail_at, last

    def load(self, weights: Any) -> None:
        self.weights = weights

    def produce(self, step: int) -> tuple[list[Any], dict[str, float], dict[str, Any]] | None:
        if self.last is not None and step > self.last:
            return None
        if step == self.fail_at:
            raise ValueError(f"environment down at step {step}")
        time.sleep(self.delay)
        self.sampled_with[step] = self.weights
        return [f"sample-{step}"], {"reward": float(step)}, {"position": step}


@pytest.mark.parametrize(
    ("max_age", "sampling_s", "training_s"), [(1, 0.01, 0.03), (2, 0.01, 0.03), (1, 0.03, 0.0)]
)
def test_step_s_is_sampled_by_the_weights_of_step_s_minus_1_minus_age(
    max_age: int, sampling_s: float, training_s: float
) -> None:
    """Whether sampling or training is the slower side, the weights used are the same (a sampler that
    took the newest published weights would differ when training is faster)."""
    sampler = FakeSampler(delay=sampling_s)
    pipeline = RolloutPipeline(
        sampler.produce, sampler.load, first_step=1, last_step=8, max_age=max_age, initial_version=0
    )
    try:
        pipeline.publish(0, "w0")
        for step in range(1, 9):
            batch = pipeline.take(step)
            assert batch is not None and batch.step == step and batch.samples == [f"sample-{step}"]
            assert batch.weights_version == max(0, step - 1 - max_age)
            assert batch.data_state == {"position": step}
            time.sleep(training_s)  # training; the producer runs ahead meanwhile, but never past its weights
            pipeline.publish(step, f"w{step}")
    finally:
        pipeline.close()
    assert sampler.sampled_with == {s: f"w{max(0, s - 1 - max_age)}" for s in range(1, 9)}


def test_a_resumed_run_starts_from_its_checkpoint_weights() -> None:
    sampler = FakeSampler()
    pipeline = RolloutPipeline(
        sampler.produce, sampler.load, first_step=6, last_step=8, max_age=1, initial_version=5
    )
    try:
        pipeline.publish(5, "w5")
        versions = []
        for step in range(6, 9):
            batch = pipeline.take(step)
            assert batch is not None
            versions.append(batch.weights_version)
            pipeline.publish(step, f"w{step}")
    finally:
        pipeline.close()
    assert versions == [5, 5, 6]


def test_validation_gets_the_generation_model_between_batches_and_with_its_own_weights() -> None:
    sampler = FakeSampler()
    pipeline = RolloutPipeline(sampler.produce, sampler.load, first_step=1, last_step=4, max_age=1)
    seen: list[Any] = []
    try:
        pipeline.publish(0, "w0")
        for step in (1, 2, 3, 4):
            assert pipeline.take(step) is not None
            pipeline.publish(step, f"w{step}")
            # Validate the trainer's newest weights (a version no batch samples with yet).
            seen.append(pipeline.exclusive(f"w{step}", step, lambda: sampler.weights))
    finally:
        pipeline.close()
    assert seen == ["w1", "w2", "w3", "w4"]
    # The batches made in between still used exactly their own weights, reloaded after validation.
    assert sampler.sampled_with == {1: "w0", 2: "w0", 3: "w1", 4: "w2"}


def train_steps(pipeline: RolloutPipeline, steps: int) -> None:
    """Take and publish like the trainer for steps 1..steps."""
    pipeline.publish(0, "w0")
    for step in range(1, steps + 1):
        assert pipeline.take(step) is not None
        pipeline.publish(step, f"w{step}")


def test_a_producer_error_is_raised_in_the_trainer() -> None:
    sampler = FakeSampler(fail_at=2)
    pipeline = RolloutPipeline(sampler.produce, sampler.load, first_step=1, last_step=5, max_age=1)
    try:
        train_steps(pipeline, 1)
        with pytest.raises(ValueError, match="environment down at step 2"):
            pipeline.take(2)
    finally:
        pipeline.close()


def test_running_out_of_prompts_ends_the_run() -> None:
    sampler = FakeSampler(last=2)
    pipeline = RolloutPipeline(sampler.produce, sampler.load, first_step=1, last_step=10, max_age=1)
    try:
        train_steps(pipeline, 2)
        assert pipeline.take(3) is None
    finally:
        pipeline.close()


def test_close_stops_a_producer_that_is_waiting_for_weights_or_queue_room() -> None:
    sampler = FakeSampler()
    waiting = RolloutPipeline(sampler.produce, sampler.load, first_step=1, last_step=10, max_age=1)
    waiting.close()  # nothing published: the producer waits for weights
    assert not waiting._thread.is_alive()
    full = RolloutPipeline(sampler.produce, sampler.load, first_step=1, last_step=10, max_age=1)
    full.publish(0, "w0")
    time.sleep(0.1)  # the producer fills the queue and waits for room
    full.close()
    assert not full._thread.is_alive()

"""The GRPO loop end to end on scored data (no generation): metrics, checkpoints, exact resume, seeds."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import MasterConfig, load_config
from gym_bridge.train.loop import train
from tests.train.helpers import TIMING_KEYS, save_random_tiny


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer Llama with the project's tokenizer, saved like a checkpoint."""
    return save_random_tiny(tmp_path_factory.mktemp("tiny_random"), seed=0)


def write_scored(path: Path, prompts: int = 12, per_prompt: int = 4, seed: int = 0) -> Path:
    """``{"input","output","reward"}`` rows (the ``transform grpo`` format), ``per_prompt`` per input."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(prompts):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            for _ in range(per_prompt):
                answer = a + b + rng.choice([0, 0, 1, -1])
                row = {
                    "input": f"What is {a} + {b}?",
                    "output": f"\\boxed{{{answer}}}",
                    "reward": float(answer == a + b),
                }
                f.write(json.dumps(row) + "\n")
    return path


def offline_config(tmp: Path, model_dir: Path, data: Path, *extra: str) -> MasterConfig:
    overrides = [
        "grpo.mode=offline",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=4",
        "grpo.max_num_epochs=10",
        "grpo.val_period=0",
        "grpo.seed=3",
        "loss_fn.reference_policy_kl_penalty=0.01",
        f"policy.model_name={model_dir}",
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=4",
        "policy.logprob_batch_size=8",
        "policy.max_total_sequence_length=64",
        "policy.generation.max_new_tokens=16",
        "policy.optimizer.kwargs.lr=1e-3",
        f"data.train.data_path={data}",
        f"checkpointing.checkpoint_dir={tmp / 'ckpt'}",
        "checkpointing.save_period=2",
        f"logger.log_dir={tmp / 'logs'}",
        *extra,
    ]
    return load_config(None, overrides)


def train_lines(log_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(log_dir) if r["split"] == "train"]


def without_timings(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_KEYS)}


def test_offline_run_writes_metrics_checkpoints_and_curves(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = write_scored(tmp_path / "scored.jsonl")
    cfg = offline_config(tmp_path, tiny_model_dir, data, "logger.tensorboard_enabled=true")
    result = train(cfg, show_progress=False)

    assert result.steps == 4
    lines = train_lines(tmp_path / "logs")
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    for record in lines:
        assert record["num_samples"] == 16  # 4 groups of 4 scored completions
        assert math.isfinite(record["loss"]) and record["grad_norm"] > 0
        assert 0.0 <= record["reward_mean"] <= 1.0
        assert record["optimizer_steps"] == 1
        # Offline: the sampler's log-probs are the step-start policy's, so no mismatch.
        assert record["gen_kl_error"] == pytest.approx(0.0, abs=1e-6)
    assert lines[0]["kl_penalty"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert lines[-1]["kl_penalty"] > 0  # and has moved away from it since
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_2", "step_4", "tokenizer"]  # tokenizer once per run
    weights = tmp_path / "ckpt" / "step_4" / "policy" / "weights"
    assert (weights / "model.safetensors").is_file()
    assert json.loads((tmp_path / "ckpt" / "step_4" / "training_info.json").read_text())["step"] == 4
    assert result.curves is not None and result.curves.stat().st_size > 1000
    assert list((tmp_path / "logs" / "tensorboard").glob("events.out.tfevents.*"))


def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = write_scored(tmp_path / "scored.jsonl")
    straight = tmp_path / "straight"
    train(offline_config(straight, tiny_model_dir, data), show_progress=False)

    resumed = tmp_path / "resumed"
    train(offline_config(resumed, tiny_model_dir, data, "grpo.max_num_steps=2"), show_progress=False)
    result = train(offline_config(resumed, tiny_model_dir, data), show_progress=False)

    assert result.resumed_from == 2
    expected = [without_timings(r) for r in train_lines(straight / "logs")]
    got = [without_timings(r) for r in train_lines(resumed / "logs")]
    assert [r["step"] for r in got] == [1, 2, 3, 4]  # the log reads as one run
    assert got == expected  # same losses, gradients, data order and KL as if never stopped


def test_same_seed_same_run_other_seed_other_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = write_scored(tmp_path / "scored.jsonl")
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        cfg = offline_config(
            tmp_path / name, tiny_model_dir, data, "grpo.max_num_steps=2", f"grpo.seed={seed}"
        )
        train(cfg, show_progress=False)
        runs[name] = [without_timings(r) for r in train_lines(tmp_path / name / "logs")]
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]  # another seed draws other prompts


def test_several_optimizer_steps_per_grpo_step_use_stored_prev_logprobs(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    data = write_scored(tmp_path / "scored.jsonl")
    cfg = offline_config(
        tmp_path,
        tiny_model_dir,
        data,
        "policy.train_global_batch_size=8",
        "grpo.max_num_steps=2",
        "checkpointing.enabled=false",
    )
    train(cfg, show_progress=False)
    lines = train_lines(tmp_path / "logs")
    assert all(r["optimizer_steps"] == 2 for r in lines)
    # The second optimizer step sees a moved policy against the step-start log-probs.
    assert any(
        abs(r["probs_ratio_max"] - 1.0) > 1e-6 or abs(r["probs_ratio_min"] - 1.0) > 1e-6 for r in lines
    )


def dynamic_sampling_config(
    tmp_path: Path, tiny_model_dir: Path, reward: Callable[[int, int], float], *extra: str
) -> MasterConfig:
    """3 steps of 2 groups over 8 offline questions x 4 answers, answer g of question q scored reward(q, g)."""
    rows = [
        {"input": f"question {q}", "output": f"answer {g}", "reward": reward(q, g)} for q in range(8) for g in range(4)
    ]
    data = tmp_path / "groups.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return offline_config(
        tmp_path,
        tiny_model_dir,
        data,
        "grpo.use_dynamic_sampling=true",
        "grpo.num_prompts_per_step=2",
        "policy.train_global_batch_size=8",
        "grpo.max_num_steps=3",
        *extra,
    )


def test_dynamic_sampling_drops_groups_without_reward_variance(tmp_path: Path, tiny_model_dir: Path) -> None:
    # even questions: all answers correct (no signal); odd: mixed
    cfg = dynamic_sampling_config(
        tmp_path, tiny_model_dir, lambda q, g: 1.0 if q % 2 == 0 else float(g % 2), "checkpointing.enabled=false"
    )
    train(cfg, show_progress=False)
    for record in train_lines(tmp_path / "logs"):
        assert record["num_samples"] == 8  # exactly 2 informative groups of 4
        assert record["reward_mean"] == pytest.approx(0.5)  # only the mixed groups remain
        assert record["generation_batches"] >= 1
        # the mixed groups among all generated (2 prompts a batch): at least the 2 kept
        assert record["informative_group_fraction"] * 2 * record["generation_batches"] >= 2
        assert 0.5 <= record["generated_reward_mean"] <= 1.0  # all-correct groups count among what was generated


def test_a_step_where_dynamic_sampling_keeps_no_group_still_counts(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Every group's rewards tie: each step is logged as skipped and the step's checkpoint (and with it
    the validation, in the same place) still happens, instead of the step vanishing."""
    cfg = dynamic_sampling_config(
        tmp_path,
        tiny_model_dir,
        lambda q, g: 1.0,
        "grpo.dynamic_sampling_max_gen_batches=2",
        "checkpointing.save_period=3",
    )
    result = train(cfg, show_progress=False)
    records = train_lines(tmp_path / "logs")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert record["no_learning_signal"] == 1.0 and record["num_samples"] == 0
        assert record["generation_batches"] == 2  # gave up after the configured number of batches
        assert record["generated_reward_mean"] == 1.0 and record["informative_group_fraction"] == 0.0
    assert result.steps == 3 and (tmp_path / "ckpt" / "step_3").is_dir()


def test_offline_rollout_records_with_token_ids_train_on_the_generated_tokens(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Rollout JSONL (NeMo Gym records carrying the policy server's token ids) trains as is."""
    rows = []
    for q in range(4):
        prompt_ids = [1, 294, 201, 300 + q, 2, 201, 1, 298, 201]
        for g in range(4):
            generated = [20 + g, 30, 2]
            item = {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "x"}],
                "prompt_token_ids": prompt_ids,
                "generation_token_ids": generated,
                "generation_log_probs": [-1.0, -2.0, -0.5],
            }
            rows.append(
                {
                    "responses_create_params": {"input": [{"role": "user", "content": f"q{q}"}]},
                    "response": {"output": [item]},
                    "reward": float(g == q % 4),
                }
            )
    data = tmp_path / "rollouts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = offline_config(
        tmp_path, tiny_model_dir, data, "grpo.max_num_steps=1", "checkpointing.enabled=false"
    )
    train(cfg, show_progress=False)
    (record,) = train_lines(tmp_path / "logs")
    assert record["gen_length_mean"] == 3  # exactly the generated tokens are in the loss
    assert record["sequence_length_mean"] == 12
    # The stored generation log-probs are used: a random model disagrees with them.
    assert record["gen_kl_error"] > 0.01


def test_grpo_raises_the_likelihood_of_rewarded_completions(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The point of it all: after a few steps, right answers gained log-probability over wrong ones."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_bridge.train.batches.rollouts import Sample, sequence_from_text
    from gym_bridge.train.batches.sequences import per_sample_logprobs

    data = write_scored(tmp_path / "scored.jsonl")
    cfg = offline_config(
        tmp_path, tiny_model_dir, data, "loss_fn.reference_policy_kl_penalty=0.0", "grpo.max_num_steps=6"
    )
    train(cfg, show_progress=False)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    samples = []
    for row in rows:
        ids, mask = sequence_from_text(tokenizer, [{"role": "user", "content": row["input"]}], row["output"])
        samples.append(Sample(group=0, token_ids=ids, loss_mask=mask, reward=row["reward"]))

    def completion_logprob_gap(model_dir: Path) -> float:
        """Mean log-prob of rewarded completions minus that of unrewarded ones."""
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        logprobs = per_sample_logprobs(cfg, model, samples, tokenizer.pad_token_id)
        totals: dict[float, list[float]] = {1.0: [], 0.0: []}
        for sample, lp in zip(samples, logprobs, strict=True):
            completion = torch.tensor(sample.loss_mask[1:], dtype=torch.float32)
            totals[sample.reward].append(float((lp * completion).sum()))
        return sum(totals[1.0]) / len(totals[1.0]) - sum(totals[0.0]) / len(totals[0.0])

    before = completion_logprob_gap(tiny_model_dir)
    after = completion_logprob_gap(tmp_path / "ckpt" / "step_6" / "policy" / "weights")
    assert after - before > 0.2, (before, after)  # measured: -0.28 -> +0.11

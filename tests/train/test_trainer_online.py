"""Online GRPO over loopback: the real embedded policy server, the real math server, the agent loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.loop import train
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_random_online"), seed=1)


@pytest.mark.timeout(300)
def test_online_steps_through_agent_loop_policy_server_and_math_server(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    parity_rows = write_say_prompts(tmp_path / "parity.jsonl", 8)
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=3",
            "grpo.val_period=2",
            "grpo.val_at_start=true",
            "grpo.max_val_samples=8",
            "grpo.val_batch_size=8",
            f"policy.model_name={tiny_model_dir}",
            "policy.train_micro_batch_size=8",
            "policy.logprob_batch_size=16",
            "data.use_multiple_dataloader=true",
            "data.num_prompts_per_dataloader=2",
            f"data.train=[{{data_path: {ROOT / 'recipes/data/arith_train.jsonl'}, env_name: math}}, "
            f"{{data_path: {parity_rows}, env_name: parity}}]",
            f"data.validation.data_path={ROOT / 'recipes/data/arith_val.jsonl'}",
            "data.validation.env_name=math",
            "env.math.server=math",
            f"env.parity.server={PARITY_SERVER}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            f"logger.log_dir={tmp_path / 'logs'}",
        ],
    )
    result = train(cfg, show_progress=False)

    records = read_metrics(tmp_path / "logs")
    steps = [r for r in records if r["split"] == "train"]
    validations = [r for r in records if r["split"] == "val"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["step"] for r in validations] == [0, 2]
    for record in steps:
        assert record["num_samples"] == 16 and record["rollout_failures"] == 0
        assert record["time_generation_s"] > 0 and record["time_reward_and_http_s"] > 0
        assert 0 < record["gen_length_mean"] <= 6
        # Training sequences are exactly the served tokens: the trainer's log-probs of them match the
        # policy server's. This also shows the server samples from the weights updated last step.
        assert record["gen_kl_error"] < 1e-4
        assert record["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
        # Both environments scored their own tasks in every step (two dataloaders, two prompts each).
        assert 0.0 <= record["reward_mean/math"] <= 1.0 and 0.0 <= record["reward_mean/parity"] <= 1.0
    assert any(r["grad_norm"] > 0 for r in steps)  # the parity env gives a learning signal
    for record in validations:
        assert record["num_samples"] == 8 and 0.0 <= record["accuracy"] <= 1.0
    assert result.validations[-1]["step"] == 2
    assert (tmp_path / "ckpt" / "step_3" / "training_info.json").is_file()
    assert result.curves is not None and result.curves.is_file()


def _async_run(tmp_path: Path, model_dir: Path, name: str, *, rollout_process: bool) -> list[dict]:
    parity_rows = write_say_prompts(tmp_path / "parity.jsonl", 16)
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=4",
            "grpo.val_period=2",
            "grpo.max_val_samples=4",
            "grpo.async_grpo.enabled=true",
            "grpo.async_grpo.max_trajectory_age_steps=1",
            f"grpo.async_grpo.rollout_process={str(rollout_process).lower()}",
            "loss_fn.use_importance_sampling_correction=true",
            f"policy.model_name={model_dir}",
            "policy.train_micro_batch_size=16",
            f"data.train.data_path={parity_rows}",
            "data.train.env_name=parity",
            f"data.validation.data_path={ROOT / 'recipes/data/arith_val.jsonl'}",
            "data.validation.env_name=math",
            "env.math.server=math",
            f"env.parity.server={PARITY_SERVER}",
            f"checkpointing.checkpoint_dir={tmp_path / name / 'ckpt'}",
            "checkpointing.save_period=2",
            f"logger.log_dir={tmp_path / name / 'logs'}",
            "logger.tensorboard_enabled=false",
        ],
    )
    train(cfg, show_progress=False)
    return read_metrics(tmp_path / name / "logs")


@pytest.mark.timeout(300)
def test_async_grpo_samples_with_weights_exactly_one_step_old_and_is_reproducible(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    first = _async_run(tmp_path, tiny_model_dir, "a", rollout_process=True)
    steps = [r for r in first if r["split"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # Step s trains on completions sampled with the weights after step s-2 (the initial ones at first).
    assert [r["trajectory_age_steps"] for r in steps] == [0.0, 1.0, 1.0, 1.0]
    # Step 1 is on-policy: the trainer's log-probs of the sampled tokens are the sampler's. Later steps
    # were sampled by an older policy, which the trainer sees as a generation/trainer mismatch.
    assert steps[0]["gen_kl_error"] < 1e-4
    assert all(r["gen_kl_error"] > 1e-4 for r in steps[1:])
    assert all(r["rollout_failures"] == 0 and r["num_samples"] == 16 for r in steps)
    # Validation (steps 2 and 4) runs on the trainer's weights, between the producer's batches.
    assert [r["step"] for r in first if r["split"] == "val"] == [2, 4]
    assert (tmp_path / "a" / "ckpt" / "step_4" / "training_info.json").is_file()
    # Which weights sample which step is fixed, so a second run with the same seed is the same run,
    # whether the rollouts run in a child process (the default) or in the trainer's.
    second = _async_run(tmp_path, tiny_model_dir, "b", rollout_process=False)
    keys = ("reward_mean", "gen_kl_error", "loss", "grad_norm")
    assert [r[k] for r in first if r["split"] == "train" for k in keys] == pytest.approx(
        [r[k] for r in second if r["split"] == "train" for k in keys], rel=1e-5, abs=1e-7
    )

"""A new advantage estimator and a new policy loss are one registered function each, chosen by name in
the config (``grpo.adv_estimator.name``, ``loss_fn.policy_loss``); unknown names are refused at load."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from gym_bridge.train.algorithm.advantages import AdvantageInputs, compute_advantages
from gym_bridge.train.algorithm.policy_losses import SurrogateTerms
from gym_bridge.train.config import ClippedPGLossConfig, ConfigError, GRPOConfig, load_config
from gym_bridge.train.loop import train
from gym_bridge.train.registry import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    register_adv_estimator,
    register_policy_loss,
)
from tests.train.helpers import offline_step_config, one_trainer_step, save_random_tiny, step_sample
from tests.train.test_trainer_offline import offline_config, train_lines, write_scored

TINY_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo_math_tiny.yaml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_variants"), seed=5, num_layers=1)


@pytest.fixture
def sign_estimator() -> Iterator[list[int]]:
    """Registers ``sign`` for the test; yields the batch sizes it was called with."""
    calls: list[int] = []

    @register_adv_estimator("sign")
    def sign(batch: AdvantageInputs, grpo: GRPOConfig) -> torch.Tensor:
        """A_i = sign(r_i - mean of the rewards of i's group)."""
        calls.append(len(batch.rewards))
        centred = compute_advantages(
            batch.rewards, batch.prompt_ids, valid_mask=batch.valid_mask, leave_one_out_baseline=False,
            normalize_rewards=False,
        )  # fmt: skip
        return torch.sign(centred)

    yield calls
    ADV_ESTIMATORS.unregister("sign")


@pytest.fixture
def reinforce_loss() -> Iterator[list[int]]:
    """Registers ``reinforce`` for the test; yields the micro-batch sizes it was called with."""
    calls: list[int] = []

    @register_policy_loss("reinforce")
    def reinforce(t: SurrogateTerms) -> torch.Tensor:
        """actor_t = -A_t logp_t: REINFORCE, no ratio and no clip."""
        calls.append(t.logprobs.shape[0])
        return -t.advantages * t.logprobs

    yield calls
    POLICY_LOSSES.unregister("reinforce")


def samples() -> list:
    """Two groups of four completions; rewards 1, 0, 0, 1 | 0, 0, 1, 0."""
    return [step_sample(i, float(i % 3 == 0)) for i in range(8)]


def test_a_registered_estimator_gives_the_step_its_advantages_by_name(
    model_dir: Path, sign_estimator: list[int]
) -> None:
    loss, advantages = one_trainer_step(model_dir, samples(), "grpo.adv_estimator.name=sign")
    # group 0's mean is 0.5, group 1's 0.25: the signs of reward - mean
    assert advantages.tolist() == [1.0, -1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0]
    assert sign_estimator == [8]
    default_loss, default_advantages = one_trainer_step(model_dir, samples())
    assert not torch.equal(advantages, default_advantages) and loss != pytest.approx(default_loss, rel=1e-4)


def test_a_registered_policy_loss_is_the_step_loss_by_name(model_dir: Path, reinforce_loss: list[int]) -> None:
    from gym_bridge.train.batches.sequences import per_sample_logprobs
    from gym_bridge.train.setup import build_learner

    loss, advantages = one_trainer_step(model_dir, samples(), "loss_fn.policy_loss=reinforce")
    assert reinforce_loss == [8]  # one micro-batch of the 8 samples
    # The step's loss is -sum_i A_i sum_t logp_it over the 28 generated tokens, the model's log-probs
    # before the step (REINFORCE reads no ratio, so the helper's shifted pi_old does not enter).
    cfg = offline_step_config(model_dir)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    logprobs = per_sample_logprobs(cfg, learner.model, samples(), learner.pad_token_id)
    generated = [torch.tensor(s.loss_mask[1:], dtype=torch.float32) for s in samples()]
    total = sum(-a * (lp * m).sum() for a, lp, m in zip(advantages, logprobs, generated, strict=True))
    assert loss == pytest.approx(float(total) / 28, rel=1e-5)
    assert loss != pytest.approx(one_trainer_step(model_dir, samples())[0], rel=1e-4)  # ppo's differs


def test_a_two_step_offline_run_trains_with_both_by_name(
    tmp_path: Path, model_dir: Path, sign_estimator: list[int], reinforce_loss: list[int]
) -> None:
    data = write_scored(tmp_path / "scored.jsonl")
    cfg = offline_config(
        tmp_path, model_dir, data, "grpo.max_num_steps=2", "checkpointing.enabled=false",
        "grpo.adv_estimator.name=sign", "loss_fn.policy_loss=reinforce",
    )  # fmt: skip
    assert train(cfg, show_progress=False).steps == 2
    lines = train_lines(tmp_path / "logs")
    assert [r["step"] for r in lines] == [1, 2] and all(r["grad_norm"] > 0 for r in lines)
    assert sign_estimator == [16, 16]  # each step's 4 groups of 4
    assert reinforce_loss == [4] * 8  # 16 samples in micro-batches of 4, each step


def test_unknown_names_are_refused_at_load_naming_the_key_and_the_registered_names(
    sign_estimator: list[int],
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["grpo.adv_estimator.name=gae", "loss_fn.policy_loss=vanilla"])
    assert err.value.problems == [
        "config key 'grpo.adv_estimator.name' expects a registered advantage estimator "
        "('gdpo', 'grpo', 'reinforce_plus_plus', 'sign'), got 'gae'",
        "config key 'loss_fn.policy_loss' expects a registered policy loss ('cispo', 'gspo', 'ppo'), got 'vanilla'",
    ]


def test_names_and_their_traits_are_checked_without_loading_torch() -> None:
    # the registry lists the built-ins by module:function, so a config loads before anything heavy
    code = (
        "import sys\n"
        "from gym_bridge.train.config import load_config\n"
        f"cfg = load_config({str(TINY_RECIPE)!r}, ['grpo.adv_estimator.name=gdpo', 'loss_fn.policy_loss=gspo',\n"
        "    'loss_fn.token_level_loss=false', 'loss_fn.ratio_clip_c=3'])\n"
        "assert cfg.grpo.adv_estimator.takes_components and cfg.loss_fn.sequence_level_importance_ratios\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_policy_loss_names_and_nemo_rl_keys_agree() -> None:
    gspo = ClippedPGLossConfig(policy_loss="gspo")
    assert gspo.sequence_level_importance_ratios is True and gspo.token_level_loss is False
    assert ClippedPGLossConfig(use_cispo=True).policy_loss_name == "cispo"
    assert ClippedPGLossConfig().policy_loss_name == "ppo"
    with pytest.raises(ValidationError, match="loss_fn.use_cispo=true contradicts loss_fn.policy_loss='ppo'"):
        ClippedPGLossConfig(policy_loss="ppo", use_cispo=True)
    with pytest.raises(ValidationError, match="loss_fn.ratio_clip_c .* does not apply to loss_fn.policy_loss='cispo'"):
        ClippedPGLossConfig(policy_loss="cispo", ratio_clip_c=3.0)


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="grpo.adv_estimator.name 'grpo' is registered already"):
        register_adv_estimator("grpo")(lambda batch, grpo: batch.rewards)
    with pytest.raises(TypeError, match="unknown traits"):
        register_policy_loss("mine", sequence_levels=True)

"""The rollout process: failures in the child reach the trainer as errors that say what broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_bridge.train.config import load_config
from gym_bridge.train.samplers.rollout_worker import ProcessSampler, RolloutWorkerError
from tests.train.helpers import save_random_tiny


@pytest.mark.timeout(120)
def test_an_environment_that_cannot_start_fails_the_worker_with_its_reason(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = save_random_tiny(tmp_path / "model", num_layers=1)
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir),
    )
    cfg = load_config(
        None,
        [
            f"policy.model_name={model_dir}",
            "env.broken.server=no_such_package.envs:Broken",
            f"data.train.data_path={Path(__file__).resolve().parents[2] / 'recipes/data/arith_train.jsonl'}",
            "data.train.env_name=broken",
        ],
    )
    with pytest.raises(
        RolloutWorkerError, match="environment 'no_such_package.envs:Broken' is not available"
    ):
        ProcessSampler(cfg, tokenizer, model.state_dict())

"""The rollout process: failures in the child reach the trainer as errors that say what broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_bridge.train.config import load_config
from gym_bridge.train.rollout_worker import RolloutWorker, RolloutWorkerError


@pytest.mark.timeout(120)
def test_an_environment_that_cannot_start_fails_the_worker_with_its_reason(tmp_path: Path) -> None:
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = new_tiny_model(
        tokenizer, TinyRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    )
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    cfg = load_config(
        None,
        [
            f"policy.model_name={tmp_path / 'model'}",
            "env.broken.server=no_such_package.envs:Broken",
            f"data.train.data_path={Path(__file__).resolve().parents[2] / 'recipes/data/arith_train.jsonl'}",
            "data.train.env_name=broken",
        ],
    )
    with pytest.raises(
        RolloutWorkerError, match="environment 'no_such_package.envs:Broken' is not available"
    ):
        RolloutWorker(cfg, tokenizer, model.state_dict())

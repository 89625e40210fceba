"""The vLLM generation backend from the trainer: built when asked for, a plain error without vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.train.helpers import save_random_tiny

ROOT = Path(__file__).resolve().parents[2]


def test_train_with_the_vllm_backend_and_no_vllm_is_a_plain_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    model_dir = save_random_tiny(tmp_path / "model")
    monkeypatch.chdir(ROOT)  # the recipe's data paths are relative to the repository
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on this CPU machine, whether or not it is installed
    args = ["train", "--config", "recipes/grpo_math_tiny.yaml", "--quiet"]
    args += [
        "policy.generation.backend=vllm",
        "cluster.gpus_per_node=1",
        f"policy.model_name={model_dir}",
        f"logger.log_dir={tmp_path / 'logs'}",
        "checkpointing.enabled=false",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "gym-bridge[vllm]" in result.output and "CUDA" in result.output
    assert "Traceback" not in result.output

"""``recipes/grpo_multi_turn_tiny.yaml``: it loads, its validation conversations are held out, and two
steps run through the CLI with the scripted user and the math_chat server over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.data.arith_conversations import TRAIN_FILE, VAL_FILE, generate
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "grpo_multi_turn_tiny.yaml"
DATA = ROOT / "recipes" / "data"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _conversation(row: dict[str, Any]) -> tuple[str, str]:
    """(opening, the user's correction): what makes a conversation."""
    return row["responses_create_params"]["input"][0]["content"], row["user_script"]["reveal"][0]["say"]


def test_recipe_loads_with_its_conversation_data_and_env() -> None:
    cfg = load_config(RECIPE, [])
    assert cfg.policy.model_name == "tiny"
    (train,), (val,) = cfg.data.resolved("train"), cfg.data.resolved("validation")
    assert (train.data_path, val.data_path) == (str(DATA / TRAIN_FILE), str(DATA / VAL_FILE))
    assert cfg.env[train.env_name].server == "resources_servers.math_chat.app:MathChatServer"
    assert cfg.grpo.max_rollout_turns == 2  # the first answer and the answer to the correction
    assert cfg.grpo.reward_weights == {"correct": 1.0, "near": 1.0}
    assert cfg.grpo.max_val_samples == len(_rows(DATA / VAL_FILE))  # the whole held-out file


def test_committed_files_are_the_generators_and_validation_is_held_out() -> None:
    train, val = _rows(DATA / TRAIN_FILE), _rows(DATA / VAL_FILE)
    assert (train, val) == generate()  # regenerated with: python -m gym_bridge.data.arith_conversations
    assert len(train) == 1000 and len(val) == 100
    assert len({_conversation(r) for r in train}) == len(train) and len({_conversation(r) for r in val}) == len(val)
    assert not {_conversation(r) for r in val} & {_conversation(r) for r in train}
    # Stricter: no validation conversation's final question ends any training conversation.
    assert not {r["question"] for r in val} & {r["question"] for r in train}
    for row in train + val:
        opening, correction = _conversation(row)
        assert row["question"] in correction and row["question"] not in opening
        assert row["user_script"]["reveal"][0]["when"] == ["boxed"] and row["extraction"] == "boxed"
    assert generate(seed=1) != (train, val)  # the seed matters


@pytest.fixture(scope="module")
def boxing_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small tiny-shaped model warm-started for a few seconds: it answers ``\\boxed{N}``, so the scripted
    user hears a box and corrects the question (a random model never writes one)."""
    from gym_bridge.models.tiny import TinyRecipe, build_tiny_model

    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, clean_steps=120,
                        near_miss_steps=0, warmup_steps=10, learning_rate=3e-3)  # fmt: skip
    return build_tiny_model(tmp_path_factory.mktemp("boxing"), recipe=recipe, show_progress=False, evaluate=False)


@pytest.mark.timeout(240)
def test_two_recipe_steps_run_the_conversation_over_http(tmp_path: Path, boxing_model: Path) -> None:
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    args = [
        "train", "--config", str(RECIPE), f"policy.model_name={boxing_model}",
        "grpo.max_num_steps=2", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8", "policy.generation_batch_size=8",
        "grpo.val_period=0", "grpo.val_at_start=false", "grpo.max_val_samples=4", "grpo.val_batch_size=4",
        "checkpointing.enabled=false", f"logger.log_dir={tmp_path / 'logs'}",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    metrics = read_metrics(tmp_path / "logs")
    steps = [m for m in metrics if m["split"] == "train"]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["rollout_failures"] == 0 and m["num_samples"] == 8 for m in steps)
    assert all("reward_component/near_mean" in m for m in steps)
    (val,) = [m for m in metrics if m["split"] == "val"]
    assert val["num_samples"] == 4

    records = [r for f in sorted((tmp_path / "logs" / "rollouts").glob("step_*.jsonl")) for r in _rows(f)]
    assert len(records) == 16
    corrected = 0
    for record in records:
        output = record["response"]["output"]
        users = [item for item in output if item.get("role") == "user"]
        replies = [item for item in output if item.get("role") == "assistant"]
        first = replies[0]["content"][0]["text"]
        if users:  # the scripted user heard a box and corrected the question; the second reply was scored
            corrected += 1
            assert "boxed" in first and [u["content"] for u in users] == [record["user_script"]["reveal"][0]["say"]]
            assert len(replies) == 2 and record["scored_after_user_turns"] == 1
        else:  # no box, or a first reply cut off: the conversation ended uncorrected and scores 0
            assert len(replies) == 1 and record["reward"] == 0.0 and record["failure_kind"] == "too_few_user_turns"
        assert set(record["reward_components"]) == {"correct", "near"}
        assert record["reward"] == record["reward_components"]["correct"]
    assert corrected >= 8, f"only {corrected} of 16 first replies held a box"

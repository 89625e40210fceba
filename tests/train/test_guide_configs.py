"""The config blocks users copy first, run as their guides print them (tests/data/seeds/).

NeMo Gym's GRPO guide uses a short ``data`` / ``model`` / ``training`` layout that the loader
translates (gym_bridge/train/config/gym_guide_layout.py); NeMo RL's GRPO guide uses ``processor``,
``subset`` and ``split`` in its data block. Both run on a random tiny model here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import ConfigError, load_config
from gym_bridge.train.loop import train
from gym_bridge.train.samplers.data import DataError, load_prompts
from tests.train.helpers import save_random_tiny

SEEDS = Path(__file__).resolve().parents[1] / "data" / "seeds"
ROLLOUTS = Path(__file__).resolve().parents[1] / "data" / "nemo_gym" / "math_rollouts.example.jsonl"
TINY_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo_math_tiny.yaml"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_random"), seed=0)


def _guide_run_dir(tmp_path: Path) -> Path:
    """NeMo Gym's guide config beside the ``grpo_train.jsonl`` it names, made by ``transform grpo``."""
    shutil.copy(SEEDS / "nemo_gym_guide_grpo.yaml", tmp_path / "config.yaml")
    made = CliRunner().invoke(
        app, ["transform", "grpo", str(ROLLOUTS), "-o", str(tmp_path / "grpo_train.jsonl")]
    )
    assert made.exit_code == 0, made.output
    return tmp_path / "config.yaml"


def test_nemo_gym_guide_config_is_translated_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = load_config(_guide_run_dir(tmp_path))

    assert cfg.policy.model_name == "Qwen/Qwen2.5-1.5B-Instruct"
    assert cfg.grpo.mode == "offline"  # the records carry rewards
    assert cfg.grpo.max_num_epochs == 3
    assert (cfg.policy.train_micro_batch_size, cfg.policy.train_global_batch_size) == (4, 512)
    [dataset] = cfg.data.resolved("train")
    assert dataset.data_path == str(tmp_path / "grpo_train.jsonl")
    assert (dataset.input_key, dataset.output_key, dataset.reward_key) == ("input", "output", "reward")
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1  # one line saying what the layout became
    assert "model.pretrained_model -> policy.model_name" in note[0]
    assert "training.num_epochs -> grpo.max_num_epochs" in note[0]


def test_nemo_gym_guide_config_trains_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _guide_run_dir(tmp_path)
    # its own output directories: the guide's default (results/grpo under the working directory) held an
    # earlier test run's checkpoint, which this run resumed with another model without a word until resumes
    # checked policy.model_name
    outputs = [f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}", f"logger.log_dir={tmp_path / 'logs'}"]
    cfg = load_config(config, [f"model.pretrained_model={tiny_model_dir}", *outputs])
    result = train(cfg, show_progress=False)

    assert result.steps >= 1
    lines = [r for r in read_metrics(cfg.logger.log_dir) if r["split"] == "train"]
    rewards = [json.loads(line)["reward"] for line in (tmp_path / "grpo_train.jsonl").read_text().splitlines()]
    assert lines and lines[0]["num_samples"] > 0
    assert min(rewards) <= lines[0]["reward_mean"] <= max(rewards)  # trained on the file's scored records


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["training.algorithm=dpo"], "runs GRPO only"),
        (["training.learning_rate=1e-5"], "training.learning_rate"),
        (["policy.model_name=tiny"], "model.pretrained_model and policy.model_name"),
        (["model.revision=main"], "only model.pretrained_model"),
        (["data.train.0.data_path=x.jsonl"], "keep one"),
    ],
)
def test_guide_layout_conflicts_and_unknown_keys_are_refused(
    tmp_path: Path, overrides: list[str], fragment: str
) -> None:
    config = _guide_run_dir(tmp_path)
    if overrides[0].startswith("data.train.0"):
        overrides = ["+data.train=[{}]", *overrides]
    with pytest.raises(ConfigError, match=fragment):
        load_config(config, overrides)


def _nemo_rl_guide_recipe(tmp_path: Path) -> Path:
    """NeMo RL's guide data block, inheriting everything else from the tiny recipe (its ``...``)."""
    shutil.copy(SEEDS / "nemo_rl_guide_data.yaml", tmp_path / "nemo_rl_guide_data.yaml")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"defaults: [{TINY_RECIPE}, nemo_rl_guide_data.yaml]\n")
    with open(tmp_path / "train.jsonl", "w") as f:  # input_key: question (the train entry's own)
        for a in range(10):
            f.write(
                json.dumps(
                    {"question": f"What is {a} + 1? Put the answer in \\boxed{{}}.", "output": str(a + 1)}
                )
                + "\n"
            )
    with open(tmp_path / "val.jsonl", "w") as f:  # the default input_key: input
        for a in range(4):
            f.write(
                json.dumps(
                    {"input": f"What is {a} + 2? Put the answer in \\boxed{{}}.", "output": str(a + 2)}
                )
                + "\n"
            )
    return recipe


def _data_overrides(tmp_path: Path) -> list[str]:
    return [
        f"data.train.data_path={tmp_path / 'train.jsonl'}",
        f"data.validation.data_path={tmp_path / 'val.jsonl'}",
    ]


def test_nemo_rl_guide_data_block_makes_the_prompts_it_describes(tmp_path: Path) -> None:
    cfg = load_config(_nemo_rl_guide_recipe(tmp_path), _data_overrides(tmp_path))
    [train_set] = cfg.data.resolved("train")
    assert (train_set.processor, train_set.subset, train_set.split) == (
        "math_hf_data_processor",
        None,
        "train",
    )

    prompts, held_out = load_prompts(cfg.data)
    assert len(prompts) + len(held_out) == 10 and len(held_out) == 1  # split_validation_size 0.05 of 10
    first = prompts[0].row
    assert first["responses_create_params"]["input"] == [
        {"role": "user", "content": "What is 0 + 1? Put the answer in \\boxed{}."}
    ]
    assert first["expected_answer"] == "1"
    validation, _ = load_prompts(cfg.data, "validation")
    assert [p.row["expected_answer"] for p in validation] == ["2", "3", "4", "5"]


def test_nemo_rl_guide_data_block_trains_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    overrides = [
        *_data_overrides(tmp_path),
        f"policy.model_name={tiny_model_dir}",
        "grpo.max_num_steps=1",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "grpo.val_at_end=false",
        "grpo.async_grpo.enabled=false",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        f"logger.log_dir={tmp_path / 'logs'}",
    ]
    cfg = load_config(_nemo_rl_guide_recipe(tmp_path), overrides)
    assert train(cfg, show_progress=False).steps == 1
    [line] = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert line["num_samples"] == 4


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("data.default.processor=sft_processor", "does not make GRPO prompts"),
        ("data.default.processor=my_processor", "unknown processor 'my_processor'"),
    ],
)
def test_processors_that_make_no_grpo_prompt_are_refused(
    tmp_path: Path, override: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(_nemo_rl_guide_recipe(tmp_path), [*_data_overrides(tmp_path), override])


def test_hub_only_keys_on_a_local_file_are_refused(tmp_path: Path) -> None:
    cfg = load_config(_nemo_rl_guide_recipe(tmp_path), [*_data_overrides(tmp_path), "data.train.split=test"])
    with pytest.raises(DataError, match="split 'test'.*local file"):
        load_prompts(cfg.data)


def test_nemo_gym_processor_wants_task_rows(tmp_path: Path) -> None:
    cfg = load_config(
        _nemo_rl_guide_recipe(tmp_path),
        [*_data_overrides(tmp_path), "data.default.processor=nemo_gym_data_processor"],
    )
    with pytest.raises(DataError, match=r"train\.jsonl:1: processor 'nemo_gym_data_processor'"):
        load_prompts(cfg.data)

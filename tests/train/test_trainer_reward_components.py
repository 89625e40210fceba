"""Online training on a multi-reward env over real HTTP (agent loop, policy server, resources server):
GDPO from the env's ``reward_components``, and grpo.reward_weights against an env at a url; each step's
line and metrics.jsonl carry ``reward_component/<name>_mean``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from gym_bridge.train.bookkeeping.logging import format_line, read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.loop import train
from tests.multi_reward_env import MULTI_REWARD_SERVER, MultiRewardEnv
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts

COMPONENTS = ("correct", "even_length", "format")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_multi_reward"), seed=3)


@pytest.fixture(scope="module")
def env_url() -> Iterator[str]:
    with start_in_thread(MultiRewardEnv().build_app()) as running:
        yield running.url


def run(tmp_path: Path, model_dir: Path, *overrides: str) -> list[dict]:
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=2",
            "grpo.val_period=0",
            f"policy.model_name={model_dir}",
            "policy.train_micro_batch_size=16",
            f"data.train.data_path={write_say_prompts(tmp_path / 'say.jsonl', 8)}",
            "data.train.env_name=multi",
            "checkpointing.enabled=false",
            f"logger.log_dir={tmp_path / 'logs'}",
            "logger.tensorboard_enabled=false",
            *overrides,
        ],
    )
    train(cfg, show_progress=False)
    return [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]


def check_component_metrics(steps: list[dict]) -> None:
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        means = [record[f"reward_component/{name}_mean"] for name in COMPONENTS]
        assert all(0.0 <= m <= 1.0 for m in means)
        assert record["reward_mean"] == pytest.approx(sum(means))  # the env's reward is their sum
        line = format_line(record["step"], record)
        assert f"even_length {record['reward_component/even_length_mean']:.3f}" in line
    assert any(r["grad_norm"] > 0 for r in steps)  # even_length varies: a learning signal


@pytest.mark.timeout(300)
def test_gdpo_trains_on_the_components_of_a_built_in_server(tmp_path: Path, tiny_model_dir: Path) -> None:
    steps = run(
        tmp_path,
        tiny_model_dir,
        f"env.multi.server={MULTI_REWARD_SERVER}",
        "grpo.adv_estimator.name=gdpo",
        "grpo.use_leave_one_out_baseline=false",
        "grpo.use_dynamic_sampling=true",
    )
    check_component_metrics(steps)
    for record in steps:  # GDPO's batch normalisation: mean 0, std 1 over the step's samples
        assert record["advantage_mean"] == pytest.approx(0.0, abs=1e-5)
        assert record["advantage_std"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.timeout(300)
def test_reward_weights_train_against_an_env_at_a_url(tmp_path: Path, tiny_model_dir: Path, env_url: str) -> None:
    steps = run(
        tmp_path,
        tiny_model_dir,
        f"env.multi.url={env_url}",
        "grpo.reward_weights={correct: 1.0, format: 0.5, even_length: 0.25}",
    )
    check_component_metrics(steps)

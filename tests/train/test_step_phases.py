"""The step line shows where a step's wall goes: each phase's share (generation, verification and HTTP,
log-probs, update), generation tokens/s, and how many batches dynamic sampling drew behind ``failed k/n``.
Checked on the rows of real online runs (agent loop, policy server, a resources server over HTTP)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from gym_bridge.train.bookkeeping.logging import format_line, phase_shares, read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.loop import train
from tests.multi_reward_env import MultiRewardEnv
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_phases"), seed=3)


@pytest.fixture(scope="module")
def env_url() -> Iterator[str]:
    with start_in_thread(MultiRewardEnv().build_app()) as running:
        yield running.url


def run(tmp_path: Path, model_dir: Path, url: str, *overrides: str) -> list[dict]:
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=3",
            "grpo.val_period=0",
            f"policy.model_name={model_dir}",
            "policy.train_micro_batch_size=16",
            f"data.train.data_path={write_say_prompts(tmp_path / 'say.jsonl', 8)}",
            "data.train.env_name=multi",
            f"env.multi.url={url}",
            "checkpointing.enabled=false",
            f"logger.log_dir={tmp_path / 'logs'}",
            "logger.tensorboard_enabled=false",
            *overrides,
        ],
    )
    train(cfg, show_progress=False)
    return [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]


def percent(line: str, label: str) -> int:
    found = re.search(rf"\b{label} (\d+)%", line)
    assert found, (label, line)
    return int(found.group(1))


@pytest.mark.timeout(300)
def test_a_dynamic_sampling_step_line_shows_its_phases_and_batches(
    tmp_path: Path, tiny_model_dir: Path, env_url: str
) -> None:
    # Two completions a prompt tie often on the env's components: dynamic sampling draws more batches.
    steps = run(
        tmp_path,
        tiny_model_dir,
        env_url,
        "grpo.use_dynamic_sampling=true",
        "grpo.num_generations_per_prompt=2",
        "grpo.dynamic_sampling_max_gen_batches=4",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8",
        "policy.generation_batch_size=8",
    )
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert any(r["generation_batches"] > 1 for r in steps), [r["generation_batches"] for r in steps]
    for r in steps:
        timed = {
            "generation": r["time_generation_s"],
            "reward_and_http": r["time_reward_and_http_s"],
            "logprobs": r.get("time_logprobs_s", 0.0),
            "update": r["time_training_s"],
        }
        for name, seconds in timed.items():  # metrics.jsonl: each phase's fraction of the step's wall
            assert r[f"step_share/{name}"] == pytest.approx(seconds / r["time_step_s"]) or (
                name == "logprobs" and "time_logprobs_s" not in r
            )
        assert sum(v for k, v in r.items() if k.startswith("step_share/")) == pytest.approx(1.0)
        assert 0.0 <= r["step_share/other"] < 0.5  # the phases time most of the step
        line = format_line(r["step"], r)
        head, _, components = line.partition("  correct ")  # the env's reward components come last
        assert components and "failed " in head and "s/step " in head and "failed" not in components, line
        assert "timed_out" not in line  # none was
        assert percent(line, "gen") == round(100 * r["step_share/generation"])
        assert percent(line, "rew") == round(100 * r["step_share/reward_and_http"])
        assert percent(line, "upd") == round(100 * r["step_share/update"])
        # tokens/s is generation's (generated tokens over generation time), labelled so
        assert f"gen tok/s {r['generation_tokens_per_s']:.0f}" in line and " tok/s" not in line.replace("gen tok/s", "")
        assert r["generation_tokens_per_s"] > r["tokens_per_s"]
        # n of failed k/n counts every batch drawn, and the line says how many there were
        batches = r["generation_batches"]
        assert r["rollouts_requested"] == 4 * 2 * batches
        drawn = f" ({batches:.0f} batches)" if batches > 1 else ""
        assert f"failed 0/{r['rollouts_requested']:.0f}{drawn}  " in line + "  "


@pytest.mark.timeout(300)
def test_an_async_step_line_shows_the_wait_for_rollouts_not_their_generation(
    tmp_path: Path, tiny_model_dir: Path, env_url: str
) -> None:
    """In async GRPO the rollouts of step n+1 are made while step n trains: the trainer's wall is the
    wait for them, the log-probs and the update; generation's time is not a share of it."""
    steps = run(tmp_path, tiny_model_dir, env_url, "grpo.async_grpo.enabled=true")
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert "step_share/generation" not in r
        assert r["step_share/waiting_for_rollouts"] == pytest.approx(r["time_waiting_for_rollouts_s"] / r["time_step_s"])
        line = format_line(r["step"], r)
        waited = r["step_share/waiting_for_rollouts"]
        if r["step"] == 1 or waited >= 0.005:  # step 1 waits for the first batch; later ones may find it made
            assert percent(line, "wait") == round(100 * waited)
        else:  # phases under 0.5% are left off the line
            assert not re.search(r"\bwait \d+%", line), line
        assert percent(line, "upd") == round(100 * r["step_share/update"])
        assert not re.search(r"\bgen \d+%", line)
        assert phase_shares(r)["update"] == pytest.approx(r["step_share/update"])


def test_an_offline_step_has_no_generation_so_its_tokens_per_second_says_per_step() -> None:
    line = format_line(3, {"reward_mean": 0.5, "time_step_s": 2.0, "time_training_s": 1.5, "tokens_per_s": 40.0})
    assert "upd 75%" in line and "etc 25%" in line and "step tok/s 40" in line and "gen" not in line

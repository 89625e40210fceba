"""``grpo.val_ranked_data_path``: the trainer's validation logs group ranking metrics, and they are the
figures ``gym-bridge eval ranked`` reports for the same model (the checkpoint of that step) and groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import ConfigError
from gym_bridge.train.loop import train
from tests.train.helpers import save_random_tiny
from tests.train.test_trainer_offline import offline_config, write_scored

# Groups of 3-4 members with distinct and tied ranks, so the metrics of a random model are not trivial.
GROUPS = [
    {"prompt": f"What is {a} + {b}?", "group": [
        {"response": f"\\boxed{{{a + b}}}", "rank": 1},
        {"response": f"\\boxed{{{a + b + 1}}}", "rank": 2},
        {"response": f"The answer is {a + b - 1}", "rank": 2},
        {"response": "I do not know", "rank": 3}][: 3 + (a % 2)]}
    for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (4, 5)]
]  # fmt: skip
KEYS = ("pairwise_accuracy", "top1_accuracy", "kendall_tau", "rankable_groups", "pairs")


def eval_ranked(ranked: Path, model: str, out: Path) -> dict:
    result = CliRunner().invoke(app, ["eval", "ranked", str(ranked), "--model", model, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_validation_logs_what_eval_ranked_reports_for_the_same_weights(tmp_path: Path) -> None:
    model_dir = save_random_tiny(tmp_path / "model", seed=4)
    ranked = tmp_path / "ranked.jsonl"
    ranked.write_text("".join(json.dumps(g) + "\n" for g in GROUPS))
    cfg = offline_config(
        tmp_path, model_dir, write_scored(tmp_path / "scored.jsonl"),
        "grpo.max_num_steps=2", "grpo.val_at_start=true", "grpo.val_at_end=true",
        f"grpo.val_ranked_data_path={ranked}", "policy.optimizer.kwargs.lr=3e-2",
    )  # fmt: skip
    result = train(cfg, show_progress=False)

    val = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "val"]
    assert [r["step"] for r in val] == [0, 2]  # no validation prompts: ranked groups alone are validated
    assert [v["step"] for v in result.validations] == [0, 2]
    for record, model in ((val[0], str(model_dir)), (val[1], str(tmp_path / "ckpt" / "step_2"))):
        report = eval_ranked(ranked, model, tmp_path / f"report_{record['step']}.json")
        assert report["pairs"] == 2 * 2 + 4 * 5  # one pair tied in rank per group: 2 of 3, 5 of 6 counted
        for key in KEYS:
            assert record[f"ranked/{key}"] == pytest.approx(report[key], abs=1e-9), (record["step"], key)
    assert 0.0 < val[0]["ranked/pairwise_accuracy"] < 1.0  # a random model: a figure that could differ


def test_a_bad_ranked_file_is_refused_naming_the_key_and_line(tmp_path: Path) -> None:
    ranked = tmp_path / "ranked.jsonl"
    ranked.write_text(json.dumps(GROUPS[0]) + '\n{"prompt": "p", "group": [{"response": "r"}]}\n')
    cfg = offline_config(
        tmp_path, tmp_path / "no-model", tmp_path / "none.jsonl", f"grpo.val_ranked_data_path={ranked}"
    )
    with pytest.raises(ConfigError) as err:  # refused before the (missing) model loads
        train(cfg, show_progress=False)
    assert "grpo.val_ranked_data_path" in str(err.value) and f"{ranked}:2" in str(err.value)

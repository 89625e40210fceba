"""``gym-bridge eval ranked`` over its real interface: the tiny model, a trainer checkpoint (whole weights
and LoRA), the JSON report and per-group output, and bad input as a CLI error naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.evaluation.scoring import ModelScorer
from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager
from tests.train.helpers import save_random_tiny

runner = CliRunner()
BOX = "Put the answer in \\boxed{}."
# Single-digit sums the tiny model was warm-started on: the right answer ranks first, near misses next.
GROUPS = [
    {"prompt": f"What is 2 + 3? {BOX}", "group": [
        {"response": "\\boxed{5}", "rank": 1}, {"response": "\\boxed{6}", "rank": 2},
        {"response": "\\boxed{9}", "rank": 3}]},
    {"prompt": [{"role": "user", "content": f"What is 4 + 4? {BOX}"}], "group": [
        {"response": "\\boxed{8}", "rank": 1}, {"response": "\\boxed{7}", "rank": 2},
        {"response": "", "rank": 2}]},
    {"prompt": f"What is 1 + 1? {BOX}", "group": [
        {"response": "\\boxed{2}", "rank": 1}, {"response": "\\boxed{2}", "rank": 1}]},
]  # fmt: skip


def write_groups(path: Path, groups: list[dict] = GROUPS) -> Path:
    path.write_text("".join(json.dumps(g) + "\n" for g in groups))
    return path


def run_eval(ranked: Path, model: str, out_dir: Path) -> tuple[dict, list[dict]]:
    report, groups = out_dir / "report.json", out_dir / "groups.jsonl"
    result = runner.invoke(
        app, ["eval", "ranked", str(ranked), "--model", model, "-o", str(report), "--groups-out", str(groups)]
    )
    assert result.exit_code == 0, result.output
    assert "pairwise accuracy" in result.output
    return json.loads(report.read_text()), [json.loads(line) for line in groups.read_text().splitlines()]


def test_tiny_model_writes_the_report_and_per_group_lines(tmp_path: Path):
    report, groups = run_eval(write_groups(tmp_path / "ranked.jsonl"), "tiny", tmp_path)
    # Group 3 has one rank only: counted as a group, not ranked. Pairs: 3 (group 1) + 2 (group 2).
    assert (report["groups"], report["rankable_groups"], report["pairs"]) == (3, 2, 5)
    assert report["model"] == "tiny" and report["truncated_sequences"] == 0
    assert report["pairwise_accuracy"] == 1.0  # the warm-started model knows these sums
    assert report["top1_accuracy"] == 1.0
    assert [g["line"] for g in groups] == [1, 2, 3]
    assert groups[2]["pairwise_accuracy"] is None and groups[2]["kendall_tau"] is None
    member = groups[0]["group"][0]
    assert set(member) == {"response", "rank", "score", "model_rank"}
    assert member["score"] < 0 and member["model_rank"] == 1
    assert groups[1]["group"][2]["score"] is None  # the empty response has nothing to score


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ('{"prompt": "p", "group": [{"response": "r", "rank": "first"}]}', "'rank' must be an integer >= 1"),
        ("not json", "invalid JSON"),
    ],
)
def test_bad_line_is_a_cli_error_naming_file_and_line(tmp_path: Path, bad: str, reason: str):
    ranked = tmp_path / "ranked.jsonl"
    ranked.write_text(json.dumps(GROUPS[0]) + "\n" + bad + "\n")
    # A model that does not exist: the file is checked first, so the error is about the file.
    result = runner.invoke(app, ["eval", "ranked", str(ranked), "--model", "no-such-model", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert f"{ranked}:2: " in result.output and reason in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)  # a clean exit
    assert not (tmp_path / "r.json").exists()


def test_unknown_model_is_a_cli_error(tmp_path: Path):
    result = runner.invoke(app, ["eval", "ranked", str(write_groups(tmp_path / "r.jsonl")), "--model", "no-such-model"])
    assert result.exit_code == 2 and "--model no-such-model" in result.output
    assert isinstance(result.exception, SystemExit)


def _save(manager: CheckpointManager, model, tokenizer, config_yaml: str, peft_model=None) -> Path:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return manager.save(
        3, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=None, data_state={},
        config_yaml=config_yaml, peft_model=peft_model,
    ).path  # fmt: skip


def _scores(groups: list[dict]) -> list[float | None]:
    return [m["score"] for g in groups for m in g["group"]]


def _in_memory_scores(model, tokenizer) -> list[float | None]:
    scorer = ModelScorer(model, tokenizer)
    out = []
    for g in GROUPS:
        out += [s if s != float("-inf") else None for s in scorer(g["prompt"], [m["response"] for m in g["group"]])]
    return out


def test_trainer_checkpoints_load_whole_and_lora(tmp_path: Path):
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.config import config_to_yaml, load_config
    from gym_bridge.train.learner.lora import apply_lora

    base_dir = save_random_tiny(tmp_path / "base", seed=7)
    ranked = write_groups(tmp_path / "ranked.jsonl")
    cfg = load_config(None, [
        "grpo.mode=offline", "data.train.data_path=unused.jsonl", f"policy.model_name={base_dir}",
        "policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.dim=4",
    ])  # fmt: skip

    # Whole weights: change them, save a checkpoint; the checkpoint directory (latest step) scores as the model.
    model, tokenizer = load_model_and_tokenizer(str(base_dir))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)
    whole = _save(CheckpointManager(tmp_path / "whole"), model, tokenizer, config_to_yaml(cfg))
    (tmp_path / "w").mkdir()
    _, groups = run_eval(ranked, str(whole.parent), tmp_path / "w")
    assert _scores(groups) == pytest.approx(_in_memory_scores(model, tokenizer), abs=1e-5)

    # LoRA: base + non-zero adapter; the step directory loads the base from config.yaml and merges.
    model, tokenizer = load_model_and_tokenizer(str(base_dir))
    base_scores = _in_memory_scores(model, tokenizer)
    peft_model = apply_lora(model, cfg.policy.dtensor_cfg.lora_cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    adapted = _in_memory_scores(peft_model, tokenizer)
    lora = _save(CheckpointManager(tmp_path / "lora"), model, tokenizer, config_to_yaml(cfg), peft_model=peft_model)
    assert (lora / "policy" / "adapter").is_dir() and not (lora / "policy" / "weights").exists()
    (tmp_path / "l").mkdir()
    _, groups = run_eval(ranked, str(lora), tmp_path / "l")
    assert _scores(groups) == pytest.approx(adapted, abs=1e-4)
    assert _scores(groups) != pytest.approx(base_scores, abs=1e-3)  # the adapter is really applied


def test_an_output_that_cannot_be_written_fails_before_the_model_runs(tmp_path: Path):
    """Before: the whole evaluation ran, then writing -o ended in a traceback (exit 1) and the report was lost."""
    ranked = write_groups(tmp_path / "ranked.jsonl")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for flag in ("-o", "--groups-out"):
        result = runner.invoke(app, ["eval", "ranked", str(ranked), "--model", "tiny", flag, str(blocker / "out.json")])
        assert result.exit_code == 2, result.output
        assert "cannot make its directory" in result.output and "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit)


def test_groups_with_nothing_to_order_exit_1(tmp_path: Path):
    """Every group at one rank: no figure measured, so not a passed evaluation (before: exit 0, all n/a)."""
    ranked = write_groups(tmp_path / "ranked.jsonl", [GROUPS[2]])
    result = runner.invoke(app, ["eval", "ranked", str(ranked), "--model", "tiny"])
    assert result.exit_code == 1, result.output
    assert "has an order to check" in result.output


def test_the_report_and_the_groups_file_must_differ(tmp_path: Path):
    """``-o x --groups-out x``: the report replaced the groups file, written a moment before, silently."""
    ranked = write_groups(tmp_path / "ranked.jsonl")
    same = tmp_path / "out.json"
    result = runner.invoke(app, ["eval", "ranked", str(ranked), "--model", "tiny", "-o", str(same), "--groups-out", str(same)])
    assert result.exit_code == 2, result.output
    assert "--groups-out" in result.output and "must differ from --output" in " ".join(result.output.split())
    assert not same.exists()

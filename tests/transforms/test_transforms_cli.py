"""``gym-bridge transform`` end to end: files in, files out, bad lines by file:line, --strict, atomic output."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from transform_rollouts import read_jsonl, rollout, run_transform, summary_count, write_jsonl


@pytest.fixture
def reference_lines(reference_dir):
    lines = []
    for path in sorted(reference_dir.glob("*rollout*.jsonl")):
        lines += path.read_text().splitlines()
    lines.append((reference_dir / "math_rollout.wire-captured.json").read_text().strip())
    return lines


@pytest.fixture
def dirty_file(tmp_path, reference_lines):
    """The 11 reference rollouts with bad lines planted at lines 3, 6, 9 and 12 (and a blank line 10)."""
    lines: list[str | bytes] = list(reference_lines)
    lines.insert(2, '{"responses_create_params": {"input": "hi"}, "reward": 1')  # line 3: cut short
    lines.insert(5, b'{"text": "\xff\xfe"}')  # line 6: not UTF-8
    lines.insert(
        8, json.dumps({"responses_create_params": {"input": "q"}, "reward": 1.0})
    )  # line 9: no response
    lines.insert(9, "")  # line 10: blank, ignored
    lines.insert(11, "[1, 2]")  # line 12: not an object
    return write_jsonl(tmp_path / "rollouts.jsonl", lines)


def test_grpo_skips_bad_lines_and_names_them(dirty_file, tmp_path, reference_lines):
    out = tmp_path / "grpo.jsonl"
    result = run_transform("grpo", dirty_file, "-o", out)
    assert result.exit_code == 0, result.output
    for lineno, reason in [
        (3, "invalid JSON"),
        (6, "not valid UTF-8"),
        (9, "response.output"),
        (12, "JSON object"),
    ]:
        assert f"{dirty_file}:{lineno}: " in result.stderr
        assert reason in result.stderr.split(f"{dirty_file}:{lineno}: ")[1].splitlines()[0]
    assert f"{dirty_file}:10:" not in result.stderr
    records = read_jsonl(out)
    assert len(records) == 11
    assert [r["reward"] for r in records] == [json.loads(line).get("reward", 0.0) for line in reference_lines]
    assert summary_count(result.stdout, "written") == 11
    assert summary_count(result.stdout, "skipped (bad lines)") == 4
    assert summary_count(result.stdout, "filtered") == 0


def test_strict_fails_at_the_first_bad_line_and_writes_nothing(dirty_file, tmp_path):
    out = tmp_path / "grpo.jsonl"
    out.write_text("previous run\n")
    result = run_transform("grpo", dirty_file, "-o", out, "--strict")
    assert result.exit_code == 1
    assert f"{dirty_file}:3: invalid JSON" in result.stderr
    assert out.read_text() == "previous run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grpo.jsonl", "rollouts.jsonl"]  # no temp file left


def test_strict_run_on_clean_input_succeeds(tmp_path, reference_lines):
    clean = write_jsonl(tmp_path / "clean.jsonl", reference_lines)
    result = run_transform("grpo", clean, "-o", tmp_path / "out.jsonl", "--strict")
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 11


def test_grpo_reward_filter_options_and_chat_format(dirty_file, tmp_path):
    out = tmp_path / "chat.jsonl"
    result = run_transform(
        "grpo", dirty_file, "-o", out, "--min-reward", "0.5", "--format", "chat", "--task-name", "math",
        "--keep-fields", "expected_answer, extracted_answer",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = read_jsonl(out)
    assert len(records) == 7  # 3 math + 3 tool + the wire record have reward 1.0
    assert summary_count(result.stdout, "filtered") == 4
    assert all(r["task_name"] == "math" and r["reward"] == 1.0 for r in records)
    assert records[-1]["expected_answer"] == "4" and records[-1]["extracted_answer"] == "4"
    assert records[-1]["messages"][-1] == {"role": "assistant", "content": "The answer is \\boxed{4}"}

    low = tmp_path / "low.jsonl"
    assert (
        run_transform("grpo", dirty_file, "-o", low, "--max-reward", "0.0", "--input-key", "question").exit_code
        == 0
    )
    assert [sorted(r) for r in read_jsonl(low)] == [["output", "question", "reward"]] * 4


def test_sft_keeps_tool_calls_and_tools(reference_dir, tmp_path):
    out = tmp_path / "sft.jsonl"
    result = run_transform("sft", reference_dir / "single_tool_call_rollouts.example.jsonl", "-o", out)
    assert result.exit_code == 0, result.output
    records = read_jsonl(out)
    assert len(records) == 3  # rewards 0, 0, 1, 1, 1
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        assert record["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert record["tools"][0]["function"]["name"] == "get_weather"
    lenient = tmp_path / "all.jsonl"
    assert run_transform("sft", reference_dir / "single_tool_call_rollouts.example.jsonl", "-o", lenient,
                   "--min-reward", "0", "--no-tools").exit_code == 0  # fmt: skip
    assert len(read_jsonl(lenient)) == 5 and all("tools" not in r for r in read_jsonl(lenient))


def _groups_file(path, order):
    """Tasks 0..2 with rewards [1,0,0], [1,1] (tie), [0.5,0,1]; ``order`` lists (task, repeat) to write."""
    rewards = {0: [1.0, 0.0, 0.0], 1: [1.0, 1.0], 2: [0.5, 0.0, 1.0]}
    records = [rollout(f"task {t}", f"t{t} r{r}", rewards[t][r], task=t, repeat=r) for t, r in order]
    return write_jsonl(path, records)


ORDERED = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
SHUFFLED = [(2, 0), (0, 0), (1, 0), (0, 1), (2, 1), (1, 1), (0, 2), (2, 2)]


@pytest.mark.parametrize("order", [ORDERED, SHUFFLED], ids=["ordered", "shuffled"])
def test_dpo_pairs_per_task_in_any_input_order(tmp_path, order):
    src = _groups_file(tmp_path / "in.jsonl", order)
    out = tmp_path / "dpo.jsonl"
    result = run_transform("dpo", src, "-o", out)
    assert result.exit_code == 0, result.output
    pairs = sorted(read_jsonl(out), key=lambda p: p["prompt"])
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [
        ("task 0", "t0 r0", "t0 r1"),
        ("task 2", "t2 r2", "t2 r1"),
    ]
    assert summary_count(result.stdout, "filtered (tasks)") == 1  # the tie
    assert summary_count(result.stdout, "tasks") == 3
    assert ("grouped through a temporary file on disk" in result.stdout) == (order is SHUFFLED)


@pytest.mark.parametrize("layout", ["concatenated", "interleaved"])
def test_two_runs_in_one_file_never_mix_prompts_in_a_group(tmp_path, layout):
    """Two runs' files joined (each numbers its tasks from 0): a group is one index AND one prompt. Before,
    task 0 of run A and task 0 of run B were one group: a DPO pair under A's prompt chose B's answer."""
    runs = {"A": [0.5, 0.0], "B": [1.0, 0.2]}
    records = {
        name: [rollout(f"{name} task {t}", f"{name} task {t} answer {r}", reward, task=t, repeat=r)
               for t in range(2) for r, reward in enumerate(rewards)]
        for name, rewards in runs.items()
    }  # fmt: skip
    lines = records["A"] + records["B"]
    if layout == "interleaved":
        lines = [x for pair in zip(records["A"], records["B"], strict=True) for x in pair]
    src = write_jsonl(tmp_path / "joined.jsonl", [json.dumps(r) for r in lines])
    dpo, ranked = tmp_path / "dpo.jsonl", tmp_path / "ranked.jsonl"
    assert run_transform("dpo", src, "-o", dpo).exit_code == 0
    pairs = read_jsonl(dpo)
    assert len(pairs) == 4
    for pair in pairs:
        assert pair["chosen"].startswith(pair["prompt"]) and pair["rejected"].startswith(pair["prompt"]), pair
    assert run_transform("ranked", src, "-o", ranked).exit_code == 0
    groups = read_jsonl(ranked)
    assert len(groups) == 4
    assert all(m["response"].startswith(g["prompt"]) for g in groups for m in g["group"]), groups


def test_dpo_all_pairs_with_margin(tmp_path):
    src = _groups_file(tmp_path / "in.jsonl", ORDERED)
    out = tmp_path / "dpo.jsonl"
    assert (
        run_transform("dpo", src, "-o", out, "--all-pairs", "--min-margin", "0.5", "--format", "chat").exit_code
        == 0
    )
    pairs = read_jsonl(out)
    assert [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs] == [
        ("t0 r0", "t0 r1"),
        ("t0 r0", "t0 r2"),
        ("t2 r2", "t2 r0"),
        ("t2 r2", "t2 r1"),
        ("t2 r0", "t2 r1"),
    ]
    assert pairs[0]["prompt"] == [{"role": "user", "content": "task 0"}]


def test_ranked_and_back_to_grpo(tmp_path):
    src = _groups_file(tmp_path / "in.jsonl", SHUFFLED)
    ranked = tmp_path / "ranked.jsonl"
    result = run_transform("ranked", src, "-o", ranked, "--min-group-size", "3")
    assert result.exit_code == 0, result.output
    groups = read_jsonl(ranked)
    assert [g["prompt"] for g in groups] == ["task 2", "task 0"]  # task 1 has 2 rollouts
    assert [(m["response"], m["rank"]) for m in groups[0]["group"]] == [
        ("t2 r2", 1),
        ("t2 r0", 2),
        ("t2 r1", 3),
    ]
    assert [m["rank"] for m in groups[1]["group"]] == [1, 2, 2]

    back = tmp_path / "grpo.jsonl"
    result = run_transform("ranked-to-grpo", ranked, "-o", back)
    assert result.exit_code == 0, result.output
    assert [(r["input"], r["output"], r["reward"]) for r in read_jsonl(back)] == [
        ("task 2", "t2 r2", 1.0),
        ("task 2", "t2 r0", 0.5),
        ("task 2", "t2 r1", 0.0),
        ("task 0", "t0 r0", 1.0),
        ("task 0", "t0 r1", 0.0),
        ("task 0", "t0 r2", 0.0),
    ]


def test_ranked_to_grpo_reports_bad_groups_by_line(tmp_path):
    src = write_jsonl(
        tmp_path / "ranked.jsonl",
        [
            {"prompt": "p", "group": [{"response": "a", "rank": 1}, {"response": "b", "rank": 2}]},
            {"prompt": "p", "group": [{"response": "a"}]},
        ],
    )
    result = run_transform("ranked-to-grpo", src, "-o", tmp_path / "out.jsonl")
    assert result.exit_code == 0
    assert f"{src}:2: group[0] 'rank' must be an integer" in result.stderr
    assert read_jsonl(tmp_path / "out.jsonl") == [
        {"input": "p", "output": "a", "reward": 1.0},
        {"input": "p", "output": "b", "reward": 0.0},
    ]


def test_output_must_differ_from_input(tmp_path, reference_lines):
    src = write_jsonl(tmp_path / "in.jsonl", reference_lines)
    result = run_transform("grpo", src, "-o", src)
    assert result.exit_code != 0
    assert len(src.read_text().splitlines()) == 11


def test_console_entry_point_runs_in_a_subprocess(tmp_path, reference_dir):
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "gym_bridge.cli", "transform", "grpo",
         str(reference_dir / "math_rollouts.example.jsonl"), "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [r["reward"] for r in read_jsonl(out)] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert re.search(r"written\s+5", proc.stdout)

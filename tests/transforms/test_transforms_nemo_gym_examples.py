"""Every example rollout file NeMo Gym 0.7.0 ships (vendored, cut down) goes through every transform.

Real records carry output entries that are not message objects (aviary environments store each turn as a
list of items), records without a request or a response, and placeholder rows. None of them may end a
run: text extraction skips what it does not know, unusable records are reported as ``file:line``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from gym_bridge.records.schema import assistant_text
from transforms.common import prompt_messages, response_messages, response_text
from transforms.dpo import dpo_pairs
from transforms.grpo import to_grpo, to_grpo_chat
from transforms.pipeline import run_grouped, run_records
from transforms.ranked import to_ranked
from transforms.sft import to_sft

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "nemo_gym_examples"
FILES = sorted(EXAMPLES.glob("*.jsonl"))
REPO = Path(__file__).resolve().parents[2]


def _usable(line: str) -> bool:
    """A line any transform can use: a JSON object with a request input and a list of output entries."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    if not isinstance(record, dict):
        return False
    params, response = record.get("responses_create_params"), record.get("response")
    return (
        isinstance(params, dict)
        and isinstance(params.get("input"), str | list)
        and isinstance(response, dict)
        and isinstance(response.get("output"), list)
    )


def _scored(line: str) -> bool:
    """A usable line with a reward (the transforms that read one refuse a rollout without)."""
    return _usable(line) and json.loads(line).get("reward") is not None


def _cut_off(record: dict) -> bool:
    """The response stopped short (NeMo Gym marks it with ``incomplete_details``, ``status`` alone rarely)."""
    return record["response"].get("status") == "incomplete" or bool(record["response"].get("incomplete_details"))


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_vendored_set_holds_every_odd_shape_nemo_gym_ships():
    assert len(FILES) == 184
    lines = [line for path in FILES for line in _lines(path)]
    usable = [line for line in lines if _usable(line)]
    nested = [
        line for line in usable if any(isinstance(item, list) for item in json.loads(line)["response"]["output"])
    ]
    assert len(usable) >= 150
    assert {p.name.split("__")[1] for p in FILES if not any(_usable(x) for x in _lines(p))} >= {
        "bbq",
        "multichallenge",
        "nemo_user_sim",
        "browsecomp_advanced_harness",
    }
    assert len(nested) == 4  # aviary, aviary_gsm8k, aviary_hotpotqa, aviary_bixbench


PER_RECORD = {
    "grpo": to_grpo,
    "grpo-chat": to_grpo_chat,
    "sft": lambda r: to_sft(r),
    "grpo-default-0": partial(to_grpo, default_reward=0.0),  # NeMo Gym's documented script, asked for by name
}
NO_REWARD_NEEDED = {"sft", "grpo-default-0"}
PER_GROUP = {"dpo": dpo_pairs, "ranked": to_ranked}


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_file_through_every_transform(path, tmp_path):
    lines = _lines(path)
    usable = sum(_usable(line) for line in lines)
    scored = sum(_scored(line) for line in lines)  # all usable but one (deepsearchqa's has no reward)
    for name, convert in PER_RECORD.items():
        errors = []
        want = usable if name in NO_REWARD_NEEDED else scored
        report = run_records(path, tmp_path / f"{name}.jsonl", convert, on_error=errors.append)
        assert (report.read, report.skipped) == (want, len(lines) - want), (name, errors)
        assert report.written == want
        assert all(re.match(rf"{re.escape(str(path))}:\d+: ", str(e)) for e in errors)
    for name, convert_group in PER_GROUP.items():
        report = run_grouped(path, tmp_path / f"{name}.jsonl", convert_group)
        assert (report.read, report.skipped) == (scored, len(lines) - scored), name


def _aviary_record():
    path = EXAMPLES / "environments__aviary_gsm8k__example_rollouts.jsonl"
    return json.loads(_lines(path)[0])


def test_output_entries_that_are_lists_are_skipped_and_messages_beside_them_kept():
    record = _aviary_record()
    turns = record["response"]["output"]
    assert all(isinstance(turn, list) for turn in turns)
    assert response_text(record) == ""
    assert response_messages(record) == []
    answer = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "18"}, {"type": "refusal", "refusal": "x"}],
    }
    record["response"]["output"] = [turns[0], answer, turns[0], 7, None, "text"]
    assert response_text(record) == "18"
    assert assistant_text(record["response"]["output"]) == "18"
    assert response_messages(record) == [{"role": "assistant", "content": "18"}]
    assert to_grpo(record)["output"] == "18"
    record["responses_create_params"]["input"] = [["not", "an", "item"], {"role": "user", "content": "q?"}]
    assert prompt_messages(record) == [{"role": "user", "content": "q?"}]
    assert to_grpo(record)["input"] == "q?"


def test_a_record_no_reader_foresaw_is_reported_by_file_and_line_and_the_run_goes_on(tmp_path):
    good = _aviary_record()
    odd = json.loads(json.dumps(good))
    odd["response"]["output"] = [{"type": "message", "role": "assistant", "content": 5}]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, odd, good)) + "\n")
    errors = []
    report = run_records(path, tmp_path / "out.jsonl", to_grpo, on_error=errors.append)
    assert (report.written, report.skipped) == (2, 1)
    assert [str(e) for e in errors] == [f"{path}:2: unusable record (TypeError: 'int' object is not iterable)"]


WORSE = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "(a worse answer)"}]}


@pytest.fixture(scope="module")
def all_examples(tmp_path_factory):
    """Every vendored line in one file; each usable record twice (reward 1 and 0) as one task's group, the
    second with one more assistant message (two rollouts that read alike make no DPO pair)."""
    out, usable, cut_off = [], 0, 0
    for path in FILES:
        for line in _lines(path):
            if not _usable(line):
                out.append(line)
                continue
            usable += 1
            record = json.loads(line)
            cut_off += _cut_off(record)
            worse = {**record["response"], "output": [*record["response"]["output"], WORSE]}
            for repeat, (reward, response) in enumerate(((1.0, record["response"]), (0.0, worse))):
                out.append(json.dumps({**record, "_ng_task_index": usable, "_ng_rollout_index": repeat,
                                       "reward": reward, "response": response}))  # fmt: skip
    path = tmp_path_factory.mktemp("examples") / "all_examples.jsonl"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path, usable, len(out) - 2 * usable, cut_off


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "gym_bridge.cli", "transform", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def _count(output, label):
    match = re.search(rf"{re.escape(label)}\s+(\d+)", output)
    assert match, output
    return int(match.group(1))


@pytest.mark.parametrize(
    ("verb", "extra", "per_task", "cut_off_left_out"),
    [
        ("grpo", [], 2, False),
        ("grpo", ["--format", "chat"], 2, False),
        ("sft", [], 1, True),  # the reward-1.0 copy only, and not a response that was cut off
        ("sft", ["--keep-cut-off"], 1, False),
        ("dpo", [], 1, True),  # a cut-off response is never the chosen one
        ("ranked", [], 1, False),
    ],
    ids=["grpo", "grpo-chat", "sft", "sft-keep-cut-off", "dpo", "ranked"],
)
def test_cli_transforms_every_shipped_record(all_examples, tmp_path, verb, extra, per_task, cut_off_left_out):
    path, usable, unusable, cut_off = all_examples
    assert cut_off == 6  # NeMo Gym's examples hold six responses stopped at max_output_tokens
    want = per_task * usable - (cut_off if cut_off_left_out else 0)
    out = tmp_path / "out.jsonl"
    result = _cli(verb, path, "-o", out, *extra)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _count(result.stdout, "written") == want
    assert _count(result.stdout, "skipped (bad lines)") == unusable
    assert re.search(rf"skipped\s+{re.escape(str(path))}:\d+: ", result.stderr)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == want
    if verb == "dpo":
        assert all(r["chosen_reward"] == 1.0 and r["rejected_reward"] == 0.0 for r in records)
        assert all(r["rejected"].endswith("(a worse answer)") for r in records)


def test_cli_strict_stops_at_the_first_unusable_record(all_examples, tmp_path):
    path, _, _, _ = all_examples
    first_bad = next(n for n, line in enumerate(path.read_text().splitlines(), 1) if not _usable(line))
    out = tmp_path / "out.jsonl"
    result = _cli("grpo", path, "-o", out, "--strict")
    assert result.returncode == 1
    assert f"{path}:{first_bad}: " in result.stderr
    assert not out.exists()

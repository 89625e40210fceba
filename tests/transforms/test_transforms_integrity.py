"""``gym-bridge transform`` writes no training signal the rollouts do not hold (through the real CLI).

Each case had made a wrong record: an unscored rollout written as reward 0 (GRPO) or as a DPO rejected
answer, a reward too large for a float ending the run in a traceback, a response cut off at
``max_output_tokens`` taught as an SFT demonstration or a DPO chosen answer, a ranked group whose members
all tied at reward 0 turned into GRPO rewards of 1.0, a file joined twice giving each rollout twice the
weight in its group, and a NaN bound filtering everything out as if the data were at fault.
"""

from __future__ import annotations

import json

import pytest
from transform_rollouts import read_jsonl, rollout, run_transform, summary_count, write_jsonl


def _cut_off(record, where="details"):
    """Mark the response cut off as NeMo Gym's records do (``incomplete_details``), or as our policy
    server also does (the response's or its message item's ``status``)."""
    if where == "details":
        record["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    elif where == "status":
        record["response"]["status"] = "incomplete"
    else:
        record["response"]["output"][-1]["status"] = "incomplete"
    return record


@pytest.fixture
def unscored(tmp_path):
    """Task 0: rewards 1.0, none, 0.0; task 1: none, 1.0. The unscored answers are lines 2 and 4."""
    records = [
        rollout("task 0", "t0 right", 1.0, task=0, repeat=0),
        rollout("task 0", "t0 unscored", None, task=0, repeat=1),
        rollout("task 0", "t0 wrong", 0.0, task=0, repeat=2),
        rollout("task 1", "t1 unscored", None, task=1, repeat=0),
        rollout("task 1", "t1 right", 1.0, task=1, repeat=1),
    ]
    return write_jsonl(tmp_path / "rollouts.jsonl", records)


@pytest.mark.parametrize(
    "verb",
    [["grpo"], ["grpo", "--format", "chat"], ["sft", "--min-reward", "0"], ["dpo", "--all-pairs"], ["ranked"]],
    ids=["grpo", "grpo-chat", "sft", "dpo", "ranked"],
)
def test_a_rollout_without_a_reward_is_a_bad_line_for_every_verb(unscored, tmp_path, verb):
    out = tmp_path / "out.jsonl"
    result = run_transform(verb[0], unscored, "-o", out, *verb[1:])
    assert result.exit_code == 0, result.output
    for line in (2, 4):
        assert f"{unscored}:{line}: no 'reward'" in result.stderr
    assert summary_count(result.stdout, "skipped (bad lines)") == 2
    assert "unscored" not in out.read_text()  # before: reward 0.0, a demonstration, a rejected answer, a rank


def test_grpo_missing_reward_scores_an_unscored_rollout_by_name(unscored, tmp_path):
    out = tmp_path / "out.jsonl"
    result = run_transform("grpo", unscored, "-o", out, "--missing-reward", "0")
    assert result.exit_code == 0, result.output
    assert [(r["output"], r["reward"]) for r in read_jsonl(out)] == [
        ("t0 right", 1.0), ("t0 unscored", 0.0), ("t0 wrong", 0.0), ("t1 unscored", 0.0), ("t1 right", 1.0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "reward",
    ["1" + "0" * 400, "NaN", "1e999", '"1"', "true", "[1]"],
    ids=["integer-too-large-for-a-float", "nan", "inf", "string", "bool", "list"],
)
def test_a_reward_that_is_no_finite_number_is_a_named_bad_line(tmp_path, reward):
    """The too-large integer had ended every verb in an OverflowError traceback; the others held."""
    good = rollout("q", "kept", 1.0)
    bad = json.dumps(rollout("q", "bad", 1.0)).replace('"reward": 1.0', f'"reward": {reward}')
    src = write_jsonl(tmp_path / "in.jsonl", [good, bad])
    out = tmp_path / "out.jsonl"
    result = run_transform("grpo", src, "-o", out)
    assert result.exit_code == 0, result.output
    assert f"{src}:2: 'reward' must be a finite number" in result.stderr
    assert [r["output"] for r in read_jsonl(out)] == ["kept"]


@pytest.fixture(params=["details", "status", "item"])
def cut(tmp_path, request):
    """One task: a cut-off response with reward 1.0 (the answer came before the cut), a complete one with
    0.5, a wrong one with 0.0."""
    records = [
        _cut_off(rollout("task", "boxed 4 and then on and on and", 1.0, task=0, repeat=0), request.param),
        rollout("task", "partly right", 0.5, task=0, repeat=1),
        rollout("task", "wrong", 0.0, task=0, repeat=2),
    ]
    return write_jsonl(tmp_path / "cut.jsonl", records)


def test_a_cut_off_response_is_no_sft_demonstration(cut, tmp_path):
    out = tmp_path / "sft.jsonl"
    result = run_transform("sft", cut, "-o", out, "--min-reward", "0.5")
    assert result.exit_code == 0, result.output
    assert [r["messages"][-1]["content"] for r in read_jsonl(out)] == ["partly right"]  # before: the cut-off too
    assert summary_count(result.stdout, "filtered") == 2
    assert run_transform("sft", cut, "-o", out, "--min-reward", "0.5", "--keep-cut-off").exit_code == 0
    assert len(read_jsonl(out)) == 2


def test_a_cut_off_response_is_never_the_chosen_answer(cut, tmp_path):
    out = tmp_path / "dpo.jsonl"
    assert run_transform("dpo", cut, "-o", out).exit_code == 0
    assert [(p["chosen"], p["rejected"]) for p in read_jsonl(out)] == [("partly right", "wrong")]
    assert run_transform("dpo", cut, "-o", out, "--all-pairs").exit_code == 0
    assert [(p["chosen"], p["rejected"]) for p in read_jsonl(out)] == [("partly right", "wrong")]
    assert run_transform("dpo", cut, "-o", out, "--keep-cut-off").exit_code == 0
    assert [p["chosen"] for p in read_jsonl(out)] == ["boxed 4 and then on and on and"]


def test_ranked_to_grpo_gives_no_reward_to_a_group_without_an_order(tmp_path):
    """Task 0's rollouts were all wrong (reward 0, one shared rank): before, each came back with reward 1.0."""
    records = [rollout("all wrong", f"wrong {n}", 0.0, task=0, repeat=n) for n in range(3)]
    records += [rollout("mixed", "right", 1.0, task=1, repeat=0), rollout("mixed", "wrong", 0.0, task=1, repeat=1)]
    ranked, back = tmp_path / "ranked.jsonl", tmp_path / "grpo.jsonl"
    assert run_transform("ranked", write_jsonl(tmp_path / "in.jsonl", records), "-o", ranked).exit_code == 0
    result = run_transform("ranked-to-grpo", ranked, "-o", back)
    assert result.exit_code == 0, result.output
    assert [(r["output"], r["reward"]) for r in read_jsonl(back)] == [("right", 1.0), ("wrong", 0.0)]
    assert summary_count(result.stdout, "filtered") == 1
    lone = write_jsonl(tmp_path / "lone.jsonl", [{"prompt": "p", "group": [{"response": "a", "rank": 1}]}])
    assert run_transform("ranked-to-grpo", lone, "-o", tmp_path / "lone_out.jsonl").exit_code == 1  # nothing to write


def test_a_file_joined_twice_counts_each_rollout_once_in_its_group(tmp_path):
    once = [rollout("task", f"answer {n}", r, task=0, repeat=n) for n, r in enumerate((1.0, 0.5, 0.0))]
    src = write_jsonl(tmp_path / "twice.jsonl", once + once)
    ranked = tmp_path / "ranked.jsonl"
    result = run_transform("ranked", src, "-o", ranked)
    assert result.exit_code == 0, result.output
    assert [(m["response"], m["rank"]) for m in read_jsonl(ranked)[0]["group"]] == [
        ("answer 0", 1), ("answer 1", 2), ("answer 2", 3),
    ]  # fmt: skip
    assert summary_count(result.stdout, "duplicates left out") == 3
    pairs = tmp_path / "dpo.jsonl"
    assert run_transform("dpo", src, "-o", pairs, "--all-pairs").exit_code == 0
    assert len(read_jsonl(pairs)) == 3  # before: 12, each pair four times
    # Two rollouts with the same text are two samples, not a duplicate: only equal records are.
    resampled = [rollout("task", "same text", 1.0, task=0, repeat=n) for n in range(2)]
    resampled.append(rollout("task", "other", 0.0, task=0, repeat=2))
    result = run_transform("ranked", write_jsonl(tmp_path / "re.jsonl", resampled), "-o", ranked)
    assert len(read_jsonl(ranked)[0]["group"]) == 3 and summary_count(result.stdout, "duplicates left out") == 0


@pytest.mark.parametrize(
    "args",
    [
        ["grpo", "--min-reward", "nan"],
        ["grpo", "--max-reward", "nan"],
        ["grpo", "--missing-reward", "nan"],
        ["grpo", "--missing-reward", "inf"],
        ["sft", "--min-reward", "nan"],
        ["dpo", "--min-margin", "nan"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_nan_bound_is_refused_naming_the_option(unscored, tmp_path, args):
    """Before: every record filtered out (every comparison with NaN is false), exit 1 blaming the data."""
    result = run_transform(args[0], unscored, "-o", tmp_path / "out.jsonl", *args[1:])
    assert result.exit_code == 2, result.output
    assert args[1] in result.output and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["grpo", "--input-key", "text", "--output-key", "text"],
        ["grpo", "--output-key", "reward"],
        ["grpo", "--format", "chat", "--reward-key", "messages"],
        ["ranked-to-grpo", "--reward-key", "input"],
    ],
    ids=lambda a: " ".join(a),
)
def test_output_keys_that_collide_are_refused(unscored, tmp_path, args):
    """Before: ``--input-key text --output-key text`` wrote records without their prompt, exit 0."""
    result = run_transform(args[0], unscored, "-o", tmp_path / "out.jsonl", *args[1:])
    assert result.exit_code == 2, result.output
    assert "one would overwrite the other" in result.output and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_output_that_is_the_input_under_another_name_never_damages_it(unscored, tmp_path, link):
    """Held: a symlink to the input is refused as the input itself; a hard link is replaced by the atomic
    rename, which leaves the input's own data as it was."""
    before = unscored.read_bytes()
    other = tmp_path / "other.jsonl"
    if link == "symlink":
        other.symlink_to(unscored)
    else:
        other.hardlink_to(unscored)
    result = run_transform("grpo", unscored, "-o", other)
    assert result.exit_code == (2 if link == "symlink" else 0), result.output
    assert unscored.read_bytes() == before


def _with_call(record, product):
    """The rollout's output: a call to add_to_cart(product), its result, then the same closing text."""
    call = {"type": "function_call", "call_id": "c1", "name": "add_to_cart", "arguments": json.dumps({"product_id": product})}
    result = {"type": "function_call_output", "call_id": "c1", "output": '{"ok": true}'}
    record["response"]["output"][1:1] = [call, result]
    return record


def test_dpo_writes_no_pair_whose_two_sides_read_the_same(tmp_path):
    """Two tool-using rollouts that differ only in their calls: the text form leaves the calls out, so
    its pair read "Done." against "Done." (the e2e test of code and tool use shows 9 such pairs of 11)."""
    records = [
        _with_call(rollout("buy P450", "Done.", 1.0, task=0, repeat=0), "P450"),
        _with_call(rollout("buy P450", "Done.", 0.0, task=0, repeat=1), "P999"),
        rollout("other", "right", 1.0, task=1, repeat=0),
        rollout("other", "wrong", 0.0, task=1, repeat=1),
    ]
    src = write_jsonl(tmp_path / "tools.jsonl", records)
    out = tmp_path / "dpo.jsonl"
    result = run_transform("dpo", src, "-o", out)
    assert result.exit_code == 0, result.output
    assert [(p["chosen"], p["rejected"]) for p in read_jsonl(out)] == [("right", "wrong")]
    assert run_transform("dpo", src, "-o", out, "--format", "chat").exit_code == 0
    chosen = read_jsonl(out)[0]["chosen"]  # the chat form keeps the calls, so the pair is there
    assert chosen[0]["tool_calls"][0]["function"]["arguments"] == {"product_id": "P450"}

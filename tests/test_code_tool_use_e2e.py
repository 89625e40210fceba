"""End to end: ``collect`` over the code and tool_use servers (started by name) with a scripted model.

The fake model writes code (right on the first repeat, wrong on the second for some tasks) and drives
the store through tools (the reference plan, a bad call fed back and recovered from, parallel calls;
on the second repeat it stops one call short). Rewards must come out exactly as scripted, and the
rollouts must go through the transforms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fake_model import FakeModel, function_call, tool_outputs

from gym_bridge.collect import CollectConfig, collect, rollout_seed
from gym_bridge.records.schema import last_user_text
from transforms.dpo import dpo_pairs
from transforms.grpo import to_grpo, to_grpo_chat
from transforms.sft import to_sft

ROOT = Path(__file__).resolve().parents[1]
SEED = 7
CODE = {  # right answers to resources_servers/code/data/example.jsonl, and a wrong one for some
    0: ("a, b = map(int, input().split())\nprint(a + b)", "a, b = map(int, input().split())\nprint(a - b)"),
    1: ("print(' '.join(reversed(input().split())))", None),
    2: (
        "import sys\nn = [int(x) for x in sys.stdin.read().split()[1:]]\nsieve = [True] * 100001\n"
        "sieve[0] = sieve[1] = False\nfor i in range(2, 317):\n    if sieve[i]:\n"
        "        sieve[i * i :: i] = [False] * len(sieve[i * i :: i])\n"
        "print('\\n'.join(str(sum(sieve[: m + 1])) for m in n))",
        None,
    ),
    3: ("def is_palindrome(s):\n    return s == s[::-1]", "def is_palindrome(s):\n    return len(s) < 4"),
    4: (
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i",
        None,
    ),
}


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_collect_over_code_and_tool_use_then_transform(tmp_path: Path) -> None:
    code_rows = load(ROOT / "resources_servers/code/data/example.jsonl")
    tool_rows = load(ROOT / "resources_servers/tool_use/data/example.jsonl")
    rows = code_rows + tool_rows
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index_of = {last_user_text(r["responses_create_params"]): i for i, r in enumerate(rows)}

    def repeat_of(request: dict[str, Any], task: int) -> int:
        return 0 if request.get("seed") == rollout_seed(SEED, task, 0) else 1

    def script(request: dict[str, Any], n: int) -> Any:
        task = index_of[last_user_text(request)]
        repeat = repeat_of(request, task)
        if task < len(code_rows):
            right, wrong = CODE[task]
            code = wrong if (repeat == 1 and wrong) else right
            return f"Let me think.\n```python\n{code}\n```"
        return tool_turn(rows[task], request, repeat)

    with FakeModel(script, record_requests=False) as model:
        result = collect(
            CollectConfig(
                tasks, tmp_path / "rollouts.jsonl", ["code", "tool_use"], model_url=model.url,
                num_repeats=2, concurrency=4, seed=SEED, progress=False,
            )
        )  # fmt: skip

    records = load(result.output_path)
    assert result.failed == 0 and len(records) == 2 * len(rows)
    got = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in records}
    for task in range(len(code_rows)):
        assert got[(task, 0)]["reward"] == 1.0, got[(task, 0)].get("failure_reason")
        wrong = CODE[task][1] is not None
        assert got[(task, 1)]["reward"] == (0.0 if wrong else 1.0)
        if wrong:
            assert got[(task, 1)]["failure_kind"] == "wrong_answer"
    for task in range(len(code_rows), len(rows)):
        first, second = got[(task, 0)], got[(task, 1)]
        assert first["reward"] == 1.0, (rows[task]["verifier_metadata"], first.get("failure_reason"))
        assert second["reward"] == 0.0 and second["failure_kind"] in ("wrong_outcome", "wrong_calls")
        assert first["agent_ref"] == {"name": "tool_use_simple_agent"}

    # The bad call was answered with a 4xx detail, fed back to the model, and the rollout recovered.
    buy = next(
        t for t in range(len(code_rows), len(rows)) if rows[t]["verifier_metadata"]["task_kind"] == "buy"
    )
    outputs = [
        i["output"] for i in got[(buy, 0)]["response"]["output"] if i["type"] == "function_call_output"
    ]
    assert any("quantity" in o and "detail" in o for o in outputs)
    # Parallel calls: the multi-product lookup answered in one turn.
    lookup = next(
        t for t in range(len(code_rows), len(rows)) if rows[t]["verifier_metadata"]["task_kind"] == "lookup"
    )
    items = [i["type"] for i in got[(lookup, 0)]["response"]["output"]]
    n_calls = len(rows[lookup]["verifier_metadata"]["expected_calls"])
    assert items[:n_calls] == ["function_call"] * n_calls

    for record in records:
        grpo = to_grpo(record)
        assert grpo["reward"] == record["reward"] and grpo["input"]
        chat = to_grpo_chat(record)
        assert chat["task_name"] == record["agent_ref"]["name"] and len(chat["messages"]) >= 2
        sft = to_sft(record)
        if record["_ng_task_index"] >= len(code_rows):
            assert sft["tools"]
            made_calls = any(i["type"] == "function_call" for i in record["response"]["output"])
            assert made_calls == any(m.get("tool_calls") for m in sft["messages"])
            assert made_calls == any(m["role"] == "tool" for m in sft["messages"])
    pairs = [p for t in range(len(rows)) for p in dpo_pairs([got[(t, 0)], got[(t, 1)]])]
    assert len(pairs) == sum(1 for t in range(len(rows)) if got[(t, 0)]["reward"] != got[(t, 1)]["reward"])
    assert all(p["chosen_reward"] == 1.0 and p["rejected_reward"] == 0.0 for p in pairs)


def tool_turn(row: dict[str, Any], request: dict[str, Any], repeat: int) -> Any:
    """The next model turn for a store task: follow the reference plan (one short on repeat 1)."""
    meta = row["verifier_metadata"]
    outcome = "reference_calls" in meta
    plan = ([{"name": "list_products", "arguments": {}}] if outcome else []) + (
        meta.get("reference_calls") or meta["expected_calls"]
    )
    if repeat == 1:
        plan = plan[:-1]
    if meta["task_kind"] == "buy" and repeat == 0:  # a bad call first: its 422 detail comes back
        plan = [{"name": "add_to_cart", "arguments": {"product_id": "P000", "quantity": "two"}}, *plan]
    done = len(tool_outputs(request))
    if not outcome and done == 0 and plan:  # argument tasks: every call at once (parallel)
        return [function_call(c["name"], c["arguments"]) for c in plan]
    if done < len(plan) and outcome:
        call = plan[done]
        return [function_call(call["name"], call["arguments"])]
    return "Done: your request is handled."

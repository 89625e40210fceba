"""The agent loop with tools: multi-turn trajectories, per-rollout cookies, errors fed back, max_steps."""

from __future__ import annotations

import asyncio
import json

from collect_helpers import TOOLS, note_taker, notes_row, read_jsonl, write_rows
from fake_model import FakeModel, function_call, message, tool_outputs

from gym_bridge.collect import CollectConfig, collect
from gym_bridge.rollout.agent import AgentConfig, make_client, run_rollout
from gym_bridge.serving.retry import RetryPolicy


def run_one(model_url: str, env_url: str, row: dict, **kw):
    async def go():
        async with make_client() as client:
            return await run_rollout(client, row, env_url, AgentConfig(model_url=model_url, **kw))

    return asyncio.run(go())


def test_multi_turn_trajectory_with_session_state(notes_env):
    env_url, env = notes_env
    with FakeModel(note_taker) as model:
        rollout = run_one(model.url, env_url, notes_row(["a", "b", "c"]))
        requests = model.requests_for("take notes")
    assert rollout.ok, rollout.failure
    record = rollout.record
    assert record["reward"] == 1.0 and record["session_notes"] == ["a", "b", "c"]
    kinds = [item["type"] for item in record["response"]["output"]]
    assert kinds == ["message", "function_call", "function_call_output"] * 3 + ["message"]
    outputs = [i for i in record["response"]["output"] if i["type"] == "function_call_output"]
    calls = [i for i in record["response"]["output"] if i["type"] == "function_call"]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]
    assert [json.loads(o["output"]) for o in outputs] == [{"count": 1}, {"count": 2}, {"count": 3}]
    assert set(outputs[0]) == {"call_id", "output", "type", "id", "status"}
    # Each request carries the original input plus every item so far; the params ride along.
    assert [len(r["input"]) for r in requests] == [1, 4, 7, 10]
    assert requests[-1]["input"][1:] == record["response"]["output"][:-1]
    assert all(r["tools"] == TOOLS for r in requests)
    assert record["responses_create_params"]["input"] == [{"role": "user", "content": "take notes: a,b,c"}]
    assert rollout.metrics.model_calls == 4 and rollout.metrics.tool_calls == 3
    assert rollout.metrics.input_tokens > record["response"]["usage"]["input_tokens"]  # summed over turns


def test_concurrent_rollouts_keep_their_own_sessions(tmp_path, notes_env):
    env_url, _ = notes_env
    rows = [notes_row([f"t{i}-{k}" for k in range(1 + i % 3)]) for i in range(24)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    with FakeModel(note_taker, record_requests=False) as model:
        config = CollectConfig(
            tasks,
            tmp_path / "out.jsonl",
            [env_url],
            model_url=model.url,
            concurrency=24,
            num_repeats=2,
            progress=False,
        )
        result = collect(config)
    records = read_jsonl(result.output_path)
    assert len(records) == 48
    assert all(r["reward"] == 1.0 for r in records), [
        r["session_notes"] for r in records if r["reward"] != 1.0
    ]
    for r in records:
        assert r["session_notes"] == rows[r["_ng_task_index"]]["expected_notes"]


def test_malformed_arguments_go_back_to_the_model(notes_env):
    env_url, env = notes_env
    calls_before = env.tool_calls["add_note"]

    def script(request, n):
        if not tool_outputs(request):
            return [function_call("add_note", '{"text": "a"')]  # invalid JSON
        return "ok, giving up"

    with FakeModel(script) as model:
        rollout = run_one(model.url, env_url, notes_row(["a"]))
        second = model.requests_for("take notes")[1]
    assert rollout.ok
    fed_back = tool_outputs(second)[0]
    assert "not valid JSON" in fed_back and "add_note" in fed_back
    assert env.tool_calls["add_note"] == calls_before  # the env was not called
    assert rollout.record["reward"] == 0.0


def test_tool_client_errors_are_shown_to_the_model(notes_env):
    env_url, _ = notes_env

    def script(request, n):
        seen = tool_outputs(request)
        if len(seen) == 0:
            return [function_call("add_note", {"txt": "typo"})]  # 422 from the env
        if len(seen) == 1:
            return [function_call("no_such_tool", {})]  # 404 from the env
        if len(seen) == 2:
            return [function_call("verify", {})]  # not a tool: never posted to /verify
        return "stopping"

    with FakeModel(script) as model:
        rollout = run_one(model.url, env_url, notes_row(["x"]))
    assert rollout.ok, rollout.failure
    outputs = [
        i["output"] for i in rollout.record["response"]["output"] if i["type"] == "function_call_output"
    ]
    assert "text" in json.loads(outputs[0])["detail"]
    assert "unknown tool 'no_such_tool'" in json.loads(outputs[1])["detail"]
    assert outputs[2] == "Error: there is no tool named 'verify'."


def test_a_tool_server_error_fails_the_rollout_without_a_second_call(notes_env):
    """A tool's 500 may come after the tool ran: it is not sent again (a state change applied twice), the rollout
    fails unscored (tests/collect/test_agent_tool_retries.py)."""
    env_url, env = notes_env
    before = env.tool_calls["explode"]
    with FakeModel(lambda request, n: [function_call("explode", {"text": "boom"})]) as model:
        rollout = run_one(
            model.url, env_url, notes_row(["boom"]), env_retry=RetryPolicy(max_attempts=2, backoff_base=0.01)
        )
    assert not rollout.ok and rollout.record is None
    assert (rollout.failure.failure_class, rollout.failure.stage, rollout.failure.attempts) == (
        "env_http_error",
        "tool",
        1,
    )
    assert "tool crashed" in rollout.failure.message and "not sent again" in rollout.failure.message
    assert env.tool_calls["explode"] - before == 1


def test_max_steps_bounds_model_calls(notes_env):
    env_url, _ = notes_env

    def always_calls(request, n):
        return [function_call("add_note", {"text": "again"})]

    with FakeModel(always_calls) as model:
        rollout = run_one(model.url, env_url, notes_row(["again"]), max_steps=3)
        assert model.calls["take notes: again"] == 3
    assert rollout.ok
    kinds = [i["type"] for i in rollout.record["response"]["output"]]
    assert kinds == ["function_call", "function_call_output"] * 3
    assert rollout.record["session_notes"] == ["again"] * 3


def test_truncated_response_ends_the_loop(notes_env):
    env_url, env = notes_env
    calls_before = env.tool_calls["add_note"]

    def truncated(request, n):
        return {
            "output": [function_call("add_note", '{"text": "cut')],
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
        }

    with FakeModel(truncated) as model:
        rollout = run_one(model.url, env_url, notes_row(["cut"]))
        assert model.calls["take notes: cut"] == 1
    assert rollout.ok
    assert rollout.record["response"]["status"] == "incomplete"
    assert env.tool_calls["add_note"] == calls_before


def test_output_items_pass_through_untouched(boxed_env):
    """Token ids and log-probs a policy server attaches reach the record as they were sent."""
    env_url, _ = boxed_env
    item = message(
        "\\boxed{2}", generation_token_ids=[5, 6], generation_log_probs=[-0.1, -0.2], prompt_token_ids=[1]
    )
    item["custom_field"] = {"nested": [1, 2]}
    row = {"responses_create_params": {"input": "What is 1 + 1?"}, "expected_answer": "2"}
    with FakeModel(lambda request, n: [dict(item)]) as model:
        rollout = run_one(model.url, env_url, row)
    assert rollout.ok
    assert rollout.record["response"]["output"] == [item]
    assert rollout.record["reward"] == 1.0
    assert rollout.record["responses_create_params"]["input"] == "What is 1 + 1?"

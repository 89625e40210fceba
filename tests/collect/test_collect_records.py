"""collect end to end over loopback: NeMo Gym records, aabbcc order, seeds, metrics, routing, bad rows."""

from __future__ import annotations

import json

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row, solve_arithmetic

from gym_bridge.collect import (
    CollectConfig,
    CollectError,
    collect,
    failures_path_for,
    metrics_path_for,
    parse_env_args,
    rollout_seed,
)
from gym_bridge.records.nemo_gym_record import environment_server_for
from gym_bridge.records.schema import RolloutRecord


def wrong_for_seven(request, n):
    """Answers correctly except for "3 + 4" (answers 8); repeat 1 of "1 + 1" answers 3."""
    if "3 + 4" in json.dumps(request):
        return "The answer is \\boxed{8}."
    if "1 + 1" in json.dumps(request) and n == 2:
        return "The answer is \\boxed{3}."
    return solve_arithmetic(request, n)


def run(tmp_path, model, env_url, rows, **kw):
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    config = CollectConfig(
        tasks_path=tasks,
        output_path=tmp_path / "out" / "rollouts.jsonl",
        envs=kw.pop("envs", [env_url]),
        model_url=model.url,
        progress=False,
        **kw,
    )
    messages: list[str] = []
    result = collect(config, report=messages.append)
    return result, messages


def test_records_are_nemo_gym_rollouts_in_aabbcc_order(tmp_path, boxed_env):
    env_url, _ = boxed_env
    rows = [
        arithmetic_row(1, 1),
        arithmetic_row(3, 4),
        arithmetic_row(2, 5, agent_ref={"name": "math_simple_agent"}),
    ]
    with FakeModel(wrong_for_seven) as model:
        result, _ = run(
            tmp_path, model, env_url, rows, num_repeats=2, concurrency=1, overrides={"temperature": 0.5}
        )
    records = read_jsonl(result.output_path)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in records] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1),
    ]  # fmt: skip
    for rec in records:
        RolloutRecord.model_validate(rec)  # NeMo Gym-readable
        assert list(rec)[:6] == [  # NeMo Gym's BaseVerifyResponse fields first, its stamps last
            "responses_create_params", "response", "reward", "mask_sample", "failure_kind", "failure_reason",
        ]  # fmt: skip
        assert list(rec)[-2:] == ["_ng_environment_server", "_ng_result_type"]
        assert rec["_ng_environment_server"] == environment_server_for(rec["agent_ref"]["name"])
        assert rec["_ng_result_type"] == "legacy_agent"
        assert rec["responses_create_params"]["temperature"] == 0.5
        assert rec["response"]["output"][-1]["type"] == "message"
        assert rec["response"]["usage"]["output_tokens"] > 0
        assert "_gb_metrics" not in rec and "metrics" not in rec
    assert [r["reward"] for r in records] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    # a bare URL is the env named "default"; a row's own agent_ref is kept, its environment server named after it
    assert records[0]["agent_ref"] == {"name": "default_simple_agent"}
    assert records[0]["_ng_environment_server"] == "default_environment_server"
    assert records[4]["agent_ref"] == {"name": "math_simple_agent"}
    assert records[4]["_ng_environment_server"] == "math_environment_server"
    assert records[2]["expected_answer"] == "7" and records[2]["extracted_answer"] == "8"
    assert result.written == 6 and result.failed == 0
    assert not failures_path_for(result.output_path).exists()

    metrics = json.loads(metrics_path_for(result.output_path).read_text())
    assert metrics["num_rollouts"] == 6 and metrics["num_tasks"] == 3
    assert metrics["mean_reward"] == pytest.approx(0.5)
    assert metrics["pass@2"] == pytest.approx(2 / 3)
    assert metrics["pass@1"] == pytest.approx(0.5)
    assert "majority@2" in metrics
    run_m = metrics["run"]
    assert run_m["rollouts_written"] == 6 and run_m["failures_by_class"] == {}
    assert run_m["model_calls"] == 6 and run_m["output_tokens"] > 0
    assert run_m["model_latency_s"]["count"] == 6
    assert run_m["model_latency_s"]["p50"] <= run_m["model_latency_s"]["p99"]


def test_overrides_params_and_seeds(tmp_path, boxed_env):
    env_url, _ = boxed_env
    rows = [arithmetic_row(1, 2), arithmetic_row(2, 2)]
    with FakeModel() as model:
        result, _ = run(
            tmp_path,
            model,
            env_url,
            rows,
            num_repeats=3,
            seed=7,
            overrides={"max_output_tokens": 64, "metadata": {"k": "v"}, "model": "m1"},
        )
        requests = list(model.requests)
    assert len(requests) == 6
    assert all(
        r["max_output_tokens"] == 64 and r["metadata"] == {"k": "v"} and r["model"] == "m1" for r in requests
    )
    records = read_jsonl(result.output_path)
    seeds = {
        (r["_ng_task_index"], r["_ng_rollout_index"]): r["responses_create_params"]["seed"] for r in records
    }
    assert len(set(seeds.values())) == 6  # every rollout its own seed
    assert seeds == {key: rollout_seed(7, *key) for key in seeds}  # reproducible from (seed, task, repeat)
    assert sorted(r["seed"] for r in requests) == sorted(seeds.values())  # and sent to the model
    assert all(r["response"]["model"] == "m1" for r in records)


def test_routing_by_env_field_and_agent_ref(tmp_path, boxed_env, notes_env):
    boxed_url, boxed = boxed_env
    notes_url, _ = notes_env
    rows = [
        arithmetic_row(1, 1, env="arith"),
        arithmetic_row(1, 2, agent_ref={"name": "arith_simple_agent"}),
        arithmetic_row(1, 3, agent_ref={"name": "elsewhere"}),  # -> default
    ]
    before = boxed.verify_calls
    with FakeModel() as model:
        result, _ = run(tmp_path, model, boxed_url, rows, envs=[f"arith={boxed_url}", notes_url])
    records = read_jsonl(result.output_path)
    by_task = {r["_ng_task_index"]: r for r in records}
    assert by_task[0]["reward"] == 1.0 and by_task[1]["reward"] == 1.0
    assert by_task[2]["reward"] == 0.0 and "session_notes" in by_task[2]  # verified by the notes env
    assert boxed.verify_calls - before == 2
    assert by_task[0]["agent_ref"] == {"name": "arith_simple_agent"}  # NeMo Gym's name for the env keyed arith
    assert by_task[0]["_ng_environment_server"] == "arith_environment_server"


def test_parse_env_args_rules():
    routes = parse_env_args(["math", "tools=http://h:1/", "http://h:2?x=1"])
    assert [(r.key, r.target) for r in routes] == [
        ("math", "math"),
        ("tools", "http://h:1/"),
        (None, "http://h:2?x=1"),
    ]
    with pytest.raises(CollectError, match="more than once"):
        parse_env_args(["a=http://h:1", "a=http://h:2"])
    with pytest.raises(CollectError, match="only one env may be a bare URL"):
        parse_env_args(["http://h:1", "http://h:2"])


def test_unrouted_row_is_reported_not_run(tmp_path, boxed_env, notes_env):
    rows = [arithmetic_row(1, 1, env="a"), arithmetic_row(1, 2, env="zzz")]
    with FakeModel() as model:
        result, messages = run(tmp_path, model, None, rows, envs=[f"a={boxed_env[0]}", f"b={notes_env[0]}"])
    assert [r["_ng_task_index"] for r in read_jsonl(result.output_path)] == [0]
    failures = read_jsonl(failures_path_for(result.output_path))
    assert failures[0]["_ng_task_index"] == 1 and failures[0]["_ng_failure_class"] == "bad_task"
    assert "no env" in failures[0]["error"]


def test_bad_rows_are_skipped_with_file_and_line(tmp_path, boxed_env):
    rows = [
        arithmetic_row(1, 1),
        '{"responses_create_params": {"input": [',  # invalid JSON, line 2
        {"question": "no params"},  # line 3
        "",  # blank line: not a row
        arithmetic_row(2, 2),  # line 5, task index 3
        {"responses_create_params": {"input": 5}},  # line 6: input has the wrong type
    ]
    with FakeModel() as model:
        result, messages = run(tmp_path, model, boxed_env[0], rows)
    assert sorted(r["_ng_task_index"] for r in read_jsonl(result.output_path)) == [0, 3]
    failures = read_jsonl(failures_path_for(result.output_path))
    assert [(f["_ng_task_index"], f["_ng_failure_class"]) for f in failures] == [
        (1, "bad_task"), (2, "bad_task"), (4, "bad_task"),
    ]  # fmt: skip
    assert "tasks.jsonl:2: invalid JSON" in failures[0]["error"]
    assert "tasks.jsonl:3: not a task row: 'responses_create_params' is missing" in failures[1]["error"]
    assert "tasks.jsonl:6: not a task row: responses_create_params.input" in failures[2]["error"]
    assert any("tasks.jsonl:2" in m for m in messages)
    assert result.skipped_rows == 3
    assert json.loads(metrics_path_for(result.output_path).read_text())["run"]["bad_task_rows"] == 3


def test_strict_stops_before_running_anything(tmp_path, boxed_env):
    rows = [arithmetic_row(1, 1), {"question": "no params"}]
    with FakeModel() as model:
        with pytest.raises(CollectError, match=r"tasks.jsonl:2: not a task row"):
            run(tmp_path, model, boxed_env[0], rows, strict=True)
        assert model.calls.total() == 0
    assert not (tmp_path / "out" / "rollouts.jsonl").exists()


def test_limit_counts_rows(tmp_path, boxed_env):
    rows = [arithmetic_row(i, 1) for i in range(5)]
    with FakeModel() as model:
        result, _ = run(tmp_path, model, boxed_env[0], rows, limit=2, num_repeats=2)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(result.output_path)) == [
        (0, 0), (0, 1), (1, 0), (1, 1),
    ]  # fmt: skip


def test_existing_output_needs_resume_or_overwrite(tmp_path, boxed_env):
    out = tmp_path / "out" / "rollouts.jsonl"
    out.parent.mkdir()
    out.write_text('{"old": 1}\n')
    with FakeModel() as model:
        with pytest.raises(
            CollectError, match=r"rollouts.jsonl already holds rollouts; use --resume .* --overwrite"
        ):
            run(tmp_path, model, boxed_env[0], [arithmetic_row(1, 1)])
        assert out.read_text() == '{"old": 1}\n'
        result, _ = run(tmp_path, model, boxed_env[0], [arithmetic_row(1, 1)], overwrite=True)
    records = read_jsonl(result.output_path)
    assert len(records) == 1 and "old" not in records[0]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"concurrency": 0}, "--concurrency"),
        ({"num_repeats": 0}, "--num-repeats"),
        ({"envs": []}, "--env"),
        ({"resume": True, "overwrite": True}, "contradict"),
        ({"envs": ["no_such_env"]}, "unknown environment 'no_such_env'"),
    ],
)
def test_config_errors_are_plain(tmp_path, boxed_env, kw, message):
    with FakeModel() as model:
        with pytest.raises(CollectError, match=message):
            run(tmp_path, model, boxed_env[0], [arithmetic_row(1, 1)], **kw)

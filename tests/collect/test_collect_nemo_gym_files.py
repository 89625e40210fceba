"""collect writes what NeMo Gym's ``gym eval run`` writes: materialized inputs, the aggregate file, record stamps.

Against the built-in math server over loopback HTTP; the shapes are NeMo Gym 0.7.0's
(``nemo_gym/rollout_collection.py``, ``nemo_gym/path_utils.py``, ``AggregateMetrics``).
"""

from __future__ import annotations

import json

import httpx
import pytest
from collect_helpers import BoxedAnswerEnv, read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row, solve_arithmetic

from gym_bridge.collect import (
    CollectConfig,
    aggregate_metrics_path_for,
    collect,
    materialized_path_for,
)
from gym_bridge.records.aggregate import strip_for_aggregation
from gym_bridge.records.nemo_gym_record import request_params
from gym_bridge.rollout.envs import running_env
from gym_bridge.serving.uvicorn_thread import start_in_thread

ENTRY_KEYS = [
    "agent_ref",
    "_ng_environment_server",
    "agent_metrics",
    "key_metrics",
    "group_level_metrics",
    "repeat_level_metrics",
]


def one_wrong(request, n):
    if "4 + 4" in json.dumps(request) and n == 1:
        return "I think the answer is \\boxed{9}."
    return solve_arithmetic(request, n)


def _collect(tmp_path, model, **kw):
    rows = [arithmetic_row(2, 3), arithmetic_row(4, 4), arithmetic_row(1, 0)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    config = CollectConfig(
        tasks, tmp_path / "r.jsonl", ["math"], model_url=model.url, num_repeats=2, concurrency=2,
        progress=False, overrides={"temperature": 0.7}, seed=3, **kw,
    )  # fmt: skip
    messages: list[str] = []
    return collect(config, report=messages.append), messages


def test_collect_writes_nemo_gym_side_files(tmp_path):
    with FakeModel(one_wrong) as model:
        result, messages = _collect(tmp_path, model)
    records = read_jsonl(result.output_path)
    assert len(records) == 6
    stamps = {(r["agent_ref"]["name"], r["_ng_environment_server"], r["_ng_result_type"]) for r in records}
    assert stamps == {("math_simple_agent", "math_environment_server", "legacy_agent")}  # NeMo Gym's names

    materialized = read_jsonl(materialized_path_for(result.output_path))
    assert materialized_path_for(result.output_path).name == "r_materialized_inputs.jsonl"
    keys = [(m["_ng_task_index"], m["_ng_rollout_index"]) for m in materialized]
    assert sorted(keys) == sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in records)
    assert len(set(keys)) == len(keys) == 6
    by_key = {(m["_ng_task_index"], m["_ng_rollout_index"]): m for m in materialized}
    for rec in records:
        row = by_key[(rec["_ng_task_index"], rec["_ng_rollout_index"])]
        # as run (overrides, seed); the record's is NeMo Gym's shape of it, without the model server's model
        assert request_params({**row["responses_create_params"], "model": None}) == rec["responses_create_params"]
        assert row["responses_create_params"]["temperature"] == 0.7 and "seed" in row["responses_create_params"]
        assert row["agent_ref"] == rec["agent_ref"] and row["_ng_environment_server"] == "math_environment_server"
        assert row["expected_answer"] == rec["expected_answer"]
        assert "response" not in row and "reward" not in row

    path = aggregate_metrics_path_for(result.output_path)
    assert path.name == "r_aggregate_metrics.json"
    aggregate = json.loads(path.read_text())
    assert aggregate == result.aggregate_metrics
    assert [list(entry) for entry in aggregate] == [ENTRY_KEYS]
    entry = aggregate[0]
    assert entry["agent_ref"] == {"name": "math_simple_agent"}
    assert entry["_ng_environment_server"] == "math_environment_server"
    agent = entry["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(5 / 6)
    assert agent["min/reward"] == 0.0 and agent["max/reward"] == 1.0 and agent["num_repeats"] == 2
    assert agent["pass@2"] == 1.0 and agent["majority@2"] == pytest.approx(2 / 3)
    assert agent["mean/output_tokens"] > 0
    assert entry["key_metrics"]["mean/reward"] == agent["mean/reward"]
    assert entry["key_metrics"]["pass@2"] == 1.0
    groups = entry["group_level_metrics"]
    assert [g["_ng_task_index"] for g in groups] == [0, 1, 2]
    assert [g["mean/reward"] for g in groups] == [1.0, 0.5, 1.0]
    assert groups[1]["std/reward"] == pytest.approx(2**-0.5)
    repeats = entry["repeat_level_metrics"]
    assert [(r["_ng_rollout_index"], r["sample_count"], r["missing_count"]) for r in repeats] == [(0, 3, 0), (1, 3, 0)]
    assert [r["mean/reward"] for r in repeats] == [pytest.approx(2 / 3), 1.0]
    assert not any("aggregate_metrics failed" in m for m in messages)


def test_resume_after_a_crash_keeps_one_materialized_row_per_rollout(tmp_path):
    with FakeModel(one_wrong) as model:
        result, _ = _collect(tmp_path, model)
        lines = result.output_path.read_text().splitlines(keepends=True)
        result.output_path.write_text("".join(lines[:3]) + lines[3][:20])  # two lost, one torn
        aggregate_metrics_path_for(result.output_path).unlink()
        resumed, _ = _collect(tmp_path, model, resume=True)
    assert resumed.already_done == 3 and resumed.written == 3
    materialized = read_jsonl(materialized_path_for(result.output_path))
    keys = [(m["_ng_task_index"], m["_ng_rollout_index"]) for m in materialized]
    assert sorted(keys) == [(t, r) for t in range(3) for r in range(2)]
    assert json.loads(aggregate_metrics_path_for(result.output_path).read_text())[0]["agent_metrics"][
        "num_rollouts"
    ] == 6


def test_the_aggregate_of_records_kept_as_written_is_the_one_read_back_from_the_output(tmp_path):
    """A fresh run posts the records it kept as it wrote them (``AggregateSpool``); the answer is the one
    the records read back from ``-o`` get (what a resumed run and ``reverify`` post), and nothing is left
    beside the output."""
    import asyncio

    from gym_bridge.collect import env_aggregate_metrics
    from gym_bridge.rollout.agent import make_session

    with FakeModel(one_wrong) as model:
        result, _ = _collect(tmp_path, model)

    async def read_back(url: str) -> list:
        session = make_session()
        try:
            return await env_aggregate_metrics(session, result.output_path, {"math": url}, print)
        finally:
            await session.close()

    with running_env("math") as url:
        assert asyncio.run(read_back(url)) == result.aggregate_metrics != []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "r.jsonl", "r_aggregate_metrics.json", "r_materialized_inputs.jsonl", "r_metrics.json", "tasks.jsonl",
    ]  # fmt: skip


class NoAggregation(BoxedAnswerEnv):
    def aggregate_metrics(self, records):
        raise RuntimeError("no aggregation here")


def test_an_env_whose_aggregation_fails_costs_only_the_aggregate_file(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(2, 3)])
    messages: list[str] = []
    with start_in_thread(NoAggregation().build_app()) as env, FakeModel() as model:
        result = collect(
            CollectConfig(tasks, tmp_path / "r.jsonl", [env.url], model_url=model.url, progress=False),
            report=messages.append,
        )
    assert result.written == 1 and result.aggregate_metrics == []
    assert not aggregate_metrics_path_for(result.output_path).exists()
    assert [m for m in messages if "/aggregate_metrics failed (HTTP 500" in m]
    assert len(read_jsonl(materialized_path_for(result.output_path))) == 1


# --------------------------------------------------------------------------- the server side, over HTTP


@pytest.fixture(scope="module")
def math_url():
    with running_env("math") as url:
        yield url


def _verified(url, answer, expected, task, repeat):
    body = {
        "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
        "response": {
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}],
            "usage": {"input_tokens": 10, "output_tokens": 5 + task, "total_tokens": 15 + task},
            "incomplete_details": None,
        },
        "expected_answer": expected,
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
    }
    return httpx.post(f"{url}/verify", json=body, timeout=30).json()


def test_server_takes_what_nemo_gym_posts_and_answers_its_aggregate_shape(math_url):
    records = [
        _verified(math_url, "\\boxed{4}", "4", 0, 0),
        _verified(math_url, "\\boxed{5}", "4", 0, 1),
        _verified(math_url, "\\boxed{2}", "2", 1, 0),
        _verified(math_url, "\\boxed{2}", "2", 1, 1),
    ]
    stripped = [strip_for_aggregation(r) for r in records]
    assert all("responses_create_params" not in s and set(s["response"]) == {"usage"} for s in stripped)
    answer = httpx.post(f"{math_url}/aggregate_metrics", json={"verify_responses": stripped}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"group_level_metrics", "agent_metrics", "key_metrics", "repeat_level_metrics"}
    agent = body["agent_metrics"]
    assert agent["mean/reward"] == 0.75 and agent["pass@1"] == 0.75 and agent["pass@2"] == 1.0
    assert agent["mean/output_tokens"] == 5.5 and agent["mean/library_reward"] == 0.75
    assert agent["extraction_methods"] == {"boxed": 4}
    assert body["key_metrics"] == {
        "mean/reward": 0.75, "mean/library_reward": 0.75, "mean/input_tokens": 10.0, "mean/output_tokens": 5.5,
        "mean/total_tokens": 15.5, "pass@1": 0.75, "pass@2": 1.0, "majority@2": 1.0,
    }  # fmt: skip
    assert [g["mean/reward"] for g in body["group_level_metrics"]] == [0.5, 1.0]
    assert [r["mean/reward"] for r in body["repeat_level_metrics"]] == [1.0, 0.5]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"verify_responses": 3}, "verify_responses: expected a list"),
        ({"verify_responses": [{"reward": 1.0}, {"_ng_task_index": 0}]}, "verify_responses.1.reward"),
        ({"verify_responses": [{"reward": "1"}]}, "verify_responses.0.reward"),
        ({"verify_responses": [{"reward": 1.0, "_ng_task_index": -1}]}, "verify_responses.0._ng_task_index"),
        ({"verify_responses": ["x"]}, "verify_responses.0: expected an object"),
    ],
)
def test_aggregate_refuses_what_it_cannot_score_naming_the_field(math_url, body, detail):
    answer = httpx.post(f"{math_url}/aggregate_metrics", json=body, timeout=30)
    assert answer.status_code == 422 and detail in answer.json()["detail"]


def test_reverify_mode_as_nemo_gym_asks_for_it():
    for name, mode in (("math", "stateless"), ("code", "stateless"), ("tool_use", "unsupported")):
        with running_env(name) as url:
            answer = httpx.get(f"{url}/reverify_mode", timeout=30)
        assert answer.status_code == 200 and answer.json() == mode, name


# --------------------------------------------------------------------------- held against NeMo Gym's own answer

AGGREGATE_FIXTURE = "aggregate_metrics_0.7.0.json"


def _check_schema(answer: dict, schema: dict) -> None:
    """NeMo Gym's ``AggregateMetrics`` schema (vendored): every key one of its fields, each of the field's type."""
    assert set(answer) <= set(schema["properties"]), set(answer) - set(schema["properties"])
    for name, value in answer.items():
        spec = schema["properties"][name]
        allowed = [s["type"] for s in spec.get("anyOf", [spec])]
        kind = {dict: "object", list: "array", type(None): "null"}[type(value)]
        assert kind in allowed, (name, kind, allowed)
        if kind == "array":
            assert all(isinstance(item, dict) for item in value), name


def test_aggregate_answer_matches_nemo_gyms_own_on_the_same_body(math_url, reference_dir):
    """The body NeMo Gym 0.7.0 posts, our answer over HTTP, NeMo Gym's answer to the same body (vendored):
    same shape, every statistic NeMo Gym computes that we compute has NeMo Gym's value, plus our pass@k."""
    fixture = json.loads((reference_dir / AGGREGATE_FIXTURE).read_text())
    request, theirs = fixture["request"], fixture["nemo_gym_answer"]
    assert all("responses_create_params" not in r and set(r["response"]) == {"usage"} for r in request["verify_responses"])
    answer = httpx.post(f"{math_url}/aggregate_metrics", json=request, timeout=30)
    assert answer.status_code == 200, answer.text
    ours = answer.json()
    _check_schema(ours, fixture["schema"])
    _check_schema(theirs, fixture["schema"])
    assert all(ours[name] for name in ("group_level_metrics", "agent_metrics", "key_metrics", "repeat_level_metrics"))

    def same(mine: dict, nemo: dict, where: str) -> None:
        stats = {k for k in nemo if "/" in k and not k.startswith(("ci_", "histogram"))}  # no CI: no scipy here
        assert stats <= set(mine), (where, sorted(stats - set(mine)))
        assert {k: mine[k] for k in stats} == pytest.approx({k: nemo[k] for k in stats}), where
        assert not {k for k in mine if k.endswith("/mask_sample")}, where  # a bool is no number to NeMo Gym

    for mine, nemo in zip(ours["group_level_metrics"], theirs["group_level_metrics"], strict=True):
        assert mine["_ng_task_index"] == nemo["_ng_task_index"] and mine["num_rollouts"] == nemo["num_rollouts"]
        same(mine, nemo, f"group {nemo['_ng_task_index']}")
    for mine, nemo in zip(ours["repeat_level_metrics"], theirs["repeat_level_metrics"], strict=True):
        for key in ("_ng_rollout_index", "sample_count", "missing_count"):
            assert mine[key] == nemo[key]
        same(mine, nemo, f"repeat {nemo['_ng_rollout_index']}")
    same(ours["agent_metrics"], theirs["agent_metrics"], "agent_metrics")
    assert ours["agent_metrics"]["num_repeats"] == theirs["agent_metrics"]["num_repeats"] == 2
    assert set(theirs["key_metrics"]) <= set(ours["key_metrics"])
    assert {k: ours["key_metrics"][k] for k in theirs["key_metrics"]} == pytest.approx(theirs["key_metrics"])
    assert ours["key_metrics"]["pass@2"] == 1.0 and ours["key_metrics"]["pass@1"] == pytest.approx(4 / 6)
    assert ours["key_metrics"]["majority@2"] == 1.0


def test_standard_deviations_in_floats_agree_with_exact_ones():
    """``std/`` is summed in floats (pandas' way, NeMo Gym's figure), not in exact fractions: equal to
    ``statistics.stdev`` within float rounding; exactly 0 for one value or equal values."""
    import random
    import statistics

    from gym_bridge.records.aggregate import _stdev

    rng = random.Random(0)
    for n in (2, 3, 8, 64, 1000):
        for scale in (1.0, 1e-6, 1e9):
            xs = [rng.gauss(0.5, 1) * scale for _ in range(n)]
            assert _stdev(xs) == pytest.approx(statistics.stdev(xs), rel=1e-12)
        ints = [float(rng.randrange(100)) for _ in range(n)]
        assert _stdev(ints) == pytest.approx(statistics.stdev(ints), rel=1e-12)
    assert _stdev([]) == _stdev([0.1]) == _stdev([0.1] * 7) == _stdev([1e300, 1e300]) == 0.0
    assert _stdev([1e300, -1e300]) == pytest.approx(statistics.stdev([1e300, -1e300]))  # squares overflow floats


def test_every_statistic_is_the_one_its_function_gives_for_every_task_repeat_and_field():
    """The statistics, computed for all tasks at once, are exactly (bit for bit) what ``statistics.fmean``,
    ``max``, ``min``, ``statistics.median``, ``_stdev`` and pandas' linear quantiles give for each group,
    with groups of 1 to 7 records, fields some records lack, signed zeros and huge values."""
    import math
    import random
    import statistics

    from gym_bridge.records.aggregate import _stdev, nemo_gym_aggregate
    from gym_bridge.records.metrics import aggregate_rewards

    def quantile(xs, q):
        xs = sorted(xs)
        pos = (len(xs) - 1) * q
        low = math.floor(pos)
        return xs[low] + (xs[min(low + 1, len(xs) - 1)] - xs[low]) * (pos - low)

    def described(rows, label, sem_name=None, quantiles=False):
        out = {}
        fields = list(dict.fromkeys(key for row in rows for key in row))
        stats = {"mean": statistics.fmean, "max": max, "min": min, "median": statistics.median, "std": _stdev}
        if sem_name:
            stats[sem_name] = lambda xs: _stdev(xs) / len(xs) ** 0.5
        if quantiles:
            stats.update(p25=lambda xs: quantile(xs, 0.25), p75=lambda xs: quantile(xs, 0.75))
        for stat, fn in stats.items():
            for field in fields:
                out[label.format(stat, field)] = fn([row[field] for row in rows if field in row])
        return out

    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, 0.25, 3.0, -2.5, 1e300, -1e300, 5e-324, 0.1]
    for _ in range(40):
        records = []
        for task in range(rng.randrange(1, 6)):
            for repeat in range(rng.randrange(1, 8)):
                record = {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": rng.choice(values)}
                record.update({f: rng.choice(values) for f in ("a", "b") if rng.random() < 0.7})
                records.append(record)
        answer = nemo_gym_aggregate(records, aggregate_rewards)
        rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in records]

        def where(index: str, value: int, rows=rows, records=records) -> list[dict]:
            return [row for row, r in zip(rows, records, strict=True) if r[index] == value]

        tasks = sorted({r["_ng_task_index"] for r in records})
        expected = [described(where("_ng_task_index", t), "{}/{}") for t in tasks]
        got = [{k: v for k, v in g.items() if "/" in k} for g in answer["group_level_metrics"]]
        assert json.dumps(got) == json.dumps(expected)  # the same floats (zeros' signs too), same order
        repeats = sorted({r["_ng_rollout_index"] for r in records})
        if len(repeats) > 1:
            expected = [described(where("_ng_rollout_index", i), "{}/{}", "sem", True) for i in repeats]
            got = [{k: v for k, v in g.items() if "/" in k} for g in answer["repeat_level_metrics"]]
            assert json.dumps(got) == json.dumps(expected)
        agent = {k: v for k, v in answer["agent_metrics"].items() if "/" in k and "across" not in k}
        assert json.dumps(agent) == json.dumps(described(rows, "{}/{}"))


def test_a_record_and_its_stripped_form_encoded_together_are_what_each_encodes_to():
    """The output line and the ``/aggregate_metrics`` entry spliced from one encoding are exactly the
    compact JSON of the record and of the record stripped, whatever order and fields it has."""
    import random

    from gym_bridge.records.aggregate import _HEAVY, whole_and_stripped_json
    from gym_bridge.records.jsonl import compact_json

    rng = random.Random(5)
    heavy = list(_HEAVY)
    light = ["reward", "question", "_ng_task_index", "agent_ref", 7]
    values = [1, 2.5, "é \u2028", None, [], {}, {"usage": {"input_tokens": 3}}, {"incomplete_details": {}}]
    for _ in range(3000):
        if rng.random() < 0.5:  # a verify answer's order: the heavy fields first
            keys = rng.sample(heavy, rng.randrange(3)) + rng.sample(light, rng.randrange(len(light)))
        else:
            keys = rng.sample(heavy + light, rng.randrange(len(heavy + light)))
        record = {key: rng.choice(values) for key in keys}
        expected = (compact_json(record), compact_json(strip_for_aggregation(record)))
        assert whole_and_stripped_json(record) == expected


def test_the_aggregate_file_has_a_line_per_task_and_reads_back_equal(tmp_path):
    """``write_json(..., flat_below=3)``: indented down to each entry's fields, then one line per value
    (a task's metrics on one line); any JSON value reads back equal, keys JSON must convert included."""
    from gym_bridge.collect.output import write_json

    groups = [{"_ng_task_index": i, "mean/reward": i / 3, "std/reward": 0.5} for i in range(4)]
    aggregate = [{"agent_ref": {"name": "math"}, "agent_metrics": {"mean/reward": 0.5}, "group_level_metrics": groups,
                  "repeat_level_metrics": []}]  # fmt: skip
    path = tmp_path / "a.json"
    write_json(path, aggregate, flat_below=3)
    text = path.read_text()
    assert json.loads(text) == aggregate
    assert [line.strip().rstrip(",") for line in text.splitlines() if "_ng_task_index" in line] == [
        json.dumps(g) for g in groups
    ]
    assert '\n      "mean/reward": 0.5\n' in text
    for value in ({}, [], {"a": {}, "b": [[], {}], 1: {2: [3]}}, [{"x": None}], "s", 2.5, None):
        write_json(path, value, flat_below=3)
        assert json.loads(path.read_text()) == json.loads(json.dumps(value))

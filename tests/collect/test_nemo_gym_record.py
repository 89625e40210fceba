"""collect writes the rollout record NeMo Gym 0.7.0 writes, stamped with NeMo Gym's names for the env.

The reference is a record NeMo Gym 0.7.0 itself wrote (``gym eval run`` with its simple_agent against our
math server and a fake model; tests/data/nemo_gym/math_rollout_of_our_server_0.7.0.json). The same task,
run by ``collect`` against the same server and the same model answers, must give the same line, byte for
byte, once the ids and times the model made up are set aside. ``scripts/nemo_gym_live_check.py`` re-runs
this against NeMo Gym itself, with its ``gym eval aggregate`` and ``gym eval reverify`` on the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, function_call, message

from gym_bridge.collect import CollectConfig, collect, materialized_path_for
from gym_bridge.collect.summary import env_of_stamp
from gym_bridge.records.nemo_gym_record import (
    agent_name_for,
    environment_server_for,
    nemo_gym_record,
    request_params,
    response_object,
)
from gym_bridge.records.nemo_gym_shapes import NEMO_GYM_VERSION, SHAPES
from gym_bridge.records.schema import RolloutRecord, dump

REPO = Path(__file__).resolve().parents[2]
STAMPS = ("_ng_task_index", "_ng_rollout_index", "agent_ref", "_ng_environment_server", "_ng_result_type")


@pytest.fixture(scope="module")
def reference(reference_dir) -> dict:
    return json.loads((reference_dir / "math_rollout_of_our_server_0.7.0.json").read_text())


def _made_up(line: str) -> str:
    """The line with what the model made up (response and item ids, creation time) blanked."""
    line = re.sub(r'"id":"(resp|msg|fc|rs)_[^"]*"', r'"id":"\1_*"', line)
    return re.sub(r'"created_at":[0-9.]+', '"created_at":0', line)


def _collect(tmp_path, rows, script, env="math", **kw):
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    with FakeModel(script) as model:
        config = CollectConfig(tasks, tmp_path / "r.jsonl", [env], model_url=model.url, concurrency=1, progress=False,
                               **kw)  # fmt: skip
        result = collect(config)
    return result.output_path


def test_the_table_is_nemo_gym_0_7_0s():
    assert NEMO_GYM_VERSION == "0.7.0"
    params = [key for key, _, _ in SHAPES["responses_create_params"]]
    assert len(params) == 30 and params[:3] == ["background", "include", "input"] and params[-1] == "stream"


def test_a_collect_record_is_byte_for_byte_the_one_nemo_gym_wrote(tmp_path, reference):
    """Same task, same server (ours, as `gym env start` ran it), same model answers: the same line."""
    usage = reference["model_usage"]

    def fake(request, n):  # what the fake model NeMo Gym talked to answered
        return {"output": [message(reference["model_answer"])], "usage": usage, "metadata": {}}

    out = _collect(tmp_path, [reference["task_row"]], fake, overrides={"model": "fake-model"})
    ours = out.read_text().splitlines()
    assert len(ours) == 1
    theirs = reference["record"]
    assert ours[0] != theirs  # the ids and times differ ...
    assert _made_up(ours[0]) == _made_up(theirs)  # ... and nothing else, byte for byte
    record = json.loads(ours[0])
    assert record["responses_create_params"]["model"] is None  # the model server's, not the record's (NeMo Gym)
    assert record["agent_ref"] == {"name": "math_simple_agent"}
    assert record["_ng_environment_server"] == "math_environment_server"
    materialized = read_jsonl(materialized_path_for(out))[0]
    assert materialized["agent_ref"] == json.loads(reference["materialized_input"])["agent_ref"]


def test_nemo_gym_records_go_through_our_writer_unchanged(reference, reference_dir):
    """The other way: a record NeMo Gym wrote, given to our writer as an env's answer with its own stamps,
    comes out as the same bytes (for our math server's record and for NeMo Gym's own math_with_judge's)."""
    wire = (reference_dir / "math_rollout.wire-captured.json").read_text().strip()
    for line in (reference["record"], wire):
        theirs = json.loads(line)
        stamps = {key: theirs[key] for key in STAMPS}
        ours = nemo_gym_record(theirs, stamps=stamps, model=theirs["responses_create_params"]["model"])
        assert json.dumps(ours, separators=(",", ":"), ensure_ascii=False) == line
        assert dump(RolloutRecord.model_validate(theirs)) == theirs  # and our reader keeps every field


def test_tool_calls_and_their_outputs_are_written_in_nemo_gym_s_shape(tmp_path):
    """A tool_use rollout (function_call, function_call_output, message items): each item has NeMo Gym's
    fields in NeMo Gym's order, and the row's own agent_ref names the environment server."""
    from resources_servers.tool_use.generate import AGENT

    rows = read_jsonl(REPO / "resources_servers" / "tool_use" / "data" / "example.jsonl")[:1]
    assert rows[0]["agent_ref"] == {"name": AGENT}

    def script(request, n):
        if n == 1:
            return [function_call("list_products", {})]
        return "Done."

    out = _collect(tmp_path, rows, script, env="tool_use")
    record = read_jsonl(out)[0]
    kinds = {item["type"]: list(item) for item in record["response"]["output"]}
    assert kinds["function_call"] == ["arguments", "call_id", "name", "type", "id", "status", "namespace"]
    assert kinds["function_call_output"] == ["call_id", "output", "type", "id", "status"]
    assert kinds["message"] == ["id", "content", "role", "status", "type", "phase"]
    assert list(record["response"]["output"][-1]["content"][0]) == ["annotations", "text", "type", "logprobs"]
    sent, written = rows[0]["responses_create_params"]["tools"], record["responses_create_params"]["tools"]
    assert written == sent  # the same tools, in NeMo Gym's key order (FunctionToolParam's)
    assert list(written[0]) == [k for k in ("name", "parameters", "strict", "type", "description") if k in sent[0]]
    assert list(record["response"]["tools"][0]) == ["name", "parameters", "strict", "type", "defer_loading", "description"]
    assert record["agent_ref"] == {"name": "tool_use_simple_agent"}
    assert record["_ng_environment_server"] == "tool_use_environment_server"


def test_names():
    assert agent_name_for("math") == "math_simple_agent"
    assert agent_name_for("http://127.0.0.1:8000") == "default_simple_agent"  # a bare URL is the env "default"
    assert environment_server_for("math_simple_agent") == "math_environment_server"
    assert environment_server_for("workplace_assistant_simple_agent") == "workplace_assistant_environment_server"
    assert environment_server_for("my_agent") == "my_environment_server"  # NeMo Gym drops a trailing _agent
    assert environment_server_for("solver") == "solver_environment_server"
    # our readers take new and old stamps alike
    envs = {"math": "http://h:1"}
    assert env_of_stamp({"_ng_environment_server": "math_environment_server"}, envs) == "math"
    assert env_of_stamp({"_ng_environment_server": "math"}, envs) == "math"  # a file written before
    assert env_of_stamp({"_ng_environment_server": "code_environment_server"}, envs) is None


def test_shapes_fill_nemo_gym_s_defaults_and_keep_what_it_does_not_know():
    params = request_params({"input": [{"role": "user", "content": "hi"}], "temperature": 1, "seed": 3})
    assert params["input"] == [{"content": "hi", "role": "user", "type": "message", "phase": None}]
    assert params["temperature"] == 1.0 and isinstance(params["temperature"], float)  # a float field, as pydantic
    assert params["tools"] == [] and params["tool_choice"] == "auto" and params["parallel_tool_calls"] is True
    assert list(params)[-1] == "seed"  # NeMo Gym would refuse it; kept, after the declared fields
    response = response_object({"id": "r", "created_at": 5, "model": "m", "object": "response", "output": [
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "t"}]},
        {"type": "message", "id": "m", "role": "assistant", "content": [{"type": "output_text", "text": "x"}],
         "prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.5]},
        {"type": "web_search_call", "id": "w", "status": "completed"},
    ], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []})  # fmt: skip
    assert response["created_at"] == 5.0 and response["usage"] is None
    reasoning, trained, unknown = response["output"]
    assert list(reasoning) == ["id", "summary", "type", "encrypted_content", "content"]
    assert list(trained)[:4] == ["prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts"]
    assert trained["content"] == [{"text": "x", "type": "output_text", "logprobs": None}]  # no annotations invented
    assert unknown == {"type": "web_search_call", "id": "w", "status": "completed"}  # no table: as it came


def test_our_readers_take_the_new_records_and_the_old_ones(reference):
    """transform, view and the resume/aggregate readers read a record with NeMo Gym's names and one written
    before (bare env name), and read the same rollout out of both."""
    from gym_bridge.viewer.records import answer_text, summarize
    from transforms.grpo import to_grpo, to_grpo_chat

    new = json.loads(reference["record"])
    old = {**new, "agent_ref": {"name": "math"}, "_ng_environment_server": "math"}  # before NeMo Gym's names
    for record, name in ((new, "math_simple_agent"), (old, "math")):
        chat = to_grpo_chat(record)
        assert chat["task_name"] == name and chat["reward"] == new["reward"]
        assert chat["messages"][-1] == {"role": "assistant", "content": reference["model_answer"]}
        assert to_grpo(record)["output"] == reference["model_answer"]
        summary = summarize(json.dumps(record).encode())
        assert (summary.task_index, summary.reward, summary.answer) == (0, new["reward"], new["extracted_answer"])
        assert answer_text(record) == reference["model_answer"]
        assert env_of_stamp(record, {"math": "http://h:1"}) == "math"


def test_resume_reads_keys_from_new_and_old_records(tmp_path, reference):
    from gym_bridge.collect.output import slim_record
    from gym_bridge.collect.resume_index import read_done

    new = json.loads(reference["record"])
    old = {**new, "agent_ref": {"name": "math"}, "_ng_environment_server": "math", "_ng_rollout_index": 1}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(new) + "\n" + json.dumps(old) + "\n")
    slim: list[dict] = []
    done = read_done(path, print, 2, lambda record: slim.append(slim_record(record)))
    assert (0, 0) in done and (0, 1) in done and [s["reward"] for s in slim] == [new["reward"]] * 2

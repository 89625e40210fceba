"""The schema reads every real NeMo Gym record and writes it back byte-for-byte equal as JSON."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gym_bridge.records.schema import (
    FunctionCall,
    FunctionCallOutput,
    OutputMessage,
    Reasoning,
    Response,
    RolloutRecord,
    TaskRow,
    VerifyRequest,
    VerifyResponse,
    assistant_text,
    content_text,
    dump,
    last_user_text,
    reward_components_problem,
)


def _records(reference_dir, pattern):
    for path in sorted(reference_dir.glob(pattern)):
        if path.suffix == ".json":
            yield path.name, json.loads(path.read_text())
        else:
            for line in path.read_text().splitlines():
                yield path.name, json.loads(line)


NOT_RECORDS = {
    "aggregate_metrics_0.7.0.json",
    "server_entry_schema_0.7.0.json",
    "code_comparator_0.7.0.json",
    "math_parity.jsonl",
    "math_rollout_of_our_server_0.7.0.json",
}  # NeMo Gym fixtures of other shapes: an aggregate, a config schema, comparator and math verdict tables, and a
# record wrapped with its provenance (tests/collect/test_nemo_gym_record.py reads it)


def test_every_reference_record_round_trips(reference_dir):
    seen = 0
    for name, raw in _records(reference_dir, "*.json*"):
        if name in NOT_RECORDS:
            continue
        model = (RolloutRecord if "response" in raw else TaskRow).model_validate(raw)
        assert dump(model) == raw, name
        # and through a JSON string, as a writer would
        again = type(model).model_validate_json(json.dumps(dump(model)))
        assert dump(again) == raw, name
        seen += 1
    assert seen == 18


def test_wire_record_fields(reference_dir):
    raw = json.loads((reference_dir / "math_rollout.wire-captured.json").read_text())
    rec = RolloutRecord.model_validate(raw)
    assert rec.ng_task_index == 2 and rec.ng_rollout_index == 0
    assert rec.agent_ref is not None and rec.agent_ref.name == "math_with_judge_simple_agent"
    assert rec.reward == 1.0 and rec.mask_sample is False
    assert rec.expected_answer == "4"  # extras pass through as attributes
    assert assistant_text(rec.response.output) == "The answer is \\boxed{4}"
    assert last_user_text(rec.responses_create_params).endswith("What is 2 + 2? (task 2)")


def test_output_items_are_typed(reference_dir):
    kinds = set()
    for _, raw in _records(reference_dir, "*rollouts*.jsonl"):
        for item in RolloutRecord.model_validate(raw).response.output:
            kinds.add(type(item))
    assert {OutputMessage, FunctionCall, FunctionCallOutput, Reasoning} <= kinds


def test_unknown_output_item_passes_through():
    raw = {"output": [{"type": "web_search_call", "id": "ws_1", "status": "completed"}]}
    resp = Response.model_validate(raw)
    assert resp.output[0] == raw["output"][0]
    assert dump(resp) == raw


def test_content_parts_and_string_input():
    row = TaskRow.model_validate(
        {
            "responses_create_params": {
                "input": [
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": [{"type": "input_text", "text": "x = "}, {"type": "input_text", "text": "2"}]},
                ]
            }
        }
    )
    assert last_user_text(row.responses_create_params) == "x = 2"
    assert last_user_text({"input": "plain"}) == "plain"
    assert last_user_text({"input": [{"role": "system", "content": "s"}]}) == ""


def test_assistant_text_joins_messages_and_skips_tools():
    output = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
    ]
    assert assistant_text(output) == "ab c"
    assert assistant_text(Response.model_validate({"output": output}).output) == "ab c"


@pytest.mark.parametrize(
    "message",
    [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}, {"text": "b", "x": 1}]},
        {"type": "message", "role": "user", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "a"}, {"text": 5}, {"type": "refusal"}]},
        {"type": "message"},
        {"type": "message", "role": "assistant", "content": []},
    ],
)
def test_assistant_text_of_models_reads_what_their_dump_says(message):
    """Messages are read in place, not dumped: the text must be what the dump-based reading gives."""

    def by_dump(output):
        texts = [dump(item) for item in output]
        return " ".join(
            content_text(d.get("content"))
            for d in texts
            if d.get("type") == "message" and d.get("role", "assistant") == "assistant"
        )

    validated = Response.model_validate({"output": [message]}).output
    built = [OutputMessage(**{k: v for k, v in message.items() if k != "type"})]  # type never set: no message
    for output in (validated, built):
        assert assistant_text(output) == by_dump(output)
    assert assistant_text(built) == ""


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "responses_create_params"),
        ({"responses_create_params": {"input": 3}}, "responses_create_params.input"),
        ({"responses_create_params": {"input": "x", "temperature": "hot"}}, "responses_create_params.temperature"),
        ({"responses_create_params": {"input": "x"}, "response": {"output": [{"type": "function_call"}]}}, "call_id"),
    ],
)
def test_bad_records_name_the_field(body, field):
    with pytest.raises(ValidationError) as err:
        VerifyRequest.model_validate(body)
    assert field in str(err.value)


def test_verify_response_requires_reward():
    base = {"responses_create_params": {"input": "x"}, "response": {"output": []}}
    with pytest.raises(ValidationError, match="reward"):
        VerifyResponse.model_validate(base)
    assert VerifyResponse.model_validate({**base, "reward": 1}).reward == 1.0


def test_verify_response_carries_reward_components_unchanged():
    base = {"responses_create_params": {"input": "x"}, "response": {"output": []}, "reward": 2.0}
    body = {**base, "reward_components": {"correct": 1.0, "format": 1}}
    parsed = VerifyResponse.model_validate(body)
    assert parsed.reward_components == {"correct": 1.0, "format": 1.0}
    assert dump(parsed)["reward_components"] == {"correct": 1.0, "format": 1}
    assert "reward_components" not in dump(VerifyResponse.model_validate(base))


@pytest.mark.parametrize(
    "components, message",
    [
        ({"correct": float("nan")}, "correct: expected a finite number"),
        ({"correct": float("inf")}, "correct: expected a finite number"),
        ({"correct": True}, "correct: expected a finite number"),
        ({"correct": "1"}, "correct: expected a finite number"),
        ({"": 1.0}, "a component name must be 1 to 128 characters"),
        ({"x" * 129: 1.0}, "a component name must be 1 to 128 characters"),
        ({f"c{i}": 0.0 for i in range(65)}, "65 components, at most 64 allowed"),
        ([1.0], "expected an object of {name: number}, got list"),
    ],
)
def test_bad_reward_components_are_refused_naming_the_entry(components, message):
    body = {"responses_create_params": {"input": "x"}, "response": {"output": []}, "reward": 1.0}
    assert message in reward_components_problem(components)
    with pytest.raises(ValidationError) as err:
        VerifyResponse.model_validate({**body, "reward_components": components})
    assert "reward_components" in str(err.value) and message in str(err.value)

"""The math server's verify record is the request echoed with the verdict: built from the request's own
validated models, it must be exactly the record the old way built (dump the request, validate it all again)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from gym_bridge.records.schema import dump
from resources_servers.math.app import MathVerifyRequest, MathVerifyResponse, _answer

_REQUEST = TypeAdapter(MathVerifyRequest)

_RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "created_at": 1795822573,  # an int where the model declares a float
    "model": "m",
    "object": "response",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{\"x\": 1}", "extra": [1, 2]},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "The answer is \\boxed{4}.", "annotations": []},
            {"type": "refusal", "refusal": "no"},
            {"text": "a part with no type"},
        ], "prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]},
        {"type": "message", "role": "user", "content": "a plain string turn"},
        {"type": "web_search_call", "id": "ws", "status": "completed"},
    ],
    "usage": {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14, "input_tokens_details": {"cached_tokens": 0}},
    "parallel_tool_calls": True,
    "temperature": 1,
    "tools": [{"type": "function", "name": "calc", "parameters": {"type": "object"}}],
    "metadata": {},
    "error": None,
    "incomplete_details": None,
}

_ROWS: list[dict[str, Any]] = [
    {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]}, "expected_answer": "4"},
    {  # every kind of field: typed, extra, nested extras, ints for floats, an int answer, unicode
        "responses_create_params": {
            "input": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2? é"}],
            "temperature": 1,
            "top_p": 0.5,
            "max_output_tokens": 64,
            "tools": [{"type": "function", "name": "calc", "parameters": {}}],
            "seed": 7,
            "metadata": {"k": [1, {"n": None}]},
        },
        "agent_ref": {"name": "math_simple_agent", "extra": 1},
        "expected_answer": 4,
        "question": "2+2?",
        "extraction": "boxed_or_final",
        "strict": False,
        "reward_components": {"format": 1},  # an extra of the request, a field of the record
        "tags": ["a", {"b": 1.5}],
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
    },
    {"responses_create_params": {"input": "a plain string prompt"}, "expected_answer": "x", "agent_ref": None},
]


def _old_answer(body: MathVerifyRequest, **verdict: Any) -> MathVerifyResponse:
    """The record as the math server built it before: the whole request dumped and validated again."""
    return MathVerifyResponse.model_validate({**dump(body), **verdict})


@pytest.mark.parametrize("row", _ROWS)
@pytest.mark.parametrize(
    "verdict",
    [
        {"reward": 1.0, "extracted": "4", "method": "boxed"},
        {"failure": ("no_answer", "the response has no final answer")},
    ],
)
def test_the_record_is_the_one_a_full_revalidation_builds(row: dict[str, Any], verdict: dict[str, Any]) -> None:
    body = _REQUEST.validate_python({**row, "response": _RESPONSE})
    new = _answer(body, **verdict)
    kind, reason = verdict.get("failure") or (None, None)
    old = _old_answer(
        body,
        reward=verdict.get("reward", 0.0),
        extracted_answer=verdict.get("extracted"),
        extraction_method=verdict.get("method"),
        library_reward=verdict.get("reward", 0.0),
        judge_evaluations=None,
        failure_kind=kind,
        failure_reason=reason,
        mask_sample=False,
    )
    assert json.dumps(dump(new)) == json.dumps(dump(old))  # same fields, values, types and order
    assert new.model_fields_set == old.model_fields_set


def test_a_request_field_the_record_declares_is_still_validated() -> None:
    """``reward_components`` is an extra of the request but a checked field of the record: a bad one is
    refused as before (the server answers 500), never echoed."""
    body = _REQUEST.validate_python({**_ROWS[0], "reward_components": {"x": "high"}, "response": _RESPONSE})
    with pytest.raises(ValidationError):
        _old_answer(body, reward=1.0)
    with pytest.raises(ValidationError):
        _answer(body, reward=1.0)

"""Completion text -> output items: tool calls, malformed JSON kept as text, reasoning, empty output."""

from __future__ import annotations

import json

from gym_bridge.policy.tool_calls import completion_to_output_items, parse_completion
from gym_bridge.records.schema import FunctionCall, OutputMessage, Reasoning


def test_plain_text_is_one_message():
    parsed = parse_completion("The answer is \\boxed{4}.")
    assert parsed.text == "The answer is \\boxed{4}."
    assert parsed.tool_calls == []


def test_several_calls_with_text_around_them():
    text = (
        "Let me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {"tz": "CET", "fmt": 24}}</tool_call>'
        " done"
    )
    parsed = parse_completion(text)
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(parsed.tool_calls[0].arguments) == {"city": "Paris"}
    assert json.loads(parsed.tool_calls[1].arguments) == {"tz": "CET", "fmt": 24}
    assert parsed.text == "Let me check.\n\n done"


def test_malformed_json_stays_as_text_and_does_not_hide_the_next_call():
    bad = '<tool_call>{"name": "broken", "arguments": {"x": </tool_call>'
    unclosed_bad = "<tool_call>{not json "
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    parsed = parse_completion(f"{unclosed_bad}{bad} then {good}")
    assert [c.name for c in parsed.tool_calls] == ["ok"]
    assert parsed.tool_calls[0].arguments == "{}"
    assert bad in parsed.text and unclosed_bad in parsed.text


def test_calls_without_a_name_or_with_non_object_arguments_stay_as_text():
    for body in (
        '{"arguments": {}}',
        '{"name": "", "arguments": {}}',
        '{"name": "f", "arguments": [1]}',
        "[1, 2]",
    ):
        parsed = parse_completion(f"<tool_call>{body}</tool_call>")
        assert parsed.tool_calls == [], body
        assert body in parsed.text


def test_string_arguments_and_parameters_alias():
    parsed = parse_completion(
        '<tool_call>{"name": "a", "arguments": "{\\"q\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"q": 2}}</tool_call>'
        '<tool_call>{"name": "c", "arguments": "not json"}</tool_call>'
    )
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("a", {"q": 1}),
        ("b", {"q": 2}),
    ]
    assert '"name": "c"' in parsed.text


def test_unterminated_final_call_is_accepted_when_its_json_is_complete():
    parsed = parse_completion('Sure <tool_call>\n{"name": "lookup", "arguments": {"query": "x"}}\n')
    assert [c.name for c in parsed.tool_calls] == ["lookup"]
    assert parsed.text == "Sure"


def test_output_items_order_ids_and_reasoning():
    items = completion_to_output_items(
        '<think>plan it</think>Calling.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    assert [type(i) for i in items] == [Reasoning, OutputMessage, FunctionCall, FunctionCall]
    assert items[0].summary == [{"type": "summary_text", "text": "plan it"}]
    assert items[1].content[0].text == "Calling."
    calls = items[2:]
    assert [c.name for c in calls] == ["f", "g"]
    assert len({c.call_id for c in calls}) == 2 and all(c.call_id.startswith("call_") for c in calls)
    assert json.loads(calls[0].arguments) == {"a": 1}


def test_only_tool_calls_gives_no_message_and_empty_output_gives_an_empty_message():
    only_calls = completion_to_output_items('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert [type(i) for i in only_calls] == [FunctionCall]
    empty = completion_to_output_items("", incomplete=True)
    assert len(empty) == 1 and isinstance(empty[0], OutputMessage)
    assert empty[0].content[0].text == "" and empty[0].status == "incomplete"


def test_reasoning_can_stay_in_the_text():
    parsed = parse_completion("<think>hmm</think>4", extract_reasoning=False)
    assert parsed.text == "<think>hmm</think>4" and parsed.reasoning == []

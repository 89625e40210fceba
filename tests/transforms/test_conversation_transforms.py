"""Multi-turn rollouts (a simulated user's turns in ``response.output``) through ``transform sft`` / ``grpo``:
every turn kept in order, and the sequence the trainer builds from them trains assistant tokens only."""

from __future__ import annotations

import json
from pathlib import Path

from transform_rollouts import read_jsonl, write_jsonl
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.train.batches.rollouts import sequence_from_chat

EXAMPLES = Path(__file__).parents[1] / "data/nemo_gym_examples"
NEMO_GYM_CONVERSATIONS = EXAMPLES / "resources_servers__conversational_tool_use_simulation__example_rollouts.jsonl"


def conversation_record() -> dict:
    """A tool_use conversation as the agent loop records it: ask, the user's answer, a call, its output, done."""
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a store assistant.", "type": "message"},
                {"role": "user", "content": "Cancel one of my orders.", "type": "message"},
            ],
            "tools": [{"type": "function", "name": "cancel_order", "parameters": {"type": "object", "properties": {}}}],
        },
        "response": {"output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Which order?"}]},
            {"content": "It is order O4398.", "role": "user", "type": "message"},
            {"type": "function_call", "call_id": "c1", "name": "cancel_order", "arguments": '{"order_id": "O4398"}'},
            {"type": "function_call_output", "call_id": "c1", "output": '{"status": "cancelled"}'},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cancelled."}]},
        ]},
        "reward": 1.0,
        "reward_components": {"outcome": 1.0, "asked_before_acting": 1.0},
        "agent_ref": {"name": "tool_use_simple_agent"},
    }  # fmt: skip


def _transform(tmp_path: Path, *args: str, records: list[dict]) -> list[dict]:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, records)
    result = CliRunner().invoke(app, ["transform", *args, str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return read_jsonl(out)


def test_sft_and_grpo_chat_keep_every_turn_in_order(tmp_path):
    (sft,) = _transform(tmp_path, "sft", records=[conversation_record()])
    roles = [m["role"] for m in sft["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert sft["messages"][3]["content"] == "It is order O4398."
    assert sft["messages"][4]["tool_calls"][0]["function"]["arguments"] == {"order_id": "O4398"}
    (grpo,) = _transform(tmp_path, "grpo", "--format", "chat", records=[conversation_record()])
    assert grpo["messages"] == sft["messages"] and grpo["reward"] == 1.0


def test_nemo_gym_conversational_rollouts_transform_with_their_user_turns(tmp_path):
    records = [json.loads(line) for line in NEMO_GYM_CONVERSATIONS.read_text().splitlines()]
    out = _transform(tmp_path, "sft", "--min-reward", "0", records=records)
    assert len(out) == len(records)
    for record, sft in zip(records, out, strict=True):
        said = [i["content"] for i in record["response"]["output"] if i.get("role") == "user"]
        users = [m["content"] for m in sft["messages"] if m["role"] == "user"]
        assert users[-len(said) :] == said if said else True
        assert [m["role"] for m in sft["messages"]][-1] == "assistant"


def test_the_trainer_sequence_of_a_conversation_trains_assistant_tokens_only(tmp_path):
    """What the trainer makes of a record without token ids (offline data): each token's mask, checked
    against the role of the chat turn it lies in (read off the template's markers, not the mask)."""
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    (sft,) = _transform(tmp_path, "sft", "--no-tools", records=[conversation_record()])
    messages = sft["messages"]
    prompt, completion = messages[:2], messages[2:]
    token_ids, mask = sequence_from_chat(tokenizer, prompt, completion)
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    role, seen = None, {"assistant": 0, "user": 0, "tool": 0, "system": 0}
    body: list[int] = []
    for position, (token, trained) in enumerate(zip(token_ids, mask, strict=True)):
        if token == start:
            role, body = "?", []
            continue
        if role == "?":  # the role name follows the marker
            body.append(token)
            text = tokenizer.decode(body)
            if text.endswith("\n"):
                role = text.strip()
            assert not trained, position
            continue
        if role is None:  # between turns (the newline after an end-of-turn marker)
            assert not trained, position
            continue
        if role == "user" and "<tool_response>" in tokenizer.decode(token_ids[position : position + 2]):
            role = "tool"
        if role == "assistant":
            assert trained, (position, tokenizer.decode([token]))  # its end-of-turn marker included
        else:
            assert not trained, (role, position, tokenizer.decode([token]))
        seen[role] += 1
        if token == end:
            role = None
    assert all(seen[r] > 3 for r in ("assistant", "user", "tool", "system")), seen
    user_text = tokenizer.encode("It is order O4398.", add_special_tokens=False)
    at = next(i for i in range(len(token_ids)) if token_ids[i : i + len(user_text)] == user_text)
    assert mask[at : at + len(user_text)] == [0] * len(user_text)

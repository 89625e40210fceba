"""``gym-bridge view`` shows a conversation's turns in order, the simulated user's among them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from gym_bridge.viewer.app import Viewer, build_app


def test_user_turns_of_the_output_render_as_user_turns(tmp_path: Path) -> None:
    record = {
        "responses_create_params": {"input": [{"role": "user", "content": "Cancel one of my orders.", "type": "message"}]},
        "response": {"output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Which order?"}]},
            {"content": "It is order O4398.", "role": "user", "type": "message"},
            {"type": "function_call", "call_id": "c1", "name": "cancel_order", "arguments": '{"order_id": "O4398"}'},
            {"type": "function_call_output", "call_id": "c1", "output": '{"status": "cancelled"}'},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cancelled."}]},
        ]},
        "reward": 1.0,
        "reward_components": {"outcome": 1.0, "asked_before_acting": 1.0},
    }  # fmt: skip
    path = tmp_path / "conversations.jsonl"
    path.write_text(json.dumps(record) + "\n")
    viewer = Viewer.for_paths([path])
    assert viewer.files["a"].build().num_records == 1
    page = TestClient(build_app(viewer)).get("/f/a/task/0")
    assert page.status_code == 200
    turns = re.findall(r'<section class="turn (\w+)"><div class="role">([^<]*)</div>.*?>([^<]*)</(?:div|pre)>', page.text, re.S)
    kinds = [(kind, text.strip()) for kind, _, text in turns]
    assert kinds[:2] == [("user", "Cancel one of my orders."), ("assistant", "Which order?")]
    assert kinds[2] == ("user", "It is order O4398.")
    assert [k for k, _ in kinds[3:]] == ["function_call", "function_call_output", "assistant"]

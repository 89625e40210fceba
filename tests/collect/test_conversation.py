"""Multi-turn conversations: a simulated user in the agent loop, against the tool_use store over real HTTP."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, function_call

from gym_bridge.collect import CollectConfig, collect
from gym_bridge.rollout.agent import AgentConfig, make_client, run_rollout
from gym_bridge.rollout.user_sim import USER_STOP, UserSimConfig, user_for
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.generate_conversations import generate, make_conversation

ORDER = re.compile(r"\bO\d+\b")


@pytest.fixture(scope="module")
def store_url():
    with start_in_thread(ToolUseServer().build_app()) as running:
        yield running.url


def cancel_row() -> dict:
    return make_conversation(random.Random(5), "cancel_my_order", "conv-0")


def _said(request: dict, role: str) -> list[str]:
    from gym_bridge.records.schema import content_text

    return [content_text(i.get("content")) for i in request["input"] if i.get("role") == role]


def polite_assistant(request: dict, n: int):
    """Asks which order, cancels the one the user names, then confirms."""
    if any(i.get("type") == "function_call_output" for i in request["input"]):
        return "Your order is cancelled."
    users = _said(request, "user")
    if len(users) >= 2 and (found := ORDER.search(users[-1])):
        return [function_call("cancel_order", {"order_id": found.group(0)})]
    return "Which order would you like to cancel? Please give me the order number."


def hasty_assistant(request: dict, n: int):
    """Cancels an order it picked without asking (a guess)."""
    if any(i.get("type") == "function_call_output" for i in request["input"]):
        return "Done."
    return [function_call("cancel_order", {"order_id": "O1"})]


def run_one(model_url: str, env_url: str, row: dict, **kw):
    async def go():
        async with make_client() as client:
            return await run_rollout(client, row, env_url, AgentConfig(model_url=model_url, **kw))

    return asyncio.run(go())


def test_scripted_user_reveals_when_asked_and_the_store_decides(store_url):
    row = cancel_row()
    oid = row["verifier_metadata"]["user_holds"][0]
    with FakeModel(polite_assistant) as model:
        rollout = run_one(model.url, store_url, row)
    assert rollout.ok, rollout.failure
    output = rollout.record["response"]["output"]
    shape = [(i["type"], i.get("role")) for i in output]
    assert shape == [
        ("message", "assistant"), ("message", "user"), ("function_call", None),
        ("function_call_output", None), ("message", "assistant"),
    ]  # fmt: skip
    assert output[1] == {"content": f"It is order {oid}.", "role": "user", "type": "message"}
    assert rollout.record["reward"] == 1.0
    assert rollout.record["reward_components"] == {"outcome": 1.0, "asked_before_acting": 1.0}
    assert rollout.metrics.user_turns == 1 and rollout.metrics.conversation_end == "user"


def test_acting_without_asking_scores_zero_on_both(store_url):
    with FakeModel(hasty_assistant) as model:
        rollout = run_one(model.url, store_url, cancel_row())
    assert rollout.ok, rollout.failure
    assert rollout.record["reward"] == 0.0
    assert rollout.record["reward_components"] == {"outcome": 0.0, "asked_before_acting": 0.0}
    assert rollout.metrics.user_turns == 0


def test_turn_limit_and_token_budget_end_the_conversation(store_url):
    def nagging(request, n):
        return "Which order? And which one again?"

    row = cancel_row()
    row["user_script"]["reveal"].append({"when": ["again"], "say": "As I said."})
    with FakeModel(nagging) as model:
        limited = run_one(model.url, store_url, row, user=UserSimConfig(max_user_turns=1))
        budget = run_one(model.url, store_url, row, user=UserSimConfig(max_conversation_tokens=5))
        free = run_one(model.url, store_url, row)
    assert limited.metrics.user_turns == 1 and limited.metrics.conversation_end == "max_user_turns"
    assert budget.metrics.user_turns == 0 and budget.metrics.conversation_end == "max_conversation_tokens"
    # without limits the script says each entry once, then ends the conversation itself
    assert free.metrics.user_turns == 2 and free.metrics.conversation_end == "user"
    row["user_script"]["max_turns"] = 0
    with FakeModel(nagging) as model:
        none = run_one(model.url, store_url, row)
    assert none.metrics.user_turns == 0 and none.metrics.conversation_end == "max_user_turns"


def test_a_row_without_a_user_stays_single_turn(store_url):
    row = cancel_row()
    del row["user_script"]
    with FakeModel(polite_assistant) as model:
        rollout = run_one(model.url, store_url, row)
    assert rollout.ok and rollout.metrics.model_calls == 1
    assert rollout.metrics.conversation_end is None
    assert rollout.record["reward_components"]["asked_before_acting"] == 0.0


def test_bad_user_script_is_named():
    with pytest.raises(ValueError, match=r"user_script\.reveal\.0\.say"):
        user_for({"user_script": {"reveal": [{"when": ["x"]}]}}, None)


def test_collect_writes_conversations_in_nemo_gym_shape(tmp_path, store_url):
    rows = generate(0, 4, "train")
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)

    def assistant(request, n):
        users = _said(request, "user")
        if any(i.get("type") == "function_call_output" for i in request["input"]):
            return "All done."
        if len(users) < 2:
            return "Which order or which product do you mean, and how many?"
        if found := ORDER.search(users[-1]):
            return [function_call("cancel_order", {"order_id": found.group(0)})]
        return "Sorry, I cannot do that."

    with FakeModel(assistant) as model:
        result = collect(CollectConfig(tasks, tmp_path / "out.jsonl", [store_url], model_url=model.url, progress=False))
    records = read_jsonl(result.output_path)
    assert result.failed == 0 and len(records) == 4
    for record in records:
        kind = record["verifier_metadata"]["task_kind"]
        users = [i for i in record["response"]["output"] if i.get("role") == "user"]
        assert len(users) == 1 and users[0]["type"] == "message" and isinstance(users[0]["content"], str)
        expected = 1.0 if kind == "cancel_my_order" else 0.0
        assert record["reward"] == expected and record["reward_components"]["outcome"] == expected
        assert record["reward_components"]["asked_before_acting"] == 1.0


def test_llm_user_gets_swapped_roles_and_can_stop(tmp_path, store_url):
    """An LLM user over HTTP: it sees the assistant as 'user', its own turns as 'assistant', no tool traffic."""
    rows = [cancel_row()]
    oid = rows[0]["verifier_metadata"]["user_holds"][0]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    seen: list[dict] = []

    def user_model(request, n):
        seen.append(request)
        said = _said(request, "assistant")
        return USER_STOP if len(said) >= 2 else f"Order {oid}, please."

    with FakeModel(polite_assistant) as model, FakeModel(user_model) as user:
        config = CollectConfig(
            tasks, tmp_path / "out.jsonl", [store_url], model_url=model.url, progress=False,
            user_model_url=user.url, user_params={"temperature": 0.5, "model": "user-llm"},
        )  # fmt: skip
        result = collect(config)
    (record,) = read_jsonl(result.output_path)
    assert result.failed == 0 and record["reward"] == 1.0
    users = [i["content"] for i in record["response"]["output"] if i.get("role") == "user"]
    assert users == [f"Order {oid}, please."]
    first = seen[0]
    assert first["temperature"] == 0.5 and first["model"] == "user-llm" and "tools" not in first
    assert [i["role"] for i in first["input"]] == ["system", "assistant", "user"]
    assert "It is order" in first["input"][0]["content"]  # the script's facts became its instructions
    assert all(i.get("type") == "message" for r in seen for i in r["input"])
    assert json.dumps(seen[-1]).count("cancel_order") == 0  # tool calls are not shown to the user


def test_llm_user_keeps_to_the_rows_max_turns():
    row = cancel_row()
    row["user_script"]["max_turns"] = 1
    user = user_for(row, UserSimConfig(model_url="http://127.0.0.1:9/v1"))
    assert type(user).__name__ == "LLMUser" and user.max_turns == 1
    del row["user_script"]
    assert user_for(row, UserSimConfig(model_url="http://127.0.0.1:9/v1")) is None  # nothing to play


def test_nemo_gym_conversational_records_validate():
    """NeMo Gym's conversational rollouts carry user turns in response.output with a plain string content."""
    from pathlib import Path

    from gym_bridge.records.schema import RolloutRecord

    path = Path(__file__).parents[1] / "data/nemo_gym_examples"
    path = path / "resources_servers__conversational_tool_use_simulation__example_rollouts.jsonl"
    records = read_jsonl(path)
    users = [i for r in records for i in r["response"]["output"] if i.get("role") == "user"]
    assert users and all(i["type"] == "message" and isinstance(i["content"], str) for i in users)
    for raw in records:
        RolloutRecord.model_validate(raw)


def test_generator_is_deterministic_and_held_out_differs():
    train, again, held = generate(0, 20, "train"), generate(0, 20, "train"), generate(0, 20, "heldout")
    assert train == again
    key = lambda r: json.dumps([r["initial_state"], r["verifier_metadata"]], sort_keys=True)  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in held}
    assert {r["verifier_metadata"]["task_kind"] for r in held} == {"cancel_my_order", "buy_my_pick"}
    for row in held:  # the opening never gives away what the user holds
        opening = row["responses_create_params"]["input"][-1]["content"]
        assert not any(fact in opening for fact in row["verifier_metadata"]["user_holds"])


def test_cli_llm_user_is_the_embedded_policy(tmp_path, store_url):
    """``collect --policy <tiny> --user-model-url policy``: the embedded model plays both sides; the user's
    turns are its own generations (not sensible, but real), in the record as user messages."""
    from typer.testing import CliRunner

    from gym_bridge.cli import app
    from tests.train.helpers import save_random_tiny

    model_dir = save_random_tiny(tmp_path / "tiny", seed=7, num_layers=1)
    row = cancel_row()
    row["responses_create_params"]["tools"] = [
        t for t in row["responses_create_params"]["tools"] if t["name"] == "cancel_order"
    ]
    row["user_instructions"] = "You want order O1 cancelled."
    tasks = write_rows(tmp_path / "tasks.jsonl", [row])
    out = tmp_path / "out.jsonl"
    args = ["collect", str(tasks), "-o", str(out), "--env", store_url, "--policy", str(model_dir),
            "--user-model-url", "policy", "--user-param", "max_output_tokens=6", "--user-param", "temperature=1.0",
            "--max-user-turns", "2", "--max-output-tokens", "24", "--param", 'stop=["a", "e", "o", " "]',
            "--num-repeats", "4", "--seed", "1", "--no-progress"]  # fmt: skip
    # (the stop strings end the random model's turns before the token cap, which would end the rollout)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = read_jsonl(out)
    assert len(records) == 4
    for record in records:
        output = record["response"]["output"]
        users = [i for i in output if i.get("role") == "user"]
        assert len(users) <= 2 and all(isinstance(u["content"], str) and u["content"] for u in users)
        assistants = [i for i in output if i.get("type") == "message" and i.get("role") == "assistant"]
        assert len(assistants) >= len(users)  # every user turn answers an assistant turn
        assert "reward_components" in record
    assert any(i.get("role") == "user" for r in records for i in r["response"]["output"])


def test_cli_refuses_bad_user_options(tmp_path):
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    tasks = write_rows(tmp_path / "tasks.jsonl", [cancel_row()])
    base = ["collect", str(tasks), "-o", str(tmp_path / "o.jsonl"), "--env", "tool_use", "--model-url", "http://127.0.0.1:9/v1"]
    bad = CliRunner().invoke(app, [*base, "--user-param", "nonsense"])
    assert bad.exit_code != 0 and "--user-param" in bad.output
    negative = CliRunner().invoke(app, [*base, "--max-user-turns", "-1"])
    assert negative.exit_code != 0 and "--max-user-turns" in negative.output

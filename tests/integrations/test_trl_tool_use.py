"""The tool-use environment inside TRL's GRPOTrainer: multi-turn tool calls over the real HTTP server.

A random tiny model is first taught (a few supervised steps) the one tool call that completes the first
task, so the GRPO run below makes real calls: TRL parses each ``<tool_call>`` block, calls the
environment's method, which posts to the server's ``/add_to_cart`` in the rollout's session, feeds the
answer back and scores the rollout with ``get_reward()`` (``/verify`` of the session's calls). A reward of
1 exists only where the server saw the call.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_bridge.integrations.trl import (
    TASK_ROW_COLUMN,
    ServerEnvironment,
    enable_tool_call_parsing,
    gym_environment_factory,
    task_dataset,
)
from gym_bridge.rollout.envs import running_env

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[2]
TOOL_ROWS = REPO / "resources_servers" / "tool_use" / "data" / "example.jsonl"
CALL = '<tool_call>\n{"name": "add_to_cart", "arguments": {"product_id": "P450", "quantity": 1}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tool_url() -> Iterator[str]:
    with running_env("tool_use") as url:
        yield url


def random_tiny(out: Path) -> Path:
    """A random 2-layer tiny Llama whose context holds the tool-use prompt (about 2,300 tokens with tools)."""
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=4096)
    new_tiny_model(tokenizer, recipe, seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def trl_prompt_ids(tokenizer, env: ServerEnvironment, prompt: list[dict]) -> list[int]:  # type: ignore[no-untyped-def]
    """The prompt as TRL renders it for an environment: its public methods as tools, in name order."""
    tools = [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")]  # fmt: skip
    rendered = tokenizer.apply_chat_template(
        conversation=[prompt], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(rendered["input_ids"][0])


def teach_the_call(model, tokenizer, prompt_ids: list[int], steps: int = 60) -> None:  # type: ignore[no-untyped-def]
    """Supervised steps on ``CALL`` after the prompt, until the model says it greedily."""
    target = tokenizer(CALL, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + target])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def test_grpo_trainer_runs_tool_calls_against_the_tool_use_server(tool_url: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    model_dir = random_tiny(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = enable_tool_call_parsing(AutoTokenizer.from_pretrained(model_dir))
    dataset = task_dataset(TOOL_ROWS).select([0])  # "Add 1 of product P450 to my cart."
    assert json.loads(dataset[0][TASK_ROW_COLUMN])["verifier_metadata"]["expected_calls"][0]["name"] == "add_to_cart"
    Env = gym_environment_factory(tool_url, dataset)
    teach_the_call(model, tokenizer, trl_prompt_ids(tokenizer, Env(), dataset[0]["prompt"]))

    verified: list[tuple[dict, list]] = []  # every /verify answer, with the calls the rollout made

    class Recording(Env):  # type: ignore[misc, valid-type]
        def get_reward(self) -> float:
            reward = super().get_reward()
            verified.append((self.last_answer, list(self.output)))
            return reward

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=64, max_tool_calling_iterations=1, temperature=0.5, max_steps=2,
        learning_rate=1e-5, beta=0.0, bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True,
        logging_steps=1, save_strategy="no", report_to="none", seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, environment_factory=Recording
    )
    trainer.train()

    logged = [h for h in trainer.state.log_history if "rewards/Recording/mean" in h]
    assert len(logged) == 2 and len(verified) == 8  # 2 steps x 4 rollouts, each scored by the server
    for step, record in enumerate(logged):
        batch = verified[4 * step : 4 * step + 4]
        assert all(answer is not None for answer, _ in batch), "a /verify failed"
        assert record["rewards/Recording/mean"] == pytest.approx(sum(a["reward"] for a, _ in batch) / 4)
    assert any(answer["reward"] == 1.0 for answer, _ in verified)
    for answer, output in verified:
        calls = [item for item in output if item.type == "function_call"]
        results = [json.loads(item.output) for item in output if item.type == "function_call_output"]
        if answer["reward"] == 1.0:  # the server's session saw the call: its answer is the cart
            assert [c.name for c in calls] == ["add_to_cart"]
            assert json.loads(calls[0].arguments) == {"product_id": "P450", "quantity": 1}
            assert "error" not in results[0] and "P450" in json.dumps(results[0])
    assert logged[-1]["tools/call_frequency"] > 0

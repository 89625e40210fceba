"""The TRL bridge against real resources servers over loopback HTTP.

The reward function and the tool environment follow TRL's calling conventions and need no TRL; only the
last test runs TRL's GRPOTrainer itself (TRL is in the ``[dev]`` extra).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.integrations.trl import (
    TASK_ROW_COLUMN,
    GymReward,
    completion_response,
    gym_environment_factory,
    response_body,
    task_dataset,
)
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.rollout.envs import running_env
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.serving.uvicorn_thread import start_in_thread

REPO = Path(__file__).resolve().parents[2]
MATH_ROWS = REPO / "resources_servers" / "math" / "data" / "example.jsonl"
TOOL_ROWS = REPO / "resources_servers" / "tool_use" / "data" / "example.jsonl"


class SessionCountingEnv(ResourcesServer):
    """Counts seedings; rewards 1 only when ``/verify`` arrives in the session seeded with the same row."""

    name = "session_counting"

    def __init__(self) -> None:
        super().__init__()
        self.seeds = 0
        self.verifies = 0

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        self.seeds += 1
        session.state["tag"] = body.get("tag")
        return {}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        self.verifies += 1
        if getattr(body, "explode", False):
            raise RuntimeError("boom")  # an unhandled server error: a 500
        same_session = session.state.get("tag") == getattr(body, "tag", None)
        saw_text = assistant_text(body.response.output) == f"answer {body.tag}"  # type: ignore[attr-defined]
        return VerifyResponse(**dump(body), reward=float(same_session and saw_text))


@pytest.fixture()
def counting() -> Iterator[tuple[SessionCountingEnv, str]]:
    env = SessionCountingEnv()
    with start_in_thread(env.build_app()) as running:
        yield env, running.url


@pytest.fixture(scope="module")
def math_url() -> Iterator[str]:
    with running_env("math", workers=1) as url:
        yield url


def _rows(tags: list[str], **extra: Any) -> list[dict[str, Any]]:
    return [{"responses_create_params": {"input": f"say {t}"}, "tag": t, **extra} for t in tags]


def test_task_dataset_has_prompt_row_json_and_scalars() -> None:
    ds = task_dataset(MATH_ROWS)
    first = json.loads(MATH_ROWS.read_text().splitlines()[0])
    assert ds[0]["prompt"] == [
        {"role": "user", "content": first["responses_create_params"]["input"][0]["content"]}
    ]
    assert json.loads(ds[0][TASK_ROW_COLUMN]) == first
    assert ds[0]["expected_answer"] == first["expected_answer"]


def test_task_dataset_names_a_bad_row() -> None:
    with pytest.raises(ValueError, match="task row 2: responses_create_params"):
        task_dataset([{"responses_create_params": {"input": "hi"}}, {"expected_answer": "1"}])
    with pytest.raises(ValueError, match=r"input\[0\]: a 'function_call' item"):
        task_dataset([{"responses_create_params": {"input": [{"type": "function_call", "name": "f"}]}}])


def test_task_dataset_drops_scalar_columns_whose_type_varies() -> None:
    ds = task_dataset(
        [
            {"responses_create_params": {"input": "a"}, "expected_answer": 12},
            {"responses_create_params": {"input": "b"}, "expected_answer": "x"},
        ]
    )
    assert "expected_answer" not in ds.column_names
    assert json.loads(ds[0][TASK_ROW_COLUMN])["expected_answer"] == 12


def test_reward_scores_right_and_wrong_answers_on_the_math_server(math_url: str) -> None:
    ds = task_dataset(MATH_ROWS).select(range(2))
    rows = [json.loads(r) for r in ds[TASK_ROW_COLUMN]]
    reward = GymReward(math_url)
    right = [f"The answer is \\boxed{{{r['expected_answer']}}}." for r in rows]
    wrong = ["The answer is \\boxed{999}." for _ in rows]
    prompts = list(ds["prompt"]) * 2
    columns = {k: list(ds[k]) * 2 for k in ds.column_names if k != "prompt"}
    # Conversational completions (a list of messages) and plain strings are both TRL completions.
    completions = [[{"role": "assistant", "content": t}] for t in right] + wrong
    assert reward(prompts, completions, **columns, trainer_state=None) == [1.0, 1.0, 0.0, 0.0]
    assert all(a is not None and a["expected_answer"] for a in reward.last_answers)


def test_reward_without_the_row_json_uses_the_columns(math_url: str) -> None:
    """A user-made dataset with the row's fields as columns (no gym_task_row) works too."""
    reward = GymReward(math_url)
    params = {"input": [{"role": "user", "content": "What is 2 + 2?"}]}
    got = reward(
        ["p", "p"],
        ["\\boxed{4}", "\\boxed{5}"],
        responses_create_params=[params, params],
        expected_answer=["4", "4"],
    )
    assert got == [1.0, 0.0]


def test_reward_keeps_one_session_per_rollout(counting: tuple[SessionCountingEnv, str]) -> None:
    env, url = counting
    tags = [f"t{i}" for i in range(12)]
    ds = task_dataset(_rows(tags))
    reward = GymReward(url, max_concurrency=4)
    got = reward(
        list(ds["prompt"]), [f"answer {t}" for t in tags], **{TASK_ROW_COLUMN: list(ds[TASK_ROW_COLUMN])}
    )
    assert got == [1.0] * len(tags)  # each verify found its own seeded session
    assert (env.seeds, env.verifies) == (len(tags), len(tags))
    assert len(env.sessions) == len(tags)  # one session per rollout, none shared or reused


def test_server_error_is_left_out_with_a_warning(
    counting: tuple[SessionCountingEnv, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A rollout whose /verify fails is None (TRL leaves it out of its group), or 0 with ``on_verify_failure="zero"``."""
    _, url = counting
    rows = _rows(["a"]) + _rows(["b"], explode=True)
    columns = {TASK_ROW_COLUMN: [json.dumps(r) for r in rows]}
    with caplog.at_level(logging.WARNING, logger="gym_bridge.integrations.trl"):
        got = GymReward(url)(["p", "p"], ["answer a", "answer b"], **columns)
        zero = GymReward(url, on_verify_failure="zero")(["p", "p"], ["answer a", "answer b"], **columns)
    assert got == [1.0, None] and zero == [1.0, 0.0]
    messages = [r.getMessage() for r in caplog.records]
    assert any("rollout 1 left out (None)" in m and "500" in m for m in messages), messages
    assert any("rollout 1 scored 0" in m and "500" in m for m in messages), messages


def test_every_call_failing_raises() -> None:
    with running_env("math", workers=1) as url:
        pass  # the server is gone: nothing listens there any more
    reward = GymReward(url, timeout_s=5)
    with pytest.raises(RuntimeError, match="every /verify of the batch failed"):
        reward(["p"], ["x"], **{TASK_ROW_COLUMN: [json.dumps(_rows(["a"])[0])]})


def test_completion_response_keeps_tool_calls_and_results() -> None:
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "name": "f", "content": '{"ok": true}'},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip
    out = response_body(completion_response(messages))["output"]
    assert [o["type"] for o in out] == ["function_call", "function_call_output", "message"]
    assert json.loads(out[0]["arguments"]) == {"x": 1} and out[1]["call_id"] == out[0]["call_id"]
    assert out[2]["content"][0]["text"] == "done"


# --------------------------------------------------------------------------- tool use


@pytest.fixture(scope="module")
def tool_url() -> Iterator[str]:
    with running_env("tool_use") as url:
        yield url


def test_tool_environment_against_the_tool_use_server(tool_url: str) -> None:
    ds = task_dataset(TOOL_ROWS)
    row0 = json.loads(ds[0][TASK_ROW_COLUMN])
    assert row0["verifier_metadata"]["expected_calls"] == [
        {"name": "add_to_cart", "arguments": {"product_id": "P450", "quantity": 1}}
    ]
    Env = gym_environment_factory(tool_url, ds)
    doer, idler = Env(), Env()
    doer.reset(**ds[0])
    idler.reset(**ds[0])
    answer = json.loads(doer.add_to_cart(product_id="P450", quantity=1))
    assert "error" not in answer
    # Each rollout has its own session: the other one's cart is still empty.
    assert json.loads(idler.view_cart())["cart"]["items"] == []
    assert doer.get_reward() == 1.0
    assert idler.get_reward() == 0.0
    # A bad call comes back as an error the model sees, not an exception.
    assert "error" in json.loads(idler.add_to_cart(product_id="P450", quantity=0))
    # reset() starts over in a fresh session.
    doer.reset(**ds[0])
    assert json.loads(doer.view_cart())["cart"]["items"] == [] and doer.get_reward() == 0.0


def test_tool_methods_render_the_row_schemas() -> None:
    from transformers.utils import get_json_schema

    ds = task_dataset(TOOL_ROWS)
    env = gym_environment_factory("http://127.0.0.1:9", ds)()
    schema = get_json_schema(env.add_to_cart)["function"]
    assert schema["name"] == "add_to_cart"
    assert schema["parameters"]["required"] == ["product_id", "quantity"]
    assert schema["parameters"]["properties"]["quantity"]["type"] == "integer"
    nullable = get_json_schema(env.list_products)["function"]["parameters"]["properties"]["category"]
    assert nullable["type"] == "string" and nullable["nullable"] is True


def test_tool_names_that_clash_with_trl_are_refused() -> None:
    with pytest.raises(ValueError, match="'reset': clashes"):
        gym_environment_factory(
            "http://127.0.0.1:9", [{"type": "function", "name": "reset", "parameters": {}}]
        )
    with pytest.raises(ValueError, match="'my-tool': must be a Python identifier"):
        gym_environment_factory("http://127.0.0.1:9", [{"type": "function", "name": "my-tool"}])
    self_arg = {"type": "object", "properties": {"self": {"type": "string"}}}
    with pytest.raises(ValueError, match="tool 'f' argument 'self': must be a Python identifier other than self"):
        gym_environment_factory("http://127.0.0.1:9", [{"type": "function", "name": "f", "parameters": self_arg}])
    twice = [{"type": "function", "name": "f", "parameters": {}}] * 2
    with pytest.raises(ValueError, match="tool name 'f': offered twice"):
        gym_environment_factory("http://127.0.0.1:9", twice)


# --------------------------------------------------------------------------- TRL itself


def test_grpo_trainer_two_steps_with_tiny_and_the_math_server(math_url: str, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gym_bridge.models.tiny import ensure_tiny

    path = ensure_tiny()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    reward = GymReward(math_url)
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=2, learning_rate=1e-5, beta=0.0, bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, logging_steps=1, save_strategy="no", report_to="none", seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=task_dataset(MATH_ROWS),
        processing_class=tokenizer,
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/gym_reward/mean" in h]
    assert len(logged) == 2
    assert len(reward.last_answers) == 4 and all(a is not None for a in reward.last_answers)


@pytest.mark.parametrize(
    ("recipe", "scheduler", "warmup"),
    [("grpo_math_tiny.yaml", "constant_with_warmup", 3), ("grpo_smollm2_135m_lora.yaml", "constant_with_warmup", 5)],
)
def test_grpo_config_from_a_recipe_is_the_same_job(recipe: str, scheduler: str, warmup: int, tmp_path: Path) -> None:
    from gym_bridge.integrations.trl import grpo_config_from
    from gym_bridge.train.config import load_config

    cfg = load_config(REPO / "recipes" / recipe, ["policy.max_grad_norm=null"])
    args = grpo_config_from(cfg, tmp_path, max_steps=3, seed=5, disable_tqdm=True)
    grpo, policy = cfg.grpo, cfg.policy
    assert args.per_device_train_batch_size == grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    assert args.num_generations == grpo.num_generations_per_prompt
    assert args.max_completion_length == policy.generation.max_new_tokens
    assert (args.temperature, args.learning_rate) == (policy.generation.temperature, policy.optimizer.kwargs.lr)
    assert (args.lr_scheduler_type.value, args.warmup_steps) == (scheduler, warmup)
    assert args.max_grad_norm == 0.0  # null: no clipping
    assert (args.max_steps, args.seed, args.beta, args.loss_type, args.disable_tqdm) == (3, 5, 0.0, "dapo", True)


@pytest.mark.parametrize(
    ("overrides", "field", "value"),
    [
        (["loss_fn.reference_policy_kl_penalty=0.01"], "beta", 0.01),  # before: 0.0 whatever the recipe said
        (["loss_fn.ratio_clip_min=0.1", "loss_fn.ratio_clip_max=0.3"], "epsilon", 0.1),
        (["loss_fn.ratio_clip_max=0.28"], "epsilon_high", 0.28),  # DAPO's clip-higher; before: dropped
        (["grpo.normalize_rewards=false"], "scale_rewards", "none"),  # before: "group"
        (["grpo.overlong_filtering=true"], "mask_truncated_completions", True),
    ],
)
def test_grpo_config_from_carries_the_loss_settings(overrides: list[str], field: str, value: Any, tmp_path: Path) -> None:
    from gym_bridge.integrations.trl import grpo_config_from
    from gym_bridge.train.config import load_config

    cfg = load_config(REPO / "recipes" / "grpo_math_tiny.yaml", overrides)
    assert getattr(grpo_config_from(cfg, tmp_path, max_steps=1, seed=0), field) == value


@pytest.mark.parametrize(
    "override",
    [
        "loss_fn.ratio_clip_c=3.0",
        "loss_fn.entropy_coeff=0.01",
        "loss_fn.token_level_loss=false",
        "loss_fn.policy_loss=cispo",
        "grpo.advantage_clip_high=2.0",
    ],
)
def test_grpo_config_from_refuses_what_trl_cannot_do(override: str, tmp_path: Path) -> None:
    """A setting that changes the job and that GRPOConfig has no field for is named, not dropped."""
    from gym_bridge.integrations.trl import grpo_config_from
    from gym_bridge.train.config import load_config

    cfg = load_config(REPO / "recipes" / "grpo_math_tiny.yaml", [override])
    with pytest.raises(ValueError, match=re.escape(override.split("=")[0]) + ".*no equivalent in TRL"):
        grpo_config_from(cfg, tmp_path, max_steps=1, seed=0)


def test_grpo_config_from_refuses_the_dapo_recipe_shaping(tmp_path: Path) -> None:
    from gym_bridge.integrations.trl import grpo_config_from
    from gym_bridge.train.config import load_config

    cfg = load_config(REPO / "recipes" / "dapo_math_tiny.yaml")
    with pytest.raises(ValueError, match=r"grpo\.reward_shaping\.enabled: no equivalent"):
        grpo_config_from(cfg, tmp_path, max_steps=1, seed=0)

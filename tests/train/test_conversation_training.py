"""A scripted-user conversation through online GRPO over real HTTP, and the loss mask token by token.

The policy is :class:`~tests.train.clerk.Clerk` behind the real embedded policy server (real token ids),
the env is the tool_use server on a loopback port (``env.<name>.url``), the user is the rows' own
``user_script`` (the agent loop's scripted user). While the trainer updates, the log-probs the loss reads
keep their gradient; after the step, every position whose target token lies in a user or tool turn
(found from the chat template's role markers, not from the mask) must have a gradient of exactly 0,
and the assistant's generated tokens a non-zero one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import load_config
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.generate_conversations import make_conversation
from tests.train.clerk import ASK, Clerk
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_conversation"), seed=2)


def role_spans(token_ids: list[int], tokenizer: Any) -> list[tuple[str, int, int]]:
    """(role, first, end) of each chat turn's body, read off the template's ``<|im_start|>role`` markers;
    a user turn that holds a ``<tool_response>`` is a tool turn."""
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    spans, i = [], 0
    while i < len(token_ids):
        if token_ids[i] != start:
            i += 1
            continue
        j = i + 1
        while j < len(token_ids) and token_ids[j] != end_id:
            j += 1
        body = tokenizer.decode(token_ids[i + 1 : j])
        role = body.split("\n", 1)[0].strip()
        if role == "user" and "<tool_response>" in body:
            role = "tool"
        spans.append((role, i + 1, j))
        i = j + 1
    return spans


@pytest.mark.timeout(240)
def test_scripted_conversations_train_and_only_assistant_tokens_get_gradient(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.train import loop, setup
    from gym_bridge.train.algorithm.loss import ClippedPGLossFn
    from gym_bridge.train.learner import update

    rng = random.Random(3)
    rows = [make_conversation(rng, "cancel_my_order", f"c{i}") for i in range(4)]
    for row in rows:  # the one tool it needs keeps the prompt short
        params = row["responses_create_params"]
        params["tools"] = [t for t in params["tools"] if t["name"] == "cancel_order"]
    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    seen: dict[str, list[Any]] = {"mbs": [], "logprobs": [], "tokenizer": []}
    real_make, real_loss = update.make_micro_batch, ClippedPGLossFn.loss_and_metrics

    def make_micro_batch(*args: Any, **kwargs: Any) -> Any:
        mb = real_make(*args, **kwargs)
        seen["mbs"].append(mb)
        return mb

    def loss_and_metrics(self: Any, current: Any, **kwargs: Any) -> Any:
        current.retain_grad()
        seen["logprobs"].append((current, kwargs["advantages"].detach().clone()))
        return real_loss(self, current, **kwargs)

    def backend(cfg: Any, stack: Any, learner: Any) -> Clerk:
        seen["tokenizer"].append(learner.tokenizer)
        return Clerk(learner.tokenizer, max_context=1024)

    monkeypatch.setattr(update, "make_micro_batch", make_micro_batch)
    monkeypatch.setattr(ClippedPGLossFn, "loss_and_metrics", loss_and_metrics)
    monkeypatch.setattr(setup, "_generation_backend", backend)

    with start_in_thread(ToolUseServer().build_app()) as env:
        cfg = load_config(
            None,
            [*SMALL_ONLINE_RUN, "policy.max_total_sequence_length=1024", "policy.generation.max_new_tokens=64",
             "grpo.max_rollout_turns=6", "policy.train_micro_batch_size=16", f"policy.model_name={tiny_model_dir}",
             f"data.train.data_path={data}", "data.train.env_name=conv", f"env.conv.url={env.url}",
             "grpo.max_num_steps=1", "grpo.val_period=0", "checkpointing.enabled=false",
             f"logger.log_dir={tmp_path / 'logs'}", "logger.tensorboard_enabled=false",
             "grpo.use_dynamic_sampling=false"],
        )  # fmt: skip
        result = loop.train(cfg, show_progress=False)
    assert result.steps == 1
    (step,) = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert step["num_samples"] == 16 and step["rollout_failures"] == 0
    assert 0 < step["reward_mean"] < 1  # the polite rollouts solved it, the hasty ones did not
    assert step["grad_norm"] > 0

    tokenizer = seen["tokenizer"][0]
    assert len(seen["mbs"]) == len(seen["logprobs"]) >= 1
    checked = {"user": 0, "tool": 0, "system": 0, "assistant": 0}
    polite = 0
    for mb, (current, advantages) in zip(seen["mbs"], seen["logprobs"], strict=True):
        grad = current.grad
        assert grad is not None
        for row, token_ids in enumerate(mb.token_ids):
            spans = role_spans(token_ids, tokenizer)
            text = tokenizer.decode(token_ids)
            if ASK in text:
                polite += 1
                assert [r for r, _, _ in spans].count("user") >= 2 and "tool" in [r for r, _, _ in spans]
            for role, first, end in spans:
                for position in range(max(first, 1), end):  # target token `position` is predicted at position-1
                    g = float(grad[row, position - 1])
                    if role in ("user", "tool", "system"):
                        assert g == 0.0, (role, position, tokenizer.decode(token_ids[first:end]))
                        checked[role] += 1
                    elif role == "assistant" and float(advantages[row]) != 0.0 and position > first + 1:
                        assert g != 0.0, (position, tokenizer.decode(token_ids[first:end]))
                        checked["assistant"] += 1
    assert polite == round(16 * step["reward_mean"])  # every polite conversation, and only those, scored 1
    assert checked["user"] > 50 and checked["tool"] > 10 and checked["assistant"] > 50, checked


def test_env_user_settings_reach_the_agent_loop(tmp_path: Path) -> None:
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.train.config import ConfigError
    from gym_bridge.train.samplers.sampling import OnlineSampler
    from tests.train.helpers import PARITY_SERVER

    model_dir = save_random_tiny(tmp_path / "m")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir))
    base = ["data.train.data_path=a.jsonl", "data.default.env_name=p", f"env.p.server={PARITY_SERVER}",
            f"env.q.server={PARITY_SERVER}"]  # fmt: skip
    cfg = load_config(
        None,
        [*base, "env.q.user_model_url=policy", "env.q.user_params={temperature: 0.3}", "env.q.max_user_turns=2",
         "env.q.max_conversation_tokens=900"],
    )  # fmt: skip
    sampler = OnlineSampler(cfg, backend, backend.tokenizer)
    try:
        p, q = sampler.agent_configs["p"].user, sampler.agent_configs["q"].user
        assert p is not None and p.model_url is None and p.max_user_turns == 8  # scripted users only
        assert q is not None and q.model_url == sampler.agent_configs["q"].model_url  # 'policy': the policy server
        assert q.responses_create_params == {"temperature": 0.3}
        assert q.max_user_turns == 2 and q.max_conversation_tokens == 900
    finally:
        sampler.close()
    with pytest.raises(ConfigError, match="user_model_url"):
        load_config(None, [*base, "env.q.user_model_url=somewhere"])
    with pytest.raises(ConfigError, match="max_user_turns"):
        load_config(None, [*base, "env.q.max_user_turns=-1"])


@pytest.mark.timeout(240)
def test_env_max_user_turns_zero_silences_the_user_in_training(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``env.conv.max_user_turns=0`` the polite clerk's question is never answered: nobody scores."""
    from gym_bridge.train import loop, setup

    rows = [make_conversation(random.Random(3), "cancel_my_order", "c0")]
    rows[0]["responses_create_params"]["tools"] = []
    data = tmp_path / "conversations.jsonl"
    data.write_text(json.dumps(rows[0]) + "\n")
    monkeypatch.setattr(setup, "_generation_backend", lambda cfg, stack, learner: Clerk(learner.tokenizer, max_context=1024))
    with start_in_thread(ToolUseServer().build_app()) as env:
        cfg = load_config(
            None,
            [*SMALL_ONLINE_RUN, "policy.max_total_sequence_length=1024", "policy.generation.max_new_tokens=64",
             "grpo.max_rollout_turns=6", "grpo.num_prompts_per_step=1", "policy.train_global_batch_size=4",
             "policy.generation_batch_size=4", f"policy.model_name={tiny_model_dir}",
             f"data.train.data_path={data}", "data.train.env_name=conv", f"env.conv.url={env.url}",
             "env.conv.max_user_turns=0", "grpo.max_num_steps=1", "grpo.val_period=0",
             "checkpointing.enabled=false", f"logger.log_dir={tmp_path / 'logs'}", "logger.tensorboard_enabled=false"],
        )  # fmt: skip
        loop.train(cfg, show_progress=False)
    (step,) = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert step["num_samples"] == 4 and step["rollout_failures"] == 0
    assert step["reward_mean"] == 0.0

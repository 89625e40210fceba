"""Trainer test helpers: small random models saved like checkpoints, a parity environment, small runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.answers import Answer
from gym_bridge.serving.server import ResourcesServer, Session

TIMING_KEYS = ("time_", "tokens_per_s", "generation_tokens_per_s", "step_share/")
"""Metric keys that measure time: two identical runs differ only in these."""


def save_random_tiny(out: Path, seed: int = 0, num_layers: int = 2) -> Path:
    """A randomly initialised tiny Llama with the project's tokenizer, saved where a model name can point."""
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=32, num_layers=num_layers, num_heads=2, intermediate_size=64)
    new_tiny_model(tokenizer, recipe, seed=seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class ParityServer(ResourcesServer):
    """Rewards completions of even character length: a signal a random model hits half the time."""

    name = "parity"

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        text = assistant_text(body.response.output)
        return VerifyResponse(**dump(body), reward=float(len(text) % 2 == 0))


PARITY_SERVER = f"{__name__}:ParityServer"
"""``env.<name>.server`` value that starts :class:`ParityServer` (also in a rollout process)."""


class RowRewardServer(ResourcesServer):
    """A broken environment: ``/verify`` answers the task row's ``give_reward`` as the reward, whatever it
    is (``"NaN"`` goes out as the bare JSON token ``NaN``, as ``json.dumps`` writes it); rows without it
    get the parity reward (even-length answers score 1)."""

    name = "row_reward"

    async def _verify_content(self, body: dict[str, Any], session: Session) -> Any:
        if "give_reward" not in body:
            text = assistant_text(body["response"]["output"])
            return {**body, "reward": float(len(text) % 2 == 0)}
        reward = body["give_reward"]
        answer = {**body, "reward": math.nan if reward == "NaN" else reward}
        return Answer(200, json.dumps(answer).encode(), (), answer)


ROW_REWARD_SERVER = f"{__name__}:RowRewardServer"
"""``env.<name>.server`` value that starts :class:`RowRewardServer`."""

SMALL_ONLINE_RUN = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_epochs=100",
    "loss_fn.reference_policy_kl_penalty=0.0",
    "policy.train_global_batch_size=16",
    "policy.generation_batch_size=16",
    "policy.max_total_sequence_length=64",
    "policy.generation.max_new_tokens=6",
    "policy.optimizer.kwargs.lr=3e-2",
]
"""Overrides for a few quick online steps of 4 prompts x 4 completions on a random tiny model."""


def write_say_prompts(path: Path, n: int) -> Path:
    """``n`` NeMo Gym task rows asking to say something (for the parity environment)."""
    rows = (
        {"responses_create_params": {"input": [{"role": "user", "content": f"Say {i}."}]}} for i in range(n)
    )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def step_sample(i: int, reward: float, record: dict | None = None) -> Any:
    """Sample ``i`` of two groups of four (group ``i // 4``): a 3-token prompt, then 2-5 generated tokens."""
    from gym_bridge.train.batches.rollouts import Sample

    generated = 2 + i % 4
    return Sample(
        group=i // 4,
        token_ids=[5 + i, 6, 7] + [10 + (i * 7 + j) % 40 for j in range(generated)],
        loss_mask=[0, 0, 0] + [1] * generated,
        reward=reward,
        record=record,
    )


def offline_step_config(model_dir: Path, *overrides: str) -> Any:
    """An offline config for one optimizer step of two groups of four on ``model_dir`` (``overrides`` last)."""
    from gym_bridge.train.config import load_config

    return load_config(
        None,
        [
            "data.train.data_path=unused.jsonl",
            "grpo.mode=offline",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=4",
            "loss_fn.reference_policy_kl_penalty=0.0",
            f"policy.model_name={model_dir}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=8",
            "policy.max_total_sequence_length=32",
            "policy.generation.max_new_tokens=8",
            "checkpointing.enabled=false",
            *overrides,
        ],
    )


def one_trainer_step(model_dir: Path, samples: list[Any], *overrides: str) -> tuple[float, Any]:
    """The loss of one optimizer step over ``samples`` (two groups of four, offline) through the trainer's
    own set-up, advantages and update, and the batch's advantages. The step-start log-probs are shifted
    by +-0.3 so ratios are away from 1 (several are clipped)."""
    import torch

    from gym_bridge.train.batches.sequences import per_sample_logprobs
    from gym_bridge.train.learner.update import StepBatch, update_policy
    from gym_bridge.train.setup import build_learner

    cfg = offline_step_config(model_dir, *overrides)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    batch = StepBatch.from_samples(cfg.grpo, samples)
    logprobs = per_sample_logprobs(cfg, learner.model, batch.samples, learner.pad_token_id)
    batch.prev_logprobs = [lp + 0.3 * (-1) ** torch.arange(lp.shape[0]) for lp in logprobs]
    return update_policy(cfg, learner, batch)["loss"], batch.advantages


def random_grpo_batch(
    seed: int, prompts: int, prompt_len: tuple[int, int], pad: int = 0, group: int = 4
) -> tuple[list[list[int]], list[list[int]], Any, Any, Any]:
    """``prompts`` random prompts x ``group`` completions of 2-9 tokens: (token ids, loss masks, padded
    ids, attention mask, next-token loss mask), for log-prob and attention tests."""
    import random

    import torch

    rng = random.Random(seed)
    token_ids, loss_masks = [], []
    for _ in range(prompts):
        prompt = [rng.randrange(3, 300) for _ in range(rng.randint(*prompt_len))]
        for _ in range(group):
            completion = [rng.randrange(3, 300) for _ in range(rng.randint(2, 9))]
            token_ids.append(prompt + completion)
            loss_masks.append([0] * len(prompt) + [1] * len(completion))
    width = max(len(t) for t in token_ids)
    ids = torch.full((len(token_ids), width), pad, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(token_ids), width))
    for i, (tokens, m) in enumerate(zip(token_ids, loss_masks, strict=True)):
        ids[i, : len(tokens)] = torch.tensor(tokens)
        attention[i, : len(tokens)] = 1
        mask[i, : len(tokens)] = torch.tensor(m, dtype=torch.float32)
    return token_ids, loss_masks, ids, attention, mask[:, 1:]

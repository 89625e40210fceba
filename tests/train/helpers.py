"""Trainer test helpers: small random models saved like checkpoints, a parity environment, small runs."""

from __future__ import annotations

import json
from pathlib import Path

from gym_bridge.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.server import ResourcesServer, Session


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

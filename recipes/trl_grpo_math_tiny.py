"""TRL's GRPOTrainer on the tiny model, scored by gym-bridge's math resources server over HTTP.

The math server starts in-process on a free loopback port (``gym_bridge.rollout.envs.running_env``; pass
``--env http://...`` to use a running server, ours or NeMo Gym's), the tasks are NeMo Gym task rows
(``recipes/data/arith_train.jsonl``) and :class:`gym_bridge.integrations.trl.GymReward` calls
``/seed_session`` and ``/verify`` for every completion. Runs on CPU in well under a minute:

    .venv/bin/python recipes/trl_grpo_math_tiny.py --steps 4

Needs the ``[train]`` and ``[bench]`` extras (TRL).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> list[float]:
    """Train for ``--steps`` and return the mean reward of each step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="math", help="a built-in server's name or a resources server's URL")
    parser.add_argument(
        "--data", default=str(HERE / "data" / "arith_train.jsonl"), help="NeMo Gym task JSONL"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument(
        "--output-dir", default=None, help="TRL's output_dir (default: a temporary directory)"
    )
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gym_bridge.integrations.trl import GymReward, task_dataset
    from gym_bridge.models.tiny import ensure_tiny
    from gym_bridge.rollout.envs import running_env

    path = ensure_tiny()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dataset = task_dataset(args.data)
    with running_env(args.env) as url, tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=args.output_dir or tmp,
            per_device_train_batch_size=args.prompts_per_step * args.generations,
            num_generations=args.generations,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            learning_rate=args.lr,
            beta=0.0,
            loss_type="dapo",
            # TRL's CPU pitfalls: no bf16, no gradient checkpointing, and say it is the CPU.
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            use_cpu=True,
            max_steps=args.steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=GymReward(url),
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.train()
    rewards = [
        h["rewards/gym_reward/mean"] for h in trainer.state.log_history if "rewards/gym_reward/mean" in h
    ]
    for step, reward in enumerate(rewards, start=1):
        print(f"step {step}: mean reward {reward:.3f}")
    return rewards


if __name__ == "__main__":
    main()

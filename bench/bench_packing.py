"""Sequence packing on the tiny recipe's own batches: padding tokens saved, and the update's time.

Runs ``recipes/grpo_math_tiny.yaml`` synchronously for ``--steps`` steps and keeps each step's samples
(the 64 sequences the update trains on). On those batches it then counts the tokens each batching
computes (real tokens plus padding):

- padded: the recipe's micro-batches (64 sequences, length-sorted, padded to the longest);
- packed: ``policy.sequence_packing`` (rows of up to ``max_total_sequence_length`` = 128 tokens, several
  sequences each, as many rows as fit ``train_mb_tokens``).

and times ``update_policy`` (forward, backward, optimizer step) on each batch under three settings,
alternating, from the same weights: padded, packed, and the recipe's default shared-prompt pass
(``policy.share_prompt_prefix``, which runs each distinct prompt once). Ratios are packed / padded.

    .venv/bin/python bench/bench_packing.py [--steps 8] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import figure, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "grpo_math_tiny.yaml"


def capture_batches(steps: int, out: Path) -> list[list]:
    """The samples of each step of a synchronous run of the tiny recipe."""
    from bench_train import quiet_run

    import gym_bridge.train.loop as loop
    from gym_bridge.train.config import load_config

    batches: list[list] = []
    original = loop.update_policy

    def recording(cfg, learner, batch):  # type: ignore[no-untyped-def]
        batches.append(copy.deepcopy(batch.samples))
        return original(cfg, learner, batch)

    cfg = load_config(
        RECIPE,
        [
            *quiet_run(steps, out),
            "grpo.async_grpo.enabled=false",
            "loss_fn.use_importance_sampling_correction=false",
            f"data.train.data_path={REPO / 'recipes/data/arith_train.jsonl'}",
            f"data.validation.data_path={REPO / 'recipes/data/arith_val.jsonl'}",
        ],
    )
    loop.update_policy = recording
    try:
        loop.train(cfg, show_progress=False)
    finally:
        loop.update_policy = original
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="4 steps")
    args = parser.parse_args()
    steps = 4 if args.quick else args.steps

    import torch

    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.algorithm.advantages import grpo_advantages
    from gym_bridge.train.algorithm.loss import ClippedPGLossFn
    from gym_bridge.train.batches.packing import pack_rows, packed_micro_batches
    from gym_bridge.train.batches.sequences import micro_batches
    from gym_bridge.train.config import load_config
    from gym_bridge.train.learner.update import Learner, StepBatch, update_policy
    from gym_bridge.train.setup import build_optimizer

    with tempfile.TemporaryDirectory() as out:
        batches = capture_batches(steps, Path(out))
    settings = {
        "padded": ["policy.share_prompt_prefix=false"],
        "packed": ["policy.share_prompt_prefix=false", "policy.sequence_packing.enabled=true"],
        "shared_prompt": [],
    }
    configs = {
        name: load_config(RECIPE, [f"data.train.data_path={REPO / 'recipes/data/arith_train.jsonl'}", *extra])
        for name, extra in settings.items()
    }

    # tokens computed
    padded_cfg = configs["padded"]
    policy = padded_cfg.policy
    counts = {"real": 0, "padded": 0, "packed": 0}
    rows_per_step = []
    for samples in batches:
        lengths = [len(s.token_ids) for s in samples]
        counts["real"] += sum(lengths)
        for group in micro_batches(padded_cfg, samples, list(range(len(samples))), for_logprobs=False):
            counts["padded"] += len(group) * max(lengths[i] for i in group)
        rows = 0
        for group in packed_micro_batches(lengths, policy.max_total_sequence_length, policy.train_mb_tokens):
            packed = pack_rows([samples[i].token_ids for i in group], policy.max_total_sequence_length, pad_token_id=0)
            counts["packed"] += packed.input_ids.numel()
            rows += packed.input_ids.shape[0]
        rows_per_step.append(rows)
    pad_padded = counts["padded"] - counts["real"]
    pad_packed = counts["packed"] - counts["real"]

    # update time, alternating settings on the same batches from the same weights
    model, tokenizer = load_model_and_tokenizer("tiny")
    torch.set_num_threads(1)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    times: dict[str, list[float]] = {name: [] for name in settings}
    losses: dict[str, list[float]] = {name: [] for name in settings}
    for samples in batches:
        rewards = torch.tensor([s.reward for s in samples])
        groups = torch.tensor([s.group for s in samples])
        advantages = grpo_advantages(rewards, groups, padded_cfg.grpo)
        for name, cfg in configs.items():
            copy_ = copy.deepcopy(model)
            optimizer, scheduler = build_optimizer(cfg, copy_, 10)
            started = time.perf_counter()
            learner = Learner(copy_, tokenizer, optimizer, scheduler, ClippedPGLossFn(cfg.loss_fn), None, pad_id)
            metrics = update_policy(cfg, learner, StepBatch(samples, advantages, torch.ones(len(samples))))
            times[name].append(time.perf_counter() - started)
            losses[name].append(metrics.get("loss", float("nan")))
    median = {name: statistics.median(values) for name, values in times.items()}
    loss_gap = max(abs(a - b) for a, b in zip(losses["padded"], losses["packed"], strict=True))

    per_step = len(batches)
    rows = [
        figure(
            "padding tokens per step, packed (tiny recipe batches)",
            pad_packed / per_step,
            "tokens",
            baseline=pad_padded / per_step,
            note="baseline: the recipe's padded micro-batches (64 sequences, length-sorted), same batches; lower is better",
        ),
        figure(
            "tokens computed per step, packed",
            counts["packed"] / per_step,
            "tokens",
            baseline=counts["padded"] / per_step,
            note=f"baseline: padded, same batches ({counts['real'] / per_step:.0f} real tokens per step); lower is better",
        ),
        figure(
            "update_policy time, packed",
            median["packed"],
            "s",
            baseline=median["padded"],
            note="baseline: padded micro-batches, same batches and weights, alternating; lower is better",
        ),
        figure(
            "update_policy time, shared-prompt pass (recipe default)",
            median["shared_prompt"],
            "s",
            baseline=median["padded"],
            note="baseline: padded micro-batches, same run; lower is better",
        ),
    ]
    details = {
        "steps": per_step,
        "tokens": counts,
        "packed_rows_per_step": rows_per_step,
        "update_times_s": times,
        "max_loss_gap_packed_vs_padded": loss_gap,
    }
    write_results("packing", rows, quick=args.quick, details=details)
    for row in rows:
        print(f"{row['name']}: {row['value']:.4g} {row['unit']} vs {row['baseline']:.4g} (ratio {row['ratio']:.3f})")
    print(f"max |loss packed - loss padded| over steps: {loss_gap:.2e}")


if __name__ == "__main__":
    main()

"""Reward after the same number of steps of the tiny GRPO recipe, one row per loss / advantage estimator.

Every row trains the recipe (``recipes/grpo_math_tiny.yaml``: tiny Llama, 8 arithmetic prompts x 8
completions, async GRPO, no KL) for the same steps from the same seed, with validation off during
training and one validation at the end (all 200 problems, sampled at temperature 1.0, as the recipe
validates), whose accuracy is the row's figure, against plain GRPO's in the same run. Each step is cut
into 4 optimizer steps of 16 samples (``policy.train_global_batch_size=16``) for every row, so the
later optimizer steps are off-policy and the ratio, its clipping and the importance weights matter
(with one optimizer step per step the ratio is 1 and GSPO, CISPO and GRPO would take the same step).

Rows: ``grpo`` (the recipe), ``gspo`` (sequence-level ratios with GSPO's clip range 3e-4 / 4e-4),
``dr_grpo``, ``dapo`` (``recipes/dapo_math_tiny.yaml``), ``cispo`` (the recipe's clip range) and
``reinforce_plus_plus``. Each run is a child process; rows alternate within a repeat (the shared
machine drifts), repeat k uses seed 42 + k. The train reward of the last five steps is kept in the
details (for DAPO it is the reward of the groups dynamic sampling kept, so not comparable).

    .venv/bin/python bench/bench_losses.py            # 30 steps, 3 seeds: bench/results/losses.json
    .venv/bin/python bench/bench_losses.py --quick    # 30 steps, one seed
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, print_rows, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

GRPO_RECIPE = REPO / "recipes" / "grpo_math_tiny.yaml"
DAPO_RECIPE = REPO / "recipes" / "dapo_math_tiny.yaml"
VARIANTS: dict[str, tuple[Path, list[str]]] = {
    "grpo": (GRPO_RECIPE, []),
    "gspo": (
        GRPO_RECIPE,
        [
            "loss_fn.sequence_level_importance_ratios=true",
            "loss_fn.token_level_loss=false",
            "loss_fn.ratio_clip_min=0.0003",
            "loss_fn.ratio_clip_max=0.0004",
        ],
    ),
    "dr_grpo": (GRPO_RECIPE, ["loss_fn.loss_type=dr_grpo", "grpo.normalize_rewards=false"]),
    "dapo": (DAPO_RECIPE, []),
    "cispo": (GRPO_RECIPE, ["loss_fn.use_cispo=true"]),
    "reinforce_plus_plus": (GRPO_RECIPE, ["grpo.adv_estimator.name=reinforce_plus_plus"]),
}


def overrides(steps: int, log_dir: Path, seed: int) -> list[str]:
    """``steps`` steps, 4 optimizer steps each, one validation at the end, nothing else written."""
    return [
        f"grpo.max_num_steps={steps}",
        f"grpo.seed={seed}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "grpo.val_at_end=true",
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=16",
        "checkpointing.enabled=false",
        "logger.tensorboard_enabled=false",
        "logger.num_val_samples_to_print=0",
        f"logger.log_dir={log_dir}",
    ]


def child(variant: str, steps: int, seed: int, out: Path) -> dict[str, Any]:
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    recipe, extra = VARIANTS[variant]
    cfg = load_config(recipe, [*overrides(steps, out, seed), *extra])
    started = time.perf_counter()
    train(cfg, show_progress=False)
    wall = time.perf_counter() - started
    records = read_metrics(out)
    train_rows = [r for r in records if r["split"] == "train"]
    val_rows = [r for r in records if r["split"] == "val"]
    return {
        "wall_s": wall,
        "val_accuracy": val_rows[-1]["accuracy"] if val_rows else float("nan"),
        "train_reward_last5": statistics.fmean(r["reward_mean"] for r in train_rows[-5:]),
        "train_rewards": [r["reward_mean"] for r in train_rows],
    }


def run_child(variant: str, steps: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--child", variant, "--steps", str(steps), "--seed", str(seed)]
        subprocess.run([*cmd, "--out", tmp, "--result", str(result)], check=True, cwd=REPO)
        return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed instead of three")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--only", action="append", choices=sorted(VARIANTS), help="rows to run (default all)")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.result.write_text(json.dumps(child(args.child, args.steps, args.seed, args.out)))
        return

    names = args.only or list(VARIANTS)
    if "grpo" not in names:
        names = ["grpo", *names]
    repeats = args.repeats or (1 if args.quick else 3)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for k in range(repeats):
        for name in names:
            run = run_child(name, args.steps, 42 + k)
            runs[name].append(run)
            print(
                f"{name:>20} seed {42 + k}: val accuracy {run['val_accuracy']:.3f}, "
                f"train reward (last 5 steps) {run['train_reward_last5']:.3f}, {run['wall_s']:.0f} s",
                flush=True,
            )
    accuracy = {name: statistics.fmean(r["val_accuracy"] for r in runs[name]) for name in names}
    seeds = f"{repeats} seed{'s' if repeats > 1 else ''}"
    rows = [
        figure(
            f"val accuracy after {args.steps} steps, {name}",
            accuracy[name],
            "accuracy",
            baseline=accuracy["grpo"],
            note=f"baseline: plain GRPO (the recipe), same steps and seeds; mean of {seeds}; higher is better",
        )
        for name in names
    ]
    path = write_results(
        "losses",
        rows,
        quick=args.quick,
        details={
            "steps": args.steps,
            "repeats": repeats,
            "variants": {n: VARIANTS[n][1] for n in names},
            "runs": runs,
        },
    )
    print_rows(rows, path)


if __name__ == "__main__":
    main()

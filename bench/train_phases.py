"""Median time per phase of the tiny GRPO recipe's steps, for A/B checks while changing the trainer.

Not a benchmark row (``run_all.py`` runs ``bench_*.py`` only; ``bench_train.py`` is the comparison with
TRL): it runs ``recipes/grpo_math_tiny.yaml`` for a few steps with validation and checkpoints off, plus
any dotted overrides, and prints the median of each ``time_*`` metric over the steps after the first
two, and the mean reward of the last five. ``time_rollouts_cpu_s`` is the CPU the sampling process
spent per step (all its threads), which a loaded machine does not inflate as it does wall times.
Compare two settings in the same sitting, alternating:

    .venv/bin/python bench/train_phases.py --steps 24 policy.share_prompt_prefix=false
    .venv/bin/python bench/train_phases.py --steps 24 grpo.async_grpo.enabled=false
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = (
    "time_step_s",
    "time_generation_s",
    "time_reward_and_http_s",
    "time_logprobs_s",
    "time_training_s",
    "time_waiting_for_rollouts_s",
    "time_producer_batch_s",
    "time_rollouts_cpu_s",
    "trajectory_age_steps",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps (the first two are skipped)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. grpo.seed=1")
    args = parser.parse_args()

    from bench_train import quiet_run  # bench/ is on sys.path when this file runs as a script

    from gym_bridge.train.config import load_config
    from gym_bridge.train.logging import read_metrics
    from gym_bridge.train.loop import train

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            REPO / "recipes" / "grpo_math_tiny.yaml",
            [
                *quiet_run(args.steps, out),
                f"data.train.data_path={REPO / 'recipes/data/arith_train.jsonl'}",
                f"data.validation.data_path={REPO / 'recipes/data/arith_val.jsonl'}",
                *args.overrides,
            ],
        )
        started = time.perf_counter()
        train(cfg, show_progress=False)
        wall = time.perf_counter() - started
        steps = [r for r in read_metrics(Path(out)) if r["split"] == "train"][2:]
    for key in PHASES:
        values = [r[key] for r in steps if key in r]
        if values:
            print(f"{key:32s} {statistics.median(values):.4f}")
    print(f"{'reward, mean of last 5 steps':32s} {statistics.mean(r['reward_mean'] for r in steps[-5:]):.4f}")
    print(f"{'wall s (incl. start-up)':32s} {wall:.1f}")


if __name__ == "__main__":
    main()

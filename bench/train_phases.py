"""Median time per phase of a GRPO recipe's steps, and each phase's share of a step (the ``step_share/*``
metrics: generation, verification and HTTP, log-probs, update), for A/B checks while changing the trainer.

Not a benchmark row (``run_all.py`` runs ``bench_*.py`` only; ``bench_train.py`` is the comparison with
TRL): it runs ``recipes/grpo_math_tiny.yaml`` (or ``--recipe``) for a few steps with validation and
checkpoints off, plus any dotted overrides, and prints the median of each ``time_*`` metric over the
steps after the first two (``--skip``), the median share of each phase, and the mean reward of the last
five. ``time_rollouts_cpu_s`` is the CPU the sampling process spent per step (all its threads), which a
loaded machine does not inflate as it does wall times. Compare two settings in the same sitting, alternating:

    .venv/bin/python bench/train_phases.py --steps 24 policy.share_prompt_prefix=false
    .venv/bin/python bench/train_phases.py --steps 24 grpo.async_grpo.enabled=false
    .venv/bin/python bench/train_phases.py --recipe recipes/grpo_smollm2_135m_lora.yaml --steps 6 --skip 1
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
SHARE_NAMES = ("generation", "reward_and_http", "waiting_for_rollouts", "logprobs", "update", "other")
SHARES = tuple(f"step_share/{name}" for name in SHARE_NAMES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the medians (warm-up)")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "grpo_math_tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. grpo.seed=1")
    args = parser.parse_args()

    from bench_train import quiet_run  # bench/ is on sys.path when this file runs as a script

    from gym_bridge.train.bookkeeping.logging import STEP_SHARE, read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    tiny = args.recipe.resolve() == (REPO / "recipes" / "grpo_math_tiny.yaml").resolve()
    data = [  # the tiny recipe's own data files are made by its make-data step
        f"data.train.data_path={REPO / 'recipes/data/arith_train.jsonl'}",
        f"data.validation.data_path={REPO / 'recipes/data/arith_val.jsonl'}",
    ]
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(args.recipe, [*quiet_run(args.steps, out), *(data if tiny else []), *args.overrides])
        started = time.perf_counter()
        train(cfg, show_progress=False)
        wall = time.perf_counter() - started
        steps = [r for r in read_metrics(Path(out)) if r["split"] == "train"][args.skip :]
    for key in PHASES:
        values = [r[key] for r in steps if key in r]
        if values:
            print(f"{key:32s} {statistics.median(values):.4f}")
    for key in (*SHARES, "generation_batches", "generation_tokens_per_s"):
        values = [r[key] for r in steps if key in r]
        if values:
            print(f"{key:32s} {statistics.median(values):.4f}")
    shares = {name: statistics.median(r.get(STEP_SHARE.format(name), 0.0) for r in steps) for name in SHARE_NAMES}
    print("median share of a step: " + "  ".join(f"{name} {share:.0%}" for name, share in shares.items() if share))
    print(f"{'reward, mean of last 5 steps':32s} {statistics.mean(r['reward_mean'] for r in steps[-5:]):.4f}")
    print(f"{'wall s (incl. start-up)':32s} {wall:.1f}")


if __name__ == "__main__":
    main()

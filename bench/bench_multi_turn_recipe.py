"""The multi-turn recipe, measured: the tiny model learning to answer the scripted user's corrected question.

Runs ``gym-bridge train`` on ``recipes/grpo_multi_turn_tiny.yaml`` for each seed, each in its own process
(one thread: ``OMP_NUM_THREADS=1`` unless set), and reads the held-out success rate (the 100 validation
conversations, sampled at temperature 1.0; success = the reply to the correction is right) from the run's
``metrics.jsonl``: before training (step 0), after (the last step) and the curve, the wall time and the
peak resident memory of the run's whole process tree. Writes ``bench/results/multi_turn_recipe.json``
and the curves, ``bench/results/multi_turn_recipe.png``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_multi_turn_recipe.py            # seeds 42 1 2
    .venv/bin/python bench/bench_multi_turn_recipe.py grpo.max_num_steps=20 --seeds 42
    .venv/bin/python bench/bench_multi_turn_recipe.py --quick       # seed 42, 4 steps, 20 conversations
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_smollm2_recipe import plot_curves, run_recipe  # noqa: E402  (a training run in a child process; its curves)
from common import figure, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

RESULT_NAME = "multi_turn_recipe"
RECIPE = REPO / "recipes" / "grpo_multi_turn_tiny.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's log, metrics, rollouts under KEEP/seed<k>/")
    parser.add_argument("--quick", action="store_true", help="seed 42, 4 steps, validation on 20 conversations")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    seeds, overrides = args.seeds, list(args.overrides)
    if args.quick:
        seeds = [42]
        overrides += ["grpo.max_num_steps=4", "grpo.val_period=0", "grpo.max_val_samples=20", "grpo.val_batch_size=20"]
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) if args.keep is None else args.keep / f"seed{seed}"
            out.mkdir(parents=True, exist_ok=True)
            print(f"seed {seed} ... ({out})", flush=True)
            run = run_recipe(RECIPE, seed, out, overrides)
        run["peak_rss_mib"] = run.pop("peak_rss_gib") * 1024
        print(f"seed {seed}: held-out success {run['base']:.2f} -> {run['final']:.2f} (best {run['best']:.2f}), "
              f"{run['wall_s'] / 60:.1f} min, peak {run['peak_rss_mib']:.0f} MiB", flush=True)  # fmt: skip
        runs.append(run)
    base, final = statistics.fmean(r["base"] for r in runs), statistics.fmean(r["final"] for r in runs)
    rose = sum(r["final"] > r["base"] for r in runs)
    label = "tiny multi-turn GRPO (scripted user corrects the question)"
    rows = [
        figure(f"{label}: held-out success after training", final, "success rate", baseline=base,
               note=f"baseline: the same runs' step-0 success; mean of seeds {seeds}; "
               f"gain {final - base:+.3f}; rose on {rose} of {len(runs)} seeds"),
        *(figure(f"{label}: held-out success after training, seed {r['seed']}", r["final"], "success rate",
                 baseline=r["base"], note="baseline: step 0 of the same run") for r in runs),
        figure(f"{label}: wall time per seed", statistics.fmean(r["wall_s"] for r in runs) / 60, "min",
               note=f"whole run incl. model load and validations, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
               f"all seeds: {sum(r['wall_s'] for r in runs) / 60:.1f} min"),
        figure(f"{label}: peak RSS", max(r["peak_rss_mib"] for r in runs), "MiB",
               note="whole process tree (trainer, rollout process, env server), sampled every 0.5 s"),
    ]  # fmt: skip
    details = {"recipe": str(RECIPE.relative_to(REPO)), "runs": runs, "overrides": overrides}
    path = write_results(RESULT_NAME, rows, quick=args.quick, details=details)
    print(path)
    curves = {f"seed {r['seed']}": r["curve"] for r in runs}
    print(plot_curves(curves, path.with_suffix(".png"), ylabel="held-out success (100 conversations, t=1.0)",
                      title="tiny model, multi-turn GRPO with a scripted user, CPU", aim=None, legend_loc="upper left"))  # fmt: skip


if __name__ == "__main__":
    main()

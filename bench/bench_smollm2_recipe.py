"""The README's second job, measured: SmolLM2-135M-Instruct learning the ``word`` task family on CPU.

Runs ``gym-bridge train`` on ``recipes/grpo_smollm2_135m_lora.yaml`` (LoRA) and
``recipes/grpo_smollm2_135m.yaml`` (full fine-tuning) for each seed, each in its own process, and reads
validation accuracy (200 held-out problems, sampled at the recipe's temperature) from the run's
``metrics.jsonl``: the base accuracy (step 0), the final and the best, the wall time, and the peak
resident memory of the run's whole process tree (sampled every 0.5 s). One row per recipe with the
mean over seeds; the per-seed curves are in the details.

    .venv/bin/python bench/bench_smollm2_recipe.py                       # both recipes, seeds 42 1 2
    .venv/bin/python bench/bench_smollm2_recipe.py --recipes lora --seeds 42
    .venv/bin/python bench/bench_smollm2_recipe.py --quick               # LoRA, seed 42, 4 steps, 40 problems
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, tree_rss_bytes, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

RESULT_NAME = "smollm2_recipe"
RECIPES = {
    "lora": REPO / "recipes" / "grpo_smollm2_135m_lora.yaml",
    "full": REPO / "recipes" / "grpo_smollm2_135m.yaml",
}



def run_recipe(recipe: Path, seed: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """One training run in a child process; validation curve, wall time and peak tree RSS."""
    log_dir, ckpt_dir = out / "logs", out / "ckpt"
    argv = [
        sys.executable, "-m", "gym_bridge.cli", "train", "--config", str(recipe), "--fresh",
        f"grpo.seed={seed}", f"logger.log_dir={log_dir}", f"checkpointing.checkpoint_dir={ckpt_dir}", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    with open(out / "train.log", "w") as log:
        child = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        peak = 0
        while child.poll() is None:
            peak = max(peak, tree_rss_bytes(child.pid))
            time.sleep(0.5)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        tail = (out / "train.log").read_text()[-2000:]
        raise RuntimeError(f"{recipe.name} seed {seed} exited with {child.returncode}:\n{tail}")
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(r["step"], r["accuracy"]) for r in rows if r.get("split") == "val" and "accuracy" in r]
    checkpoints = sorted(ckpt_dir.glob("step_*"))
    ckpt_bytes = sum(f.stat().st_size for f in checkpoints[-1].rglob("*") if f.is_file()) if checkpoints else 0
    return {
        "seed": seed,
        "curve": curve,
        "base": curve[0][1],
        "final": curve[-1][1],
        "best": max(acc for _, acc in curve),
        "wall_s": wall,
        "peak_rss_gib": peak / 2**30,
        "checkpoint_mib": ckpt_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=["lora", "full"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    parser.add_argument("--quick", action="store_true", help="LoRA, seed 42, 4 steps, validation on 40 problems")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each run's train.log, metrics and checkpoints under KEEP/<recipe>-seed<k>/")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    args = parser.parse_args()
    recipes, seeds, extra = args.recipes, args.seeds, list(args.overrides)
    if args.quick:
        recipes, seeds = ["lora"], [42]
        extra += ["grpo.max_num_steps=4", "grpo.val_period=4", "grpo.max_val_samples=40"]
    runs: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for name in recipes:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) if args.keep is None else args.keep / f"{name}-seed{seed}"
                out.mkdir(parents=True, exist_ok=True)
                print(f"[{name}] seed {seed} ... ({out})", flush=True)
                run = run_recipe(RECIPES[name], seed, out, extra)
            print(f"[{name}] seed {seed}: {run['base']:.3f} -> {run['final']:.3f} (best {run['best']:.3f}), "
                  f"{run['wall_s'] / 60:.1f} min, peak {run['peak_rss_gib']:.2f} GiB", flush=True)
            runs.setdefault(name, []).append(run)
        done = runs[name]
        base = statistics.fmean(r["base"] for r in done)
        final = statistics.fmean(r["final"] for r in done)
        label = f"SmolLM2-135M {name} GRPO, word problems"
        rows += [
            figure(f"{label}: final validation accuracy", final, "accuracy", baseline=base,
                   note=f"baseline: the same runs' step-0 accuracy; mean of seeds {seeds}; "
                        f"gain {final - base:+.3f}; aim +0.5"),
            figure(f"{label}: wall time", statistics.fmean(r["wall_s"] for r in done) / 60, "min",
                   note="whole run incl. model load and validations; aim <= 20 min on 2 cores"),
            figure(f"{label}: peak RSS", max(r["peak_rss_gib"] for r in done), "GiB",
                   note="whole process tree; LoRA aim < 2 GiB"),
            figure(f"{label}: checkpoint size", max(r["checkpoint_mib"] for r in done), "MiB",
                   note="last checkpoint on disk; LoRA aim < 50 MiB"),
        ]
    write_results(RESULT_NAME, rows, quick=args.quick, details={"runs": runs, "overrides": extra})


if __name__ == "__main__":
    main()

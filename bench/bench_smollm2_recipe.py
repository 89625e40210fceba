"""The README's second job, measured: SmolLM2-135M-Instruct learning the ``word`` task family on CPU.

Runs ``gym-bridge train`` on ``recipes/grpo_smollm2_135m_lora.yaml`` (LoRA) and
``recipes/grpo_smollm2_135m.yaml`` (full fine-tuning), or with ``--recipes main`` the README's main job
(``recipes/grpo_math_tiny.yaml``: its validation is sampling accuracy on the arithmetic training space),
for each seed, each in its own process, and reads
validation accuracy (200 held-out problems, sampled at the recipe's temperature) from the run's
``metrics.jsonl``: the base accuracy (step 0), the final and the best, the wall time, and the peak
resident memory of the run's whole process tree (sampled every 0.5 s). One row per recipe with the
mean over seeds; the per-seed curves are in the details.

    .venv/bin/python bench/bench_smollm2_recipe.py                       # both recipes, seeds 42 1 2
    .venv/bin/python bench/bench_smollm2_recipe.py --recipes lora --seeds 42
    .venv/bin/python bench/bench_smollm2_recipe.py --quick               # LoRA, seed 42, 4 steps, 40 problems
    .venv/bin/python bench/bench_smollm2_recipe.py --plot-only KEEP...   # the curves PNG of kept runs

Every run also draws the validation curves of its seeds, one line per recipe and seed, into
``<results dir>/smollm2_recipe.png``; ``--plot-only`` draws them from runs kept with ``--keep`` (run
one seed at a time, or side by side, then plot them together).
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
    "main": REPO / "recipes" / "grpo_math_tiny.yaml",  # the README's main job (tiny model, arithmetic)
}
LABELS = {
    "lora": "SmolLM2-135M lora GRPO, word problems",
    "full": "SmolLM2-135M full GRPO, word problems",
    "main": "tiny main job GRPO, arithmetic (accuracy on the training space)",
}
AIMS = {  # issue 38 on 2 quiet cores: (validation gain, wall minutes)
    "lora": "aim: gain >= +0.6, <= 12 min",
    "full": "aim: gain >= +0.6, <= 15 min",
    "main": "no aim set",
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
    curve = val_curve(log_dir / "metrics.jsonl")
    checkpoints = sorted(ckpt_dir.glob("step_*"))
    ckpt_bytes = (
        sum(f.stat().st_size for f in checkpoints[-1].rglob("*") if f.is_file()) if checkpoints else 0
    )
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


def val_curve(metrics: Path) -> list[tuple[int, float]]:
    """(step, validation accuracy) pairs of a run's ``metrics.jsonl``."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [(r["step"], r["accuracy"]) for r in rows if r.get("split") == "val" and "accuracy" in r]


def plot_curves(
    curves: dict[str, list[tuple[int, float]]],
    path: Path,
    *,
    ylabel: str = "validation accuracy (200 held-out problems)",
    title: str = "SmolLM2-135M-Instruct GRPO on word problems, CPU",
    aim: float | None = 0.5,
    legend_loc: str = "lower right",
) -> Path:
    """One validation line per run (label -> curve); with ``aim``, the mean base + ``aim`` dashed.
    The recipe benches (this one, bench_multi_turn_recipe.py) draw their curves with it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for label, curve in sorted(curves.items()):
        steps, accuracy = zip(*curve, strict=True)
        ax.plot(
            steps,
            accuracy,
            marker="o",
            linewidth=2,
            label=f"{label} ({accuracy[0]:.2f} -> {accuracy[-1]:.2f})",
        )
    if aim is not None:
        base = statistics.fmean(curve[0][1] for curve in curves.values())
        ax.axhline(
            base + aim, color="grey", linestyle="--", linewidth=1, label=f"aim: base + {aim:g} ({base + aim:.2f})"
        )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_loc, fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def results_png() -> Path:
    return Path(os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results") / f"{RESULT_NAME}.png"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=["lora", "full"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    parser.add_argument(
        "--quick", action="store_true", help="LoRA, seed 42, 4 steps, validation on 40 problems"
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep each run's train.log, metrics and checkpoints under KEEP/<recipe>-seed<k>/",
    )
    parser.add_argument(
        "--plot-only",
        nargs="+",
        type=Path,
        default=None,
        metavar="KEEP",
        help="only draw the curves PNG of runs kept under these --keep directories",
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    args = parser.parse_args()
    if args.plot_only:
        kept = [m for k in args.plot_only for m in sorted(k.glob("*-seed*/logs/metrics.jsonl"))]
        names = [m.parents[1].name for m in kept]  # <recipe>-seed<k>; the --keep folder only if that repeats
        found = {
            name if names.count(name) == 1 else f"{name} ({m.parents[2].name})": val_curve(m)
            for name, m in zip(names, kept, strict=True)
        }
        curves = {label: curve for label, curve in found.items() if curve}
        if not curves:
            parser.error(f"no validation curves under {', '.join(map(str, args.plot_only))}")
        print(plot_curves(curves, results_png(), aim=0.6))
        return
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
            print(
                f"[{name}] seed {seed}: {run['base']:.3f} -> {run['final']:.3f} (best {run['best']:.3f}), "
                f"{run['wall_s'] / 60:.1f} min, peak {run['peak_rss_gib']:.2f} GiB",
                flush=True,
            )
            runs.setdefault(name, []).append(run)
        done = runs[name]
        base = statistics.fmean(r["base"] for r in done)
        final = statistics.fmean(r["final"] for r in done)
        label = LABELS[name]
        gains = ", ".join(f"{r['final'] - r['base']:+.3f}" for r in done)
        rows += [
            figure(
                f"{label}: final validation accuracy",
                final,
                "accuracy",
                baseline=base,
                note=f"baseline: the same runs' step-0 accuracy; mean of seeds {seeds}; "
                f"gain {final - base:+.3f} (seeds: {gains}); "
                f"{AIMS[name]}",
            ),
            figure(
                f"{label}: wall time",
                statistics.fmean(r["wall_s"] for r in done) / 60,
                "min",
                note=f"whole run incl. model load and validations, mean of seeds (longest "
                f"{max(r['wall_s'] for r in done) / 60:.1f}); {AIMS[name]}",
            ),
            figure(
                f"{label}: peak RSS",
                max(r["peak_rss_gib"] for r in done),
                "GiB",
                note="whole process tree, largest of the seeds",
            ),
            figure(
                f"{label}: checkpoint size",
                max(r["checkpoint_mib"] for r in done),
                "MiB",
                note="last checkpoint on disk" + ("; LoRA aim < 50 MiB" if name == "lora" else ""),
            ),
        ]
    write_results(RESULT_NAME, rows, quick=args.quick, details={"runs": runs, "overrides": extra})
    curves = {f"{name} seed {r['seed']}": r["curve"] for name, done in runs.items() for r in done}
    if "main" in runs:  # not held out: the arithmetic space the training file also holds
        label = "validation accuracy (200 problems; main: the training space)"
        print(plot_curves(curves, results_png(), ylabel=label, title="GRPO on CPU: the shipped recipes", aim=None))
    else:
        print(plot_curves(curves, results_png(), aim=0.6))


if __name__ == "__main__":
    main()

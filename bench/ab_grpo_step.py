"""A/B of the tiny GRPO recipe's step time between checkouts, in one sitting, runs taking turns.

Why: ``bench_train.py`` times today's trainer against TRL; a change to the trainer needs today's code
against an older commit's on the same machine in the same minutes. Each checkout runs its own
``gym-bridge train --config recipes/grpo_math_tiny.yaml`` (``PYTHONPATH=<checkout>``, run from the
checkout) for ``--steps`` steps, seed 42, with validation, checkpoints and TensorBoard off
(``bench_train.quiet_run``), in each mode asked for: ``async`` (the recipe's default: the next step's
rollouts in a child process) and ``sync`` (``grpo.async_grpo.enabled=false``). The checkouts take turns,
A B, B A, A B, ...; a run's step times are ``time_step_s`` of its ``metrics.jsonl`` train rows after the
first ``bench_train.WARMUP_STEPS``. Reported per mode: each checkout's median step over all its runs,
B/A, the median of each step phase, the median CPU seconds of a whole run (start-up included; the
train process and its children: less moved by load than wall time), the runs' rewards (the same seed
samples the same completions only if nothing in sampling changed) and the load average at each run's
start and at the end.

    git worktree add --detach /tmp/ab-old 99bf06e && git worktree add --detach /tmp/ab-new HEAD
    .venv/bin/python bench/ab_grpo_step.py /tmp/ab-old /tmp/ab-new --steps 10 --rounds 3

Writes ``bench/results/grpo_step_ab.json``. Both checkouts' recipes must take the same keys (they do
from 99bf06e on). The tiny model is built once and cached (``~/.cache/gym-bridge``) before the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_train import WARMUP_STEPS, quiet_run
from common import figure, write_results

MODES = {"async": ["grpo.async_grpo.enabled=true"], "sync": ["grpo.async_grpo.enabled=false"]}
PHASES = ("time_generation_s", "time_reward_and_http_s", "time_logprobs_s", "time_training_s",
          "time_waiting_for_rollouts_s")  # fmt: skip


def run_once(checkout: Path, mode: str, steps: int, threads: int, log_dir: Path) -> dict[str, Any]:
    """One ``gym-bridge train`` of ``checkout``: its train rows' step times, phases and rewards."""
    cmd = [sys.executable, "-m", "gym_bridge.cli", "train", "--config", "recipes/grpo_math_tiny.yaml", "-q",
           *quiet_run(steps, log_dir), "grpo.seed=42", *MODES[mode]]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": str(threads)}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout} ({mode}): train failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if r.get("split") == "train"]
    if len(rows) != steps:
        raise RuntimeError(f"{checkout} ({mode}): {len(rows)} train rows in metrics.jsonl, expected {steps}")
    return {
        "checkout": str(checkout),
        "mode": mode,
        "step_s": [round(r["time_step_s"], 4) for r in rows],
        "phases_s": {p: [round(r.get(p, 0.0), 4) for r in rows] for p in PHASES},
        "reward_mean": [round(r["reward_mean"], 4) for r in rows],
        "wall_s": round(wall, 2),
        "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
        "loadavg_1m_at_start": round(load, 2),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every run's steps after the warm-up; rewards of every step, run by run."""
    steps = [s for run in runs for s in run["step_s"][WARMUP_STEPS:]]
    return {
        "median_step_s": round(statistics.median(steps), 4),
        "step_s_range": [min(steps), max(steps)],
        "median_phase_s": {p.removeprefix("time_").removesuffix("_s"): round(statistics.median(
            s for run in runs for s in run["phases_s"][p][WARMUP_STEPS:]), 4) for p in PHASES},  # fmt: skip
        "mean_reward": round(statistics.mean(r for run in runs for r in run["reward_mean"]), 4),
        "wall_s_per_run": [run["wall_s"] for run in runs],
        "median_cpu_s_per_run": statistics.median(run["cpu_s"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path, nargs=2, help="the baseline checkout (A), then B")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per checkout and mode (alternating)")
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["async", "sync"])
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (gym-bridge's default for tiny)")
    args = parser.parse_args()
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")
    a, b = (c.resolve() for c in args.checkouts)
    subprocess.run([sys.executable, "-c", "from gym_bridge.models.tiny import ensure_tiny; ensure_tiny()"],
                   env={**os.environ, "PYTHONPATH": str(b)}, check=True)  # fmt: skip
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ab-grpo-step-") as tmp:
        for i in range(args.rounds):
            for mode in args.modes:
                for checkout in (a, b) if i % 2 == 0 else (b, a):
                    runs.append(run_once(checkout, mode, args.steps, args.threads, Path(tmp) / f"run{len(runs)}"))
                    last = runs[-1]
                    print(f"{checkout} {mode}: median step {statistics.median(last['step_s'][WARMUP_STEPS:]):.3f} s, "
                          f"wall {last['wall_s']} s, CPU {last['cpu_s']} s, load {last['loadavg_1m_at_start']}", flush=True)  # fmt: skip
    summaries = {mode: {side: summarize([r for r in runs if r["mode"] == mode and r["checkout"] == str(c)])
                        for side, c in (("a", a), ("b", b))} for mode in args.modes}  # fmt: skip
    note = (f"median over {args.rounds} alternating runs x {args.steps - WARMUP_STEPS} steps (first {WARMUP_STEPS} "
            f"skipped), OMP_NUM_THREADS={args.threads}, seed 42; A (baseline): {a}; lower is better")  # fmt: skip
    rows = [figure(f"GRPO step, tiny recipe 8x8x16, {mode} (B: {b})", s["b"]["median_step_s"], "s/step",
                   baseline=s["a"]["median_step_s"], note=note) for mode, s in summaries.items()]  # fmt: skip
    details = {"a": str(a), "b": str(b), "steps_per_run": args.steps, "warmup_steps_skipped": WARMUP_STEPS,
               "threads": args.threads, "summaries": summaries, "runs": runs,
               "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}  # fmt: skip
    path = write_results("grpo_step_ab", rows, details=details)
    for mode, s in summaries.items():
        ratio = s["b"]["median_step_s"] / s["a"]["median_step_s"]
        cpu = s["b"]["median_cpu_s_per_run"] / s["a"]["median_cpu_s_per_run"]
        print(f"{mode}: A {s['a']['median_step_s']:.3f} s/step, B {s['b']['median_step_s']:.3f} s/step, B/A {ratio:.2f}; "
              f"CPU per run B/A {cpu:.2f}; mean reward A {s['a']['mean_reward']}, B {s['b']['mean_reward']}")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""GRPO step time with 1 vs 2 data-parallel training workers on the tiny recipe (issue 16).

The tiny recipe (``recipes/grpo_math_tiny.yaml``), synchronous GRPO, validation and checkpoints off,
``policy.train_micro_batch_size=32`` (two micro-batches per optimizer step, so two workers each get
one), run three ways, each in its own child process with ``OMP_NUM_THREADS=1``:

- ``inproc``: the update in the trainer's process (``cluster.train_workers_per_node=0``);
- ``w1``: one Ray training worker (the same update plus Ray's overhead: shipping the batch, mirroring
  rank 0's weights and optimizer state back);
- ``w2``: two Ray workers, gradients all-reduced over gloo on 127.0.0.1.

The headline ratio is w2 / w1 for the update (``time_training_s``) and for the whole step. Why the
gain is bounded here: the machine has 2 cores, shared by the trainer, generation, the math server
and the workers; two workers can at best halve the update (one core each), the rest of the step
(generation, log-probs, reward HTTP) does not move, and every update adds a fixed cost (object store
round trip of the batch and the state, a gloo all-reduce of every gradient). On separate nodes with a
larger model the update term dominates and the ratio approaches 1 / workers; that is on paper here.
Medians skip each run's first two steps (Ray and torch warm-up); configurations alternate because
this machine's speed drifts.

    .venv/bin/python bench/bench_data_parallel.py            # 12 steps x 2 rounds
    .venv/bin/python bench/bench_data_parallel.py --quick    # 6 steps x 1 round
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
from common import figure, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

RECIPE = REPO / "recipes" / "grpo_math_tiny.yaml"
WARMUP_STEPS = 2
CONFIGS = {"inproc": 0, "w1": 1, "w2": 2}  # cluster.train_workers_per_node


def _child(workers: int, steps: int, out: Path) -> dict[str, Any]:
    """One training run of the tiny recipe; its per-step timings."""
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        cfg = load_config(
            RECIPE,
            [
                f"grpo.max_num_steps={steps}", "grpo.val_period=0", "grpo.val_at_start=false",
                "grpo.val_at_end=false", "grpo.async_grpo.enabled=false", "checkpointing.enabled=false",
                "logger.tensorboard_enabled=false", f"logger.log_dir={tmp}",
                "policy.train_micro_batch_size=32", f"cluster.train_workers_per_node={workers}",
            ],
        )  # fmt: skip
        started = time.perf_counter()
        train(cfg, show_progress=False)
        wall = time.perf_counter() - started
        rows = [r for r in read_metrics(tmp) if r["split"] == "train"]
    result = {
        "wall_s": wall,
        "step_s": [r["time_step_s"] for r in rows],
        "training_s": [r.get("time_training_s", 0.0) for r in rows],
        "loss": [r["loss"] for r in rows],
    }
    out.write_text(json.dumps(result))
    return result


def run_child(name: str, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run(
            [sys.executable, __file__, "--child", name, "--steps", str(steps), "--child-out", str(out)],
            check=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        )
        return json.loads(out.read_text())


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(v for run in runs for v in run[key][WARMUP_STEPS:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 steps x 1 round")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 12)
    if args.child:
        _child(CONFIGS[args.child], steps, args.child_out)
        return
    rounds = args.rounds or (1 if args.quick else 2)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    for r in range(rounds):
        for name in CONFIGS:
            result = run_child(name, steps)
            runs[name].append(result)
            print(f"round {r + 1}/{rounds} {name}: wall {result['wall_s']:.1f} s, "
                  f"step {statistics.median(result['step_s'][WARMUP_STEPS:]):.3f} s, "
                  f"update {statistics.median(result['training_s'][WARMUP_STEPS:]):.3f} s", flush=True)  # fmt: skip
    bound = "2 shared cores bound the gain (see the module docstring); lower is better"
    load = os.getloadavg()[0]
    rows = [
        figure("update time (time_training_s), 2 workers vs 1", _median(runs["w2"], "training_s"), "s/step",
               baseline=_median(runs["w1"], "training_s"),
               note=f"baseline: 1 Ray training worker, same run; {bound}"),
        figure("GRPO step time, 2 workers vs 1", _median(runs["w2"], "step_s"), "s/step",
               baseline=_median(runs["w1"], "step_s"), note=f"baseline: 1 Ray training worker, same run; {bound}"),
        figure("update time, 1 Ray worker vs in-process", _median(runs["w1"], "training_s"), "s/step",
               baseline=_median(runs["inproc"], "training_s"),
               note="baseline: the update in the trainer's process, same run; above 1 is Ray's overhead"),
        figure("GRPO step time, 2 workers vs in-process update", _median(runs["w2"], "step_s"), "s/step",
               baseline=_median(runs["inproc"], "step_s"), note=f"baseline: in-process update, same run; {bound}"),
    ]  # fmt: skip
    write_results(
        "data_parallel",
        rows,
        quick=args.quick,
        details={"steps": steps, "rounds": rounds, "load_average_1min_at_end": load, "warmup_steps": WARMUP_STEPS, "runs": runs},
    )


if __name__ == "__main__":
    main()

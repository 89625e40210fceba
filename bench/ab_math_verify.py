"""Math ``/verify`` throughput, old code against new, in one sitting: ``bench_math_verify.py`` run
alternately in a copy of an older commit's tree (``git archive``) and in this tree, same Python, same
machine, each writing to its own results directory; the medians per workload go to
``bench/results/math_verify_ab.json``.

    .venv/bin/python bench/ab_math_verify.py --old-ref febed3a^ [--rounds 2] [--requests 300]

Both trees run with the libraries installed now (so a library pin is not part of the comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("noop_verify", "fast_path", "pool_path", "grpo_groups", "nemo_records")


def run_bench(tree: Path, out: Path, requests: int) -> dict[str, Any]:
    """One ``bench_math_verify.py`` run in ``tree``: per workload, requests per second and requests per
    CPU-second of the server and its workers (the load-independent cost, for a shared machine)."""
    env = {**os.environ, "BENCH_RESULTS_DIR": str(out), "PYTHONPATH": str(tree)}
    command = [sys.executable, "bench/bench_math_verify.py", "--quick", "--requests", str(requests)]
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    details = json.loads((out / "math_verify.json").read_text())["details"]
    median = details["median"]
    return {
        **{name: median[name]["per_s"] for name in WORKLOADS},
        **{f"{name}_per_cpu_s": median[name]["per_server_cpu_s"] for name in WORKLOADS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-ref", required=True, help="the commit whose code is the baseline")
    parser.add_argument("--rounds", type=int, default=2, help="old/new pairs, alternating")
    parser.add_argument("--requests", type=int, default=300, help="requests per workload and run")
    args = parser.parse_args()
    old_commit = subprocess.run(
        ["git", "rev-parse", args.old_ref], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "archive", old_commit], cwd=REPO, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
        for r in range(args.rounds):
            for name, tree in (("old", old_tree), ("new", REPO)):
                out = Path(tmp) / f"{name}{r}"
                out.mkdir()
                rates = run_bench(tree, out, args.requests)
                runs[name].append(rates)
                print(
                    f"round {r + 1} {name}: " + "  ".join(f"{k} {v:.1f}" for k, v in rates.items()),
                    flush=True,
                )
    keys = list(runs["old"][0])
    medians = {name: {k: statistics.median(run[k] for run in runs[name]) for k in keys} for name in runs}
    rows = [
        figure(
            f"verify req/s, c=16, {workload}",
            medians["new"][workload],
            "req/s",
            baseline=medians["old"][workload],
            note=f"baseline: the code at {old_commit[:10]}, same sitting, alternating runs; higher is better",
        )
        for workload in WORKLOADS
    ] + [
        figure(
            f"verify requests per server CPU-second, {workload}",
            medians["new"][f"{workload}_per_cpu_s"],
            "req/CPU-s",
            baseline=medians["old"][f"{workload}_per_cpu_s"],
            note=f"baseline: the code at {old_commit[:10]}, same sitting; server + workers CPU from /proc, "
            "load-independent; higher is better",
        )
        for workload in WORKLOADS
    ]
    details = {
        "old_commit": old_commit,
        "rounds": args.rounds,
        "requests": args.requests,
        "runs": runs,
        "medians": medians,
        "loadavg_end": os.getloadavg(),
    }
    path = write_results("math_verify_ab", rows, details=details)
    for workload in WORKLOADS:
        old, new = medians["old"][workload], medians["new"][workload]
        old_cpu, new_cpu = (medians[n][f"{workload}_per_cpu_s"] for n in ("old", "new"))
        print(
            f"{workload:13s} old {old:7.1f}/s  new {new:7.1f}/s  x{new / old:.2f}   "
            f"per CPU-s old {old_cpu:7.1f}  new {new_cpu:7.1f}  x{new_cpu / old_cpu:.2f}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

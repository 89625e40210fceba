"""Memory and throughput of one ``gym-bridge collect`` run as the run grows: does memory stay flat with N?

The real CLI runs as a child process against the fake model (tests/fake_model.py, its own process) and the
built-in math env (in-process, the default), at ``--concurrency 65536`` (above what the machine's open-file
and ephemeral-port limits allow: collect bounds it and says so). For each run size N (65,536, 262,144 and
1,048,576 rollouts: N/4 task rows, 4 repeats) it records failures, the main process's peak RSS
(``wait4``'s ``ru_maxrss``), the summed PSS of its process tree (math verifier workers included, 1 s
samples) and rollouts/s (collect's own figure, and N over the child's wall time). The flat-memory figure is
the slope of peak RSS between the smallest and the largest run, in bytes per rollout.

    .venv/bin/python bench/bench_collect_scale.py             # 65,536 / 262,144 / 1,048,576: bench/results/collect_scale.json
    .venv/bin/python bench/bench_collect_scale.py --quick     # 8,192 / 32,768 at c=4096 (about a minute)
    .venv/bin/python bench/bench_collect_scale.py --sizes 65536 262144
    .venv/bin/python bench/bench_collect_scale.py --sizes 1048576 --add   # beside the runs already in the file
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collect import REPO, _child_env, _gym_bridge, _run_child, _write_tasks  # noqa: E402
from common import figure, write_results  # noqa: E402

RESULT_NAME = "collect_scale"
FULL_SIZES = (65_536, 262_144, 1_048_576)
QUICK_SIZES = (8_192, 32_768)
REPEATS = 4
ISSUE_BEFORE = {
    65_536: {"rollouts_per_s": 1409.0, "peak_rss_gb": 1.25},
    262_144: {"rollouts_per_s": 923.0, "peak_rss_gb": 2.73},
}
"""Before this change, as measured in issue 37 (same machine kind, c=65536, math, fake model)."""


def scale_run(url: str, n: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    """One collect run of ``n`` rollouts: failures, peak memory, rate, and what collect said of its concurrency."""
    rows = n // REPEATS
    tasks, out = workdir / f"tasks_{rows}.jsonl", workdir / f"out_{n}.jsonl"
    if not tasks.exists():
        _write_tasks(tasks, rows)
    cmd = [*_gym_bridge(), "collect", str(tasks), "-o", str(out), "--overwrite", "--env", "math",
           "--model-url", url, "--concurrency", str(concurrency), "--num-repeats", str(REPEATS),
           "--no-progress", "--request-timeout", "600"]  # fmt: skip
    loadavg_start = os.getloadavg()
    run = _run_child(cmd, _child_env(), timeout=7200, poll_s=1.0)  # peak RSS is exact (wait4); PSS sampled
    metrics = json.loads(out.with_name(out.stem + "_metrics.json").read_text())
    aggregate = out.with_name(out.stem + "_aggregate_metrics.json")
    lines = sum(1 for _ in open(out, "rb"))
    block = metrics["run"]
    result = {
        "rollouts": n,
        "rollouts_written": block["rollouts_written"],
        "lines_in_output": lines,
        "failed": block["rollouts_failed"],
        "rollouts_per_s": block["rollouts_per_s"],
        "rollouts_per_s_wall": block["rollouts_written"] / run["wall_s"],
        "wall_s": run["wall_s"],
        "cpu_s": run["cpu_s"],
        "peak_rss_main_mib": run["peak_rss_main_mib"],
        "peak_pss_tree_mib": run["peak_pss_tree_mib"],
        "concurrency_requested": concurrency,
        "concurrency": block.get("concurrency"),
        "concurrency_bound": block.get("concurrency_bound"),
        "pass@4": metrics.get("pass@4"),
        "failures_by_class": block.get("failures_by_class"),
        "console_tail": (run["stdout"] + run.get("stderr", ""))[-1500:],
        "aggregate_file_bytes": aggregate.stat().st_size if aggregate.exists() else None,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
    }
    for path in (out, aggregate, out.with_name(out.stem + "_materialized_inputs.jsonl")):
        path.unlink(missing_ok=True)  # a million rollouts take ~2 GB of disk
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8,192 and 32,768 rollouts at c=4096")
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--add", action="store_true",
                        help="keep the runs already in the results file (other sizes, run earlier) beside these")
    args = parser.parse_args()
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    concurrency = args.concurrency or (4096 if args.quick else 65_536)
    fake = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_model.py")], cwd=REPO, env=_child_env(),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    runs: list[dict[str, Any]] = []
    try:
        url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        if not url.startswith("http"):
            raise RuntimeError(f"fake model did not start (printed {url!r})")
        with tempfile.TemporaryDirectory(prefix="bench-collect-scale-") as tmp:
            for n in sizes:
                run = scale_run(url, n, concurrency, Path(tmp))
                runs.append(run)
                print(
                    f"N={n:>9,d}: {run['failed']} failed, {run['rollouts_per_s']:7.0f} rollouts/s "
                    f"({run['rollouts_per_s_wall']:.0f} over the wall time), peak RSS {run['peak_rss_main_mib']:.0f} MiB "
                    f"(tree PSS {run['peak_pss_tree_mib']:.0f} MiB), concurrency {run['concurrency']} "
                    f"of {concurrency}, load {run['loadavg_start'][0]:.1f}->{run['loadavg_end'][0]:.1f}",
                    flush=True,
                )
    finally:
        fake.kill()
        fake.wait()
    if args.add:
        earlier = Path(os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results") / f"{RESULT_NAME}.json"
        if earlier.exists():
            sizes_now = {r["rollouts"] for r in runs}
            kept = [r for r in json.loads(earlier.read_text())["details"]["runs"] if r["rollouts"] not in sizes_now]
            runs = sorted(kept + runs, key=lambda r: r["rollouts"])
    rows = []
    for r in runs:
        before = ISSUE_BEFORE.get(r["rollouts"])
        note = (f"c={r['concurrency_requested']:,} requested, {r['concurrency']} run at once (bounded by collect: "
                f"{r['concurrency_bound']}); {r['failed']} failed; {r['rollouts_written']:,} written; "
                f"load average {r['loadavg_start'][0]:.1f} at start, {r['loadavg_end'][0]:.1f} at end")  # fmt: skip
        before_note = (f"; before this change (issue 37, not this run): {before['rollouts_per_s']:g} rollouts/s, "
                       f"{before['peak_rss_gb']:g} GB") if before else ""  # fmt: skip
        rows.append(figure(f"collect rollouts/s, N={r['rollouts']:,}", r["rollouts_per_s"], "rollouts/s",
                           note=note + before_note + "; higher is better"))  # fmt: skip
        rows.append(figure(f"collect peak RSS, N={r['rollouts']:,}", r["peak_rss_main_mib"], "MiB",
                           note=f"main process (wait4 ru_maxrss); tree PSS {r['peak_pss_tree_mib']:.0f} MiB; "
                                "aim < 1.5 GB at 1,048,576; lower is better"))  # fmt: skip
        rows.append(figure(f"collect failed rollouts, N={r['rollouts']:,}", r["failed"], "rollouts",
                           note="aim 0; lower is better"))  # fmt: skip
    if len(runs) >= 2:
        small, large = runs[0], runs[-1]
        slope = (large["peak_rss_main_mib"] - small["peak_rss_main_mib"]) * 1024 * 1024 / (large["rollouts"] - small["rollouts"])
        rows.append(figure(
            f"collect memory growth, N={small['rollouts']:,} -> {large['rollouts']:,}", slope, "bytes/rollout",
            baseline=5.8 * 1024, baseline_unit="bytes/rollout", ratio=slope / (5.8 * 1024),
            note=("slope of the main process's peak RSS over run size; baseline: ~5.8 KB/rollout before this "
                  "change as measured in issue 37 (not this run); lower is better, ~0 is flat"),
        ))  # fmt: skip
    details = {"runs": runs, "repeats": REPEATS, "concurrency": concurrency, "issue_37_before": ISSUE_BEFORE}
    path = write_results(RESULT_NAME, rows, quick=args.quick, details=details)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

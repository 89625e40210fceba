"""Memory and throughput of one ``gym-bridge collect`` run as the run grows: does memory stay flat with N?

The real CLI runs as a child process against the fake model (tests/fake_model.py, its own process) and the
built-in math env (in-process, the default), at ``--concurrency 65536`` (above what the machine's open-file
and ephemeral-port limits allow: collect bounds it and says so). For each run size N (65,536, 262,144 and
1,048,576 rollouts: N/4 task rows, 4 repeats) it records failures, the main process's peak RSS
(``wait4``'s ``ru_maxrss``), the summed PSS of its process tree (math verifier workers included, 1 s
samples) and rollouts/s (collect's own figure, and N over the child's wall time), and the CPU milliseconds a
rollout of collect's process tree (``wait4``: worker processes included) and of the fake model. The
flat-memory figure is the slope of peak RSS between the smallest and the largest run, in bytes per rollout.

``--workers 1 2`` runs every size once per value (``collect --workers N``: N processes run the rollouts),
taking turns (1 2, then 2 1, ...) so that both see the same machine; ``--rounds R`` repeats that. With
worker processes, ``peak_rss_main_mib`` is the largest single process of the run (``wait4`` counts the
workers the main process reaped) and the tree PSS is the sum of them all.

    .venv/bin/python bench/bench_collect_scale.py             # 65,536 / 262,144 / 1,048,576: bench/results/collect_scale.json
    .venv/bin/python bench/bench_collect_scale.py --quick     # 8,192 / 32,768 at c=4096 (about a minute)
    .venv/bin/python bench/bench_collect_scale.py --sizes 65536 262144
    .venv/bin/python bench/bench_collect_scale.py --sizes 1048576 --add   # beside the runs already in the file
    .venv/bin/python bench/bench_collect_scale.py --quick --workers 1 2 --rounds 2   # one process vs two workers
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collect import REPO, _child_env, _gym_bridge, _run_child, _write_tasks  # noqa: E402
from common import figure, write_results  # noqa: E402

RESULT_NAME = "collect_scale"
WORKER_MODULE = "gym_bridge.collect.local_worker"
"""How a ``collect --workers`` worker process is named on its command line."""
FULL_SIZES = (65_536, 262_144, 1_048_576)
QUICK_SIZES = (8_192, 32_768)
REPEATS = 4
ISSUE_BEFORE = {
    65_536: {"rollouts_per_s": 1409.0, "peak_rss_gb": 1.25},
    262_144: {"rollouts_per_s": 923.0, "peak_rss_gb": 2.73},
}
"""Before this change, as measured in issue 37 (same machine kind, c=65536, math, fake model)."""


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_parts(run: dict[str, Any], model_cpu: float | None, rollouts: int) -> dict[str, float | None]:
    """CPU ms a rollout of the main process, its worker processes (``collect --workers``), its other
    descendants (verifier processes) and the model: the descendants as last sampled (each second), the
    main process the rest of the tree's exact total (``wait4``)."""
    by_pid = run.get("cpu_by_pid", {})
    workers = sum(cpu for cpu, name in by_pid.values() if WORKER_MODULE in name)
    others = sum(cpu for cpu, name in by_pid.values() if WORKER_MODULE not in name)
    per = 1000 / max(1, rollouts)
    return {"main": (run["cpu_s"] - workers - others) * per, "workers": workers * per, "other_descendants": others * per,
            "model": None if model_cpu is None else model_cpu * per}  # fmt: skip


def scale_run(url: str, n: int, concurrency: int, workdir: Path, workers: int = 1, model_pid: int | None = None) -> dict[str, Any]:
    """One collect run of ``n`` rollouts with ``workers`` processes: failures, peak memory, rate, CPU per
    rollout (collect's tree, and the model process ``model_pid``), what collect said of its concurrency."""
    rows = n // REPEATS
    tasks, out = workdir / f"tasks_{rows}.jsonl", workdir / f"out_{n}.jsonl"
    if not tasks.exists():
        _write_tasks(tasks, rows)
    cmd = [*_gym_bridge(), "collect", str(tasks), "-o", str(out), "--overwrite", "--env", "math",
           "--model-url", url, "--concurrency", str(concurrency), "--num-repeats", str(REPEATS),
           "--no-progress", "--request-timeout", "600", "--workers", str(workers)]  # fmt: skip
    loadavg_start = os.getloadavg()
    model_cpu = _cpu_s(model_pid) if model_pid else None
    run = _run_child(cmd, _child_env(), timeout=7200, poll_s=1.0)  # peak RSS is exact (wait4); PSS sampled
    model_cpu = _cpu_s(model_pid) - model_cpu if model_pid and model_cpu is not None else None
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
        "workers": workers,
        "worker_processes": block.get("worker_processes"),
        "cpu_ms_per_rollout": 1000 * run["cpu_s"] / max(1, block["rollouts_written"]),
        "cpu_ms_per_rollout_parts": _cpu_parts(run, model_cpu, block["rollouts_written"]),
        "model_cpu_ms_per_rollout": None if model_cpu is None else 1000 * model_cpu / max(1, block["rollouts_written"]),
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
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="collect --workers values; several take turns at each size (default: 1)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each size and workers value")
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
            turn = 0
            for n in sizes:
                for _ in range(args.rounds):
                    for workers in args.workers if turn % 2 == 0 else args.workers[::-1]:
                        run = scale_run(url, n, concurrency, Path(tmp), workers, fake.pid)
                        runs.append(run)
                        print(
                            f"N={n:>9,d} --workers {workers}: {run['failed']} failed, {run['rollouts_per_s']:7.0f} "
                            f"rollouts/s ({run['rollouts_per_s_wall']:.0f} over the wall time), peak RSS "
                            f"{run['peak_rss_main_mib']:.0f} MiB (tree PSS {run['peak_pss_tree_mib']:.0f} MiB), CPU "
                            f"{run['cpu_ms_per_rollout']:.3f} ms/rollout ("
                            + ", ".join(f"{k} {v:.3f}" for k, v in run["cpu_ms_per_rollout_parts"].items() if v is not None)
                            + "), "
                            f"concurrency {run['concurrency']} of {concurrency}, load "
                            f"{run['loadavg_start'][0]:.1f}->{run['loadavg_end'][0]:.1f}",
                            flush=True,
                        )
                    turn += 1
    finally:
        fake.kill()
        fake.wait()
    if args.add:
        earlier = Path(os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results") / f"{RESULT_NAME}.json"
        if earlier.exists():
            now = {(r["rollouts"], r.get("workers", 1)) for r in runs}
            kept = [r for r in json.loads(earlier.read_text())["details"]["runs"]
                    if (r["rollouts"], r.get("workers", 1)) not in now]  # fmt: skip
            runs = sorted(kept + runs, key=lambda r: (r.get("workers", 1), r["rollouts"]))
    rows = []
    runs_of, seen = Counter((r["rollouts"], r.get("workers", 1)) for r in runs), Counter()
    for r in runs:
        before = ISSUE_BEFORE.get(r["rollouts"])
        workers = r.get("workers", 1)
        label = f"N={r['rollouts']:,}" + (f", --workers {workers}" if workers != 1 else "")
        seen[r["rollouts"], workers] += 1
        if runs_of[r["rollouts"], workers] > 1:
            label += f", run {seen[r['rollouts'], workers]}"
        cpu = r.get("cpu_ms_per_rollout")
        parts = r.get("cpu_ms_per_rollout_parts") or {}
        split = ", ".join(f"{k} {v:.3f}" for k, v in parts.items() if v is not None)
        note = (f"--workers {workers} ({'one process' if workers == 1 else f'{workers} worker processes run the rollouts'}); "
                f"c={r['concurrency_requested']:,} requested, {r['concurrency']} run at once (bounded by collect: "
                f"{r['concurrency_bound']}); {r['failed']} failed; {r['rollouts_written']:,} written; "
                + (f"CPU {cpu:.3f} ms a rollout (collect's tree; {split}); " if cpu else "")
                + f"load average {r['loadavg_start'][0]:.1f} at start, {r['loadavg_end'][0]:.1f} at end")  # fmt: skip
        before_note = (f"; before this change (issue 37, not this run): {before['rollouts_per_s']:g} rollouts/s, "
                       f"{before['peak_rss_gb']:g} GB") if before else ""  # fmt: skip
        rows.append(figure(f"collect rollouts/s, {label}", r["rollouts_per_s"], "rollouts/s",
                           note=note + before_note + "; higher is better"))  # fmt: skip
        largest = "main process" if workers == 1 else "largest process of the run"
        rows.append(figure(f"collect peak RSS, {label}", r["peak_rss_main_mib"], "MiB",
                           note=f"{largest} (wait4 ru_maxrss); tree PSS {r['peak_pss_tree_mib']:.0f} MiB; "
                                "aim < 1.5 GB at 1,048,576; lower is better"))  # fmt: skip
        rows.append(figure(f"collect failed rollouts, {label}", r["failed"], "rollouts",
                           note="aim 0; lower is better"))  # fmt: skip
    single = [r for r in runs if r.get("workers", 1) == 1]
    if len({r["rollouts"] for r in single}) >= 2:
        small = min(single, key=lambda r: r["rollouts"])
        large = max(single, key=lambda r: r["rollouts"])
        slope = (large["peak_rss_main_mib"] - small["peak_rss_main_mib"]) * 1024 * 1024 / (large["rollouts"] - small["rollouts"])
        rows.append(figure(
            f"collect memory growth, N={small['rollouts']:,} -> {large['rollouts']:,}", slope, "bytes/rollout",
            baseline=5.8 * 1024, baseline_unit="bytes/rollout", ratio=slope / (5.8 * 1024),
            note=("slope of the main process's peak RSS over run size; baseline: ~5.8 KB/rollout before this "
                  "change as measured in issue 37 (not this run); lower is better, ~0 is flat"),
        ))  # fmt: skip
    details = {"runs": runs, "repeats": REPEATS, "concurrency": concurrency, "workers": args.workers,
               "rounds": args.rounds, "issue_37_before": ISSUE_BEFORE}  # fmt: skip
    path = write_results(RESULT_NAME, rows, quick=args.quick, details=details)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

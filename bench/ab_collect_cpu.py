"""A/B of ``gym-bridge collect``'s throughput between checkouts, in one sitting, on one fake model.

Why: collect on a small machine is bound by one core running the rollout loop (its requests to the model,
the envs it serves in-process, the files it writes), so CPU per rollout is its throughput. Each checkout's
``collect`` (``--env math``, in-process as by default) runs the same task file against one fake model
(``tests/fake_model.py`` of the last checkout, in its own process); the checkouts take turns, A B, B A,
A B, ... and each run records its rollouts/s, its own CPU seconds (user + system, the collect process and
its children) and the load average when it started. Other work on a shared machine moves the absolute
figures; read the ratio of the medians. The outputs of the last two runs are compared: the same records,
failures, materialized inputs, aggregate metrics and metrics apart from timings, each checkout's against
the baseline's (ids and ``created_at``
are the fake model's own). Across a change of the record format (the redesign's A/B against 99bf06e:
records became NeMo Gym's full shapes), ``--records-may-differ`` reports the comparison without failing;
each run also records its output's bytes per rollout.

    git worktree add --detach /tmp/collect-old <commit before>
    .venv/bin/python bench/ab_collect_cpu.py /tmp/collect-old . --rows 8192 --repeats 4 --concurrency 4096 --rounds 3
    .venv/bin/python bench/ab_collect_cpu.py /tmp/ab-old /tmp/ab-new --rows 4096 --repeats 4 --concurrency 1024 \
        --rounds 3 --records-may-differ        # the redesign's A/B (issue 35, bench/README.md)

Each checkout runs with ``PYTHONPATH=<checkout>`` under this interpreter (the first is the baseline; more than two take turns
forwards, then backwards); writes
``bench/results/collect_cpu_ab.json``. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_collect import _write_tasks
from common import figure, print_rows, write_results

_SIDE_FILES = ("", "_failures", "_materialized_inputs")
_TIMINGS = ("elapsed_s", "rollouts_per_s", "time_to_first_rollout_s", "model_latency_s", "rollout_latency_s")
_FRESH = re.compile(rb'"created_at":[0-9.e+-]+|"(?:resp|msg|fc|call)_fake_[0-9]+"')
"""What the fake model makes anew for every answer: its timestamp and its ids (a counter over its life)."""


def _env(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'bench'}"}


def _start_model(checkout: Path) -> tuple[subprocess.Popen[str], str]:
    fake = subprocess.Popen(
        [sys.executable, str(checkout / "tests" / "fake_model.py")], env=_env(checkout), stdout=subprocess.PIPE, text=True
    )
    url = fake.stdout.readline().strip() if fake.stdout is not None else ""
    if not url.startswith("http://127.0.0.1:"):
        fake.kill()
        raise SystemExit(f"the fake model did not start on loopback (it said {url!r})")
    return fake, url


def run_once(checkout: Path, tasks: Path, out: Path, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One ``collect`` of ``checkout``: rollouts/s (its metrics file), CPU seconds, load average at start."""
    cmd = [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--overwrite",
           "--env", "math", "--model-url", url, "--concurrency", str(args.concurrency),
           "--num-repeats", str(args.repeats), "--no-progress"]  # fmt: skip
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=checkout, env=_env(checkout), capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: collect failed ({done.returncode}): {done.stderr[-2000:]}")
    run = json.loads(out.with_name(out.stem + "_metrics.json").read_text())["run"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "checkout": str(checkout),
        "rollouts_per_s": run["rollouts_per_s"],
        "written": run["rollouts_written"],
        "failed": run["rollouts_failed"],
        "cpu_s": round(cpu, 2),
        "cpu_ms_per_rollout": round(1000 * cpu / max(1, run["rollouts_written"]), 3),
        "record_bytes_per_rollout": round(out.stat().st_size / max(1, run["rollouts_written"])),
        "wall_s": round(wall, 2),
        "loadavg_1m_at_start": round(load, 2),
    }


def _normalized(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    return sorted(_FRESH.sub(b"_", line) for line in path.read_bytes().splitlines())


def same_outputs(a: Path, b: Path) -> dict[str, bool]:
    """Whether two runs wrote the same files, apart from timings (line order is completion order)."""
    same = {f"{stem or 'rollouts'}.jsonl": _normalized(a.with_name(a.stem + stem + ".jsonl"))
            == _normalized(b.with_name(b.stem + stem + ".jsonl")) for stem in _SIDE_FILES}  # fmt: skip
    aggregate = [p.with_name(p.stem + "_aggregate_metrics.json").read_text() for p in (a, b)]
    same["aggregate_metrics.json"] = aggregate[0] == aggregate[1]
    metrics = [json.loads(p.with_name(p.stem + "_metrics.json").read_text()) for p in (a, b)]
    for m in metrics:
        for key in _TIMINGS:
            m["run"].pop(key, None)
    same["metrics.json (less timings)"] = metrics[0] == metrics[1]
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path, nargs="+", help="the checkouts; the first is the baseline")
    parser.add_argument("--rows", type=int, default=8192, help="task rows")
    parser.add_argument("--repeats", type=int, default=4, help="collect --num-repeats")
    parser.add_argument("--concurrency", type=int, default=4096, help="collect --concurrency")
    parser.add_argument("--rounds", type=int, default=3, help="runs per checkout (alternating)")
    parser.add_argument("--records-may-differ", action="store_true",
                        help="report different outputs (a record format change) instead of failing")  # fmt: skip
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkouts]
    if len(checkouts) < 2:
        parser.error("give the baseline checkout and at least one more")
    old = checkouts[0]
    fake, url = _start_model(checkouts[-1])
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="ab-collect-cpu-") as tmp:
            work = Path(tmp)
            tasks = work / "tasks.jsonl"
            _write_tasks(tasks, args.rows)
            outs = {c: work / f"out{i}.jsonl" for i, c in enumerate(checkouts)}
            for i in range(args.rounds):
                for checkout in checkouts if i % 2 == 0 else checkouts[::-1]:
                    runs.append(run_once(checkout, tasks, outs[checkout], url, args))
                    print(json.dumps(runs[-1]), flush=True)
            identical = {str(c): same_outputs(outs[old], outs[c]) for c in checkouts[1:]}
    finally:
        fake.terminate()
        fake.wait(10)
    median = {c: {k: statistics.median(r[k] for r in runs if r["checkout"] == str(c))
                  for k in ("rollouts_per_s", "cpu_ms_per_rollout")} for c in checkouts}  # fmt: skip
    rollouts = args.rows * args.repeats
    note = (f"median of {args.rounds} alternating runs each, {rollouts:,} rollouts, --concurrency {args.concurrency}, "
            f"--env math in-process, fake model in its own process; baseline: {old}")  # fmt: skip
    rows = []
    for c in checkouts[1:]:
        rows += [
            figure(f"collect rollouts/s ({c})", median[c]["rollouts_per_s"], "rollouts/s",
                   baseline=median[old]["rollouts_per_s"], note=note),
            figure(f"collect CPU per rollout ({c})", median[c]["cpu_ms_per_rollout"], "ms",
                   baseline=median[old]["cpu_ms_per_rollout"], note=note + "; lower is better"),
        ]  # fmt: skip
    details = {"checkouts": [str(c) for c in checkouts], "runs": runs, "identical_outputs": identical,
               "rollouts": rollouts, "failures": sum(r["failed"] for r in runs),
               "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}  # fmt: skip
    print_rows(rows, write_results("collect_cpu_ab", rows, details=details))
    print("identical outputs:", identical)
    if details["failures"] or not (args.records_may_differ or all(all(s.values()) for s in identical.values())):
        raise SystemExit("a checkout wrote different outputs from the baseline's, or rollouts failed")


if __name__ == "__main__":
    main()

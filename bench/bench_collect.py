"""Throughput, start-up and memory of ``gym-bridge collect`` against a fast fake model.

For each concurrency (16, 256, 10,000) and each env (a no-op verifier, the built-in math server) the real
CLI (``gym-bridge collect``) runs as a child process; the fake model (tests/fake_model.py, arithmetic
solver) runs in its own process. Every figure has a ceiling measured in the same run with the same client
code (``ClientPool`` + ``post_json``), in a child process of its own:

* throughput: the fake model's raw request rate at the same concurrency. One rollout is three requests
  (seed_session, model, verify) plus verification, so a ratio of 1/3 would mean the env and the loop cost
  nothing beyond their HTTP round trips;
* peak memory: that ceiling process's peak, same concurrency (collect's process tree, verifier workers
  included, against a client that only posts requests);
* time to first rollout (spawning ``gym-bridge collect`` to the first complete line in its output): a fresh
  interpreter that imports the client and writes the model's first answer to a file.

Memory is the peak of the summed PSS of the child and its descendants (sampled every 0.1 s: the math
server's verifier workers are grandchildren that ``wait4`` does not see); the main process's exact peak RSS
is in the details. NeMo Gym 0.7.0 figures appear in the notes only as quoted in the issue (not measured
here).

    .venv/bin/python bench/bench_collect.py             # c = 16, 256, 10,000: bench/results/collect.json
    .venv/bin/python bench/bench_collect.py --quick     # c = 16 and 256, fewer rollouts (under 2 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.server import ResourcesServer, Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

FULL_SIZES = {16: (500, 2), 256: (1000, 3), 10_000: (10_000, 2)}
"""concurrency -> (task rows, repeats): at 10,000 every worker gets two rollouts."""
QUICK_SIZES = {16: (300, 2), 256: (512, 2)}
"""Quick mode skips 10,000 (20,000 rollouts take minutes on 2 cores)."""

ISSUE_NEMO_GYM = {"math_rollouts_per_s_c16": 12.0, "trivial_rollouts_per_s": 100.0, "first_rollout_s": 7.0}
"""NeMo Gym 0.7.0 on this machine as quoted in the issue (not measured by this bench); the aim is >= 10x."""


class NoopServer(ResourcesServer):
    """A verifier that does nothing: reward 1 for every response (``--env bench_collect:NoopServer``)."""

    name = "noop"

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse(**dump(body), reward=1.0)


_CEILING = """
import asyncio, json, sys, time
import uvloop
from gym_bridge.collect import ClientPool, connection_cap
from gym_bridge.serving.retry import RetryPolicy, post_json
url, concurrency, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = {"input": [{"role": "user", "content": "What is 2 + 3? Put the answer in \\\\boxed{}.", "type": "message"}]}
async def main():
    pool = ClientPool(concurrency, connection_cap())
    jobs = iter(range(total))
    policy = RetryPolicy()
    async def worker(i):
        client = pool.for_worker(i)
        for _ in jobs:
            await post_json(client, url + "/responses", body, target="model", policy=policy)
    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    await pool.aclose()
    print(json.dumps({"requests": total, "elapsed_s": elapsed, "requests_per_s": total / elapsed}))
uvloop.run(main())
"""

# Start-up ceiling: a fresh interpreter, the same client imports, one model answer written as one line.
_FIRST_ANSWER = """
import asyncio, json, sys
from gym_bridge.collect import ClientPool, connection_cap
from gym_bridge.serving.retry import RetryPolicy, post_json
url, out = sys.argv[1], sys.argv[2]
body = {"input": [{"role": "user", "content": "What is 2 + 3? Put the answer in \\\\boxed{}.", "type": "message"}]}
async def main():
    pool = ClientPool(1, connection_cap())
    answer = await post_json(pool.for_worker(0), url + "/responses", body, target="model", policy=RetryPolicy())
    with open(out, "w") as f:
        f.write(json.dumps(answer.data) + "\\n")
    await pool.aclose()
asyncio.run(main())
"""


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc/<pid>/task/<tid>/children)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return pids


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cpu_and_name(pid: int, name: str | None = None) -> tuple[float, str] | None:
    """CPU seconds (user + system) a process has used so far, and its command line (read unless given);
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if name is None:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                name = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), name


def _memory_poll(pid: int, stop: threading.Event, out: dict[str, Any], every_s: float = 0.1) -> None:
    """Peak summed PSS of the process tree and the main process's VmHWM, sampled every 0.1 s; and each
    descendant's CPU seconds and command line as last seen (``cpu_by_pid``: a process that ends between
    two samples is short of its last interval's CPU)."""
    seen: dict[int, tuple[float, str]] = out.setdefault("cpu_by_pid", {})
    while not stop.is_set():
        tree = _tree_pids(pid)
        out["tree_pss_kb"] = max(out.get("tree_pss_kb", 0), sum(_pss_kb(p) for p in tree))
        for p in tree[1:]:
            if (found := _cpu_and_name(p, seen[p][1] if p in seen else None)) is not None:
                seen[p] = found
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    out["hwm_kb"] = max(out.get("hwm_kb", 0), int(line.split()[1]))
        except OSError:
            return
        stop.wait(every_s)


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (``wait4`` must still get its rusage)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _run_child(
    cmd: list[str], env: dict[str, str], watch: Path | None = None, timeout: float = 1800, poll_s: float = 0.1
) -> dict[str, Any]:
    """Run a child to completion: wall time, CPU time, peak memory, stdout and (with ``watch``) the time
    from spawning it to the first complete line in that file (``poll_s``: how often the tree's PSS is
    sampled; reading it costs CPU the child then lacks)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop, memory = threading.Event(), {}
    poller = threading.Thread(target=_memory_poll, args=(proc.pid, stop, memory, poll_s), daemon=True)
    poller.start()
    stdout_chunks: list[bytes] = []
    stderr_chunks: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: stdout_chunks.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    killer = threading.Timer(timeout, proc.kill)  # a hung child fails the bench instead of hanging it
    killer.start()
    first_line = None
    while watch is not None and first_line is None and not _exited(proc.pid):
        try:
            with open(watch, "rb") as f:
                if b"\n" in f.read(1 << 16):
                    first_line = time.perf_counter() - start
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    _, status, usage = os.wait4(proc.pid, 0)  # reaps it: exit status, CPU time and peak RSS in one call
    elapsed = time.perf_counter() - start
    killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    poller.join(5)
    for reader in readers:
        reader.join(5)
    if first_line is None and watch is not None and watch.exists() and b"\n" in watch.read_bytes()[: 1 << 16]:
        first_line = elapsed  # it finished between two polls: an upper bound
    if proc.returncode != 0:
        tail = b"".join(stderr_chunks).decode(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({proc.returncode}): {tail}")
    main_rss_kb = max(usage.ru_maxrss, memory.get("hwm_kb", 0))
    return {
        "wall_s": elapsed,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_main_mib": main_rss_kb / 1024,
        "peak_pss_tree_mib": (memory.get("tree_pss_kb") or main_rss_kb) / 1024,
        "first_line_s": first_line,
        "cpu_by_pid": memory.get("cpu_by_pid", {}),
        "stdout": b"".join(stdout_chunks).decode(errors="replace"),
        "stderr": b"".join(stderr_chunks).decode(errors="replace"),
    }


def _write_tasks(path: Path, rows: int) -> None:
    with open(path, "w") as f:
        for i in range(rows):
            a, b = i % 10, (i // 10) % 10
            prompt = f"What is {a} + {b}? Put the answer in \\boxed{{}}."
            row = {"responses_create_params": {"input": [{"role": "user", "content": prompt}]},
                   "question": f"What is {a} + {b}?", "expected_answer": str(a + b)}  # fmt: skip
            f.write(json.dumps(row) + "\n")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "bench"), str(REPO), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    return env


def _gym_bridge() -> list[str]:
    """The installed ``gym-bridge`` console script next to this interpreter (else ``-m gym_bridge.cli``)."""
    script = Path(sys.executable).parent / "gym-bridge"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gym_bridge.cli"]


def ceiling(url: str, concurrency: int, requests: int) -> dict[str, Any]:
    """The fake model's raw request rate with collect's client code, and that process's peak memory."""
    run = _run_child([sys.executable, "-c", _CEILING, url, str(concurrency), str(requests)], _child_env())
    data = json.loads(run["stdout"].strip().splitlines()[-1])
    return {
        **data,
        "cpu_s": run["cpu_s"],
        "requests_per_cpu_s": requests / run["cpu_s"],
        "peak_rss_main_mib": run["peak_rss_main_mib"],
        "peak_pss_tree_mib": run["peak_pss_tree_mib"],
    }


def first_answer_ceiling(url: str, workdir: Path) -> float:
    """Seconds from spawning a fresh interpreter to the model's first answer written as a line."""
    out = workdir / "first_answer.jsonl"
    out.unlink(missing_ok=True)
    run = _run_child([sys.executable, "-c", _FIRST_ANSWER, url, str(out)], _child_env(), watch=out)
    return run["first_line_s"]


def collect_run(
    url: str, env_arg: str, concurrency: int, rows: int, repeats: int, workdir: Path
) -> dict[str, Any]:
    """One ``gym-bridge collect`` run as a child process: its figures from its metrics file and ``wait4``."""
    tasks, out = (
        workdir / f"tasks_{rows}.jsonl",
        workdir / f"out_{env_arg.split(':')[-1]}_{concurrency}.jsonl",
    )
    if not tasks.exists():
        _write_tasks(tasks, rows)
    cmd = [*_gym_bridge(), "collect", str(tasks), "-o", str(out), "--overwrite", "--env", env_arg,
           "--model-url", url, "--concurrency", str(concurrency), "--num-repeats", str(repeats),
           "--no-progress", "--request-timeout", "600"]  # fmt: skip
    out.unlink(missing_ok=True)  # the first-line watch must not see a previous run's file
    run = _run_child(cmd, _child_env(), watch=out)
    metrics = json.loads(out.with_name(out.stem + "_metrics.json").read_text())
    written = metrics["run"]["rollouts_written"]
    return {
        "rollouts": written,
        "failed": metrics["run"]["rollouts_failed"],
        "mean_reward": metrics["mean_reward"],
        "rollouts_per_s": metrics["run"]["rollouts_per_s"],
        "rollouts_per_s_wall": written / run["wall_s"],
        "rollouts_per_cpu_s": written / run["cpu_s"],
        "first_rollout_s": run["first_line_s"],
        "first_rollout_in_process_s": metrics["run"]["time_to_first_rollout_s"],
        "wall_s": run["wall_s"],
        "cpu_s": run["cpu_s"],
        "peak_rss_main_mib": run["peak_rss_main_mib"],
        "peak_pss_tree_mib": run["peak_pss_tree_mib"],
        "model_latency_p50_s": metrics["run"]["model_latency_s"]["p50"],
        "model_latency_p99_s": metrics["run"]["model_latency_s"]["p99"],
    }


ENV_LABEL = {"noop": "no-op verifier", "math": "math server"}


def rows_for(runs: list[dict[str, Any]], first_answer_s: float) -> list[dict[str, Any]]:
    """Result rows: throughput and memory per (env, concurrency), time to first rollout at the lowest one."""
    rows = []
    for r in runs:
        label = f"{ENV_LABEL[r['env']]}, c={r['concurrency']:,}"
        quoted = ISSUE_NEMO_GYM["math_rollouts_per_s_c16" if r["env"] == "math" else "trivial_rollouts_per_s"]
        quoted_where = (
            "math rollouts/s at c=16" if r["env"] == "math" else "rollouts/s with a trivial verifier"
        )
        rows.append(figure(
            f"collect rollouts/s, {label}", r["rollouts_per_s"], "rollouts/s",
            baseline=r["ceiling_requests_per_s"], baseline_unit="req/s",
            ratio=r["rollouts_per_s"] / r["ceiling_requests_per_s"],
            note=(f"baseline: fake model's raw request rate, same client (ClientPool + post_json), c={r['concurrency']:,}, "
                  "same run; a rollout is 3 requests, so 0.33 would mean the env and loop are free; higher is better. "
                  f"Quoted from the issue, not measured here: NeMo Gym 0.7.0 ~{quoted:g} {quoted_where} "
                  f"(aim >= 10x: {10 * quoted:g}); {r['rollouts']:,} rollouts, {r['failed']} failed"),
        ))  # fmt: skip
        rows.append(figure(
            f"collect peak memory, {label}", r["peak_pss_tree_mib"], "MiB",
            baseline=r["ceiling_peak_pss_tree_mib"],
            note=(f"PSS of collect and its child processes, peak of 0.1 s samples (main process peak RSS "
                  f"{r['peak_rss_main_mib']:.0f} MiB); baseline: the same-run ceiling client at c={r['concurrency']:,}, "
                  "which only posts requests; lower is better"),
        ))  # fmt: skip
    lowest = min(r["concurrency"] for r in runs)
    for r in (r for r in runs if r["concurrency"] == lowest and r["first_rollout_s"] is not None):
        quoted = ISSUE_NEMO_GYM["first_rollout_s"]
        rows.append(figure(
            f"collect time to first rollout, {ENV_LABEL[r['env']]}, c={lowest:,}", r["first_rollout_s"], "s",
            baseline=first_answer_s,
            note=("spawning gym-bridge collect to the first complete line in its output (server start-up included); "
                  "baseline: spawning a fresh interpreter that imports the same client and writes the fake model's "
                  "first answer to a file, same run; lower is better. Quoted from the issue, not measured here: "
                  f"NeMo Gym 0.7.0 ~{quoted:g} s (aim >= 10x faster: {quoted / 10:g} s)"),
        ))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="c = 16 and 256 only, fewer rollouts (under 2 minutes)"
    )
    parser.add_argument("--concurrency", type=int, nargs="*", default=None)
    parser.add_argument("--envs", nargs="*", default=["noop", "math"], choices=sorted(ENV_LABEL))
    args = parser.parse_args()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    concurrencies = args.concurrency or list(sizes)
    env_args = {"noop": "bench_collect:NoopServer", "math": "math"}
    fake = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_model.py")], cwd=REPO, env=_child_env(),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    runs: list[dict[str, Any]] = []
    ceilings: dict[int, dict[str, Any]] = {}
    loadavg_start = os.getloadavg()
    try:
        url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        if not url.startswith("http"):
            raise RuntimeError(f"fake model did not start (printed {url!r})")
        with tempfile.TemporaryDirectory(prefix="bench-collect-") as tmp:
            workdir = Path(tmp)
            first_answer_s = first_answer_ceiling(url, workdir)
            print(f"first-answer ceiling: {first_answer_s:.2f} s", flush=True)
            for concurrency in concurrencies:
                rows, repeats = sizes.get(concurrency, (max(200, concurrency), 2))
                ceil = ceilings[concurrency] = ceiling(
                    url, concurrency, max(1000 if args.quick else 2000, rows * repeats)
                )
                print(
                    f"ceiling c={concurrency}: {ceil['requests_per_s']:.0f} req/s, {ceil['peak_pss_tree_mib']:.0f} MiB",
                    flush=True,
                )
                for env_name in args.envs:
                    run = collect_run(url, env_args[env_name], concurrency, rows, repeats, workdir)
                    run.update(
                        env=env_name,
                        concurrency=concurrency,
                        ceiling_requests_per_s=ceil["requests_per_s"],
                        ceiling_requests_per_cpu_s=ceil["requests_per_cpu_s"],
                        ceiling_peak_pss_tree_mib=ceil["peak_pss_tree_mib"],
                        ratio_to_ceiling=run["rollouts_per_s"] / ceil["requests_per_s"],
                        ratio_to_ceiling_cpu=run["rollouts_per_cpu_s"] / ceil["requests_per_cpu_s"],
                    )
                    runs.append(run)
                    print(
                        f"  {env_name:5s} c={concurrency:<6d} {run['rollouts_per_s']:8.1f} rollouts/s "
                        f"({run['ratio_to_ceiling']:.3f} of ceiling), first {run['first_rollout_s']:.2f} s, "
                        f"peak {run['peak_pss_tree_mib']:.0f} MiB PSS ({run['peak_rss_main_mib']:.0f} MiB RSS main)",
                        flush=True,
                    )
    finally:
        fake.kill()
        fake.wait()
    details = {
        "runs": runs,
        "ceilings": {str(c): v for c, v in ceilings.items()},
        "first_answer_ceiling_s": first_answer_s,
        "sizes": {
            str(c): {"rows": sizes.get(c, (0, 0))[0], "repeats": sizes.get(c, (0, 0))[1]}
            for c in concurrencies
        },
        "issue_quoted_nemo_gym_0_7_0_not_measured_here": ISSUE_NEMO_GYM,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
    }
    path = write_results("collect", rows_for(runs, first_answer_s), quick=args.quick, details=details)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

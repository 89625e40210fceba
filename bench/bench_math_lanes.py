r"""A plain math answer's latency while hostile answers run into the check timeout (issue 33, finding 8).

Math servers (``gym-bridge serve math --config ...``, as users run it, one verifier worker per core,
``timeout_s`` 5) with the shipped settings, this tree's code against a baseline: with ``--old-ref REF``
the code of commit REF (a copy of its tree, run with the libraries installed now), with ``--one-lane``
this code with ``slow_lane_workers: 0`` (every check waits its turn: the pool before the slow lane); one
of them at least (``--one-lane`` when neither is given). Rounds alternate between them in one sitting,
and each round records the machine's load average (a shared machine: compare within a sitting only).
A round sends ``--hostile`` distinct answers
that each run into the 5 s budget (power towers ``k^{9^{9^9}}``, against a new expected answer every
round, so none is known to time out) at once, then, while they run, one plain
answer every ``--interval`` seconds (``\boxed{\sqrt{N^2}}`` against N, a distinct N each time: a worker
check, no cache), and times each plain answer on its own connection. A baseline round without hostile
answers shows the plain latency of an idle server.

    .venv/bin/python bench/bench_math_lanes.py --old-ref 670e63a   # writes bench/results/math_lanes.json
    .venv/bin/python bench/bench_math_lanes.py --quick             # 1 round each, against --one-lane
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import builtin_server, figure, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ONE_LANE = {"slow_lane_workers": 0}
"""Over the shipped config.yaml: every check waits its turn."""


def _body(text: str, expected: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Solve it."}]},
        "response": {
            "id": "r",
            "output": [{"type": "message", "role": "assistant", "id": "m", "content": content}],
        },
        "expected_answer": expected,
    }


@contextmanager
def math_server(settings: dict[str, Any], tree: Path = REPO) -> Iterator[str]:
    """``gym-bridge serve math --config FILE --port 0`` as a child process running ``tree``'s code,
    warmed; yields its URL."""
    import yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(settings, f)
    try:
        with builtin_server("math", extra_args=("--config", f.name), tree=tree) as (_, url):
            warm = httpx.post(f"{url}/verify", json=_body("\\boxed{\\sqrt{4}}", "2"), timeout=120).json()
            assert warm["reward"] == 1.0, warm
            yield url
    finally:
        os.unlink(f.name)


async def _settled(client: httpx.AsyncClient, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until the pool is back to its size with nothing slow running (between rounds)."""
    deadline = time.monotonic() + timeout
    while True:
        pool = (await client.get("/health")).json()["verifier_pool"]
        if pool["live_workers"] == pool["size"] and not pool.get("slow_running") and not pool["starting"]:
            return pool
        if time.monotonic() > deadline:
            return pool
        await asyncio.sleep(0.1)


async def one_round(
    url: str, hostile: int, plain: int, interval: float, numbers: Iterator[int]
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=hostile + plain + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await _settled(client)
        load = os.getloadavg()

        async def timed(text: str, expected: str) -> tuple[float, dict[str, Any]]:
            start = time.perf_counter()
            response = await client.post("/verify", json=_body(text, expected))
            response.raise_for_status()
            return time.perf_counter() - start, response.json()

        expected = str(next(numbers))  # fresh hostile answers every round: none is a known timeout yet
        hostile_tasks = [
            asyncio.create_task(timed(f"\\boxed{{{k}^{{9^{{9^9}}}}}}", expected))
            for k in range(2, 2 + hostile)
        ]
        if hostile:
            await asyncio.sleep(0.3)  # they have reached the workers
        plain_tasks = []
        for _ in range(plain):
            n = next(numbers)
            plain_tasks.append(asyncio.create_task(timed(f"\\boxed{{\\sqrt{{{n}^2}}}}", str(n))))
            await asyncio.sleep(interval)
        plain_results = await asyncio.gather(*plain_tasks)
        hostile_results = await asyncio.gather(*hostile_tasks)
        pool = (await client.get("/health")).json()["verifier_pool"]
    assert all(out["reward"] == 1.0 for _, out in plain_results), plain_results
    return {
        "plain_latencies_s": [seconds for seconds, _ in plain_results],
        "hostile_latencies_s": [seconds for seconds, _ in hostile_results],
        "hostile_failure_kinds": sorted({out["failure_kind"] for _, out in hostile_results}),
        "hostile_rewards": sorted({out["reward"] for _, out in hostile_results}),
        "pool_after": pool,
        "loadavg_at_start": load,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def old_tree(ref: str) -> Iterator[tuple[str, Path]]:
    """A copy of commit ``ref``'s tree (``git archive``, removed afterwards): ``(commit, path)``."""
    commit = subprocess.run(
        ["git", "rev-parse", ref], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-math-lanes-") as tmp:
        archive = subprocess.run(["git", "archive", commit], cwd=REPO, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield commit, Path(tmp)


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    hostile = [s for run in runs["hostile"] for s in run["plain_latencies_s"]]
    idle = [s for run in runs["idle"] for s in run["plain_latencies_s"]]
    return {
        "plain_p50_s": statistics.median(hostile),
        "plain_p95_s": _percentile(hostile, 0.95),
        "plain_p99_s": _percentile(hostile, 0.99),
        "plain_max_s": max(hostile),
        "plain_samples": len(hostile),
        "hostile_max_s": max(s for run in runs["hostile"] for s in run["hostile_latencies_s"]),
        "idle_plain_p50_s": statistics.median(idle),
        "idle_plain_p99_s": _percentile(idle, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hostile", type=int, default=8)
    parser.add_argument("--plain", type=int, default=20, help="plain answers per round")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between plain answers")
    parser.add_argument("--old-ref", help="baseline: the code of this commit, shipped settings")
    parser.add_argument("--one-lane", action="store_true", help="baseline: this code, slow_lane_workers: 0")
    parser.add_argument("--quick", action="store_true", help="1 round each")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    if not args.old_ref:
        args.one_lane = True
    numbers = itertools.count(1000)
    load_start = os.getloadavg()
    with ExitStack() as stack:
        arms: dict[str, tuple[Path, dict[str, Any]]] = {"slow_lane": (REPO, {})}
        old_commit = None
        if args.old_ref:
            old_commit, tree = stack.enter_context(old_tree(args.old_ref))
            arms["old_ref"] = (tree, {})
        if args.one_lane:
            arms["one_lane"] = (REPO, ONE_LANE)
        urls = {
            name: stack.enter_context(math_server(settings, tree)) for name, (tree, settings) in arms.items()
        }
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {"idle": [], "hostile": []} for name in arms
        }
        for name, url in urls.items():
            runs[name]["idle"].append(asyncio.run(one_round(url, 0, args.plain, args.interval, numbers)))
        for r in range(args.rounds):
            order = list(urls) if r % 2 == 0 else list(reversed(urls))  # neither arm always goes first
            for name in order:
                result = asyncio.run(one_round(urls[name], args.hostile, args.plain, args.interval, numbers))
                runs[name]["hostile"].append(result)
                lat = result["plain_latencies_s"]
                print(
                    f"round {r + 1} {name:9s} plain p50 {statistics.median(lat):6.3f} s  max {max(lat):6.3f} s  "
                    f"hostile max {max(result['hostile_latencies_s']):5.1f} s {result['hostile_failure_kinds']}  "
                    f"load {result['loadavg_at_start'][0]:.1f}",
                    flush=True,
                )
    load_end = os.getloadavg()

    summary = {name: _summary(runs[name]) for name in runs}
    new = summary["slow_lane"]
    baseline_name = "old_ref" if args.old_ref else "one_lane"
    old = summary[baseline_name]
    what = f"{args.hostile} answers running into the 5 s timeout"
    base_note = (
        f"baseline: the code at {old_commit[:10]} (shipped settings)"
        if old_commit
        else "baseline: slow_lane_workers: 0 (every check waits its turn)"
    )
    load_note = f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end (2-core shared machine)"
    rows = [
        figure(
            f"plain answer p99 latency, {what}",
            new["plain_p99_s"],
            "s",
            baseline=old["plain_p99_s"],
            note=f"{base_note}, same sitting, alternating rounds; lower is better; target < 1 s; {load_note}",
        ),
        figure(
            f"plain answer p50 latency, {what}",
            new["plain_p50_s"],
            "s",
            baseline=old["plain_p50_s"],
            note=f"{base_note}, same sitting; lower is better; {load_note}",
        ),
        figure(
            "plain answer p99 latency, idle server",
            new["idle_plain_p99_s"],
            "s",
            baseline=old["idle_plain_p99_s"],
            note=f"{base_note}, same sitting (no hostile answers: the lanes cost nothing); {load_note}",
        ),
    ]
    details = {
        "rounds": args.rounds,
        "hostile_per_round": args.hostile,
        "plain_per_round": args.plain,
        "interval_s": args.interval,
        "arms": {
            name: {"tree": "this" if tree == REPO else old_commit, "settings": st}
            for name, (tree, st) in arms.items()
        },
        "old_commit": old_commit,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "summary": summary,
        "runs": runs,
    }
    path = write_results("math_lanes", rows, quick=args.quick, details=details)
    for name, s in summary.items():
        print(
            f"{name:9s} plain under attack: p50 {s['plain_p50_s']:.3f} s  p95 {s['plain_p95_s']:.3f} s  "
            f"p99 {s['plain_p99_s']:.3f} s  max {s['plain_max_s']:.3f} s  (idle p99 {s['idle_plain_p99_s']:.3f} s)"
        )
    print(f"load average {load_start} -> {load_end}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""``/verify`` throughput of the math resources server at concurrency 16, beside ceilings from the same run.

The real server runs as a child process (``gym-bridge serve math``, default config.yaml: one verifier
worker per core, fast path on); this process is the client (httpx + uvloop, keep-alive). Workloads:

* ``health``: ``GET /health``, the HTTP round-trip ceiling of this client and server.
* ``noop_verify``: ``/verify`` of a response with no text (answered ``no_answer`` before any math): the
  ceiling for ``/verify`` itself (body parsing, validation, echo).
* ``fast_path``: single-digit arithmetic rows in NeMo Gym's format with boxed integers (70 % right).
* ``pool_path``: answers only math-verify can judge (``\\frac{\\sqrt{8}}{2}`` vs ``\\sqrt{2}``, ``0.75`` vs
  ``\\frac{3}{4}``, ``2\\pi``, ``x = 4``...), every one distinct, so every request is a worker check.
* ``grpo_groups``: the same kind of answers in GRPO groups of 8 samples per task, most samples agreeing
  (5 right, 2 wrong, 1 decimal): the verdict cache and in-flight coalescing answer the repeats.
* ``nemo_records``: the six NeMo Gym reference math records cycled (long responses, judge evaluations
  echoed): after the first six, verdicts come from the cache, so this measures payload handling.

Each workload runs ``--rounds`` times, interleaved, so all see the same (shared, noisy) machine; the
median round counts. Rates are given as ratios to the ``noop_verify`` and ``health`` ceilings and to
NeMo Gym's ~12 math rollouts/s at concurrency 16 on this machine (the goal is >= 10x, i.e. >= 120/s).
Server CPU seconds (server, fork server and workers, from /proc) give a load-independent cost per check
(``per_server_cpu_s``: requests per CPU-second), which matters on a shared machine.
``fork_per_check`` times NeMo Gym's own design (a forked process per math-verify check, 16 at a time)
on the same pool-path pairs, without HTTP.

    .venv/bin/python bench/bench_math_verify.py            # writes bench/results/math_verify.json (rows)
    .venv/bin/python bench/bench_math_verify.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import builtin_server, figure, tree_cpu_seconds, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "nemo_gym"  # NeMo Gym records, vendored
NEMO_GYM_MATH_ROLLOUTS_PER_S = 12.0


# --------------------------------------------------------------------------- workloads


def _body(text: str | None, expected: str, **extra: Any) -> dict[str, Any]:
    output = []
    if text is not None:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        output.append(
            {"type": "message", "role": "assistant", "id": "msg_b", "status": "completed", "content": content}
        )
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Solve it.", "type": "message"}]},
        "response": {"id": "resp_b", "output": output},
        "expected_answer": expected,
        **extra,
    }


def fast_path_bodies() -> list[dict[str, Any]]:
    from gym_bridge.data.arithmetic import problem_space, to_nemo_gym_row

    bodies = []
    for i, problem in enumerate(problem_space()):
        answer = int(problem["answer"]) + (0 if i % 10 < 7 else 1)
        text = f"{problem['question']} Adding up, the result is \\boxed{{{answer}}}."
        bodies.append({**to_nemo_gym_row(problem), "response": _body(text, "")["response"]})
    return bodies


def pool_path_bodies(count: int, offset: int) -> list[dict[str, Any]]:
    """``count`` answer pairs that only math-verify can judge, all distinct (no cache can help): roots,
    decimals, multiples of pi, equations, complex numbers, sets, and fractions against decimals."""
    bodies = []
    for i in range(count):
        n = offset + i + 2
        kind = i % 7
        if kind == 0:
            bodies.append(_body(f"so \\boxed{{\\frac{{\\sqrt{{{4 * n}}}}}{{2}}}}", f"\\(\\sqrt{{{n}}}\\)"))
        elif kind == 1:
            bodies.append(_body(f"\\boxed{{{n / 4}}}", f"\\frac{{{n}}}{{4}}"))
        elif kind == 2:
            bodies.append(_body(f"The answer is $\\boxed{{{n}\\pi}}$.", f"{n}\\pi"))
        elif kind == 3:
            bodies.append(_body(f"\\boxed{{x = {n}}}", str(n + n % 2)))
        elif kind == 4:
            bodies.append(_body(f"\\boxed{{{n} + {n % 5 + 1}i}}", f"{n}+{n % 5 + 1}i"))
        elif kind == 5:
            bodies.append(_body(f"\\boxed{{\\{{{n}, {n + 1}\\}}}}", f"\\{{{n + 1}, {n}\\}}"))
        else:
            bodies.append(_body(f"\\boxed{{\\frac{{{n}}}{{8}}}}", f"{n / 8}"))
    return bodies


def grpo_group_bodies(count: int, offset: int, group: int = 8) -> list[dict[str, Any]]:
    """GRPO-shaped traffic: ``group`` samples per task, most agreeing (5 right, 2 wrong, 1 decimal)."""
    bodies = []
    for i in range(count):
        task = offset + i // group + 2
        expected = f"\\(\\sqrt{{{task}}}\\)"
        sample = i % group
        if sample < 5:
            text = f"\\boxed{{\\frac{{\\sqrt{{{4 * task}}}}}{{2}}}}"
        elif sample < 7:
            text = f"\\boxed{{\\sqrt{{{task + 1}}}}}"
        else:
            text = f"\\boxed{{{task**0.5:.6f}}}"
        bodies.append(_body(text, expected, _ng_task_index=task))
    return bodies


def nemo_record_bodies() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (REFERENCE / "math_rollouts.example.jsonl").read_text().splitlines()]
    return [*rows, json.loads((REFERENCE / "math_rollout.wire-captured.json").read_text())]


# --------------------------------------------------------------------------- the client


async def run_load(
    url: str, make_request: Callable[[Any, int], Any], total: int, concurrency: int, server_pid: int
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        for i in range(50):  # warm connections (these bodies are not used again below)
            (await make_request(client, total + i)).raise_for_status()
        latencies: list[float] = []
        rewards: list[float] = []
        counter = iter(range(total))

        async def worker() -> None:
            for i in counter:
                start = time.perf_counter()
                response = await make_request(client, i)
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()
                data = response.json()
                if "reward" in data:
                    rewards.append(data["reward"])

        cpu_before = tree_cpu_seconds(server_pid)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        server_cpu = tree_cpu_seconds(server_pid) - cpu_before
    latencies.sort()
    return {
        "requests": total,
        "per_s": total / wall,
        "server_cpu_s_per_1000": 1000 * server_cpu / total,
        # Load-independent capacity: requests per CPU-second of the server and its workers.
        "per_server_cpu_s": total / server_cpu if server_cpu > 0 else None,
        "latency_p50_ms": 1000 * latencies[len(latencies) // 2],
        "latency_p95_ms": 1000 * latencies[int(len(latencies) * 0.95)],
        "mean_reward": statistics.fmean(rewards) if rewards else None,
    }


def poster(bodies: list[dict[str, Any]]) -> Callable[[Any, int], Any]:
    encoded = [json.dumps(b).encode() for b in bodies]
    headers = {"content-type": "application/json"}
    return lambda client, i: client.post("/verify", content=encoded[i % len(encoded)], headers=headers)


# --------------------------------------------------------------------------- NeMo Gym's design, for scale


def _fork_check(expected: str, text: str) -> None:
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    metric = math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
    )
    metric(["\\boxed{" + expected + "}"], [text])


def fork_per_check_rate(bodies: list[dict[str, Any]], total: int, concurrency: int) -> float:
    """Checks/s with one forked process per check, ``concurrency`` at a time (NeMo Gym's verifier)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    import math_verify  # noqa: F401  (imported before forking, as in a running NeMo Gym server)

    ctx = mp.get_context("fork")
    pairs = [
        (
            b["expected_answer"].strip("$").removeprefix("\\(").removesuffix("\\)"),
            b["response"]["output"][0]["content"][0]["text"],
        )
        for b in bodies
    ]
    running: dict[Any, Any] = {}
    started = done = 0
    start = time.perf_counter()
    while done < total:
        while started < total and len(running) < concurrency:
            process = ctx.Process(target=_fork_check, args=pairs[started % len(pairs)])
            process.start()
            running[process.sentinel] = process
            started += 1
        for sentinel in wait(list(running)):
            running.pop(sentinel).join()
            done += 1
    return total / (time.perf_counter() - start)


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per workload and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="300 requests, 1 round")
    parser.add_argument("--only", nargs="*", help="run only these workloads (noop_verify always runs)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 300, 1

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    load_start = os.getloadavg()
    fork_bodies = pool_path_bodies(64, offset=10**6)
    fork_rate = fork_per_check_rate(
        fork_bodies, total=64 if args.quick else 160, concurrency=args.concurrency
    )
    per_round = args.requests + 50  # warm-up requests included

    def workloads(r: int) -> dict[str, Callable[[Any, int], Any]]:
        # Pool workloads get fresh answers every round: the server's verdict cache must not help them.
        every = {
            "health": lambda client, i: client.get("/health"),
            "noop_verify": poster([_body(None, "1")]),
            "fast_path": poster(fast_path_bodies()),
            "pool_path": poster(pool_path_bodies(per_round, offset=r * per_round)),
            "grpo_groups": poster(grpo_group_bodies(per_round, offset=r * per_round)),
            "nemo_records": poster(nemo_record_bodies()),
        }
        keep = set(args.only or every) | {"noop_verify"}
        return {name: make for name, make in every.items() if name in keep}

    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in workloads(0)}
    with builtin_server("math") as (server, url):
        for r in range(args.rounds):
            for name, make_request in workloads(r).items():
                result = asyncio.run(run_load(url, make_request, args.requests, args.concurrency, server.pid))
                rounds[name].append(result)
                print(
                    f"round {r + 1} {name:13s} {result['per_s']:8.1f} req/s  p50 {result['latency_p50_ms']:6.1f} ms"
                )
        pool_stats = httpx.get(f"{url}/health", timeout=30).json()["verifier_pool"]

    def median_round(name: str) -> dict[str, Any]:
        ordered = sorted(rounds[name], key=lambda x: x["per_s"])
        return ordered[len(ordered) // 2]

    summary = {name: median_round(name) for name in rounds}
    if args.only:  # a partial run: print, write nothing
        for name, result in summary.items():
            print(
                f"{name:13s} {result['per_s']:8.1f} req/s  {result['per_server_cpu_s']:6.0f} per server CPU-s  "
                f"mean reward {result['mean_reward']}"
            )
        return
    noop, health = summary["noop_verify"]["per_s"], summary["health"]["per_s"]
    for result in summary.values():
        result["ratio_to_noop_verify"] = result["per_s"] / noop
        result["ratio_to_health"] = result["per_s"] / health
        result["vs_nemo_gym_math"] = result["per_s"] / NEMO_GYM_MATH_ROLLOUTS_PER_S
    fast, pool, groups, records = (
        summary[k]["per_s"] for k in ("fast_path", "pool_path", "grpo_groups", "nemo_records")
    )
    per_noop = (
        "baseline: /verify of an empty response (no math) on the same server, same run; higher is better"
    )
    published = f"NeMo Gym 0.7.0 on this machine: ~{NEMO_GYM_MATH_ROLLOUTS_PER_S:g} math rollouts/s at c=16"
    rows = [
        figure(
            "verify req/s, c=16, no-op (empty response)",
            noop,
            "req/s",
            baseline=health,
            note="baseline: GET /health on the same server, same run; higher is better",
        ),
        figure("verify req/s, c=16, fast path (boxed integers)", fast, "req/s", baseline=noop, note=per_noop),
        figure(
            "verify req/s, c=16, pool path (distinct LaTeX answers)",
            pool,
            "req/s",
            baseline=noop,
            note=per_noop + "; " + published,
        ),
        figure(
            "verify req/s, c=16, GRPO groups of 8 (cache + coalescing)",
            groups,
            "req/s",
            baseline=noop,
            note=per_noop,
        ),
        figure(
            "verify req/s, c=16, NeMo Gym reference records",
            records,
            "req/s",
            baseline=noop,
            note=per_noop + "; " + published,
        ),
        figure(
            "pool path req/s vs fork-per-check checks/s",
            pool,
            "req/s",
            baseline=fork_rate,
            baseline_unit="checks/s",
            ratio=pool / fork_rate,
            note="baseline: NeMo Gym's design (one forked math-verify process per check, 16 at a time, "
            "no HTTP), same run; higher is better",
        ),
        figure(
            "pool path checks per server CPU-second",
            summary["pool_path"]["per_server_cpu_s"],
            "req/CPU-s",
            note="load-independent cost: server + workers CPU time from /proc; higher is better",
        ),
        figure(
            "fast path requests per server CPU-second",
            summary["fast_path"]["per_server_cpu_s"],
            "req/CPU-s",
            note="load-independent cost: server CPU time from /proc; higher is better",
        ),
    ]
    details = {
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "nemo_gym_math_rollouts_per_s_c16": NEMO_GYM_MATH_ROLLOUTS_PER_S,
        "fork_per_check_per_s": fork_rate,
        "verifier_pool_at_end": pool_stats,
        "median": summary,
        "all_rounds": rounds,
    }
    path = write_results("math_verify", rows, quick=args.quick, details=details)
    print(f"\nfork-per-check (NeMo Gym's design, no HTTP): {fork_rate:.1f} checks/s")
    for name, result in summary.items():
        print(
            f"{name:13s} {result['per_s']:8.1f} req/s  x{result['ratio_to_noop_verify']:.2f} of noop verify  "
            f"x{result['vs_nemo_gym_math']:.1f} NeMo Gym math  {result['per_server_cpu_s']:.0f} per server CPU-s"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

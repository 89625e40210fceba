"""``/verify`` throughput of the reasoning_gym server, whose scorers run in isolated worker processes.

Why: every check now crosses a pipe to a scorer worker, and a worker whose check evaluated answer text
(``eval``-ing and SymPy families) is retired and replaced by a fork, so those families pay a fork per
check. This bench shows what that costs. The real server runs as a child process (``gym-bridge serve
reasoning_gym``, default config: one worker per core); this process is the client, at concurrency 8.

Workloads (each answer distinct, half of them right):

* ``plain``: basic_arithmetic answers (a string compare in the scorer: the worker is kept);
* ``eval``: spiral_matrix answers written as Python lists (the scorer evaluates them: one fork per check);
* ``sympy``: countdown expressions (SymPy parses them: one fork per check).

``--baseline-repo DIR`` also serves the same workloads from another checkout (e.g. the code before the
workers, from ``git archive``) in the same run, as each figure's baseline. Server CPU seconds (server,
fork server and workers) per request are given beside the rates: the machine is shared and noisy.

    .venv/bin/python bench/bench_reasoning_gym_verify.py [--quick] [--baseline-repo /tmp/rg-old]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, tree_cpu_seconds, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 8


@contextmanager
def server(repo: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``gym-bridge serve reasoning_gym`` from the checkout ``repo``."""
    command = [sys.executable, "-m", "gym_bridge.cli", "serve", "reasoning_gym", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=repo)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the server did not start: {line!r}")
        yield process, line.split("listening on ")[1].split()[0]
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _body(row: dict[str, Any], answer: str) -> dict[str, Any]:
    text = f"<answer>{answer}</answer>"
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {**row, "response": {"output": [message]}}


def workloads(n: int) -> dict[str, list[dict[str, Any]]]:
    from resources_servers.reasoning_gym.generate import task_rows

    arithmetic = task_rows(["basic_arithmetic"], n, seed=3)
    plain = [_body(r, r["answer"] if i % 2 else str(i)) for i, r in enumerate(arithmetic)]
    spiral = [
        _body(r, "[" + ", ".join(r["answer"].split()[: -1 if i % 2 else None]) + "]")
        for i, r in enumerate(task_rows(["spiral_matrix"], n, seed=3))
    ]
    countdown = [
        _body(r, r["answer"] if i % 2 else f"{r['answer']} + {i}")
        for i, r in enumerate(task_rows(["countdown"], n, seed=3))
    ]
    return {"plain": plain, "eval": spiral, "sympy": countdown}


async def drive(url: str, bodies: list[dict[str, Any]]) -> float:
    """Requests per second at :data:`CONCURRENCY`."""
    queue = list(bodies)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one() -> None:
            while queue:
                out = await client.post("/verify", json=queue.pop())
                out.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
        return len(bodies) / (time.perf_counter() - started)


def measure(repo: Path, loads: dict[str, list[dict[str, Any]]], rounds: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, list[float]]] = {name: {"rate": [], "cpu": []} for name in loads}
    with server(repo) as (process, url):
        asyncio.run(drive(url, loads["plain"][:16] + loads["eval"][:8]))  # warm: workers up
        for _ in range(rounds):
            for name, bodies in loads.items():
                cpu = tree_cpu_seconds(process.pid)
                out[name]["rate"].append(asyncio.run(drive(url, bodies)))
                out[name]["cpu"].append((tree_cpu_seconds(process.pid) - cpu) / len(bodies))
    return {n: {k: statistics.median(v) for k, v in d.items()} for n, d in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--baseline-repo", type=Path, default=None)
    args = parser.parse_args()
    n, rounds = (40, 1) if args.quick else (200, 3)
    loads = workloads(n)
    ours = measure(REPO, loads, rounds)
    base = measure(args.baseline_repo, loads, rounds) if args.baseline_repo else None
    rows = []
    for name in loads:
        note = f"{n} requests, c={CONCURRENCY}, median of {rounds}"
        rows.append(
            figure(f"reasoning_gym /verify {name}", ours[name]["rate"], "req/s",
                   baseline=base[name]["rate"] if base else None,
                   note=note + ("; baseline: --baseline-repo, same run" if base else ""))
        )  # fmt: skip
        rows.append(
            figure(f"reasoning_gym server CPU per {name} check", ours[name]["cpu"] * 1000, "ms",
                   baseline=base[name]["cpu"] * 1000 if base else None, note=note)
        )  # fmt: skip
    for row in rows:
        print(f"{row['name']:48s} {row['value']:9.2f} {row['unit']:6s} baseline {row['baseline']}")
    write_results("reasoning_gym_verify", rows, quick=args.quick, details={"ours": ours, "baseline": base})


if __name__ == "__main__":
    main()

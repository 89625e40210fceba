"""Cost of sandboxed code verification, beside a plain interpreter start measured in the same run.

* ``start_plain`` / ``start_sandboxed``: sequential runs of ``python -I -S -c pass``, as an unsandboxed
  asyncio subprocess and through :class:`gym_bridge.sandbox.Sandbox` (bubblewrap: namespaces, uid drop,
  rlimits). Their difference is the sandbox's start-up cost per run.
* ``verify``: ``/verify`` of a short passing program (a + b, 3 stdin tests) against the real code server
  (``gym-bridge serve code`` as a child process) at concurrency 4; the baseline is plain interpreter
  starts per second at the same concurrency (what a sandbox-free grader that starts one interpreter per
  task could at best do).
* ``tests``: tests per second inside one verification -- the harness (one sandbox per task, a fork per
  test) against one sandboxed interpreter per test, on a 30-test task.

    .venv/bin/python bench/bench_code_verify.py           # writes bench/results/code_verify.json
    .venv/bin/python bench/bench_code_verify.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import builtin_server, figure, print_rows, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_bridge.sandbox import Sandbox  # noqa: E402
from resources_servers.code.runner import CodeLimits, TestCase, run_code_tests  # noqa: E402

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"


def sum_task(n_tests: int) -> dict[str, Any]:
    inputs = [f"{i} {2 * i}\n" for i in range(n_tests)]
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Print a + b."}]},
        "verifier_metadata": {
            "unit_tests": {"inputs": inputs, "outputs": [f"{3 * i}\n" for i in range(n_tests)]}
        },
        "response": {
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"```python\n{PROGRAM}\n```"}],
                }
            ]
        },
    }


async def plain_start(python: str) -> None:
    proc = await asyncio.create_subprocess_exec(python, "-I", "-S", "-c", "pass")
    await proc.wait()


async def sequential_ms(make: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await make()
    return 1000 * (time.perf_counter() - start) / n


async def concurrent_rate(make: Any, n: int, concurrency: int) -> float:
    counter = iter(range(n))

    async def worker() -> None:
        for _ in counter:
            await make()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - start)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    sandbox = Sandbox(max_concurrency=args.concurrency).start()
    python = sandbox.python
    runs = 15 if args.quick else 60
    rounds = 2 if args.quick else 3
    out: dict[str, list[float]] = {k: [] for k in ("plain_ms", "sandbox_ms", "plain_rate", "verify_rate")}
    out.update(harness_tests_s=[], per_test_sandbox_tests_s=[])
    with builtin_server("code") as (_, url):
        body = json.dumps(sum_task(3)).encode()
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            rewards = []

            async def verify_once() -> None:
                response = await client.post("/verify", content=body, headers=headers)
                response.raise_for_status()
                rewards.append(response.json()["reward"])

            await verify_once()  # warm-up (sandbox probe, connections)
            many = [TestCase(input=f"{i} {i}\n", expected=f"{2 * i}\n") for i in range(30)]
            for _ in range(rounds):  # interleaved, so every figure sees the same (shared, noisy) machine
                out["plain_ms"].append(await sequential_ms(lambda: plain_start(python), runs))
                out["sandbox_ms"].append(
                    await sequential_ms(lambda: sandbox.run([python, "-I", "-S", "-c", "pass"]), runs)
                )
                out["plain_rate"].append(
                    await concurrent_rate(lambda: plain_start(python), 2 * runs, args.concurrency)
                )
                out["verify_rate"].append(await concurrent_rate(verify_once, 2 * runs, args.concurrency))
                start = time.perf_counter()
                result = await run_code_tests(sandbox, PROGRAM, many, limits=CodeLimits())
                assert result.all_passed, result.failure_reason
                out["harness_tests_s"].append(len(many) / (time.perf_counter() - start))
                start = time.perf_counter()
                for case in many:
                    done = await sandbox.run([python, "-I", "-S", "-c", PROGRAM], case.input.encode())
                    assert done.stdout.decode() == case.expected
                out["per_test_sandbox_tests_s"].append(len(many) / (time.perf_counter() - start))
            assert set(rewards) == {1.0}, rewards
    medians = {k: statistics.median(v) for k, v in out.items()}
    return {"medians": medians, "raw": out, "sandbox": sandbox.description, "runs": runs, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    m = result["medians"]
    c = args.concurrency
    rows = [
        figure(
            "sandboxed `python -c pass`, per run",
            m["sandbox_ms"],
            "ms",
            baseline=m["plain_ms"],
            note="baseline: the same interpreter started as a plain subprocess, same run; lower is better; "
            f"sandbox start-up cost = {m['sandbox_ms'] - m['plain_ms']:.1f} ms/run ({result['sandbox']})",
        ),
        figure(
            f"code /verify, short passing program (3 tests), c={c}",
            m["verify_rate"],
            "verif/s",
            baseline=m["plain_rate"],
            baseline_unit="verif/s",
            note=f"baseline: unsandboxed `python -c pass` starts per second at c={c}, same run (a grader "
            "starting one bare interpreter per task, doing nothing); higher is better",
        ),
        figure(
            "tests/s in one task: harness (1 sandbox per task, fork per test)",
            m["harness_tests_s"],
            "tests/s",
            baseline=m["per_test_sandbox_tests_s"],
            note="baseline: one sandboxed interpreter per test, same 30-test task, same run; higher is better",
        ),
    ]
    path = write_results("code_verify", rows, quick=args.quick, details=result)
    print_rows(rows, path)


if __name__ == "__main__":
    main()

"""Tool-use rollouts per second at concurrency 256, beside a no-op endpoint measured in the same run.

The real tool_use server runs as a child process (``gym-bridge serve tool_use``). A rollout is what the
agent loop sends it for one task: ``/seed_session`` with the row, ``list_products``, each of the task's
reference (or expected) calls, and ``/verify`` with the whole trajectory (function calls, their outputs
and a final message) -- the model's turns are left out, so this is the environment's own cost. Tasks come
from ``resources_servers.tool_use.generate`` (seed 0, every kind); every rollout must earn reward 1.

The baseline sends the same number of requests per rollout to ``GET /health`` (a no-op endpoint of the
same server) with the same clients and concurrency: the HTTP ceiling. Rounds alternate between the two.

    .venv/bin/python bench/bench_tool_use.py          # writes bench/results/tool_use.json
    .venv/bin/python bench/bench_tool_use.py --quick
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
from common import builtin_server, figure, print_rows, tree_cpu_seconds, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_bridge.rollout.agent import make_client  # noqa: E402
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE  # noqa: E402
from resources_servers.tool_use.generate import generate  # noqa: E402

WORKERS_PER_CLIENT = 4  # httpx pools stay cheap when small (see gym_bridge/collect.py)


def _plan(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls of a rollout: a look at the catalogue, then the reference calls (outcome tasks), or just
    the expected calls (argument tasks, where any other call but a free read would count against the
    answer)."""
    meta = row["verifier_metadata"]
    if "expected_calls" in meta:
        return list(meta["expected_calls"])
    return [{"name": "list_products", "arguments": {}}, *meta["reference_calls"]]


def _session_header(response: httpx.Response) -> str:
    """``Cookie`` header value from a ``Set-Cookie`` (parsed by hand: the cookie jar costs client CPU)."""
    for value in response.headers.get_list("set-cookie"):
        if value.startswith(SESSION_COOKIE + "="):
            return value.split(";", 1)[0]
    raise RuntimeError("no session cookie from /seed_session")


async def tool_rollout(client: httpx.AsyncClient, row: dict[str, Any], encoded_row: bytes) -> float:
    headers = {"content-type": "application/json"}
    seeded = await client.post("/seed_session", content=encoded_row, headers=headers)
    seeded.raise_for_status()
    headers["cookie"] = _session_header(seeded)
    output: list[dict[str, Any]] = []
    for i, call in enumerate(_plan(row)):
        arguments = json.dumps(call["arguments"])
        answer = await client.post(f"/{call['name']}", content=arguments, headers=headers)
        answer.raise_for_status()
        output.append(
            {"type": "function_call", "call_id": f"c{i}", "name": call["name"], "arguments": arguments}
        )
        output.append({"type": "function_call_output", "call_id": f"c{i}", "output": answer.text})
    output.append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
    )
    body = encoded_row[:-1] + b', "response": {"output": ' + json.dumps(output).encode() + b"}}"
    verified = await client.post("/verify", content=body, headers=headers)
    verified.raise_for_status()
    return verified.json()["reward"]


async def noop_rollout(client: httpx.AsyncClient, row: dict[str, Any], _: bytes) -> float:
    for _ in range(len(_plan(row)) + 2):
        (await client.get("/health")).raise_for_status()
    return 1.0


async def run_round(
    url: str, rows: list[dict[str, Any]], encoded: list[bytes], kind: Any, total: int, concurrency: int
) -> dict[str, Any]:
    clients = [
        make_client(max_connections=WORKERS_PER_CLIENT)
        for _ in range(max(1, concurrency // WORKERS_PER_CLIENT))
    ]
    for client in clients:
        client.base_url = httpx.URL(url)
    counter = iter(range(total))
    rewards: list[float] = []
    latencies: list[float] = []

    async def worker(client: httpx.AsyncClient) -> None:
        for i in counter:
            start = time.perf_counter()
            rewards.append(await kind(client, rows[i % len(rows)], encoded[i % len(rows)]))
            latencies.append(time.perf_counter() - start)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(clients[w % len(clients)]) for w in range(concurrency)))
        wall = time.perf_counter() - start
    finally:
        for client in clients:
            await client.aclose()
    latencies.sort()
    requests = sum(len(_plan(rows[i % len(rows)])) + 2 for i in range(total))
    return {
        "rollouts_per_s": total / wall,
        "requests_per_s": requests / wall,
        "latency_p50_ms": 1000 * latencies[len(latencies) // 2],
        "latency_p95_ms": 1000 * latencies[int(0.95 * len(latencies))],
        "mean_reward": statistics.fmean(rewards),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows = generate(0, 90, "bench")
    encoded = [json.dumps(row).encode() for row in rows]
    total = 512 if args.quick else 2048
    rounds = 2 if args.quick else 3
    results: dict[str, list[dict[str, Any]]] = {"tool_use": [], "noop": []}
    cpu: dict[str, list[float]] = {"tool_use": [], "noop": []}
    with builtin_server("tool_use") as (process, url):
        await run_round(url, rows, encoded, tool_rollout, 64, 16)  # warm-up
        for _ in range(rounds):  # alternating, so both see the same (shared, noisy) machine
            for kind, rollout in (("tool_use", tool_rollout), ("noop", noop_rollout)):
                before = tree_cpu_seconds(process.pid)
                results[kind].append(await run_round(url, rows, encoded, rollout, total, args.concurrency))
                cpu[kind].append((tree_cpu_seconds(process.pid) - before) / total)
    rewards = {r["mean_reward"] for r in results["tool_use"]}
    if rewards != {1.0}:
        raise SystemExit(f"reference rollouts did not all earn reward 1: {rewards}")
    median = {k: statistics.median(r["rollouts_per_s"] for r in v) for k, v in results.items()}
    return {
        "median": median,
        "rounds": results,
        "server_cpu_s_per_rollout": {k: statistics.median(v) for k, v in cpu.items()},
        "rollouts": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    m = result["median"]
    per_rollout = statistics.fmean(len(_plan(r)) + 2 for r in generate(0, 90, "bench"))
    rows = [
        figure(
            f"tool_use rollouts/s (seed + tools + verify), c={args.concurrency}",
            m["tool_use"],
            "rollouts/s",
            baseline=m["noop"],
            note=f"baseline: the same {per_rollout:.1f} requests per rollout to GET /health (no-op) of the same "
            "server, same clients and concurrency, same run; higher is better",
        ),
        figure(
            "tool_use server CPU per rollout",
            1000 * result["server_cpu_s_per_rollout"]["tool_use"],
            "ms",
            baseline=1000 * result["server_cpu_s_per_rollout"]["noop"],
            note="server process CPU time per rollout (less sensitive to the shared machine's load); baseline: "
            "the same number of GET /health requests; lower is better",
        ),
    ]
    path = write_results("tool_use", rows, quick=args.quick, details=result)
    print_rows(rows, path)


if __name__ == "__main__":
    main()

"""A/B of the HTTP layer between two checkouts, in short alternating bursts (for a noisy machine).

Each checkout serves, in its own process, the policy server over an instant backend (no model) and a
no-op resources server (``bench_collect.NoopServer``). The client (collect's: ``ClientPool`` +
``post_json``) sends bursts of requests to A, then B, then A ... and reports each side's median rate
and B/A. Alternating short bursts puts both sides under the same machine load, which a shared machine
changes by the minute. Each checkout's server script imports its own code: today's module paths, or the
ones before the serving/ package (``gym_bridge.server.start_in_thread``), so A can be a commit before
the redesign. Writes ``bench/results/http_ab_c<concurrency>.json`` (per target: B's median rate, A's as the baseline,
every burst's rate, the load average at start and end). Each burst also counts the serving process's
CPU seconds (``common.tree_cpu_seconds``): CPU per request moves less with the machine's load than the
rate does. ``--targets`` picks targets by a part of their name.

    .venv/bin/python bench/ab_http.py --a /tmp/main-checkout --b . --rounds 9 --burst 400 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, tree_cpu_seconds, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

_SERVERS = """
import sys
sys.path.insert(0, sys.argv[1] + "/bench")
from bench_collect import NoopServer
from gym_bridge.generation.backend import GenerationBackend, GenerationResult
from gym_bridge.models.tokenizer import build_tokenizer
from gym_bridge.policy.server import build_policy_app
try:
    from gym_bridge.serving.uvicorn_thread import start_in_thread
except ImportError:  # before serving/uvicorn_thread.py (issue 35), then before the serving/ package
    try:
        from gym_bridge.serving.server import start_in_thread
    except ImportError:
        from gym_bridge.server import start_in_thread

class Instant(GenerationBackend):
    def __init__(self):
        self.tokenizer = build_tokenizer()
        self.model_name = "instant"
        self.max_context = 2048
        self.text = "The answer is \\\\boxed{5}."
        self.ids = self.tokenizer(self.text, add_special_tokens=False)["input_ids"]

    def generate(self, requests):
        return [GenerationResult(list(r.prompt_token_ids), list(self.ids), [-0.5] * len(self.ids), "stop", self.text)
                for r in requests]

policy = start_in_thread(build_policy_app(Instant()))
noop = start_in_thread(NoopServer().build_app())
print(policy.url, noop.url, flush=True)
sys.stdin.read()
"""

VERIFY = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 3?", "type": "message"}]},
    "response": {"id": "r", "output": [{"type": "message", "role": "assistant", "id": "m",
                 "content": [{"type": "output_text", "text": "\\boxed{5}", "annotations": []}]}]},
}  # fmt: skip
TARGETS = {
    "policy POST /v1/chat/completions": ("policy", "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}),
    "policy POST /v1/responses": ("policy", "/v1/responses", {"input": [{"role": "user", "content": "What is 2 + 3?", "type": "message"}]}),
    "resources POST /verify (no-op)": ("noop", "/verify", VERIFY),
    "resources POST /seed_session": ("noop", "/seed_session", {"responses_create_params": {"input": "x"}}),
}  # fmt: skip


async def burst(url: str, body: Any, concurrency: int, total: int) -> float:
    from gym_bridge.collect import ClientPool, connection_cap
    from gym_bridge.serving.retry import RetryPolicy, post_json

    pool = ClientPool(concurrency, connection_cap())
    jobs = iter(range(total))
    policy = RetryPolicy()

    async def worker(i: int) -> None:
        client = pool.for_worker(i)
        for _ in jobs:
            await post_json(client, url, body, target="model", policy=policy)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    await pool.aclose()
    return total / elapsed


def start(checkout: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.Popen([sys.executable, "-c", _SERVERS, str(checkout)], env=env, cwd=checkout,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    policy, noop = proc.stdout.readline().split()  # type: ignore[union-attr]
    return proc, {"policy": policy, "noop": noop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, default=REPO, help="checkout B")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--burst", type=int, default=400, help="requests per burst")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--targets", nargs="+", default=[""], help="only targets whose name holds one of these")
    args = parser.parse_args()
    procs = {}
    rows, bursts, cpu_us = [], {}, {}
    load_at_start = os.getloadavg()
    try:
        for side in ("a", "b"):
            procs[side] = start(getattr(args, side).resolve())
        for name, (server, path, body) in TARGETS.items():
            if not any(part in name for part in args.targets):
                continue
            rates: dict[str, list[float]] = {"a": [], "b": []}
            cpu: dict[str, list[float]] = {"a": [], "b": []}
            for side in ("a", "b"):  # warm-up
                asyncio.run(burst(procs[side][1][server] + path, body, args.concurrency, 100))
            for _ in range(args.rounds):
                for side in ("a", "b"):
                    before = tree_cpu_seconds(procs[side][0].pid)
                    rates[side].append(asyncio.run(burst(procs[side][1][server] + path, body, args.concurrency, args.burst)))
                    cpu[side].append(1e6 * (tree_cpu_seconds(procs[side][0].pid) - before) / args.burst)
            a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
            ca, cb = statistics.median(cpu["a"]), statistics.median(cpu["b"])
            print(f"{name:34s} c={args.concurrency:<4d} A {a:7.0f} req/s   B {b:7.0f} req/s   B/A {b / a:5.2f}   "
                  f"server CPU/req A {ca:5.0f} us  B {cb:5.0f} us  B/A {cb / ca:5.2f}", flush=True)  # fmt: skip
            bursts[name] = {side: [round(r, 1) for r in rates[side]] for side in rates}
            cpu_us[name] = {side: [round(r, 1) for r in cpu[side]] for side in cpu}
            rows.append(figure(f"{name}, c={args.concurrency} (B: {args.b})", round(b, 1), "req/s", baseline=round(a, 1),
                               note=f"A: {args.a}; median of {args.rounds} alternating bursts of {args.burst}; "
                               "higher is better"))  # fmt: skip
            rows.append(figure(f"{name}, c={args.concurrency}, server CPU per request (B: {args.b})", round(cb, 1),
                               "us", baseline=round(ca, 1), note=f"A: {args.a}; the serving process's CPU over each "
                               f"burst / requests, median of {args.rounds}; lower is better"))  # fmt: skip
    finally:
        for proc, _ in procs.values():
            proc.kill()
            proc.wait()
    details = {"a": str(args.a), "b": str(args.b), "rounds": args.rounds, "burst": args.burst,
               "concurrency": args.concurrency, "bursts_req_per_s": bursts, "bursts_server_cpu_us_per_req": cpu_us,
               "loadavg_at_start": [round(x, 2) for x in load_at_start],
               "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    print(f"wrote {write_results(f'http_ab_c{args.concurrency}', rows, details=details)}")


if __name__ == "__main__":
    main()

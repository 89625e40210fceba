"""Requests per second of the policy server's HTTP layer, over a backend that answers instantly.

What is measured is the server's own cost per request (body parsing, validation, prompt rendering
through the chat template, batching, the answer's rendering), not generation: the backend returns a
fixed completion without running a model. The server runs in its own process (uvicorn, as
``gym-bridge serve policy`` runs it); the client is the one collect uses (``ClientPool`` + ``post_json``),
in this process. Baseline: ``GET /health`` on the same server, same client, same concurrency, same run
(a request that does no work), so the ratio says how close a generation route comes to a bare request.

    .venv/bin/python bench/bench_policy_http.py            # c = 16 and 64, 4,000 requests each
    .venv/bin/python bench/bench_policy_http.py --quick    # 1,500 requests each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

_SERVER = """
import sys
from gym_bridge.generation.backend import GenerationBackend, GenerationResult
from gym_bridge.models.tokenizer import build_tokenizer
from gym_bridge.policy.server import build_policy_app
from gym_bridge.serving.uvicorn_thread import start_in_thread

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

server = start_in_thread(build_policy_app(Instant()))
print(server.url, flush=True)
sys.stdin.read()
"""

_BODIES = {
    "responses": ("/v1/responses", {"input": [{"role": "user", "content": "What is 2 + 3?", "type": "message"}]}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}),
}


async def _rate(url: str, path: str, body: Any, concurrency: int, total: int) -> float:
    from gym_bridge.collect import ClientPool, connection_cap
    from gym_bridge.serving.retry import RetryPolicy, post_json

    pool = ClientPool(concurrency, connection_cap())
    jobs = iter(range(total))
    policy = RetryPolicy()

    async def worker(i: int) -> None:
        client = pool.for_worker(i)
        for _ in jobs:
            if body is None:
                async with client.get(url + path) as answer:
                    await answer.read()
            else:
                await post_json(client, url + path, body, target="model", policy=policy)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    await pool.aclose()
    return total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,500 requests per figure")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[16, 64])
    args = parser.parse_args()
    total = 1500 if args.quick else 4000
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    server = subprocess.Popen([sys.executable, "-c", _SERVER], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    rows, raw = [], []
    try:
        url = server.stdout.readline().strip()  # type: ignore[union-attr]
        if not url.startswith("http"):
            raise RuntimeError(f"policy server did not start (printed {url!r})")
        asyncio.run(_rate(url, "/v1/chat/completions", _BODIES["chat"][1], 4, 200))  # warm-up
        for concurrency in args.concurrency:
            health = asyncio.run(_rate(url, "/health", None, concurrency, total))
            for path, body in _BODIES.values():
                rate = asyncio.run(_rate(url, path, body, concurrency, total))
                raw.append({"route": path, "concurrency": concurrency, "requests_per_s": rate, "health_per_s": health})
                print(f"{path:24s} c={concurrency:<4d} {rate:8.0f} req/s   (GET /health {health:.0f} req/s)", flush=True)
                rows.append(figure(
                    f"policy server req/s, POST {path}, c={concurrency}", rate, "req/s", baseline=health,
                    note=("instant backend (no model), so this is the HTTP layer's own cost; baseline: GET /health "
                          f"on the same server, same client, c={concurrency}, same run; higher is better"),
                ))  # fmt: skip
    finally:
        server.kill()
        server.wait()
    write_results("policy_http", rows, quick=args.quick, details={"runs": raw, "requests_per_figure": total})
    print(json.dumps(raw))


if __name__ == "__main__":
    main()

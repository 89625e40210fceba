"""How long other requests wait while a large body is handled: serves a resources server from a checkout, sends
one large request of N items (100,000: ~10-16 MB) to a route and polls ``/health`` meanwhile.

    .venv/bin/python scripts/verify_loop_latency.py [--repo DIR] [--items N] [--route ROUTE]

``--route``: ``verify`` (math: a transcript of N assistant messages), ``seed_session`` (math: NeMo Gym's typed
seed of a task row whose prompt holds N messages), ``tool`` (tool_use: ``/add_to_cart`` with N stray arguments,
a hostile call, answered 422), ``mcp`` (tool_use with ``--expose-tools-over-mcp``: the same call as ``tools/call``
on a seeded session, an error result) or ``aggregate_metrics`` (math: N verified rollouts).
``--repo`` runs another checkout's code (e.g. ``git archive <commit> | tar -x -C /tmp/old``) to compare.
Prints the large request's time and the worst and median ``/health`` latency while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=HERE, help="checkout whose gym_bridge serves (default: this one)")
    parser.add_argument("--items", type=int, default=100_000, help="items (messages, arguments, rollouts) in the body")
    parser.add_argument("--route", choices=sorted(ROUTES), default="verify", help="the route the large body goes to")
    args = parser.parse_args()
    server, path, build = ROUTES[args.route]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = "import sys; from gym_bridge.cli import main; sys.argv[0] = 'gym-bridge'; sys.exit(main())"
    serve = ["serve", server, "--port", str(port), *(["--expose-tools-over-mcp"] if path == "/mcp" else [])]
    proc = subprocess.Popen([sys.executable, "-c", code, *serve], cwd=args.repo,
                            env={**os.environ, "PYTHONPATH": str(args.repo)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc)
        raw = json.dumps(build(args.items)).encode()
        print(f"{path} body ({server}): {len(raw) / 1e6:.1f} MB, {args.items:,} items ({args.repo})")
        done: dict[str, Any] = {}
        headers = {"content-type": "application/json"}
        if path == "/mcp":  # a seeded session's token
            seed = httpx.post(f"{url}/seed_session", json=_tool_use_seed(), timeout=60)
            headers = {**headers, "accept": "application/json, text/event-stream", **seed.json()["resources_tools"]["headers"]}

        def large() -> None:
            start = time.monotonic()
            reply = httpx.post(f"{url}{path}", content=raw, headers=headers, timeout=600)
            done.update(seconds=time.monotonic() - start, status=reply.status_code)

        sender = threading.Thread(target=large)
        sender.start()
        time.sleep(0.2)
        waits = []
        while sender.is_alive():
            start = time.monotonic()
            httpx.get(f"{url}/health", timeout=600)
            waits.append(time.monotonic() - start)
            time.sleep(0.02)
        sender.join()
        waits.sort()
        print(f"large {path}: {done['seconds']:.2f} s, HTTP {done['status']}")
        if waits:
            print(f"/health meanwhile: {len(waits)} answered, worst {waits[-1]:.2f} s, median {waits[len(waits) // 2]:.3f} s")
        return 0
    finally:
        proc.terminate()
        proc.wait(30)


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode})")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not answer /health in 120 s")


def _message(i: int, text: str) -> dict[str, Any]:
    return {"id": f"m{i}", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _body(items: int) -> dict[str, Any]:
    output = [_message(i, "thinking") for i in range(items)] + [_message(items, "\\boxed{12}")]
    response = {"id": "r", "created_at": 0.0, "model": "m", "object": "response", "output": output}
    return {"responses_create_params": {"input": [{"role": "user", "content": "What is 7 + 5?"}]},
            "expected_answer": "12", "response": response}  # fmt: skip


def _seed(items: int) -> dict[str, Any]:
    prompt = [{"role": "user", "content": f"step {i}"} for i in range(items)]
    row = {"responses_create_params": {"input": prompt}, "expected_answer": "12"}
    return {"resources_session_id": "rs-large", "episode_id": {"rollout_id": "r-large"},
            "task_id": {"taskset": "t", "task_id": "0"}, "task_data": row}  # fmt: skip


def _tool(items: int) -> dict[str, Any]:
    return {"product_id": "P125", "quantity": 1, **{f"stray_{i}": i for i in range(items)}}


def _mcp(items: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "add_to_cart", "arguments": _tool(items)}}


def _tool_use_seed() -> dict[str, Any]:
    row = json.loads((HERE / "resources_servers" / "tool_use" / "data" / "example.jsonl").read_text().splitlines()[0])
    return {"resources_session_id": "rs-mcp", "episode_id": {"rollout_id": "r-mcp"},
            "task_id": {"taskset": "t", "task_id": "0"}, "task_data": row}  # fmt: skip


def _aggregate(items: int) -> dict[str, Any]:
    rollouts = [{"reward": float(i % 2), "_ng_task_index": i // 4, "_ng_rollout_index": i % 4,
                 "response": {"id": f"r{i}", "output": []}} for i in range(items)]  # fmt: skip
    return {"verify_responses": rollouts}


ROUTES = {
    "verify": ("math", "/verify", _body),
    "seed_session": ("math", "/seed_session", _seed),
    "tool": ("tool_use", "/add_to_cart", _tool),
    "mcp": ("tool_use", "/mcp", _mcp),
    "aggregate_metrics": ("math", "/aggregate_metrics", _aggregate),
}
"""``--route``: the server it is measured on, its path, and the large body."""


if __name__ == "__main__":
    sys.exit(main())

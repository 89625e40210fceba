"""tool_use under 1,000 large seeds: session state stays under its byte bound, with the server capped.

The server runs as ``gym-bridge serve tool_use`` under ``prlimit --as`` (address space), so a regression
that keeps every seed's state fails here instead of exhausting the machine. Each seed carries a ~160 KB
store (~160 MB of JSON over the run, more as Python objects); the server keeps at most
``max_session_bytes`` (64 MiB) of it, dropping the least recently used sessions.
"""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gym_bridge.serving.server import ServerSettings

from .procs import cli, start, stop, wait_for_line

SEEDS = 1000
BOUND = ServerSettings().max_session_bytes


def big_seed() -> bytes:
    """A ``/seed_session`` body with a ~160 KB store of 250 products; ``@@`` marks where the seed's number goes."""
    products = {f"P{k}": {"name": f"item @@-{k} " + "x" * 560, "category": "bulk", "price": 1.0, "stock": k}
                for k in range(250)}  # fmt: skip
    return json.dumps({"initial_state": {"products": products}}).encode()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_a_thousand_large_seeds_stay_under_the_session_bound():
    proc = start(["prlimit", f"--as={3 * 1024**3}", *cli("serve", "tool_use", "--port", "0")])
    try:
        line = wait_for_line(proc, "http://")
        url = next(word for word in line.split() if word.startswith("http://")).rstrip("/")
        template = big_seed()
        assert len(template) > 150_000

        clients = threading.local()  # one client per thread: making an httpx.Client costs ~0.15 s

        def seed(i: int) -> str:
            if not hasattr(clients, "client"):
                clients.client = httpx.Client(base_url=url, timeout=60)
            client = clients.client
            client.cookies.clear()  # each seed a new rollout: no cookie, a new session
            body = template.replace(b"@@", str(i).encode())
            answer = client.post("/seed_session", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 200, answer.text[:300]
            return answer.cookies["gym_bridge_session"]

        with ThreadPoolExecutor(4) as pool:
            cookies = list(pool.map(seed, range(SEEDS)))
        health = httpx.get(url + "/health", timeout=30).json()
        resident = rss_mib(proc.pid)  # prlimit execs the server in place
        with httpx.Client(base_url=url, timeout=30) as client:
            newest = client.post("/get_product", json={"product_id": "P1"}, headers={"cookie": f"gym_bridge_session={cookies[-1]}"})
            oldest = client.post("/get_product", json={"product_id": "P1"}, headers={"cookie": f"gym_bridge_session={cookies[0]}"})
    finally:
        stop(proc)
    assert 0 < health["session_bytes"] <= BOUND
    assert health["sessions"] < SEEDS  # the least recently used were dropped
    assert newest.status_code == 200 and newest.json()["name"].startswith(f"item {SEEDS - 1}-1 ")
    assert oldest.status_code == 409  # its session was dropped: the server says to seed first
    print(f"{resident:.0f} MiB resident, {health['session_bytes'] / 2**20:.0f} MiB of session state")
    assert resident < 200 + 6 * BOUND / 2**20, f"{resident:.0f} MiB resident"
